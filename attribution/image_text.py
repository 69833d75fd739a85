"""
A vision-language map split into its image part and its text part, and their shares.

A method on :class:`~attribution.models.vlm.ImageTextInputs` gives one value per sequence
position (at the first language-model block's input). Its *image part* is the value of each
visual token, painted over the pixels its region stands for
(:mod:`attribution.models.regions`); its *text part* the value of every other position. The
*share* of the image is ``Σ|visual| / Σ|all|``, the text's the rest, per answer step too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from attrlab.attribution.models.regions import box_pixels
from attrlab.attribution.models.vlm import ImageTextInputs

__all__ = ["ImageTextParts", "image_text_parts", "map_parts", "region_heatmap", "step_shares"]


@dataclass(frozen=True)
class ImageTextParts:
    """
    A map's image part, text part and shares.

    Attributes:
        visual: ``(N,)``: each visual token's value, in the order of the inputs' regions.
        heatmap: ``(H, W)`` over the original image (:func:`region_heatmap`).
        text: ``(T,)``: the map with the visual positions set to zero.
        image_share: ``Σ|visual| / Σ|map|`` (0 for a map of zeros).
        text_share: ``1 - image_share`` (0 for a map of zeros).
        image_sum: ``Σ visual``, signed.
        text_sum: ``Σ`` over the other positions, signed.
    """

    visual: np.ndarray
    heatmap: np.ndarray
    text: np.ndarray
    image_share: float
    text_share: float
    image_sum: float
    text_sum: float

    def metrics(self) -> dict[str, float]:
        """The shares and sums as an Explanation's metrics."""
        return {
            "image_share": self.image_share,
            "text_share": self.text_share,
            "image_relevance": self.image_sum,
            "text_relevance": self.text_sum,
        }


def region_heatmap(regions: np.ndarray, values: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """
    ``values`` painted over their ``regions`` in an image of ``size`` ``(H, W)``.

    A pixel takes the value of the token whose box holds its centre, the mean of them where
    boxes overlap (a tile's token and the whole image's, in tiled layouts); NaN where no box
    does (pixels a centre crop drops). Tokens of no region (NaN boxes) are left out.
    """
    total = np.zeros(size)
    count = np.zeros(size)
    for box, value in zip(regions, values, strict=True):
        if np.isnan(box[0]):
            continue
        inside = box_pixels(box, size)
        total[inside] += value
        count[inside] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def _shares(values: np.ndarray, visual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(image share, text share)`` of ``|values|`` along the last axis."""
    magnitude = np.abs(values)
    total = magnitude.sum(axis=-1)
    image = magnitude[..., visual].sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, image / total, 0.0)
    return share, np.where(total > 0, 1.0 - share, 0.0)


def image_text_parts(inputs: ImageTextInputs, scores: np.ndarray) -> ImageTextParts:
    """``scores`` ``(T,)`` (one per position of ``inputs``) split into image and text."""
    visual = inputs.visual_tokens.cpu().numpy()
    return _parts(np.asarray(scores, dtype=np.float64), visual, inputs.regions, inputs.image.shape)


def map_parts(maps: Mapping[str, np.ndarray], scores: np.ndarray) -> ImageTextParts:
    """
    ``scores`` ``(T,)`` split as the Explanation whose ``maps`` these are splits its own.

    ``maps``: an image and a prompt's Explanation's (``visual_mask``, ``visual_regions``,
    ``image_heatmap`` for the image's size); ``scores``: one value per position, such as a row
    of ``maps["steps"]`` (one answer step's map).

    Raises:
        ValueError: maps without an image part, or scores of another length.
    """
    if not {"visual_mask", "visual_regions", "image_heatmap"} <= maps.keys():
        raise ValueError("an image part needs the Explanation of an image and a prompt")
    visual = np.asarray(maps["visual_mask"]) == 1
    values = np.asarray(scores, dtype=np.float64)
    if values.shape != visual.shape:
        raise ValueError(f"{values.shape[-1]} scores for a map of {visual.shape[0]} positions")
    return _parts(values, visual, maps["visual_regions"], maps["image_heatmap"].shape)


def _parts(
    values: np.ndarray, visual: np.ndarray, regions: np.ndarray, shape: tuple[int, ...]
) -> ImageTextParts:
    """``values`` split at the ``visual`` positions, painted over ``regions`` (image ``shape``)."""
    image_share, text_share = _shares(values, visual)
    text = np.where(visual, 0.0, values)
    return ImageTextParts(
        visual=values[visual],
        heatmap=region_heatmap(np.asarray(regions), values[visual], (shape[0], shape[1])),
        text=text,
        image_share=float(image_share),
        text_share=float(text_share),
        image_sum=float(values[visual].sum()),
        text_sum=float(text.sum()),
    )


def step_shares(inputs: ImageTextInputs, steps: np.ndarray) -> dict[str, np.ndarray]:
    """Per answer step (rows of ``steps``, ``(S, T)``): the image's and the text's shares."""
    visual = inputs.visual_tokens.cpu().numpy()
    image_share, text_share = _shares(np.asarray(steps, dtype=np.float64), visual)
    return {"step_image_share": image_share, "step_text_share": text_share}
