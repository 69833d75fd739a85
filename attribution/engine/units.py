"""
Unit kinds: what an importance score is about, and how to take it out of the model.

A *unit kind* (a layer, an attention head, the residual stream at a position, ...) is data plus
small functions: one that lists its sites on a model and input (each a :class:`Site`, a named,
typed record), and, per way of removing it (skip a block, zero, mean, ...), one that opens a
context in which each batch row runs without its own set of sites. A kind that activation
patching reaches can also be *patched*: its sites written with another run's activations
(:meth:`UnitKind.patched`). Every removal is a context manager that undoes its hooks when the
block exits, error or not, and runs under :func:`~attribution.alteration.altered`'s caller.

Layers and heads are the model's own sites; the patching components at a token position
(``residual_position``, ``attention_position``, ``mlp_position``, ``head_position``: one per
:data:`~attribution.patching.base.COMPONENTS` entry at a position) and the input's tokens
(``token``: those a perturbation may hide, hidden as it hides them) are the input's, listed from
the input (a dataset's inputs then need the same length). The verification loop
(:func:`~attribution.engine.verification.pruning_curves`) and the agreement table
(:func:`~attribution.engine.agreement.removal_agreement`) work on any registered kind; a pruning
study, and the front ends' pruning choices, take the model's kinds (:func:`model_unit_kinds`).
Registering a kind (:func:`register_unit_kind`) is all a new one needs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attrlab.attribution.errors import (
    InvalidInputError,
    InvalidParameterError,
    UnsupportedMethodError,
)
from attrlab.attribution.inputs.features import features_of
from attrlab.attribution.inputs.perturb import hidden_tokens
from attrlab.attribution.layers.analysis import ModelParts
from attrlab.attribution.layers.hooks import ablate_head_sets, skip_blocks
from attrlab.attribution.models.base import Adapter, Inputs, TextInputs
from attrlab.attribution.patching.base import COMPONENTS
from attrlab.attribution.patching.hooks import Activations, removed_sites

__all__ = [
    "COMPONENT_KINDS",
    "UNIT_KINDS",
    "Removal",
    "Site",
    "UnitKind",
    "check_unit_kinds",
    "default_unit_kinds",
    "layer_masks",
    "model_unit_kinds",
    "register_unit_kind",
    "shared_sites",
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
        position: The token position of the input.
        channel: The channel within its layer (an MLP neuron, a convolution's output channel).
        expert: The expert of a mixture-of-experts layer.
    """

    kind: str
    layer: int | None = None
    head: int | None = None
    position: int | None = None
    channel: int | None = None
    expert: int | None = None

    def name(self) -> int | list[int]:
        """
        Its JSON form in a removal order: its fields that are set, in order, or one alone.

        A layer is its index, a head ``[layer, head]``, a residual site ``[layer, position]``,
        a head at a position ``[layer, head, position]``, a neuron ``[layer, channel]``, an
        expert ``[layer, expert]`` (the kind says which fields it has).
        """
        fields = (self.layer, self.head, self.position, self.channel, self.expert)
        where = [v for v in fields if v is not None]
        return where[0] if len(where) == 1 else where


#: Opens a context in which batch row ``r`` of the passes inside runs without ``rows[r]``.
Removal = Callable[[Adapter, Sequence[Sequence[Site]]], AbstractContextManager[None]]
#: The activations of the run patched from, one row per batch row -> a removal writing them.
Patch = Callable[[Activations], Removal]


