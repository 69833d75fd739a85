"""DeepLIFT, Rescale rule (Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685) via Captum."""

from __future__ import annotations

from dataclasses import dataclass

from captum.attr import DeepLift as CaptumDeepLift
from captum.attr import LayerDeepLift

from attrlab.attribution.methods._captum import (
    BASELINE,
    attribute_with,
    baseline_for,
    delta_metrics,
    forward_function,
)
from attrlab.attribution.methods._deeplift import deeplift_eps, deeplift_scope, summation_verdict
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.methods.smoothing import SmoothingParams
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["DeepLift", "DeepLiftParams"]


@dataclass(frozen=True, kw_only=True)
class DeepLiftParams(SmoothingParams):
    """The parameters of :class:`DeepLift`."""

    baseline: str = BASELINE.as_field()


@register
class DeepLift(AttributionMethod[DeepLiftParams]):
    """
    Difference from a reference input, propagated with DeepLIFT's Rescale multipliers.

    Text: Captum ``LayerDeepLift`` on the token-embedding output, against pad or mask tokens
    (special tokens kept), summed over the embedding dimension. Images: Captum ``DeepLift``
    on the normalised pixels, summed over colour channels. ``metrics.convergence_delta`` is
    ``Σ attributions − (F(x) − F(baseline))``: zero up to rounding when every nonlinearity has
    a rule. Elementwise activation modules (ReLU, ReLU6, GELU, SiLU, Hardswish, Tanh, ...) get
    the Rescale multiplier ``Δy/Δx``; LayerNorm, RMSNorm, softmax attention, gated products and
    cosine heads get DeepLIFT's rules composed exactly (``_deeplift_rules``). Whatever is left
    (other norms, attention outside the transformers interface) passes plain gradients, and
    the Explanation warns about it.
    """

    name = "deeplift"
    title = "DeepLIFT (Rescale)"
    paper = "https://arxiv.org/abs/1704.02685"
    requires = frozenset({"gradients"})
    routes_attention = True  # its rules reach attention only through the eager function
    has_convergence_delta = True
    reads_prediction = True  # F(x) of the convergence delta
    param_record = DeepLiftParams

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: DeepLiftParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        return Passes(3, 1, batch=2)  # the input and baseline batch, then F(x0) for the delta

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: DeepLiftParams,
        run: RunContext,
    ) -> Attribution:
        baseline = baseline_for(adapter, inputs, params.baseline)
        with deeplift_scope(adapter.model, adapter) as report:
            attributions = attribute_with(
                adapter,
                inputs,
                target,
                LayerDeepLift,
                CaptumDeepLift,
                as_module=True,
                eps=deeplift_eps(adapter.model),
                baselines=baseline,
            )
        scores = inputs.reduce(attributions)
        _, extra = inputs.attributed()
        forward = forward_function(adapter, inputs, target)
        output = run.clean_score(adapter, inputs, target)  # F(x): explain's own prediction
        metrics = delta_metrics(forward, output, baseline, extra, [float(scores.sum())])
        run.count(forward=3, backward=1)  # input+baseline batch, then F(x0) for the delta
        verdict = summation_verdict(adapter.model, run, scores, metrics, report)
        return Attribution(scores=scores, metrics=metrics, verdicts=[verdict])
