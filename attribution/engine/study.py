"""
One call for a pruning study: rank layers and heads on one prompt, prune by each over a dataset.

:func:`pruning_study` analyses one input and target (:func:`~attribution.layers.analysis.
analyze`: the measures that rank layers and heads), optionally adds exact residual patching's
layer ranking from a patching problem on that input, and measures the layer and head pruning
curves of every ranking beside random orders (:func:`~attribution.engine.verification.
pruning_curves`) over a small dataset: the bundled sentences by default, or given texts, each
scored on its own top prediction of the unpruned model; or inputs prepared with their targets.
:func:`study_parts` prices it before it runs (:func:`~attribution.request.estimate.study_estimate`);
the study refuses to start over its settings' budgets
(:func:`~attribution.request.gate.clear_study`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch

from attrlab.attribution.engine.agreement import (
    RemovalAgreement,
    agreement_passes,
    removal_agreement,
)
from attrlab.attribution.engine.allocation import (
    WEIGHT_ALLOCATIONS,
    check_allocation,
    layer_scores,
    weight_allocation,
)
from attrlab.attribution.engine.estimators import Evidence
from attrlab.attribution.engine.registry import (
    ESTIMATORS,
    UNIT_KINDS,
    check_unit_kinds,
    default_unit_kinds,
    estimators_for,
    scores_of,
    shared_sites,
)
from attrlab.attribution.engine.units import Site
from attrlab.attribution.engine.verification import (
    LayerBudget,
    PruningCurves,
    curve_passes,
    pruning_curves,
)
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.layers.analysis import analyze, checked_target, chosen_measures
from attrlab.attribution.layers.analysis import planned_passes as analysis_passes
from attrlab.attribution.metrics.leaderboard import bundled_items
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.patching import PatchingProblem, patching_problem, patching_report
from attrlab.attribution.patching import planned_passes as patching_passes
from attrlab.attribution.rendering import renderer
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.defaults import PRUNING_DRAWS
from attrlab.attribution.request.gate import clear_study
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target, explained_target, target_record

__all__ = [
    "MAX_TEXTS",
    "SPARSITIES",
    "PruningStudy",
    "bundled_texts",
    "check_sparsity",
    "pruning_study",
    "ranked_input",
    "study_parts",
]

#: Most dataset texts one study measures its curves on.
MAX_TEXTS = 64
#: How the sites removed at ``k`` are chosen: over all layers, or each layer its share.
SPARSITIES = ("global", "per_layer")
#: A study's part for pricing: an input, its forward rows, backward passes and widest batch.
Part = tuple[Inputs, int, int, int]


@dataclass
class PruningStudy:
    """
    A pruning study's results: plain data, JSON-ready with :meth:`to_dict`.

    Attributes:
        target: The label of the target the rankings were made for.
        texts: The dataset's size (inputs the curves are measured on).
        analysis: The layer analysis the rankings come from (long format).
        by_unit: The pruning curves of each unit kind pruned.
        agreements: Per unit kind, when asked: each site removed alone over the dataset, and
            each estimator's agreement with those exact effects.
        sparsity: ``global`` (the ``k`` least important sites of all layers) or ``per_layer``
            (each layer its share, the least important of its own).
        allocation: The per-layer allocation the curves of :attr:`allocated` follow, if any.
        allocated: Per unit kind, the curves under :attr:`allocation` (beside the uniform
            per-layer ones in :attr:`by_unit`).
        removal: How the sites were removed (``None``: each kind's default).
        rankings: Per unit kind, each estimator's scores, one per site in the kind's site order
            (what the curves' orders and the agreement's scatter come from; not in
            :meth:`to_dict`, whose orders say the same).
        sites: Per unit kind, its sites in the order of :attr:`rankings` (where each score is:
            :mod:`~attribution.engine.score_views`).
        forward_passes: Forward rows spent.
        backward_passes: Backward passes spent.
        warnings: What the run noted.
    """

    target: str
    texts: int
    analysis: pd.DataFrame
    by_unit: dict[str, PruningCurves] = field(default_factory=dict)
    agreements: dict[str, RemovalAgreement] = field(default_factory=dict)
    sparsity: str = "global"
    allocation: str | None = None
    allocated: dict[str, PruningCurves] = field(default_factory=dict)
    removal: str | None = None
    rankings: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    sites: dict[str, list[Site]] = field(default_factory=dict)
    forward_passes: int = 0
    backward_passes: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def layers(self) -> PruningCurves | None:
        """The layer pruning curves, when layers were pruned."""
        return self.by_unit.get("layer")

    @property
    def heads(self) -> PruningCurves | None:
        """The head pruning curves, when heads were pruned."""
        return self.by_unit.get("head")

    def _repr_html_(self) -> str | None:  # a notebook's display, by the registered renderer
        drawing = renderer()
        return None if drawing is None else drawing.pruning_html(self)

    def curves(self) -> dict[str, PruningCurves]:
        """The curves by unit kind, those that ran, in the order the kinds are registered."""
        return {unit: self.by_unit[unit] for unit in UNIT_KINDS if unit in self.by_unit}

    def labelled_curves(self) -> dict[str, PruningCurves]:
        """Each unit's curves (:meth:`curves`), then the allocated ones as ``unit@allocation``."""
        allocated = {f"{u}@{self.allocation}": c for u, c in self.allocated.items()}
        return {**self.curves(), **allocated}

    def curve_table(self) -> pd.DataFrame:
        """Every unit's curves in one long table, ``unit`` first (``unit@allocation``: those)."""
        return _by_unit({u: c.curves for u, c in self.labelled_curves().items()})

    def score_table(self) -> pd.DataFrame:
        """Every unit's areas and verdicts in one table, ``unit`` first."""
        return _by_unit({u: c.scores for u, c in self.labelled_curves().items()})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the analysis table left out: ``attrlab layers`` gives it)."""
        return {
            "target": self.target,
            "texts": self.texts,
            **{unit: curves.to_dict() for unit, curves in self.curves().items()},
            **(
                {"agreements": {u: a.to_dict() for u, a in self.agreements.items()}}
                if self.agreements
                else {}
            ),
            "sparsity": self.sparsity,
            "removal": self.removal,
            **(
                {
                    "allocation": self.allocation,
                    "allocated": {u: c.to_dict() for u, c in self.allocated.items()},
                }
                if self.allocation is not None
                else {}
            ),
            "forward_passes": self.forward_passes,
            "backward_passes": self.backward_passes,
            "warnings": self.warnings,
        }


def _by_unit(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(
        [frame.assign(unit=unit)[["unit", *frame.columns]] for unit, frame in frames.items()],
        ignore_index=True,
    )


def _units(adapter: Adapter, units: Collection[str] | None) -> list[str]:
    """The unit kinds a study prunes: ``units`` checked, or the model's defaults."""
    return check_unit_kinds(default_unit_kinds(adapter) if units is None else units, adapter)