@dataclass(frozen=True)
class UnitKind:
    """
    A kind of unit that importance is scored for and that can be removed.

    Attributes:
        name: Its name in requests and tables (``layer``, ``head``).
        description: What it is and how it is removed, for people.
        find_sites: Its sites on a model and an input, in a fixed order (scores are given in
            this order); kinds that are the model's own ignore the input (:meth:`sites`).
        removals: Each way to remove a set of sites by name; the first is the default.
        patch: How its sites are written with another run's activations (activation
            patching: ``patch`` among its removals), or ``None``.
        positional: Its sites are positions of an input, so they depend on the input.
        by_default: A pruning study prunes it when no kinds are named (the cheap ones).
        unsupported: Why it does not apply to a model (``None``: it does), or ``None`` for a
            kind every model with transformer blocks has.
        collect: Reads what its estimators need over a dataset, once per study:
            ``(adapter, items, needs, run)`` -> statistics (:attr:`Evidence.statistics
            <attribution.engine.estimators.Evidence.statistics>`), ``needs`` the union of its
            estimators' :attr:`~attribution.engine.estimators.Estimator.needs`; ``None``: its
            estimators read no dataset statistics.
        collect_passes: ``needs`` -> ``(forward, backward)`` that ``collect`` runs per input.
    """

    name: str
    description: str
    find_sites: Callable[[Adapter, Inputs | None], list[Site]]
    removals: Mapping[str, Removal]
    patch: Patch | None = None
    positional: bool = False
    by_default: bool = True
    unsupported: Callable[[Adapter], str | None] | None = None
    collect: Callable[..., Any] | None = None
    collect_passes: Callable[[frozenset[str]], tuple[int, int]] | None = None

    def applies_to(self, adapter: Adapter) -> str | None:
        """``None`` where ``adapter`` has this kind's sites, else why not."""
        return None if self.unsupported is None else self.unsupported(adapter)

    def describe(self) -> dict[str, Any]:
        """JSON-ready: its name, description and removals (the default first; ``patch`` last)."""
        removals = [*self.removals, *(["patch"] if self.patch is not None else [])]
        return {
            "name": self.name,
            "description": self.description,
            "removals": removals,
            "positional": self.positional,
            "by_default": self.by_default,
        }

    def sites(self, adapter: Adapter, inputs: Inputs | None = None) -> list[Site]:
        """
        Its sites on ``adapter`` (and ``inputs``, which a positional kind needs), in order.

        Raises:
            InvalidInputError: a positional kind without a text input.
        """
        return self.find_sites(adapter, inputs)

    def removal(self, name: str | None = None) -> Removal:
        """
        The removal named ``name`` (``None``: the default).

        Raises:
            InvalidParameterError: a removal this kind does not have (``patch``, which needs
                the other run's activations, is :meth:`patched`).
        """
        chosen = next(iter(self.removals)) if name is None else name
        if chosen not in self.removals:
            patch = " (patch writes another run's activations: UnitKind.patched)"
            raise InvalidParameterError(
                f"a {self.name} is removed by {', '.join(self.removals)}; got {chosen!r}"
                f"{patch if chosen == 'patch' and self.patch is not None else ''}"
            )
        return self.removals[chosen]

    def patched(self, source: Activations) -> Removal:
        """
        The removal writing ``source`` (the other run's activations) into each row's sites.

        ``source``: per ``(component, layer)`` the activation ``(rows, T, F)`` of the run
        patched from, row ``r`` for batch row ``r`` (the layers of the sites patched at least).

        Raises:
            InvalidParameterError: a kind that cannot be patched.
        """
        if self.patch is None:
            raise InvalidParameterError(f"a {self.name} cannot be patched from another run")
        return self.patch(source)


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


def model_unit_kinds() -> list[str]:
    """The registered kinds whose sites are the model's own (not positional): what is pruned."""
    return [name for name, kind in UNIT_KINDS.items() if not kind.positional]


def default_unit_kinds(adapter: Adapter) -> list[str]:
    """What a pruning study of ``adapter`` prunes when no kinds are named."""
    return [
        name
        for name in model_unit_kinds()
        if UNIT_KINDS[name].by_default and UNIT_KINDS[name].applies_to(adapter) is None
    ]


def unit_kind(name: str) -> UnitKind:
    """
    The registered kind ``name``.

    Raises:
        InvalidParameterError: no kind of that name.
    """
    if name not in UNIT_KINDS:
        raise InvalidParameterError(f"unit is one of {', '.join(UNIT_KINDS)}; got {name!r}")
    return UNIT_KINDS[name]


def check_unit_kinds(names: Collection[str], adapter: Adapter | None = None) -> list[str]:
    """
    ``names`` checked as a pruning study's units (on ``adapter``, where given).

    The model's kinds (:func:`model_unit_kinds`), each once, at least one.

    Raises:
        InvalidParameterError: none, or one that is unknown or positional.
        UnsupportedMethodError: a kind ``adapter`` does not have (a convolution channel of a
            transformer).
    """
    known = model_unit_kinds()
    chosen = list(dict.fromkeys(names))
    unknown = [u for u in chosen if u not in known]
    if not chosen or unknown:
        raise InvalidParameterError(f"units are one or more of {', '.join(known)}; got {chosen}")
    if adapter is not None:
        for name in chosen:
            reason = UNIT_KINDS[name].applies_to(adapter)
            if reason is not None:
                raise UnsupportedMethodError(reason)
    return chosen


def shared_sites(adapter: Adapter, unit: str, inputs: Sequence[Inputs]) -> list[Site]:
    """
    The sites of ``unit`` on every one of ``inputs``, which must all give the same.

    Without inputs, the model's own sites (a positional kind's are refused).

    Raises:
        InvalidParameterError: an unknown unit.
        InvalidInputError: inputs giving different sites (a positional kind on inputs of
            different lengths), or none for a positional kind.
    """
    kind = unit_kind(unit)
    sites = kind.sites(adapter, inputs[0] if inputs else None)
    if kind.positional and any(kind.sites(adapter, i) != sites for i in inputs[1:]):
        raise InvalidInputError(
            f"a {unit} site is a token position: every input needs the same token length"
        )
    return sites


