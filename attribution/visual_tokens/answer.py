"""
An answer on one image and a prompt, read in a batch: the helpers the visual-token studies share.

Kept apart from :mod:`~attribution.visual_tokens.removal` (which registers the visual-token
unit with :mod:`~attribution.engine.units`) so that the layer analysis reads ShortV's rows
without importing that registry, which imports the layer analysis.
"""

from __future__ import annotations

import torch

from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.vlm import ImageTextInputs, VisionLanguageAdapter

__all__ = ["answer_scores", "batched_kwargs", "prompt_end", "visual_adapter", "visual_inputs"]


def visual_adapter(adapter: Adapter) -> VisionLanguageAdapter:
    """``adapter`` as a vision-language model, or why not."""
    if not isinstance(adapter, VisionLanguageAdapter):
        raise InvalidInputError(f"model '{adapter.model_id}' does not take an image and text")
    return adapter


def visual_inputs(inputs: Inputs | ImageTextInputs | None) -> ImageTextInputs:
    """``inputs`` as one image and a prompt holding visual tokens, or why not."""
    if not isinstance(inputs, ImageTextInputs) or not bool(inputs.visual_tokens.any()):
        raise InvalidInputError("a visual-token site is a visual position of an image and prompt")
    inputs.one_image("the visual-token study")
    return inputs


def prompt_end(inputs: ImageTextInputs) -> int:
    """The position after the prompt: where a teacher-forced answer begins."""
    return int(inputs.input_ids.shape[1]) - inputs.answer_length


def batched_kwargs(inputs: ImageTextInputs, rows: int) -> dict[str, torch.Tensor]:
    """
    The model's keyword arguments for ``rows`` copies of ``inputs`` in one batch.

    Tensors with a batch dimension are repeated along it; a processor's flattened patches
    (Qwen2-VL's ``pixel_values``, one row per patch beside ``image_grid_thw``) are concatenated,
    one image per batch row.
    """
    flattened = "image_grid_thw" in inputs.image_kwargs
    batched = {}
    for key, value in inputs.model_kwargs().items():
        if flattened and key == "pixel_values":
            batched[key] = value.repeat(rows, *[1] * (value.dim() - 1))
        else:
            batched[key] = value.expand(rows, *value.shape[1:]).contiguous()
    return batched


def answer_scores(
    logits: torch.Tensor, inputs: ImageTextInputs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    ``(log_prob, exact, log_probs)`` of the teacher-forced answer per batch row.

    ``log_prob`` ``(B,)``: the answer's log-probability (summed over its tokens); ``exact``
    ``(B,)``: 1.0 where every answer token is the top prediction given the earlier ones (greedy
    decoding's answer); ``log_probs`` ``(B, A, V)``: the next-token log-probabilities at the
    answer's steps (float64).

    Raises:
        InvalidInputError: an input without an answer.
    """
    count = inputs.answer_length
    if count < 1:
        raise InvalidInputError(
            "visual-token importance is measured on an answer: give the input one (with_answer)"
        )
    end = prompt_end(inputs)
    answer = inputs.input_ids[0, end:].to(logits.device)
    log_probs = torch.log_softmax(logits[:, end - 1 : end - 1 + count].double(), -1)
    steps = torch.arange(count, device=logits.device)
    log_prob = log_probs[:, steps, answer].sum(1)
    exact = (log_probs.argmax(-1) == answer).all(1).double()
    return log_prob, exact, log_probs
