"""
One call for a pruning study: rank layers and heads on one prompt, prune by each over a dataset.

:func:`pruning_study` analyses one input and target (:func:`~attribution.layers.analysis.
analyze`: the measures that rank layers and heads), optionally adds exact residual patching's
layer ranking from a patching problem on that input, and measures the layer and head pruning
curves of every ranking beside random orders (:func:`~attribution.layers.pruning.
pruning_curves`) over a small dataset: the bundled sentences by default, or given texts, each
scored on its own top prediction of the unpruned model; or inputs prepared with their targets.
:func:`study_parts` prices it before it runs (:func:`~attribution.estimate.study_estimate`);
the study refuses to start over its settings' budgets (:func:`~attribution.gate.clear_study`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import torch

from attrlab.attribution.answers import answer_request
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.gate import clear_study
from attrlab.attribution.layers.analysis import (
    ModelParts,
    analyze,
    checked_target,
    chosen_measures,
)
from attrlab.attribution.layers.analysis import planned_passes as analysis_passes
from attrlab.attribution.layers.pruning import (
    UNITS,
    PruningCurves,
    curve_passes,
    head_rankings,
    layer_rankings,
    pruning_curves,
    residual_patching_ranking,
)
from attrlab.attribution.metrics.leaderboard import bundled_items
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.patching import PatchingProblem, patching_problem, patching_report
from attrlab.attribution.patching import planned_passes as patching_passes
from attrlab.attribution.run import RunContext, RunSettings
from attrlab.attribution.target import Target, resolve_target

__all__ = [
    "MAX_TEXTS",
    "PruningStudy",
    "bundled_texts",
    "check_units",
    "pruning_study",
    "ranked_input",
    "study_parts",
]

#: Most dataset texts one study measures its curves on.
MAX_TEXTS = 64
#: The measure groups that rank layers, and heads.
_RANKING_MEASURES = {
    "layer": ("block_influence", "skip", "lrp", "logit_lens"),
    "head": ("gradient", "lrp", "ablation"),
}
#: How many layer rankings each layer measure group gives, and head rankings the head groups.
_LAYER_RANKINGS = ("block_influence", "skip", "lrp", "logit_lens")
_HEAD_RANKINGS = 4
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
        layers: The layer pruning curves, when layers were pruned.
        heads: The head pruning curves, when heads were pruned.
        forward_passes: Forward rows spent.
        backward_passes: Backward passes spent.
        warnings: What the run noted.
    """

    target: str
    texts: int
    analysis: pd.DataFrame
    layers: PruningCurves | None = None
    heads: PruningCurves | None = None
    forward_passes: int = 0
    backward_passes: int = 0
    warnings: list[str] = field(default_factory=list)

    def curves(self) -> dict[str, PruningCurves]:
        """The curves by unit (``layer``, ``head``), those that ran."""
        found = {"layer": self.layers, "head": self.heads}
        return {unit: curves for unit, curves in found.items() if curves is not None}

    def curve_table(self) -> pd.DataFrame:
        """Every unit's curves in one long table, ``unit`` first."""
        return _by_unit({u: c.curves for u, c in self.curves().items()})

    def score_table(self) -> pd.DataFrame:
        """Every unit's areas and verdicts in one table, ``unit`` first."""
        return _by_unit({u: c.scores for u, c in self.curves().items()})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the analysis table left out: ``attrlab layers`` gives it)."""
        return {
            "target": self.target,
            "texts": self.texts,
            **{unit: curves.to_dict() for unit, curves in self.curves().items()},
            "forward_passes": self.forward_passes,
            "backward_passes": self.backward_passes,
            "warnings": self.warnings,
        }


def _by_unit(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(
        [frame.assign(unit=unit)[["unit", *frame.columns]] for unit, frame in frames.items()],
        ignore_index=True,
    )


def bundled_texts() -> list[str]:
    """The bundled evaluation sentences (``assets/eval``), the default dataset."""
    return [str(item.raw) for item in bundled_items("text")]


def check_units(units: Collection[str]) -> list[str]:
    """
    ``units`` checked: one or both of :data:`~attribution.layers.pruning.UNITS`, each once.

    Raises:
        InvalidParameterError: none, or an unknown one.
    """
    chosen = list(dict.fromkeys(units))
    unknown = [u for u in chosen if u not in UNITS]
    if not chosen or unknown:
        raise InvalidParameterError(f"units are one or more of {', '.join(UNITS)}; got {chosen}")
    return chosen


def _measures(adapter: Adapter, units: Sequence[str]) -> list[str]:
    wanted = {m for unit in units for m in _RANKING_MEASURES[unit]}
    return [m for m in chosen_measures(adapter, None) if m in wanted]


def _layer_ranking_count(adapter: Adapter, problem: PatchingProblem | None) -> int:
    decoder = adapter.family == "decoder-lm"
    return len(_LAYER_RANKINGS) - (0 if decoder else 1) + (problem is not None)


def _dataset(adapter: Adapter, texts: Sequence[str] | None) -> list[Inputs]:
    chosen = bundled_texts() if texts is None else list(texts)
    if not chosen or len(chosen) > MAX_TEXTS:
        raise InvalidInputError(f"give 1 to {MAX_TEXTS} texts to prune over; got {len(chosen)}")
    return [adapter.preprocess(text) for text in chosen]


def study_parts(
    adapter: Adapter,
    inputs: Inputs,
    dataset: Sequence[Inputs],
    problem: PatchingProblem | None = None,
    units: Collection[str] = UNITS,
    draws: int = 5,
    head_step: int | None = None,
    targets_known: bool = False,
) -> list[Part]:
    """
    What :func:`pruning_study` runs, per input: ``(inputs, forward rows, backward, widest)``.

    ``dataset``: the inputs the curves are measured on; ``targets_known``: their targets are
    given (else each costs a forward to find its top prediction).

    Raises:
        InvalidParameterError: as :func:`pruning_study`.
    """
    chosen = check_units(units)
    if draws < 1:
        raise InvalidParameterError(f"draws is at least 1; got {draws}")
    parts = ModelParts.of(adapter)
    forward, backward, widest = analysis_passes(adapter, _measures(adapter, chosen))
    found: list[Part] = [(inputs, forward, backward, widest)]
    if problem is not None and "layer" in chosen:
        forward, backward, widest = patching_passes(
            adapter, problem, ["exact"], ["residual"], ["denoising"]
        )
        found.append((problem.clean, forward, backward, widest))
    rankings = {"layer": _layer_ranking_count(adapter, problem), "head": _HEAD_RANKINGS}
    steps = {"layer": None, "head": head_step}
    rows = sum(curve_passes(parts, rankings[u], draws, u, step=steps[u]) for u in chosen)
    width = max(curve_passes(parts, rankings[u], draws, u, step=steps[u]) for u in chosen)
    found += [(item, rows + (not targets_known), 0, width) for item in dataset]
    return found


def pruning_study(
    adapter: Adapter,
    inputs: Inputs,
    target: int | str | Target | None,
    texts: Sequence[str] | None = None,
    items: Sequence[tuple[Inputs, Target]] | None = None,
    problem: PatchingProblem | None = None,
    units: Collection[str] = UNITS,
    draws: int = 5,
    head_step: int | None = None,
    settings: RunSettings | None = None,
) -> PruningStudy:
    """
    Rank layers and heads for ``target`` on ``inputs``, and prune by each ranking over a dataset.

    ``target``: a record (an answer, a contrast: :func:`ranked_input`), or an output's index or
    label (``None``: the top prediction). The dataset: ``items`` (inputs with their targets),
    else ``texts`` (default: the bundled sentences), each scored on the unpruned model's top
    prediction (a class, or the next token). ``problem``: a patching problem on ``inputs`` and
    ``target`` (its clean side) whose exact residual patching ranks the layers too
    (``residual_patching``). ``units``:
    ``layer``, ``head`` or both; ``draws`` random orders each; ``head_step``: heads removed
    per point of the head curves (default: at most :data:`~attribution.layers.pruning.
    MAX_POINTS` points). The whole study is priced first and refused over ``settings``'
    forward-pass budget or seconds (:func:`~attribution.gate.clear_study`).

    Raises:
        InvalidParameterError: unknown units, ``draws`` < 1, a bad ``head_step``.
        InvalidInputError: no texts or too many, a target its input does not hold, a problem
            on another input or target.
        UnsupportedMethodError: a model whose blocks attrlab does not know.
        BudgetExceededError, TooSlowError: over the settings' budgets, before any work.
        JobCancelledError: once ``settings.cancel`` is set.
    """
    settings = settings or RunSettings()
    chosen = check_units(units)
    dataset = [i for i, _ in items] if items is not None else _dataset(adapter, texts)
    run = RunContext.of(settings)
    parts = study_parts(
        adapter, inputs, dataset, problem, chosen, draws, head_step, items is not None
    )
    if not isinstance(target, Target):  # its top prediction or label: one forward more
        _, forward, backward, widest = parts[0]
        parts[0] = (inputs, forward + 1, backward, widest)
    clear_study(adapter, "pruning", parts, settings, run, "the texts, units or draws")
    if not isinstance(target, Target):
        target = _prediction(adapter, inputs, target, run)
    target = checked_target(adapter, inputs, target)
    if problem is not None:
        same = torch.equal(problem.clean.input_ids, inputs.model_kwargs()["input_ids"])
        if not same or problem.target != target:
            raise InvalidInputError(
                "the patching problem must be on the input and target the layers are ranked for"
            )
    report = analyze(adapter, inputs, target, _measures(adapter, chosen), run)
    model = ModelParts.of(adapter)
    if items is None:
        items = [(i, _prediction(adapter, i, None, run)) for i in dataset]
    found = PruningStudy(target.label, len(items), report.table)
    if "layer" in chosen:
        rankings = layer_rankings(report.table, adapter, target)
        if problem is not None:
            quiet = replace(settings, max_forward_passes=None, max_seconds=None)  # priced above
            patched = patching_report(
                adapter, problem, ["exact"], ["residual"], ["denoising"], quiet
            )
            run.count(forward=patched.forward_passes)
            mask = inputs.model_kwargs()["attention_mask"]
            read_at = int(DecoderLMAdapter.predicted_positions(mask)[0]) - target.read_offsets()[0]
            rankings["residual_patching"] = residual_patching_ranking(
                patched.table, len(model.blocks), read_at
            )
        found.layers = pruning_curves(adapter, items, rankings, draws, run=run)
    if "head" in chosen:
        rankings = head_rankings(report.table, len(model.blocks), model.heads)
        found.heads = pruning_curves(
            adapter, items, rankings, draws, unit="head", step=head_step, run=run
        )
    found.forward_passes, found.backward_passes = run.forward_passes, run.backward_passes
    found.warnings = run.warnings
    return found


def _prediction(
    adapter: Adapter, inputs: Inputs, target: int | str | None, run: RunContext
) -> Target:
    """``target`` (an index, a label, or ``None``: the top prediction) on ``inputs`` as a record."""
    run.stop_if_cancelled()
    with torch.no_grad():
        logits = adapter.logits(**inputs.model_kwargs())[0]
    run.count(forward=1)
    return resolve_target(adapter, target, logits)


def ranked_input(
    adapter: Adapter,
    text: str,
    target: int | str | None = None,
    answer: str | None = None,
    contrast: str | None = None,
    corrupted: str | None = None,
) -> tuple[Inputs, int | str | Target | None, PatchingProblem | None]:
    """
    What a front end's fields rank the layers and heads on: inputs, target and patching problem.

    ``text`` with ``target`` (a class or a next token; ``None``: the top prediction), or a
    decoder's prompt with its ``answer`` (``contrast``: rather than that one); ``corrupted``:
    a corrupted prompt of the same token length, whose exact residual patching against
    ``text`` ranks the layers too (:func:`~attribution.patching.patching_problem`).

    Raises:
        InvalidInputError: a target beside an answer, and what
            :func:`~attribution.answers.answer_request` and
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
    return adapter.preprocess(text), target, None
