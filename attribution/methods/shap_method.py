"""SHAP Partition explainer (Lundberg & Lee 2017, arXiv:1705.07874) on text and images."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import shap
import torch

from attribution.errors import UnsupportedMethodError
from attribution.methods._masks import BATCH_SIZE_PARAM
from attribution.methods.base import Attribution, AttributionMethod
from attribution.methods.registry import register
from attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs, text_adapter
from attribution.params import Param
from attribution.perturb import BatchRunner, auto_batch_size, box_blur
from attribution.run import RunContext

__all__ = ["Shap"]


@register
class Shap(AttributionMethod):
    """
    Owen values of a hierarchy of features, from ``shap``'s Partition explainer.

    Text: ``shap.maskers.Text`` with the model's tokenizer (hidden tokens become the mask
    token; its partition tree groups neighbouring tokens). Images: ``shap.maskers.Image``
    hiding regions with a box-blurred copy of the image (``blur×blur``, as the masker's
    ``"blur(k,k)"`` option, computed without OpenCV) over axis-aligned splits; pixel values
    are summed over colour channels. Scores explain the target logit. The explainer spends at
    most ``max_evals`` forward passes. Paper: https://arxiv.org/abs/1705.07874
    """

    name = "shap"
    title = "SHAP (Partition)"
    paper = "https://arxiv.org/abs/1705.07874"
    params = (
        Param("max_evals", "int", 500, "Most forward passes the explainer may spend.", 10, 100_000),
        Param("blur", "int", 128, "Images: side of the box blur hiding masked regions.", 1, 4096),
        BATCH_SIZE_PARAM,
    )

    @classmethod
    def attribute(
        cls, adapter: Adapter, inputs: Inputs, target: int, params: dict[str, Any], run: RunContext
    ) -> Attribution:
        batch_size = params["batch_size"] or auto_batch_size(adapter, inputs)
        runner = BatchRunner(adapter, run, batch_size, params["max_evals"])
        explain, data, reduce = _EXPLAINERS[inputs.modality](adapter, inputs, runner, params)
        result = explain(
            data,
            max_evals=params["max_evals"],
            batch_size=batch_size,
            outputs=[target],
            silent=True,
        )
        values = np.asarray(result.values[0], dtype=np.float64)[..., 0]
        scores = reduce(values)
        return Attribution(
            scores=scores,
            metrics={
                "base_value": float(np.asarray(result.base_values).ravel()[0]),
                # Credit of groups left unsplit within max_evals that fell on special
                # tokens the model input lacks (0 once max_evals suffices).
                "unassigned_credit": float(values.sum() - scores.sum()),
            },
        )


def _image(
    adapter: Adapter, inputs: Inputs, runner: BatchRunner, params: dict[str, Any]
) -> tuple[Any, Any, Callable[[np.ndarray], np.ndarray]]:
    """Partition explainer over normalised H×W×3 pixels, blurred where hidden."""
    image, blur = cast(ImageInputs, inputs), params["blur"]
    device = image.pixel_values.device
    pixels = image.pixel_values[0].permute(1, 2, 0).cpu().numpy().astype(np.float32)
    blurred = box_blur(image.pixel_values, blur)[0].permute(1, 2, 0).cpu().numpy()
    masker = shap.maskers.Image(blurred.astype(np.float32), pixels.shape)

    def model(batch: np.ndarray) -> np.ndarray:
        tensor = torch.as_tensor(np.asarray(batch, dtype=np.float32), device=device)
        return runner.logits(pixel_values=tensor.permute(0, 3, 1, 2)).cpu().numpy()

    explainer = shap.explainers.Partition(model, masker)
    return explainer, pixels[None], lambda values: values.sum(-1)


def _text(
    adapter: Adapter, inputs: Inputs, runner: BatchRunner, params: dict[str, Any]
) -> tuple[Any, Any, Callable[[np.ndarray], np.ndarray]]:
    """Partition explainer over the masker's tokens, mapped onto the model's tokens."""
    tokens = cast(TextInputs, inputs)
    tokenizer = text_adapter(adapter).tokenizer
    text = _kept_text(adapter, tokens)
    encoded = tokenizer(text, return_special_tokens_mask=True)
    masker_ids = np.asarray(encoded["input_ids"])
    masker_free = np.flatnonzero(np.asarray(encoded["special_tokens_mask"]) == 0)
    ours = tokens.input_ids[0]
    our_free = (~tokens.special_tokens).nonzero().squeeze(1).cpu().numpy()
    if np.array_equal(masker_ids, ours.cpu().numpy()):
        source = target = np.arange(len(masker_ids))  # same tokens, special ones included
    elif len(masker_free) == len(our_free) and np.array_equal(
        masker_ids[masker_free], ours.cpu().numpy()[our_free]
    ):
        source, target = masker_free, our_free  # the model adds other (or no) special tokens
    else:
        raise UnsupportedMethodError(
            "shap's text masker tokenises this text differently from the model input; "
            "use rise, sobol or occlusion for this model"
        )
    masker = shap.maskers.Text(
        tokenizer, mask_token=text_adapter(adapter).mask_token_id, output_type="token_ids"
    )
    target_index = torch.as_tensor(target, device=ours.device)

    def model(batch: np.ndarray) -> np.ndarray:
        masked = torch.as_tensor(np.asarray(batch, dtype=np.int64)[:, source], device=ours.device)
        ids = ours.expand(masked.shape[0], -1).clone()
        ids[:, target_index] = masked
        mask = tokens.attention_mask.expand_as(ids)
        return runner.logits(input_ids=ids, attention_mask=mask).cpu().numpy()

    def reduce(values: np.ndarray) -> np.ndarray:
        scores = np.zeros(len(tokens.tokens))
        scores[target] = values[source]
        return scores

    return shap.explainers.Partition(model, masker), [text], reduce


#: The shap masker and data for each modality.
_EXPLAINERS = {"text": _text, "image": _image}


def _kept_text(adapter: Adapter, inputs: TextInputs) -> str:
    """The input text, cut after the last token the model kept when it was truncated."""
    if not inputs.truncated:
        return inputs.text
    offsets = text_adapter(adapter).tokenizer(
        inputs.text,
        return_offsets_mapping=True,
        add_special_tokens=False,
        truncation=True,
        max_length=int((~inputs.special_tokens).sum()),
    )["offset_mapping"]
    return inputs.text[: offsets[-1][1]]