def bundled_texts() -> list[str]:
    """The bundled evaluation sentences (``assets/eval``), the default dataset."""
    return [str(item.raw) for item in bundled_items("text")]


def _measures(
    adapter: Adapter, units: Sequence[str], patching: bool, allocation: str | None = None
) -> list[str]:
    """
    The analysis's measure groups the estimators of ``units`` read, in the order they run.

    And those of the layer estimator ``allocation`` names, if it is one.
    """
    wanted = {
        m
        for unit in units
        for e in estimators_for(adapter, unit, _given(patching))
        for m in e.measures
    }
    if allocation in ESTIMATORS and allocation not in WEIGHT_ALLOCATIONS:
        wanted |= set(ESTIMATORS[allocation].measures)
    return [m for m in chosen_measures(adapter, None) if m in wanted]


def _given(patching: bool) -> tuple[str, ...]:
    """
    The evidence a study's estimators may read beyond its analysis.

    Channel statistics over its dataset, always; exact residual patching where asked.
    """
    return ("statistics", "patching") if patching else ("statistics",)


def _needs(adapter: Adapter, unit: str) -> frozenset[str] | None:
    """
    What ``unit``'s collector must read for its applicable estimators, or ``None``.

    ``None`` where the kind has no collector; the union of its estimators' ``needs``
    (the next-token loss only on decoder LMs).
    """
    if UNIT_KINDS[unit].collect is None:
        return None
    applicable = estimators_for(adapter, unit, _given(False))
    needs = {n for e in applicable if e.reads == "statistics" for n in e.needs}
    return frozenset(needs - ({"loss"} if adapter.family != "decoder-lm" else set()))


