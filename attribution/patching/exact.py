"""
Activation patching: each site's activation from one run written into the other, one forward each.

Denoising writes the clean activation into the corrupted run, noising the corrupted one into
the clean run (Meng et al. 2022, https://arxiv.org/abs/2202.05262; Heimersheim & Nanda 2024,
https://arxiv.org/abs/2404.15255). Each batch row patches one site, by the patch removal of
the site's unit kind (:meth:`~attribution.engine.units.UnitKind.patched`); the sites of one
layer go in one forward batch (halved on CUDA out-of-memory by
:class:`~attribution.inputs.perturb.BatchRunner`).
With Gaussian-noise corruption every site is patched once per noise draw and the scores are
averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from attrlab.attribution.alteration import altered
from attrlab.attribution.engine.units import COMPONENT_KINDS, Site, unit_kind
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.perturb import BatchRunner
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.patching.base import (
    COMPONENTS,
    Scale,
    check_components,
    check_directions,
    row_chunks,
    scale_of,
)
from attrlab.attribution.patching.base import Site as Located
from attrlab.attribution.patching.hooks import (
    Activations,
    Pattern,
    noised,
    recorded,
    recorded_patterns,
)
from attrlab.attribution.patching.problem import PatchingProblem, Run, Runs

__all__ = ["Baseline", "baseline", "exact", "exact_rows", "patched_score"]

Key = TypeVar("Key")


@dataclass
class Baseline:
    """
    The unpatched passes of both sides: their scores and every activation of theirs.

    Attributes:
        clean: The clean score.
        corrupted: The corrupted side's score per noise draw (one without noise).
        activations: ``"clean"`` / ``"corrupted"`` -> the side's activations ``(rows, T, F)``.
        patterns: The same -> the side's attention patterns and values (when asked for).
    """

    clean: float
    corrupted: list[float]
    activations: dict[str, Activations]
    patterns: dict[str, Pattern] = field(default_factory=dict)

    def scale(self, direction: str) -> Scale:
        """The normalised scale of ``direction``."""
        return scale_of(self.clean, sum(self.corrupted) / len(self.corrupted), direction)

    def of(self, runs: Runs, run: Run) -> Activations:
        """The activations of ``run`` (one of the two sides of ``runs``)."""
        return self.activations[runs.side_name(run)]


def baseline(
    runs: Runs, components: Sequence[str], patterns: bool = False, max_rows: int | None = None
) -> Baseline:
    """
    One unpatched forward of each side (``1 + draws`` rows), recording ``components``.

    ``patterns``: record the attention patterns and values too (AtP*'s QK fix). ``max_rows``:
    most rows per forward (a memory bound): a side's draws then run in several.

    Raises:
        InvalidInputError: the corruption does not change the target's score.
    """
    activations: dict[str, Activations] = {}
    found_patterns: dict[str, Pattern] = {}
    scores: dict[str, torch.Tensor] = {}
    for run in (runs.clean, runs.corrupted):
        chunks: list[tuple[torch.Tensor, Activations, Pattern]] = []
        for rows in row_chunks(run.rows, max_rows):
            with ExitStack() as stack:
                stack.enter_context(torch.no_grad())
                seen = stack.enter_context(recorded(runs.parts, components))
                pattern = stack.enter_context(recorded_patterns(runs.adapter)) if patterns else {}
                score = runs.score(run, rows).double().cpu()
            chunks.append((score, seen, pattern))
        name = runs.side_name(run)
        scores[name] = torch.cat([score for score, _, _ in chunks])
        activations[name] = _joined([seen for _, seen, _ in chunks])
        if patterns:
            found_patterns[name] = _joined([pattern for _, _, pattern in chunks])
    clean, corrupted = float(scores["clean"][0]), scores["corrupted"].tolist()
    found = Baseline(clean, corrupted, activations, found_patterns)
    found.scale("denoising")  # refuses a corruption that changes nothing
    return found


def _joined(chunks: list[dict[Key, Any]]) -> dict[Key, Any]:
    """
    Each key's tensors (or tuples of tensors) of several passes joined along their rows.

    Each chunk's tensor is let go once joined, so the join holds one key twice at most.
    """
    if len(chunks) == 1:
        return chunks[0]
    joined: dict[Key, Any] = {}
    for key in list(chunks[0]):
        pieces = [chunk.pop(key) for chunk in chunks]
        if isinstance(pieces[0], torch.Tensor):
            joined[key] = torch.cat(pieces)
        else:  # a pattern's (weights, values)
            joined[key] = tuple(torch.cat(part) for part in zip(*pieces, strict=True))
    return joined


def exact_rows(runs: Runs, direction: str, components: Sequence[str]) -> int:
    """Patched rows (forward passes) of one direction: sites × layers × noise draws."""
    destination, source = runs.sides(direction)
    repeats = max(destination.rows, source.rows)
    return sum(len(runs.sites(c)) for c in components) * runs.layers * repeats


def _sites(component: str, layer: int, located: list[Located]) -> list[Site]:
    """``located`` (positions and heads of one layer) as sites of the component's unit kind."""
    kind = COMPONENT_KINDS[component]
    return [Site(kind, layer=layer, head=head, position=at) for at, head in located]


def _patched_scores(
    runs: Runs,
    direction: str,
    component: str,
    layer: int,
    patched: list[list[Site]],
    items: range,
    sources: torch.Tensor,
) -> torch.Tensor:
    """
    The target's score of each item, patched from ``sources`` ``(rows, T, F)``.

    Item ``i`` patches the sites ``patched[i // draws]`` with noise draw ``i % draws``
    (``draws``: the noised side's rows).
    """
    destination, source = runs.sides(direction)
    repeats = max(destination.rows, source.rows)
    index = torch.tensor(list(items))
    draw = index % repeats
    rows = [patched[i] for i in (index // repeats).tolist()]
    values = sources[draw % source.rows]
    noise = None if destination.noise is None else destination.noise[draw % destination.rows]
    patch = unit_kind(COMPONENT_KINDS[component]).patched({(component, layer): values})
    target, adapter = runs.problem.target, runs.adapter
    with noised(adapter, noise), patch(adapter, rows):
        return target.score(target.outputs(adapter, **destination.kwargs(len(items))))


def exact(
    runs: Runs,
    base: Baseline,
    direction: str,
    components: Sequence[str],
    runner: BatchRunner,
) -> list[tuple]:
    """
    Table rows (:data:`~attribution.patching.base.COLUMNS` after the first two) of each site.

    Raises:
        JobCancelledError: between batches, once the run is cancelled.
        DeviceMemoryError: a batch of one row does not fit.
    """
    destination, source = runs.sides(direction)
    repeats = max(destination.rows, source.rows)
    scale = base.scale(direction)
    rows: list[tuple] = []
    for component in components:
        sites = runs.sites(component)
        for layer in range(runs.layers):
            sources = base.of(runs, source)[component, layer]
            alone = [[site] for site in _sites(component, layer, sites)]

            def forward(
                start: int,
                stop: int,
                component: str = component,
                layer: int = layer,
                alone: list[list[Site]] = alone,
                sources: torch.Tensor = sources,
            ) -> torch.Tensor:
                items = range(start, stop)
                return _patched_scores(runs, direction, component, layer, alone, items, sources)

            totals = torch.zeros(len(sites), dtype=torch.float64)
            for start, stop, scores in runner.chunks(len(sites) * repeats, forward):
                at = torch.arange(start, stop) // repeats
                totals.index_add_(0, at, scores.double().cpu())
            for site, total in zip(sites, (totals / repeats).tolist(), strict=True):
                rows.append(runs.row(component, layer, site, scale, total - scale.destination))
    return rows


def patched_score(
    adapter: Adapter,
    problem: PatchingProblem,
    component: str,
    layer: int,
    positions: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    direction: str = "denoising",
) -> float:
    """
    The normalised score with several sites of one layer patched together, in one forward.

    ``positions``: the token positions patched (``None``: all; ``()``: none); ``heads``: the
    heads patched, for the head components (``None``: all).

    Raises:
        InvalidParameterError: an unknown component or direction, a layer, position or head
            the model or input does not have, heads for a component without heads.
        InvalidInputError, UnsupportedMethodError: as :meth:`Runs.of`.
    """
    (component,) = check_components([component])
    (direction,) = check_directions([direction])
    runs = Runs.of(adapter, problem)
    if not 0 <= layer < runs.layers:
        raise InvalidParameterError(
            f"layer {layer} is not in this model: it has {runs.layers} (0..{runs.layers - 1})"
        )
    if heads is not None and not COMPONENTS[component].per_head:
        raise InvalidParameterError(f"the {component} component has no heads to choose")
    chosen_positions = list(range(runs.length)) if positions is None else list(positions)
    chosen_heads = list(range(runs.heads)) if heads is None else list(heads)
    for name, values, count in (
        ("position", chosen_positions, runs.length),
        ("head", chosen_heads, runs.heads),
    ):
        outside = [v for v in values if not 0 <= v < count]
        if outside:
            raise InvalidParameterError(f"{name}(s) {outside} are outside 0..{count - 1}")
    destination, source = runs.sides(direction)
    repeats = max(destination.rows, source.rows)
    with altered(adapter.model), torch.no_grad():
        base = baseline(runs, [component])
        sources = base.of(runs, source)[component, layer]
        per_head: list[int | None] = [*chosen_heads] if COMPONENTS[component].per_head else [None]
        together = _sites(component, layer, [(p, h) for p in chosen_positions for h in per_head])
        scores = _patched_scores(
            runs, direction, component, layer, [together], range(repeats), sources
        )
    return base.scale(direction).normalise(float(scores.double().mean()))
