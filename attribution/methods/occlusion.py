"""Occlusion (Zeiler & Fergus 2014, arXiv:1311.2901) via Captum: sliding patches / windows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from captum.attr import FeatureAblation
from captum.attr import Occlusion as CaptumOcclusion

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.features import Feature, features_of
from attrlab.attribution.inputs.masks import slic_segments
from attrlab.attribution.inputs.perturb import (
    BatchRunner,
    ImageTextPerturbation,
    Perturbation,
    TextPerturbation,
    auto_batch_size,
)
from attrlab.attribution.methods._captum import BASELINE, baseline_for
from attrlab.attribution.methods._masks import (
    BATCH_SIZE,
    N_SEGMENTS,
    PRECISION,
    SEGMENTS,
    check_segments,
)
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.params import MethodParams, param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["Occlusion", "OcclusionParams"]


@dataclass(frozen=True, kw_only=True)
class OcclusionParams(MethodParams):
    """The parameters of :class:`Occlusion`."""

    window: int | None = param(
        None,
        "Window side in pixels (default: an eighth of the image) or in tokens (default 1); an "
        "image and a prompt: the side in pixels of the cells whose visual tokens are hidden "
        "together (default: each alone).",
        1,
        4096,
    )
    stride: int | None = param(None, "Step between windows (default: half a window).", 1, 4096)
    baseline: str = BASELINE.as_field()
    segments: str = SEGMENTS.as_field()
    n_segments: int = N_SEGMENTS.as_field()
    batch_size: int | None = BATCH_SIZE.as_field()
    precision: str = PRECISION.as_field()


@register
class Occlusion(AttributionMethod[OcclusionParams]):
    """
    Drop in the target's score when a window of the input is replaced by a baseline.

    Images: a ``window×window`` patch moved with ``stride`` over the image (all channels),
    filled with the mean colour (normalised zero) or black; each pixel gets the average drop
    of the windows covering it. With ``segments=slic`` each SLIC superpixel is occluded once
    instead (Captum ``FeatureAblation``). Text: windows of ``window`` tokens replaced by pad or
    mask tokens (special tokens stay); a text explained by words, sentences or spans
    (:mod:`attribution.inputs.features`) has each feature occluded once instead, its drop shared
    evenly among its tokens. An image and a prompt: each text token and each visual token
    (with ``window``: the visual tokens of each ``window × window``-pixel cell of the image
    together; with ``segments=slic``: those of each superpixel; the drop shared evenly among
    them) hidden once, its rows of the language model's
    first block input set to zero (special and answer tokens stay;
    :class:`~attribution.inputs.perturb.ImageTextPerturbation`).
    Paper: https://arxiv.org/abs/1311.2901
    """

    alters_model = False  # plain forward and gradient passes

    name = "occlusion"
    title = "Occlusion"
    paper = "https://arxiv.org/abs/1311.2901"
    param_record = OcclusionParams
    modalities = frozenset({"text", "image", "image-text"})

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: OcclusionParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        check_segments(inputs, params.segments)
        batch = params.batch_size or auto_batch_size(adapter, inputs)
        if isinstance(inputs, ImageTextInputs):
            return Passes(_positions(inputs, params).n_cells(0) + 1, batch=batch)
        if (features := _features(inputs, params)) is not None:
            return Passes(len(features) + 1, batch=batch)
        if params.segments == "slic":
            image = cast(ImageInputs, inputs).image
            return Passes(int(slic_segments(image, params.n_segments).max()) + 2, batch=batch)
        tensor, _ = inputs.attributed()
        _, _, windows = _windows(inputs.map_shape, tensor.shape[1:], params.window, params.stride)
        return Passes(windows + 1, batch=batch)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: OcclusionParams,
        run: RunContext,
    ) -> Attribution:
        check_segments(inputs, params.segments)
        if isinstance(inputs, ImageTextInputs):
            return _occluded(adapter, inputs, _positions(inputs, params), target, params, run)
        batch_size = params.batch_size or auto_batch_size(adapter, inputs)
        tensor, extra = inputs.attributed()
        baseline = baseline_for(adapter, inputs, params.baseline)
        if _features(inputs, params) is not None:
            text = cast(TextInputs, inputs)
            kind = "mask" if params.baseline == "mask" else "pad"
            perturbation = TextPerturbation(adapter, text, kind, _features(text, params))
            return _occluded(adapter, text, perturbation, target, params, run)
        if params.segments == "slic":
            image = cast(ImageInputs, inputs).image  # check_segments: images only
            labels = slic_segments(image, params.n_segments).to(tensor.device)
            runner = BatchRunner(
                adapter,
                run,
                batch_size,
                int(labels.max()) + 2,
                precision=params.precision,
                target=target,
            )
            method = FeatureAblation(_forward(runner, inputs, target))
            kwargs: dict[str, Any] = {"feature_mask": labels[None, None]}
        else:
            window, stride, windows = _windows(
                inputs.map_shape, tensor.shape[1:], params.window, params.stride
            )
            runner = BatchRunner(
                adapter, run, batch_size, windows + 1, precision=params.precision, target=target
            )
            method = CaptumOcclusion(_forward(runner, inputs, target))
            kwargs = {"sliding_window_shapes": window, "strides": stride}
        attributions = method.attribute(
            tensor,
            baselines=baseline,
            additional_forward_args=extra or None,
            perturbations_per_eval=batch_size,
            **kwargs,
        )
        # Windows span all channels, so every channel holds the same drop: keep one.
        scores = attributions[0].reshape(-1, *inputs.map_shape)[0]
        return Attribution(scores=scores.detach().double().cpu().numpy())


def _features(inputs: Inputs, params: OcclusionParams) -> tuple[Feature, ...] | None:
    """
    What a text occludes one at a time: its features, or its tokens one by one.

    Features are words, sentences or spans; ``None`` where windows slide (images, text windows
    wider than a token, a fill other than a token). Token by token, only tokens that can change
    are occluded: a window over a special token or an answer's (kept as they are) would spend a
    forward to change nothing.
    """
    if not isinstance(inputs, TextInputs):
        return None
    if inputs.features is None:
        one_by_one = params.window in (None, 1) and params.stride in (None, 1)
        if not one_by_one or params.baseline not in ("auto", "pad", "mask"):
            return None
        return tuple(features_of(inputs, "token"))
    if params.window or params.stride:
        raise InvalidParameterError(
            f"window and stride slide over tokens; at granularity={inputs.granularity} "
            "each feature is occluded on its own: leave them empty"
        )
    return inputs.features


def _positions(inputs: ImageTextInputs, params: OcclusionParams) -> ImageTextPerturbation:
    """
    An image and a prompt, occluded feature by feature at the first block's input.

    Each text token on its own; each visual token on its own, or with ``window`` the visual
    tokens in each ``window × window``-pixel cell of the image together, or with
    ``segments=slic`` those of each SLIC superpixel
    (:func:`~attribution.inputs.perturb.superpixel_regions`).

    Raises:
        InvalidParameterError: a stride other than the window (cells do not overlap), a
            window with superpixels, or a baseline other than zero.
    """
    superpixels = params.n_segments if params.segments == "slic" else None
    if superpixels is not None and params.window is not None:
        raise InvalidParameterError(
            "window groups the visual tokens into cells and segments=slic into superpixels: "
            "leave window empty, or set segments=grid"
        )
    if params.stride not in (None, params.window):
        raise InvalidParameterError(
            "an image and a prompt are occluded in cells of window × window pixels that do "
            "not overlap: leave stride empty"
        )
    if params.baseline not in ("auto", "zero"):
        raise InvalidParameterError(
            f"baseline '{params.baseline}' does not apply to an image and a prompt; use zero"
        )
    cell = None if params.window is None else (float(params.window), float(params.window))
    return ImageTextPerturbation(inputs, cell=cell, superpixels=superpixels)


def _occluded(
    adapter: Adapter,
    inputs: Inputs,
    perturbation: Perturbation,
    target: Target,
    params: OcclusionParams,
    run: RunContext,
) -> Attribution:
    """Each cell's drop in the target's score when it alone is hidden (a feature's tokens)."""
    n = perturbation.n_cells(0)
    # row 0 keeps everything; row j + 1 hides feature j
    design = torch.cat([torch.ones(1, n), 1 - torch.eye(n)])
    batch_size = params.batch_size or auto_batch_size(adapter, inputs)
    runner = BatchRunner(adapter, run, batch_size, n + 1, precision=params.precision, target=target)
    masks = perturbation.design_masks(design, 0, adapter.device)
    scores = np.concatenate(
        [
            target.score(outputs).double().cpu().numpy()
            for _, outputs in runner.score(masks, perturbation)
        ]
    )
    return Attribution(scores=perturbation.element_map(scores[0] - scores[1:]))


def _forward(runner: BatchRunner, inputs: Inputs, target: Target) -> Any:
    """Captum's forward: ``target``'s score of the runner's batched logits."""
    keys = inputs.forward_keys
    return lambda *tensors: target.score(runner.logits(**dict(zip(keys, tensors, strict=True))))


def _windows(
    sizes: tuple[int, ...], attributed: tuple[int, ...], window: int | None, stride: int | None
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """
    Captum window and stride shapes, and the number of window positions.

    ``sizes`` is the score map's shape (tokens, or H×W); the attributed tensor's leading
    dimensions before it (colour channels) are covered whole. By default a window is one token
    of a text, an eighth of an image's shorter side.
    """
    window = window or (1 if len(sizes) == 1 else max(1, min(sizes) // 8))
    stride = stride or max(1, window // 2)
    if window > min(sizes):
        raise InvalidParameterError(
            f"parameter 'window' must be at most the input size {min(sizes)}; got {window}"
        )
    if stride > window:
        raise InvalidParameterError(
            f"parameter 'stride' must not exceed the window ({window}); got {stride}"
        )
    lead = tuple(attributed[: len(attributed) - len(sizes)])
    counts = [int(np.ceil((size - window) / stride)) + 1 for size in sizes]
    return (
        (*lead, *(window,) * len(sizes)),
        (*lead, *(stride,) * len(sizes)),
        int(np.prod(counts)),
    )