def _patches(adapter: Adapter, units: Sequence[str], problem: PatchingProblem | None) -> bool:
    """Whether an estimator of ``units`` reads exact residual patching of ``problem``."""
    if problem is None:
        return False
    return any(e.needs_patching for u in units for e in estimators_for(adapter, u, _given(True)))


def _dataset(adapter: Adapter, texts: Sequence[str] | None) -> list[Inputs]:
    if texts is None and adapter.modality == "image":  # the bundled images
        return [adapter.preprocess(item.raw) for item in bundled_items("image")]
    chosen = bundled_texts() if texts is None else list(texts)
    if not chosen or len(chosen) > MAX_TEXTS:
        raise InvalidInputError(f"give 1 to {MAX_TEXTS} texts to prune over; got {len(chosen)}")
    return [adapter.preprocess(text) for text in chosen]


def study_parts(
    adapter: Adapter,
    inputs: Inputs,
    dataset: Sequence[Inputs],
    problem: PatchingProblem | None = None,
    units: Collection[str] | None = None,
    draws: int = PRUNING_DRAWS,
    head_step: int | None = None,
    targets_known: bool = False,
    agreement: bool = False,
    sparsity: str = "global",
    allocation: str | None = None,
    removal: str | None = None,
) -> list[Part]:
    """
    What :func:`pruning_study` runs, per input: ``(inputs, forward rows, backward, widest)``.

    ``dataset``: the inputs the curves are measured on; ``targets_known``: their targets are
    given (else each costs a forward to find its top prediction); ``agreement``: each site is
    removed alone too; ``allocation``: the curves run twice (uniform and allocated).

    Raises:
        InvalidParameterError: as :func:`pruning_study`.
    """
    chosen = _units(adapter, units)
    if draws < 1:
        raise InvalidParameterError(f"draws is at least 1; got {draws}")
    check_sparsity(chosen, sparsity, allocation)
    for unit in chosen:  # each kind must have the removal named
        UNIT_KINDS[unit].removal(removal)
    patches = _patches(adapter, chosen, problem)
    measures = _measures(adapter, chosen, patches, allocation)
    forward, backward, widest = analysis_passes(adapter, measures) if measures else (0, 0, 1)
    found: list[Part] = [(inputs, forward, backward, widest)]
    if problem is not None and patches:
        forward, backward, widest = patching_passes(
            adapter, problem, ["exact"], ["residual"], ["denoising"]
        )
        found.append((problem.clean, forward, backward, widest))
    rows = [
        curve_passes(
            adapter,
            len(estimators_for(adapter, u, _given(patches))),
            draws,
            u,
            step=_step(u, head_step),
        )
        * (1 + (allocation is not None))
        for u in chosen
    ]
    if agreement:  # each site alone, beside the plain model, as a batch of its own
        given = _given(patches)
        rows += [
            agreement_passes(adapter, u, estimators=len(estimators_for(adapter, u, given)))
            for u in chosen
        ]
    collected = [
        passes(needs)
        for u in chosen
        if (passes := UNIT_KINDS[u].collect_passes) is not None
        and (needs := _needs(adapter, u)) is not None
    ]
    forward = sum(rows) + (not targets_known) + sum(f for f, _ in collected)
    backward = sum(b for _, b in collected)
    found += [(item, forward, backward, max(rows)) for item in dataset]
    return found


def check_sparsity(units: Sequence[str], sparsity: str, allocation: str | None) -> None:
    """
    Refuse a sparsity other than ``global`` / ``per_layer``, or an allocation that cannot apply.

    An allocation is per layer: it needs ``per_layer``.

    Raises:
        InvalidParameterError: naming what is allowed.
    """
    if sparsity not in SPARSITIES:
        raise InvalidParameterError(f"sparsity is one of {', '.join(SPARSITIES)}; got {sparsity!r}")
    if allocation is None:
        return
    if sparsity != "per_layer":
        raise InvalidParameterError("an allocation sets each layer's sparsity: use per_layer")
    check_allocation(allocation)
    for unit in units:
        check_allocation(allocation, unit)


