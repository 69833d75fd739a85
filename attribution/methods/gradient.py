"""Gradient, or saliency (Simonyan et al. 2014, https://arxiv.org/abs/1312.6034) via Captum."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from captum.attr import LayerGradientXActivation, Saliency

from attrlab.attribution.methods.gradient_x_input import GradientXInput
from attrlab.attribution.methods.registry import register

__all__ = ["Gradient"]


class _SignedSaliency(Saliency):
    """Captum's ``Saliency`` keeping the gradient's sign (its default takes the absolute value)."""

    def attribute(
        self,
        inputs: torch.Tensor,
        target: Any = None,
        abs: bool = False,  # Captum's name, shadowing the builtin
        additional_forward_args: Any = None,
    ) -> torch.Tensor:
        return super().attribute(inputs, target, abs, additional_forward_args)


@register
class Gradient(GradientXInput):
    """
    The gradient of the target's score with respect to the input.

    Text: at the token embeddings (Captum ``LayerGradientXActivation`` without the
    activation), summed over the embedding dimension. Images: at the normalised pixels
    (Captum ``Saliency``), summed over colour channels. Signed, unlike the paper's maximum of
    absolute values over channels, so that the average over noisy copies (SmoothGrad: this
    method with ``smoothing``) is the average of the gradient.
    """

    name = "gradient"
    title = "Gradient (saliency)"
    paper = "https://arxiv.org/abs/1312.6034"
    layer_method = partial(LayerGradientXActivation, multiply_by_inputs=False)
    input_method = _SignedSaliency
