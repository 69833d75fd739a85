"""
Glue between adapters and Captum: forward functions, inputs, baselines, reductions.

Text methods attribute to the output of the token-embedding layer (Captum ``Layer*``
classes), images attribute to the normalised pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from captum.attr import Attribution as CaptumAttribution

from attribution.errors import InvalidParameterError
from attribution.models.base import Adapter, Inputs, TextInputs
from attribution.params import Param

__all__ = ["BASELINE_PARAM", "attribute_with", "baseline_for"]

BASELINE_PARAM = Param(
    "baseline",
    "str",
    "auto",
    "Reference input: text 'pad' or 'mask' tokens (CLS/SEP kept); image 'mean' colour "
    "(normalised zero) or 'black'. 'auto' = pad for text, mean for images.",
    choices=("auto", "pad", "mask", "mean", "black"),
)
_BASELINES = {"text": ("pad", "mask"), "image": ("mean", "black")}


def forward_function(adapter: Adapter, inputs: Inputs) -> Callable[..., torch.Tensor]:
    """Positional-argument forward for Captum, matching :func:`main_input`."""
    if isinstance(inputs, TextInputs):
        return lambda ids, mask: adapter.logits(input_ids=ids, attention_mask=mask)
    return lambda pixels: adapter.logits(pixel_values=pixels)


def main_input(inputs: Inputs) -> tuple[torch.Tensor, tuple[Any, ...]]:
    """The tensor Captum attributes to, and the extra forward arguments."""
    if isinstance(inputs, TextInputs):
        return inputs.input_ids, (inputs.attention_mask,)
    return inputs.pixel_values, ()


def baseline_for(adapter: Adapter, inputs: Inputs, kind: str) -> torch.Tensor:
    """Reference input of the same shape as :func:`main_input`'s tensor."""
    allowed = _BASELINES[inputs.modality]
    kind = allowed[0] if kind == "auto" else kind
    if kind not in allowed:
        raise InvalidParameterError(
            f"baseline '{kind}' does not apply to {inputs.modality}; use {' or '.join(allowed)}"
        )
    if isinstance(inputs, TextInputs):
        fill = adapter.pad_token_id if kind == "pad" else adapter.mask_token_id
        return torch.where(inputs.special_tokens, inputs.input_ids, fill)
    if kind == "mean":
        return torch.zeros_like(inputs.pixel_values)
    mean = torch.tensor(adapter.transform.mean, device=inputs.pixel_values.device)
    std = torch.tensor(adapter.transform.std, device=inputs.pixel_values.device)
    return (-mean / std).view(1, 3, 1, 1).expand_as(inputs.pixel_values).clone()


def to_scores(attributions: torch.Tensor) -> np.ndarray:
    """Sum over embedding dimensions (text) or colour channels (image) for example 0."""
    reduce_dim = -1 if attributions.dim() == 3 else 0
    return attributions[0].sum(dim=reduce_dim).detach().double().cpu().numpy()


def attribute_with(
    adapter: Adapter,
    inputs: Inputs,
    text_method: Callable[..., CaptumAttribution],
    image_method: Callable[..., CaptumAttribution],
    **kwargs: Any,
) -> Any:
    """Build the Captum method for the modality and call ``attribute`` on the main input."""
    forward = forward_function(adapter, inputs)
    tensor, extra = main_input(inputs)
    if isinstance(inputs, TextInputs):
        method = text_method(forward, adapter.token_embedding_module())
    else:
        method = image_method(forward)
    return method.attribute(tensor, additional_forward_args=extra or None, **kwargs)
