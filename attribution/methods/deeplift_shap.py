"""DeepLIFT-SHAP (Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874) via Captum."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from captum.attr import DeepLift as CaptumDeepLift

from attrlab.attribution.methods._captum import (
    BASELINE,
    AdapterModule,
    baseline_for,
    delta_metrics,
    reference_space,
)
from attrlab.attribution.methods._deeplift import deeplift_eps, deeplift_scope, summation_verdict
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.methods.smoothing import SmoothingParams
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.params import param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["DeepLiftShap", "DeepLiftShapParams", "reference_distribution"]


def reference_distribution(
    reference: torch.Tensor, count: int, noise: float, scale: float, run: RunContext
) -> torch.Tensor:
    """
    ``count`` references ``reference + noise·scale·ε`` with ``ε ~ N(0, I)`` from the run's seed.

    Args:
        reference: ``(1, ...)`` the single reference input (pixels or token embeddings).
        count: Number of references drawn.
        noise: Standard deviation relative to ``scale``.
        scale: Typical spread of the input (1 for normalised pixels, the embedding std).
        run: Supplies the seeded generator.
    """
    shape = (count, *reference.shape[1:])
    epsilon = torch.randn(shape, generator=run.generator, dtype=torch.float64)
    return reference + (noise * scale) * epsilon.to(reference.device, reference.dtype)


@dataclass(frozen=True, kw_only=True)
class DeepLiftShapParams(SmoothingParams):
    """The parameters of :class:`DeepLiftShap`."""

    n_references: int = param(8, "Number of references averaged over.", 2, 256)
    noise: float = param(
        0.25,
        "Spread of the references around the baseline (normalised pixel units; for text, "
        "embedding standard deviations).",
        0.0,
        10.0,
    )
    baseline: str = BASELINE.as_field()


@register
class DeepLiftShap(AttributionMethod[DeepLiftShapParams]):
    """
    DeepLIFT against several references, averaged: an estimate of SHAP values.

    The references are a small Gaussian cloud around the ``baseline`` reference: for images
    around the mean (or black) image in normalised pixel units; for text around the pad or
    mask token embeddings, in units of the embedding matrix's standard deviation, with CLS/SEP
    (special tokens) left equal to the input. Text attributes to the word embeddings (given to
    the model as ``inputs_embeds``), summed over the embedding dimension; images to pixels,
    summed over channels. ``metrics.convergence_delta`` is ``Σ attributions − (F(x) − mean
    F(references))``; ``max_abs_reference_delta`` is the largest delta of a single reference.
    The multipliers are DeepLIFT's (see ``deeplift``), transformer rules included.
    """

    name = "deeplift_shap"
    title = "DeepLIFT-SHAP"
    paper = "https://arxiv.org/abs/1705.07874"
    requires = frozenset({"gradients"})
    routes_attention = True  # its rules reach attention only through the eager function
    has_convergence_delta = True
    reads_prediction = True  # F(x) of the convergence delta
    param_record = DeepLiftShapParams

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: DeepLiftShapParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        count = params.n_references
        return Passes(3 * count, count, batch=2 * count)  # inputs and references together

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: DeepLiftShapParams,
        run: RunContext,
    ) -> Attribution:
        baseline = baseline_for(adapter, inputs, params.baseline)
        count, noise = params.n_references, params.noise
        space = reference_space(adapter, inputs, baseline)
        references = reference_distribution(space.reference, count, noise, space.scale, run)
        references = torch.where(space.fixed, space.tensor, references)
        module = AdapterModule(adapter, space.keys, target)
        explainer = CaptumDeepLift(module)
        explainer.eps = deeplift_eps(adapter.model)
        # DeepLIFT against each reference, the input repeated once per reference, then averaged:
        # what Captum's DeepLiftShap does, but keeping each reference's attributions, whose
        # sums give the per-reference deltas without Captum running the input's forward again.
        repeated = (count,) + (1,) * (space.tensor.dim() - 1)
        extra = tuple(e.repeat(count, *(1,) * (e.dim() - 1)) for e in space.extra or ())
        with deeplift_scope(adapter.model, adapter) as report:
            per_reference = explainer.attribute(
                space.tensor.repeat(*repeated).requires_grad_(),
                baselines=references,
                additional_forward_args=extra or None,
            )
        scores = inputs.reduce(per_reference.mean(dim=0, keepdim=True))
        sums = per_reference.detach().double().flatten(1).sum(dim=1).tolist()
        output = run.clean_score(adapter, inputs, target)  # F(x): explain's own prediction
        metrics = delta_metrics(module, output, references, space.extra, sums)
        run.count(forward=3 * count, backward=count)  # inputs and references, then F(references)
        verdict = summation_verdict(adapter.model, run, scores, metrics, report)
        return Attribution(scores=scores, metrics=metrics, verdicts=[verdict])
