"""
What a front end offers for a pruning study's removal: the ways every chosen kind shares.

A study removes every kind's sites one way (:func:`~attribution.engine.study.pruning_study`'s
``removal``), so the choices are those each chosen kind has, in the first kind's order; none
chosen, none offered (each kind's default applies).
"""

from __future__ import annotations

from collections.abc import Collection

from attrlab.attribution.engine.units import unit_kind

__all__ = ["shared_removals"]


def shared_removals(units: Collection[str]) -> list[str]:
    """
    The removals every one of ``units`` has (:attr:`~attribution.engine.units.UnitKind.removals`).

    Raises:
        InvalidParameterError: an unknown unit.
    """
    kinds = [unit_kind(u) for u in units]
    if not kinds:
        return []
    return [name for name in kinds[0].removals if all(name in k.removals for k in kinds[1:])]
