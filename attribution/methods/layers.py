"""Layer and head analysis as a registered method: the long table in ``Explanation.layers``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attrlab.attribution.engine.recheck import recheck_heads, recheck_passes
from attrlab.attribution.layers.agreement import agreement, agreement_metrics
from attrlab.attribution.layers.analysis import (
    HEAD_ESTIMATORS,
    MEASURES,
    analyze,
    head_estimators,
    planned_passes,
)
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.layouts import unsupported_reason
from attrlab.attribution.request.defaults import LAYERS_TOP_K, RECHECK_DRAWS
from attrlab.attribution.request.params import MethodParams, param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import draw_rounds

__all__ = ["LayerAnalysis", "LayerAnalysisParams", "measure_names"]


def measure_names(value: str) -> list[str] | None:
    """``"all"`` -> ``None`` (every measure that applies); else the comma-separated names."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    return None if names in ([], ["all"]) else names


def _known(value: str) -> str | None:
    unknown = [n for n in measure_names(value) or [] if n not in MEASURES]
    if unknown:
        return f"names unknown measure(s) {', '.join(unknown)}; choose from {', '.join(MEASURES)}"
    return None


@dataclass(frozen=True, kw_only=True)
class LayerAnalysisParams(MethodParams):
    """The parameters of :class:`LayerAnalysis`."""

    measures: str = param(
        "all",
        "Comma-separated measures, or 'all' (those that apply): "
        + "; ".join(
            f"{m.name} ({m.description}; rows {', '.join(m.produces)}; {m.cost})"
            for m in MEASURES.values()
        ),
        check=_known,
    )
    top_k: int = param(
        LAYERS_TOP_K,
        "Heads compared by the top-k overlap of estimators, and zeroed together to re-check "
        "each estimator's top heads.",
        1,
        1000,
    )
    recheck_draws: int = param(
        RECHECK_DRAWS,
        "The most random sets of top_k heads each estimator's top heads are re-checked against "
        "(zeroed together; five at first, more while a margin is unsettled); 0 leaves the "
        "re-check out.",
        0,
        100,
    )


@register
class LayerAnalysis(AttributionMethod[LayerAnalysisParams]):
    """
    Which layers and heads carried the prediction (``attribution.layers``).

    Per-layer and per-head measures go to ``layers``, the agreement of the head estimators to
    ``metrics`` (``spearman:a:b``, ``top_k_overlap:a:b``), and AttnLRP token relevance (the
    ``lrp`` measure's pass) to ``scores``. On text, that pass also gives
    ``maps["token_per_layer"]``, ``(layers + 1, tokens)``: the relevance entering each block's
    residual stream, then leaving the last one, per token (where in the sequence each layer's
    relevance sits). Each head estimator's top ``top_k`` heads are then zeroed together beside
    ``recheck_draws`` random sets of as many heads (:mod:`attribution.engine.recheck`): the
    target's change goes to ``metrics`` (``recheck:<estimator>``, ``recheck:random``), a
    verdict per estimator to ``verdicts``. On a vision-language model's image and prompt the
    blocks are its language model's, and ShortV's layer contribution (``shortv``) joins the
    measures when the input holds an answer; PA-LRP's positional relevance is left out there.
    """

    alters_model = False  # each measure holds the model altered for its own hooks (analyze)

    name = "layers"
    title = "Layer and head analysis"
    paper = "https://arxiv.org/abs/1905.10650"
    category = "analysis"
    requires = frozenset({"gradients", "attentions"})
    param_record = LayerAnalysisParams
    modalities = frozenset({"text", "image", "image-text"})

    @classmethod
    def unsupported_reason(cls, adapter: Adapter) -> str | None:
        reason = super().unsupported_reason(adapter)
        if reason is None and (layout := unsupported_reason(adapter)) is not None:
            return f"{cls.name} needs a transformer attrlab knows: {layout}"
        return reason

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: LayerAnalysisParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        measures = measure_names(params.measures)
        forward, backward, width = planned_passes(adapter, measures, inputs)
        exact = True
        if params.recheck_draws and (estimators := head_estimators(adapter, measures)):
            rechecked = recheck_passes(len(estimators), params.recheck_draws)
            forward, width = forward + rechecked, max(width, rechecked)
            exact = draw_rounds(params.recheck_draws) == 1  # more draws only while unsettled
        return Passes(forward, backward, batch=width if width > 1 else None, exact=exact)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: LayerAnalysisParams,
        run: RunContext,
    ) -> Attribution:
        report = analyze(adapter, inputs, target, measure_names(params.measures), run)
        pairs = agreement(report.table, HEAD_ESTIMATORS, params.top_k)
        metrics = agreement_metrics(pairs)
        verdicts = []
        if params.recheck_draws:
            rechecked = recheck_heads(
                adapter,
                inputs,
                target,
                report.table,
                params.top_k,
                params.recheck_draws,
                run.seed,
            )
            if rechecked is not None:
                run.count(forward=len(rechecked.sets) + 1)
                metrics.update(rechecked.metrics())
                verdicts = rechecked.verdicts
        maps: dict[str, np.ndarray] = {}
        if report.lrp is None:
            run.warn("scores are zero: token relevance comes with the 'lrp' measure")
            scores, positional = np.zeros(inputs.map_shape), None
        else:
            scores, positional = report.lrp.scores, report.lrp.positional_scores
            if inputs.modality == "text":
                maps["token_per_layer"] = np.stack(report.lrp.residual_tokens)
        return Attribution(
            scores=scores,
            positional_scores=positional,
            layers=report.table,
            maps=maps,
            metrics=metrics,
            verdicts=verdicts,
        )
