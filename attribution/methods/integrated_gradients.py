"""Integrated Gradients (Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365) via Captum."""

from __future__ import annotations

from dataclasses import dataclass

from captum.attr import IntegratedGradients as CaptumIG

from attrlab.attribution.methods._captum import (
    BASELINE,
    AdapterModule,
    baseline_for,
    delta_metrics,
    reference_space,
)
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.checkpointing import CheckpointingParams
from attrlab.attribution.methods.registry import register
from attrlab.attribution.methods.smoothing import SmoothingParams
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.params import param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import integral_convergence

__all__ = ["IntegratedGradients", "IntegratedGradientsParams"]


@dataclass(frozen=True, kw_only=True)
class IntegratedGradientsParams(SmoothingParams, CheckpointingParams):
    """The parameters of :class:`IntegratedGradients`."""

    n_steps: int = param(50, "Points on the straight path (Gauss-Legendre).", 2, 2000)
    internal_batch_size: int | None = param(
        None, "Path points per forward pass (default: all at once).", 1, 4096
    )
    baseline: str = BASELINE.as_field()


@register
class IntegratedGradients(AttributionMethod[IntegratedGradientsParams]):
    """
    Path integral of gradients from a baseline to the input.

    Text integrates along the token embeddings (given to the model as ``inputs_embeds``; the
    special tokens' embeddings stay the input's); images along normalised pixels.
    ``metrics.convergence_delta`` is ``Σ attributions − (F(x) − F(baseline))``; completeness
    holds when it is small, and the verdict :func:`~attribution.verdicts.integral_convergence`
    judges it relative to ``|F(x) − F(baseline)|`` (a warning too when it does not pass).
    """

    alters_model = False  # plain forward and gradient passes

    name = "integrated_gradients"
    title = "Integrated Gradients"
    paper = "https://arxiv.org/abs/1703.01365"
    modalities = frozenset({"text", "image", "image-text"})
    checkpointable = True
    requires = frozenset({"gradients"})
    has_convergence_delta = True
    reads_prediction = True  # F(x) of the convergence delta
    param_record = IntegratedGradientsParams

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: IntegratedGradientsParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        batch = params.internal_batch_size or params.n_steps
        return Passes(params.n_steps + 1, params.n_steps, batch=batch)  # + F(baseline)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: IntegratedGradientsParams,
        run: RunContext,
    ) -> Attribution:
        space = reference_space(adapter, inputs, baseline_for(adapter, inputs, params.baseline))
        module = AdapterModule(adapter, space.keys, target, space.held)
        attributions = CaptumIG(module).attribute(
            space.tensor,
            baselines=space.reference,
            additional_forward_args=space.extra,
            n_steps=params.n_steps,
            internal_batch_size=params.internal_batch_size,
        )
        scores = inputs.reduce(attributions)
        # The delta's F(x) is the prediction explain already made: only F(baseline) is a pass
        # (Captum's own delta would run the input's forward again).
        output = run.clean_score(adapter, inputs, target)
        total = [float(scores.sum())]
        metrics = delta_metrics(module, output, space.reference, space.extra, total)
        run.count(forward=params.n_steps + 1, backward=params.n_steps)
        verdict = integral_convergence(metrics, params.n_steps)
        if verdict.status != "pass":
            run.warn(verdict.sentence())
        return Attribution(scores=scores, metrics=metrics, verdicts=[verdict])