def layer_masks(
    rows: Sequence[Sequence[Site]], sizes: Sequence[int], field: str
) -> dict[int, torch.Tensor]:
    """
    Per layer, ``(rows, sizes[layer])`` booleans: the sites each batch row runs without.

    ``field``: the site's index within its layer (``channel``, ``expert``).

    Raises:
        InvalidParameterError: a site the model does not have.
    """
    where: list[tuple[int, int, int]] = []  # (row, layer, index), checked, then set at once
    for r, row in enumerate(rows):
        for site in row:
            layer, index = site.layer or 0, getattr(site, field)
            known = site.layer is not None and 0 <= layer < len(sizes)
            if not known or index is None or not 0 <= index < sizes[layer]:
                raise InvalidParameterError(f"{site} is not one of this model's {site.kind}s")
            where.append((r, layer, index))
    found = np.array(where, dtype=np.int64).reshape(-1, 3)
    masks: dict[int, torch.Tensor] = {}
    for layer in np.unique(found[:, 1]):
        chosen = found[found[:, 1] == layer]
        mask = torch.zeros(len(rows), sizes[layer], dtype=torch.bool)
        mask[torch.from_numpy(chosen[:, 0]), torch.from_numpy(chosen[:, 2])] = True
        masks[int(layer)] = mask
    return masks


def _layers(adapter: Adapter, _inputs: Inputs | None) -> list[Site]:
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


def _heads(adapter: Adapter, _inputs: Inputs | None) -> list[Site]:
    parts = ModelParts.of(adapter)
    layers = range(len(parts.blocks))
    return [Site("head", layer=b, head=h) for b in layers for h in range(parts.heads)]


def _zero_heads(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> AbstractContextManager[None]:
    """Each row's heads zeroed at their output projection's input, in that row only."""
    parts = ModelParts.of(adapter)
    sets = [[(_where(s.layer), _where(s.head)) for s in row] for row in rows]
    return ablate_head_sets(parts.projections, parts.heads, sets)


def _positions(unit: str, inputs: Inputs | None) -> range:
    """The token positions of ``inputs``, where a positional kind's sites lie."""
    if not isinstance(inputs, TextInputs):
        raise InvalidInputError(f"a {unit} site is a token position of a text input: give one")
    return range(int(inputs.input_ids.shape[1]))


def _position_sites(unit: str, per_head: bool) -> Callable[[Adapter, Inputs | None], list[Site]]:
    """Sites of a component at a position: layer, then head (``per_head``), then position."""

    def sites(adapter: Adapter, inputs: Inputs | None) -> list[Site]:
        positions = _positions(unit, inputs)
        parts = ModelParts.of(adapter)
        heads: list[int | None] = [*range(parts.heads)] if per_head else [None]
        return [
            Site(unit, layer=b, head=h, position=p)
            for b in range(len(parts.blocks))
            for h in heads
            for p in positions
        ]

    return sites


def _removed(component: str, how: str, source: Activations | None = None) -> Removal:
    """Each row's sites of ``component`` removed ``how`` (``zero``, ``mean``, ``patch``)."""

    def remove(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> AbstractContextManager[None]:
        located = [[(_where(s.layer), s.position, s.head) for s in row] for row in rows]
        return removed_sites(ModelParts.of(adapter), component, located, how, source)

    return remove


def _patch(component: str) -> Patch:
    """Each row's sites of ``component`` written with the other run's activations."""

    def patch(source: Activations) -> Removal:
        return _removed(component, "patch", source)

    return patch


def _tokens(adapter: Adapter, inputs: Inputs | None) -> list[Site]:
    """Each token a perturbation may hide (not a special or answer token), in text order."""
    if not isinstance(inputs, TextInputs):
        raise InvalidInputError("a token site is a token of a text input: give one")
    return [Site("token", position=f.start) for f in features_of(inputs, "token")]


def _hidden(kind: str) -> Removal:
    """Each row's tokens hidden as the perturbation methods hide them (``mask``, ``pad``)."""

    def remove(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> AbstractContextManager[None]:
        return hidden_tokens(adapter, [[_where(s.position) for s in row] for row in rows], kind)

    return remove


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
#: Each patching component (:data:`~attribution.patching.base.COMPONENTS`) -> its unit kind.
COMPONENT_KINDS = {
    # a head over every position is the head kind; a head at a position is named so already
    c.name: ("head" if not c.per_position else c.name if c.per_head else f"{c.name}_position")
    for c in COMPONENTS.values()
}

register_unit_kind(
    UnitKind(
        "head",
        "an attention head, removed by zeroing its output at the output projection's input "
        "(or patched from another run)",
        _heads,
        {"zero": _zero_heads},
        patch=_patch("head"),
    )
)
for _component in (c for c in COMPONENTS.values() if c.per_position):
    _name = COMPONENT_KINDS[_component.name]
    register_unit_kind(
        UnitKind(
            _name,
            f"{_component.description} (a site: one layer"
            f"{', head' if _component.per_head else ''} and position); removed by zeroing it, by "
            "its mean over the input's positions, or by patching it from another run",
            _position_sites(_name, _component.per_head),
            {how: _removed(_component.name, how) for how in ("zero", "mean")},
            patch=_patch(_component.name),
            positional=True,
        )
    )
register_unit_kind(
    UnitKind(
        "token",
        "a token of the input (special and answer tokens stay), removed by the mask token in "
        "its place, or the pad token, as the perturbation methods hide it",
        _tokens,
        {kind: _hidden(kind) for kind in ("mask", "pad")},
        positional=True,
    )
)