def _budgets(
    adapter: Adapter,
    unit: str,
    evidence: Evidence,
    sparsity: str,
    allocation: str | None,
) -> tuple[LayerBudget | None, LayerBudget | None]:
    """``unit``'s per-layer budgets: uniform (``per_layer``) and the allocation's, if any."""
    if sparsity == "global":
        return None, None
    layers = np.array([site.layer for site in UNIT_KINDS[unit].sites(adapter)], dtype=int)
    uniform = LayerBudget(layers)
    if allocation is None:
        return uniform, None
    statistics = evidence.statistics or {}
    if allocation in WEIGHT_ALLOCATIONS:
        scores = weight_allocation(allocation, statistics[unit])
    else:
        scores = layer_scores(allocation, scores_of(evidence, "layer"))
    return uniform, LayerBudget.allocated(layers, scores)


def _step(unit: str, head_step: int | None) -> int | None:
    """The removal step of ``unit``'s curves: ``head_step`` for heads, the default for others."""
    return head_step if unit == "head" else None


def pruning_study(
    adapter: Adapter,
    inputs: Inputs,
    target: Target | None,
    texts: Sequence[str] | None = None,
    items: Sequence[tuple[Inputs, Target]] | None = None,
    problem: PatchingProblem | None = None,
    units: Collection[str] | None = None,
    draws: int = PRUNING_DRAWS,
    head_step: int | None = None,
    settings: RunSettings | None = None,
    agreement: bool = False,
    sparsity: str = "global",
    allocation: str | None = None,
    removal: str | None = None,
) -> PruningStudy:
    """
    Rank layers and heads for ``target`` on ``inputs``, and prune by each ranking over a dataset.

    ``target``: a record (a class, a next token, an answer, a contrast: :func:`ranked_input`),
    or ``None``: the top prediction. The dataset: ``items`` (inputs with their targets),
    else ``texts`` (default: the bundled sentences), each scored on the unpruned model's top
    prediction (a class, or the next token). ``problem``: a patching problem on ``inputs`` and
    ``target`` (its clean side) whose exact residual patching ranks the layers too
    (``residual_patching``). ``units``: the unit kinds to prune
    (:func:`~attribution.engine.units.model_unit_kinds`; ``None``: the model's default kinds,
    :func:`~attribution.engine.units.default_unit_kinds`), each ranked by every
    registered estimator of it that applies; ``draws`` random orders each; ``head_step``: heads
    removed per point of the head curves (default: at most :data:`~attribution.engine.
    verification.MAX_POINTS` points); ``agreement``: also remove each site alone over the
    dataset and score every ranking against those exact effects
    (:func:`~attribution.engine.agreement.removal_agreement`). ``sparsity``: ``global`` removes
    the ``k`` least important sites of all layers, ``per_layer`` each layer's share of them
    (:class:`~attribution.engine.verification.LayerBudget`); ``allocation``: with
    ``per_layer``, also the curves under that per-layer allocation
    (:mod:`~attribution.engine.allocation`: ``owl``, ``dlp`` or a layer estimator's name). The
    ``removal``: how every kind's sites are removed (``zero``, ``mean``: a kind that has it;
    ``None``: each kind's default). The whole study is priced first and refused over
    ``settings``' forward-pass budget or seconds (:func:`~attribution.request.gate.clear_study`).

    Raises:
        InvalidParameterError: unknown units, ``draws`` < 1, a bad ``head_step``, sparsity or
            allocation.
        InvalidInputError: no texts or too many, a target its input does not hold, a problem
            on another input or target.
        UnsupportedMethodError: a model whose blocks attrlab does not know.
        BudgetExceededError, TooSlowError: over the settings' budgets, before any work.
        JobCancelledError: once ``settings.cancel`` is set.
    """
    settings = settings or RunSettings()
    chosen = _units(adapter, units)
    dataset = [i for i, _ in items] if items is not None else _dataset(adapter, texts)
    run = RunContext.of(settings)
    parts = study_parts(
        adapter,
        inputs,
        dataset,
        problem,
        chosen,
        draws,
        head_step,
        items is not None,
        agreement,
        sparsity,
        allocation,
        removal,
    )
    if target is None:  # its top prediction: one forward more
        _, forward, backward, widest = parts[0]
        parts[0] = (inputs, forward + 1, backward, widest)
    clear_study(adapter, "pruning", parts, settings, run, "the texts, units or draws")
    target = checked_target(adapter, inputs, _prediction(adapter, inputs, target, run))
    if problem is not None:
        same = torch.equal(problem.clean.input_ids, inputs.model_kwargs()["input_ids"])
        if not same or problem.target != target:
            raise InvalidInputError(
                "the patching problem must be on the input and target the layers are ranked for"
            )
    patches = _patches(adapter, chosen, problem)
    measures = _measures(adapter, chosen, patches, allocation)
    # a study of channels alone reads no measure (a CNN has no layer analysis)
    table = analyze(adapter, inputs, target, measures, run).table if measures else pd.DataFrame()
    if items is None:
        items = [(i, _prediction(adapter, i, None, run)) for i in dataset]
    statistics: dict[str, Any] = {}
    for unit in chosen:
        collect, needs = UNIT_KINDS[unit].collect, _needs(adapter, unit)
        if collect is not None and needs is not None:
            statistics[unit] = collect(adapter, items, needs, run)
    evidence = Evidence(adapter, target, table, statistics=statistics)
    if problem is not None and patches:
        quiet = replace(settings, max_forward_passes=None, max_seconds=None)  # priced above
        patched = patching_report(adapter, problem, ["exact"], ["residual"], ["denoising"], quiet)
        run.count(forward=patched.forward_passes)
        mask = inputs.model_kwargs()["attention_mask"]
        read_at = int(DecoderLMAdapter.predicted_positions(mask)[0]) - target.read_offsets()[0]
        evidence = replace(evidence, patching=patched.table, read_at=read_at)
    found = PruningStudy(
        target.label, len(items), table, sparsity=sparsity, allocation=allocation, removal=removal
    )
    for unit in chosen:
        rankings = found.rankings[unit] = scores_of(evidence, unit)
        found.sites[unit] = shared_sites(adapter, unit, dataset)
        step = _step(unit, head_step)
        uniform, allocated = _budgets(adapter, unit, evidence, sparsity, allocation)
        curves = partial(
            pruning_curves, adapter, items, rankings, draws, unit=unit, step=step, run=run
        )
        found.by_unit[unit] = curves(removal=removal, budget=uniform)
        if allocated is not None:
            found.allocated[unit] = curves(removal=removal, budget=allocated)
        if agreement:
            found.agreements[unit] = removal_agreement(
                adapter, items, unit, rankings, removal=removal, run=run
            )
    found.forward_passes, found.backward_passes = run.forward_passes, run.backward_passes
    found.warnings = run.warnings
    return found


