"""DeepLIFT-SHAP (Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874) via Captum."""

from __future__ import annotations

from typing import Any

import torch
from captum.attr import DeepLiftShap as CaptumDeepLiftShap

from attribution.methods._captum import (
    BASELINE_PARAM,
    AdapterModule,
    baseline_for,
    deeplift_scope,
    delta_metrics,
    to_scores,
    warn_untreated,
)
from attribution.methods.base import Attribution, AttributionMethod
from attribution.methods.registry import register
from attribution.models.base import Adapter, Inputs, TextInputs
from attribution.params import Param
from attribution.run import RunContext

__all__ = ["DeepLiftShap", "reference_distribution"]


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


@register
class DeepLiftShap(AttributionMethod):
    """
    DeepLIFT against several references, averaged: an estimate of SHAP values.

    The references are a small Gaussian cloud around the ``baseline`` reference: for images
    around the mean (or black) image in normalised pixel units; for text around the pad or
    mask token embeddings, in units of the embedding matrix's standard deviation, with CLS/SEP
    (special tokens) left equal to the input. Text attributes to the word embeddings (given to
    the model as ``inputs_embeds``), summed over the embedding dimension; images to pixels,
    summed over channels. ``metrics.convergence_delta`` is ``Σ attributions − (F(x) − mean
    F(references))``; ``max_abs_reference_delta`` is the largest delta of a single reference.
    Captum's DeepLIFT has no rule for GELU/SiLU, LayerNorm or attention: a warning says so.
    """

    name = "deeplift_shap"
    title = "DeepLIFT-SHAP"
    paper = "https://arxiv.org/abs/1705.07874"
    requires = frozenset({"gradients"})
    has_convergence_delta = True
    params = (
        Param("n_references", "int", 8, "Number of references averaged over.", 2, 256),
        Param(
            "noise",
            "float",
            0.25,
            "Spread of the references around the baseline (normalised pixel units; for text, "
            "embedding standard deviations).",
            0.0,
            10.0,
        ),
        BASELINE_PARAM,
    )

    @classmethod
    def attribute(
        cls, adapter: Adapter, inputs: Inputs, target: int, params: dict[str, Any], run: RunContext
    ) -> Attribution:
        baseline = baseline_for(adapter, inputs, params["baseline"])
        count, noise = params["n_references"], params["noise"]
        if isinstance(inputs, TextInputs):
            embedding = adapter.token_embedding_module()
            with torch.no_grad():
                tensor, reference = embedding(inputs.input_ids), embedding(baseline)
            weight = getattr(embedding, "weight", None)
            scale = (
                float(weight.detach().std())
                if isinstance(weight, torch.Tensor)
                else float(tensor.std())
            )
            references = reference_distribution(reference, count, noise, scale, run)
            special = inputs.special_tokens.view(1, -1, 1)
            references = torch.where(special, tensor, references)
            module = AdapterModule(adapter, ("inputs_embeds", "attention_mask"))
            extra = (inputs.attention_mask,)
        else:
            tensor = inputs.pixel_values
            references = reference_distribution(baseline, count, noise, 1.0, run)
            module = AdapterModule(adapter, ("pixel_values",))
            extra = None
        with deeplift_scope(adapter.model, adapter.config, adapter.family) as report:
            attributions, delta = CaptumDeepLiftShap(module).attribute(
                tensor,
                baselines=references,
                target=target,
                additional_forward_args=extra,
                return_convergence_delta=True,
            )
        run.count(forward=3 * count, backward=count)
        scores = to_scores(attributions)
        metrics = delta_metrics(float(scores.sum()), float(delta.double().mean()))
        metrics["max_abs_reference_delta"] = float(delta.abs().max())
        warn_untreated(adapter.model, run, metrics, report)
        return Attribution(scores=scores, metrics=metrics)
