"""
Activation patching: each site's activation from one run written into the other, one forward each.

Denoising writes the clean activation into the corrupted run, noising the corrupted one into
the clean run (Meng et al. 2022, https://arxiv.org/abs/2202.05262; Heimersheim & Nanda 2024,
https://arxiv.org/abs/2404.15255). Each batch row patches one site; the sites of one layer go in
one forward batch (halved on CUDA out-of-memory by :class:`~attribution.perturb.BatchRunner`).
With Gaussian-noise corruption every site is patched once per noise draw and the scores are
averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch

from attrlab.attribution.patching.base import (
    Activations,
    Pattern,
    Run,
    Runs,
    Scale,
    edited,
    noised,
    recorded,
    recorded_patterns,
    scale_of,
    site_masks,
)
from attrlab.attribution.perturb import BatchRunner

__all__ = ["Baseline", "baseline", "exact", "exact_rows"]


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


def baseline(runs: Runs, components: Sequence[str], patterns: bool = False) -> Baseline:
    """
    One unpatched forward of each side (``1 + draws`` rows), recording ``components``.

    ``patterns``: record the attention patterns and values too (AtP*'s QK fix).

    Raises:
        InvalidInputError: the corruption does not change the target's score.
    """
    activations: dict[str, Activations] = {}
    found_patterns: dict[str, Pattern] = {}
    scores: dict[str, torch.Tensor] = {}
    for run in (runs.clean, runs.corrupted):
        name = runs.side_name(run)
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            seen = stack.enter_context(recorded(runs.parts, components))
            if patterns:
                found_patterns[name] = stack.enter_context(recorded_patterns(runs))
            scores[name] = runs.score(run).double().cpu()
        activations[name] = dict(seen)
    clean, corrupted = float(scores["clean"][0]), scores["corrupted"].tolist()
    found = Baseline(clean, corrupted, activations, found_patterns)
    found.scale("denoising")  # refuses a corruption that changes nothing
    return found


def exact_rows(runs: Runs, direction: str, components: Sequence[str]) -> int:
    """Patched rows (forward passes) of one direction: sites × layers × noise draws."""
    destination, source = runs.sides(direction)
    repeats = max(destination.rows, source.rows)
    return sum(len(runs.sites(c)) for c in components) * runs.layers * repeats


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
    sources = base.of(runs, source)
    target, adapter = runs.problem.target, runs.adapter
    rows: list[tuple] = []
    for component in components:
        sites = runs.sites(component)
        for layer in range(runs.layers):
            patch_from = sources[component, layer]
            masks = site_masks(
                sites, patch_from.shape[1], patch_from.shape[2], runs.heads, patch_from.device
            )

            def forward(
                start: int,
                stop: int,
                patch_from: torch.Tensor = patch_from,
                masks: torch.Tensor = masks,
            ) -> torch.Tensor:
                # item i patches site i // repeats with draw i % repeats
                items = torch.arange(start, stop)
                draw = items % repeats
                where = masks[items // repeats]
                values = patch_from[draw % source.rows]
                noise = None
                if destination.noise is not None:
                    noise = destination.noise[draw % destination.rows]

                def patch(x: torch.Tensor) -> torch.Tensor:
                    return torch.where(where, values.to(x.dtype), x)

                with noised(adapter, noise), edited(runs.parts, component, layer, patch):
                    return target.score(target.outputs(adapter, **destination.kwargs(stop - start)))

            totals = torch.zeros(len(sites), dtype=torch.float64)
            for start, stop, scores in runner.chunks(len(sites) * repeats, forward):
                at = torch.arange(start, stop) // repeats
                totals.index_add_(0, at, scores.double().cpu())
            for site, total in zip(sites, (totals / repeats).tolist(), strict=True):
                rows.append(runs.row(component, layer, site, scale, total - scale.destination))
    return rows
