"""
Every built-in unit kind and estimator, registered: what listings and lookups go through.

Unit kinds and estimators register themselves where they are defined
(:mod:`~attribution.engine.units`, :mod:`~attribution.engine.channels`,
:mod:`~attribution.engine.estimators`, :mod:`~attribution.engine.channel_estimators`,
:mod:`~attribution.engine.experts`, :mod:`~attribution.engine.expert_estimators`); this
module imports all of them, so a lookup or a listing made from here sees every one whatever
was imported before.
"""

from __future__ import annotations

from attrlab.attribution.engine import channel_estimators, channels, expert_estimators, experts
from attrlab.attribution.engine.estimators import (
    ESTIMATORS,
    engine_catalog,
    estimators_for,
    scores_of,
)
from attrlab.attribution.engine.units import (
    UNIT_KINDS,
    check_unit_kinds,
    default_unit_kinds,
    model_unit_kinds,
    shared_sites,
    unit_kind,
)

#: The modules whose imports register the built-in kinds and estimators beyond the base ones.
REGISTERING = (channels, experts, channel_estimators, expert_estimators)

__all__ = [
    "ESTIMATORS",
    "REGISTERING",
    "UNIT_KINDS",
    "check_unit_kinds",
    "default_unit_kinds",
    "engine_catalog",
    "estimators_for",
    "model_unit_kinds",
    "scores_of",
    "shared_sites",
    "unit_kind",
]