def _prediction(adapter: Adapter, inputs: Inputs, target: Target | None, run: RunContext) -> Target:
    """``target``, or (``None``) the top prediction on ``inputs``, read from one forward."""
    if target is not None:
        return target
    run.stop_if_cancelled()
    with torch.no_grad():
        logits = adapter.logits(**inputs.model_kwargs())[0]
    run.count(forward=1)
    return explained_target(adapter, None, logits)


def ranked_input(
    adapter: Adapter,
    text: str,
    target: int | str | None = None,
    answer: str | None = None,
    contrast: str | None = None,
    corrupted: str | None = None,
) -> tuple[Inputs, Target | None, PatchingProblem | None]:
    """
    What a front end's fields rank the layers and heads on: inputs, target and patching problem.

    ``text`` with ``target`` (a class or a next token, an index or a label read as a record:
    :func:`~attribution.request.target.target_record`; ``None``: the top prediction), or a
    decoder's prompt with its ``answer`` (``contrast``: rather than that one); ``corrupted``:
    a corrupted prompt of the same token length, whose exact residual patching against
    ``text`` ranks the layers too (:func:`~attribution.patching.patching_problem`).

    Raises:
        InvalidInputError: a target beside an answer, an unknown label, and what
            :func:`~attribution.request.answers.answer_request` and
            :func:`~attribution.patching.patching_problem` refuse.
    """
    asks_answer = answer is not None or contrast is not None or corrupted is not None
    if target is not None and asks_answer:
        raise InvalidInputError(
            "give a target, or an answer (a contrast, a corrupted prompt) of a decoder LM: the "
            "answer is what the layers are ranked for"
        )
    if corrupted is not None:
        problem = patching_problem(adapter, text, corrupted, answer, contrast)
        return problem.clean, problem.target, problem
    if asks_answer:
        inputs, record = answer_request(adapter, text, answer=answer, contrast=contrast)
        return inputs, record, None
    return adapter.preprocess(text), target_record(adapter, target), None
