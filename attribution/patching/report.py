"""
One call for a patching study: exact patching and its estimators, their table and agreement.

:data:`ESTIMATORS` says what each estimator is and costs (data a front end lists): the engine's
estimators computed by the report (:data:`~attribution.engine.estimators.ESTIMATORS`);
:func:`planned_passes` prices a study before it runs; :func:`patching_report` runs it under
the model's alteration lock, with progress, cancellation and the pass budget of its
:class:`~attribution.request.run.RunSettings`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from attrlab.attribution.alteration import altered
from attrlab.attribution.engine.agreement import PATCHING_AGREEMENT_COLUMNS as AGREEMENT_COLUMNS
from attrlab.attribution.engine.agreement import agreement_with_exact
from attrlab.attribution.engine.estimators import ESTIMATORS as ENGINE_ESTIMATORS
from attrlab.attribution.engine.estimators import Estimator
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.perturb import BatchRunner, auto_batch_size
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.patching.atp import atp, atp_star
from attrlab.attribution.patching.base import (
    check_components,
    check_directions,
    chosen_names,
    row_chunks,
    table,
)
from attrlab.attribution.patching.exact import Baseline, baseline, exact, exact_rows
from attrlab.attribution.patching.problem import PatchingProblem, Runs
from attrlab.attribution.patching.relp import relp
from attrlab.attribution.patching.visual import VisualPositions
from attrlab.attribution.request.defaults import PATCHING_TOP_K
from attrlab.attribution.request.gate import clear_study, memory_rows
from attrlab.attribution.request.run import RunContext, RunSettings

__all__ = [
    "AGREEMENT_COLUMNS",
    "ESTIMATORS",
    "Estimator",
    "PatchingReport",
    "agreement_reading",
    "check_study",
    "patching_report",
    "planned_passes",
]


#: The patching report's estimators, from the engine's registry (those computed by the report),
#: in table order.
ESTIMATORS: dict[str, Estimator] = {
    name: e for name, e in ENGINE_ESTIMATORS.items() if e.reads == "report"
}


#: ``(runs, baseline, direction, components, run, max_rows)`` -> an estimator's table rows.
_Rows = Callable[[Runs, Baseline, str, Sequence[str], RunContext, int | None], list[tuple]]
#: How the report computes each gradient estimator's rows of one direction (one stage each).
_GRADIENT: dict[str, _Rows] = {
    "atp": atp,
    "atp_star": atp_star,
    "relp": relp,
}


def _check_estimators(estimators: Sequence[str] | None) -> list[str]:
    return chosen_names("estimator", estimators, ESTIMATORS)


def check_study(
    estimators: Sequence[str] | None = None,
    components: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
) -> None:
    """
    Refuse unknown names before a model is loaded (a front end queueing a study).

    Raises:
        InvalidParameterError: as :func:`patching_report`, naming what exists.
    """
    _check_estimators(estimators)
    check_components(components)
    check_directions(directions)


@dataclass
class PatchingReport:
    """
    A patching study's results: plain data, JSON-ready with :meth:`to_dict`.

    Attributes:
        table: One row per estimator, direction, component and site
            (:data:`~attribution.patching.base.COLUMNS`).
        agreement: Each estimator against exact patching (:data:`AGREEMENT_COLUMNS`).
        target: The target's label.
        clean_score: The target's score on the clean input.
        corrupted_score: On the corrupted side (the mean over noise draws).
        corrupted_scores: Per noise draw (one value without noise).
        tokens: The clean input's token texts.
        corrupted_tokens: The corrupted input's (``None`` with noise).
        forward_passes: Forward rows spent.
        backward_passes: Backward passes spent.
        visual: Which positions are visual tokens and their regions of the image (a
            vision-language study, :mod:`~attribution.patching.image`; ``None`` on text).
    """

    table: pd.DataFrame
    agreement: pd.DataFrame
    target: str
    clean_score: float
    corrupted_score: float
    corrupted_scores: list[float]
    tokens: list[str]
    corrupted_tokens: list[str] | None
    forward_passes: int = 0
    backward_passes: int = 0
    warnings: list[str] = field(default_factory=list)
    visual: VisualPositions | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the tables as lists of records (missing values as ``None``)."""

        def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
            plain = frame.astype(object).where(frame.notna(), None)
            return [
                {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
                for row in plain.to_dict(orient="records")
            ]

        return {
            "target": self.target,
            "clean_score": self.clean_score,
            "corrupted_score": self.corrupted_score,
            "corrupted_scores": self.corrupted_scores,
            "tokens": self.tokens,
            "corrupted_tokens": self.corrupted_tokens,
            "table": records(self.table),
            "agreement": records(self.agreement),
            "forward_passes": self.forward_passes,
            "backward_passes": self.backward_passes,
            "warnings": self.warnings,
            "visual": None if self.visual is None else self.visual.to_dict(),
        }


#: Spearman's ρ of an estimator's site ranking with exact patching's, on its weakest component
#: and direction, from which it is read as tracking exact patching (or roughly so).
TRACKS = 0.8
ROUGHLY = 0.5


def agreement_reading(report: PatchingReport) -> list[str]:
    """
    In plain words, per estimator: does it rank the sites as exact patching does, and where not.

    Judged on the weakest Spearman ρ over the components and directions compared (at least
    :data:`TRACKS`: it tracks; at least :data:`ROUGHLY`: roughly; below: it does not), with
    that cell's top-k overlap; none without exact patching beside an estimator.
    """
    lines = []
    table = report.agreement
    for name in dict.fromkeys(table["estimator"]):
        rows = table[table["estimator"] == name]
        title = ESTIMATORS[name].title if name in ESTIMATORS else name
        measured = rows.dropna(subset=["spearman"])
        if measured.empty:
            lines.append(f"{title}: no ranking to compare (the effects are constant).")
            continue
        weakest = measured.loc[measured["spearman"].idxmin()]
        rho = float(weakest["spearman"])
        verdict = (
            "tracks exact patching"
            if rho >= TRACKS
            else "tracks exact patching roughly"
            if rho >= ROUGHLY
            else "does not track exact patching"
        )
        where = f"{weakest['component']}, {weakest['direction']}"
        overlap = f"top-{int(weakest['k'])} overlap {float(weakest['top_k_overlap']):.2f}"
        # the ranking is judged; Pearson's r says whether the sizes of the effects match too
        sizes = f"Pearson r {float(weakest['pearson']):.2f}"
        spread = "" if len(measured) == 1 else f" (weakest of {len(measured)}: {where})"
        lines.append(f"{title} {verdict}: Spearman ρ {rho:.2f}, {overlap}, {sizes}{spread}.")
    return lines


def planned_passes(
    adapter: Adapter,
    problem: PatchingProblem,
    estimators: Sequence[str] | None = None,
    components: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
    max_rows: int | None = None,
) -> tuple[int, int, int]:
    """
    ``(forward rows, backward passes, widest batch)`` of :func:`patching_report`.

    ``max_rows``: every pass holds at most that many rows (a memory bound): the baseline's
    noise draws and exact patching's sites run in batches of that many, and the gradient
    estimators' rows (noise draws; AtP*: times the dropped layers) in passes of that many, one
    backward each.

    Raises:
        InvalidParameterError, InvalidInputError, UnsupportedMethodError: as
            :func:`patching_report`.
    """
    chosen = _check_estimators(estimators)
    parts = check_components(components)
    ways = check_directions(directions)
    runs = Runs.of(adapter, problem)
    forward = runs.clean.rows + runs.corrupted.rows  # the baseline of both sides
    backward = 0
    widest = max(len(row_chunks(side.rows, max_rows)[0]) for side in (runs.clean, runs.corrupted))
    for direction in ways:
        destination, _ = runs.sides(direction)
        if "exact" in chosen:
            forward += exact_rows(runs, direction, parts)
            repeats = max(runs.clean.rows, runs.corrupted.rows)
            exact_width = max(len(runs.sites(c)) for c in parts) * repeats
            widest = max(widest, min(exact_width, max_rows or exact_width))
        for name, rows in (
            ("atp", destination.rows),
            ("relp", destination.rows),
            ("atp_star", destination.rows * (runs.layers if runs.layers > 1 else 1)),
        ):
            if name in chosen:
                passes = row_chunks(rows, max_rows)
                forward += rows
                backward += len(passes)
                widest = max(widest, len(passes[0]))
    return forward, backward, widest


def patching_report(
    adapter: Adapter,
    problem: PatchingProblem,
    estimators: Sequence[str] | None = None,
    components: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
    settings: RunSettings | None = None,
    top_k: int = PATCHING_TOP_K,
    batch_size: int | None = None,
) -> PatchingReport:
    """
    Patch every site of ``components`` in ``directions`` exactly and by the ``estimators``.

    All by default. ``batch_size``: most rows per forward (default: a layer's sites in one
    batch, at most :func:`~attribution.inputs.perturb.auto_batch_size`'s rows, which on a CPU scale
    down with the input's length: a long prompt's sites times many noise draws would not fit
    in memory; halved on CUDA out-of-memory either way). ``top_k``: the overlap's ``k``.

    Raises:
        InvalidParameterError: unknown names, ``top_k`` < 1.
        InvalidInputError: inputs of different token lengths, a target they do not hold, a
            corruption that leaves the score unchanged.
        UnsupportedMethodError: a model whose blocks attrlab does not know (RelP: whose LRP
            rules it lacks; AtP*: whose attention it cannot route).
        BudgetExceededError: more forward rows than the settings allow.
        TooSlowError: estimated over ``settings.max_seconds`` (before any work).
        JobCancelledError: once ``settings.cancel`` is set (the model is left as it was).
    """
    chosen = _check_estimators(estimators)
    parts = check_components(components)
    ways = check_directions(directions)
    if top_k < 1:
        raise InvalidParameterError(f"top_k is at least 1; got {top_k}")
    settings = settings or RunSettings()
    run = RunContext.of(settings)
    fits = memory_rows(adapter, problem.clean, settings)  # every pass's rows fit in it
    forward, backward, widest = planned_passes(adapter, problem, chosen, parts, ways, fits)
    lower = "the components, directions or noise draws"
    clear_study(
        adapter, "patching", [(problem.clean, forward, backward, widest)], settings, run, lower
    )
    runs = Runs.of(adapter, problem)
    gradient_stages = sum(1 for e in chosen if e != "exact") * len(ways)
    exact_total = sum(exact_rows(runs, d, parts) for d in ways) if "exact" in chosen else 0
    batch = batch_size or min(widest, auto_batch_size(adapter, problem.clean), fits or widest)
    runner = BatchRunner(adapter, run, batch, exact_total + gradient_stages)
    rows: list[tuple] = []

    def stage_done() -> None:
        runner.done += 1
        run.step(runner.done, runner.total)

    with altered(adapter.model):
        base = baseline(runs, parts, patterns="atp_star" in chosen, max_rows=fits)
        run.count(forward=runs.clean.rows + runs.corrupted.rows)
        for direction in ways:
            found: dict[str, list[tuple]] = {}
            for name in (n for n in ESTIMATORS if n in chosen):  # in the registry's order
                if name == "exact":  # on its own batches, which step the progress
                    found[name] = exact(runs, base, direction, parts, runner)
                    continue
                found[name] = _GRADIENT[name](runs, base, direction, parts, run, fits)
                stage_done()
            for name in chosen:
                rows += [(name, direction, *row) for row in found[name]]
    if runs.layers < 2 and "atp_star" in chosen:
        run.warn("AtP*: a model of one layer has no layer to drop: GradDrop was left out")
    frame = table(rows)
    magnitudes = {e.name for e in ESTIMATORS.values() if e.magnitude}
    corrupted = problem.corrupted
    return PatchingReport(
        table=frame,
        agreement=agreement_with_exact(frame, magnitudes, top_k),
        target=problem.target.label,
        clean_score=base.clean,
        corrupted_score=sum(base.corrupted) / len(base.corrupted),
        corrupted_scores=base.corrupted,
        tokens=runs.tokens,
        corrupted_tokens=None if corrupted is None else list(corrupted.token_texts),
        forward_passes=run.forward_passes,
        backward_passes=run.backward_passes,
        warnings=run.warnings,
    )
