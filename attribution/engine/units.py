"""
Unit kinds: what an importance score is about, and how to take it out of the model.

A *unit kind* (a layer, an attention head, ...) is data plus two small functions: one that
lists its sites on a model (each a :class:`Site`, a named, typed record), and, per way of
removing it (skip a block, zero a head, ...), one that opens a context in which each batch row
runs without its own set of sites. Every removal is a context manager that undoes its hooks when
the block exits, error or not, and runs under :func:`~attribution.alteration.altered`'s caller.

The verification loop (:func:`~attribution.engine.verification.pruning_curves`) and the
agreement table (:func:`~attribution.engine.agreement.removal_agreement`) work on any
registered kind; front ends list :data:`UNIT_KINDS` for their choices. Registering a kind
(:func:`register_unit_kind`) is all a new one needs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.layers.analysis import ModelParts
from attrlab.attribution.layers.hooks import ablate_head_sets, skip_blocks
from attrlab.attribution.models.base import Adapter

__all__ = [
    "UNIT_KINDS",
    "Removal",
    "Site",
    "UnitKind",
    "check_unit_kinds",
    "register_unit_kind",
    "unit_kind",
]


@dataclass(frozen=True)
class Site:
    """
    One unit of a model: its kind and where it is (the fields its kind uses, others ``None``).

    Attributes:
        kind: The unit kind's name.
        layer: The block it is in.
        head: The attention head (query head) in that block.
    """

    kind: str
    layer: int | None = None
    head: int | None = None

    def name(self) -> int | list[int]:
        """Its JSON form in a removal order: the layer alone, or ``[layer, head]``."""
        where = [v for v in (self.layer, self.head) if v is not None]
        return where[0] if len(where) == 1 else where


#: Opens a context in which batch row ``r`` of the passes inside runs without ``rows[r]``.
Removal = Callable[[Adapter, Sequence[Sequence[Site]]], AbstractContextManager[None]]


@dataclass(frozen=True)
class UnitKind:
    """
    A kind of unit that importance is scored for and that can be removed.

    Attributes:
        name: Its name in requests and tables (``layer``, ``head``).
        description: What it is and how it is removed, for people.
        sites: Its sites on a model, in a fixed order (scores are given in this order).
        removals: Each way to remove a set of sites by name; the first is the default.
    """

    name: str
    description: str
    sites: Callable[[Adapter], list[Site]]
    removals: Mapping[str, Removal]

    def describe(self) -> dict[str, Any]:
        """JSON-ready: its name, description and removals (the default first)."""
        return {"name": self.name, "description": self.description, "removals": [*self.removals]}

    def removal(self, name: str | None = None) -> Removal:
        """
        The removal named ``name`` (``None``: the default).

        Raises:
            InvalidParameterError: a removal this kind does not have.
        """
        chosen = next(iter(self.removals)) if name is None else name
        if chosen not in self.removals:
            raise InvalidParameterError(
                f"a {self.name} is removed by {', '.join(self.removals)}; got {chosen!r}"
            )
        return self.removals[chosen]


#: Every registered unit kind by name, in registration order.
UNIT_KINDS: dict[str, UnitKind] = {}


def register_unit_kind(kind: UnitKind) -> UnitKind:
    """
    Add ``kind`` to :data:`UNIT_KINDS` (front ends list it from then on).

    Raises:
        ValueError: a kind of that name is registered already.
    """
    if kind.name in UNIT_KINDS:
        raise ValueError(f"a unit kind named {kind.name!r} is registered already")
    UNIT_KINDS[kind.name] = kind
    return kind


def unit_kind(name: str) -> UnitKind:
    """
    The registered kind ``name``.

    Raises:
        InvalidParameterError: no kind of that name.
    """
    if name not in UNIT_KINDS:
        raise InvalidParameterError(f"unit is one of {', '.join(UNIT_KINDS)}; got {name!r}")
    return UNIT_KINDS[name]


def check_unit_kinds(names: Collection[str]) -> list[str]:
    """
    ``names`` checked: registered kinds, each once, at least one.

    Raises:
        InvalidParameterError: none, or an unknown one.
    """
    chosen = list(dict.fromkeys(names))
    unknown = [u for u in chosen if u not in UNIT_KINDS]
    if not chosen or unknown:
        raise InvalidParameterError(
            f"units are one or more of {', '.join(UNIT_KINDS)}; got {chosen}"
        )
    return chosen


def _layers(adapter: Adapter) -> list[Site]:
    return [Site("layer", layer=b) for b in range(len(ModelParts.of(adapter).blocks))]


def _skip(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> AbstractContextManager[None]:
    """Each row's blocks bypassed (each returns its input) in that row only."""
    blocks = ModelParts.of(adapter).blocks
    bypassed: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        for site in row:
            bypassed.setdefault(_where(site.layer), []).append(r)
    chosen = sorted(bypassed)
    return skip_blocks([blocks[b] for b in chosen], [bypassed[b] for b in chosen])


def _heads(adapter: Adapter) -> list[Site]:
    parts = ModelParts.of(adapter)
    layers = range(len(parts.blocks))
    return [Site("head", layer=b, head=h) for b in layers for h in range(parts.heads)]


def _zero_heads(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> AbstractContextManager[None]:
    """Each row's heads zeroed at their output projection's input, in that row only."""
    parts = ModelParts.of(adapter)
    sets = [[(_where(s.layer), _where(s.head)) for s in row] for row in rows]
    return ablate_head_sets(parts.projections, parts.heads, sets)


def _where(value: Any) -> int:
    if value is None:  # a site of another kind handed to this kind's removal
        raise InvalidParameterError("a site lacks the position its unit kind needs")
    return int(value)


register_unit_kind(
    UnitKind(
        "layer",
        "a transformer block, removed by bypassing it (it returns its input)",
        _layers,
        {"skip": _skip},
    )
)
register_unit_kind(
    UnitKind(
        "head",
        "an attention head, removed by zeroing its output at the output projection's input",
        _heads,
        {"zero": _zero_heads},
    )
)
