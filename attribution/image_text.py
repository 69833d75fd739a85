"""
A vision-language map split into its image part and its text part, and their shares.

A method on :class:`~attribution.models.vlm.ImageTextInputs` gives one value per sequence
position (at the first language-model block's input). Its *image part* is the value of each
visual token, painted over the pixels its region stands for in its own image
(:mod:`attribution.models.regions`); its *text part* the value of every other position. The
*share* of an image is ``Σ|its visual tokens| / Σ|all|``, the text's the rest, per answer step
too; with one image, that image's is the image share.

An Explanation's maps hold the image part as ``maps["image_heatmap"]`` for one image, and as
``maps["image_heatmap_1"]``, ``maps["image_heatmap_2"]``, ... for several, with each visual
token's image number (from 1) in ``maps["visual_image"]`` and each image's share in
``metrics["image_1_share"]``, ... beside the images' total ``metrics["image_share"]``
(:func:`image_heatmaps` reads either).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from attrlab.attribution.models.regions import box_pixels
from attrlab.attribution.models.vlm import ImageTextInputs

__all__ = [
    "ImageTextParts",
    "image_heatmaps",
    "image_text_parts",
    "map_parts",
    "region_heatmap",
    "step_shares",
]


@dataclass(frozen=True)
class ImageTextParts:
    """
    A map's image part (per image), text part and shares.

    Attributes:
        visual: ``(N,)``: each visual token's value, in the order of the inputs' regions.
        heatmaps: One ``(H, W)`` per image, over that original image (:func:`region_heatmap`).
        text: ``(T,)``: the map with the visual positions set to zero.
        image_shares: Each image's ``Σ|its visual tokens| / Σ|map|`` (0 for a map of zeros).
        text_share: ``1 - Σ image_shares`` (0 for a map of zeros).
        image_sums: Each image's ``Σ`` over its visual tokens, signed.
        text_sum: ``Σ`` over the other positions, signed.
    """

    visual: np.ndarray
    heatmaps: tuple[np.ndarray, ...]
    text: np.ndarray
    image_shares: tuple[float, ...]
    text_share: float
    image_sums: tuple[float, ...]
    text_sum: float

    @property
    def image_share(self) -> float:
        """The images' share together: ``Σ|visual| / Σ|map|``."""
        return float(sum(self.image_shares))

    @property
    def heatmap(self) -> np.ndarray:
        """
        The one image's heatmap.

        Raises:
            ValueError: a map of several images (read :attr:`heatmaps`).
        """
        if len(self.heatmaps) != 1:
            raise ValueError(f"the map covers {len(self.heatmaps)} images: read heatmaps")
        return self.heatmaps[0]

    def metrics(self) -> dict[str, float]:
        """The shares and sums as an Explanation's metrics (per image too, for several)."""
        metrics = {
            "image_share": self.image_share,
            "text_share": self.text_share,
            "image_relevance": float(sum(self.image_sums)),
            "text_relevance": self.text_sum,
        }
        if len(self.heatmaps) > 1:
            pairs = zip(self.image_shares, self.image_sums, strict=True)
            for number, (share, total) in enumerate(pairs, 1):
                metrics[f"image_{number}_share"] = share
                metrics[f"image_{number}_relevance"] = total
        return metrics

    def heatmap_maps(self) -> dict[str, np.ndarray]:
        """The heatmaps as an Explanation's maps (``image_heatmap``, or one key per image)."""
        if len(self.heatmaps) == 1:
            return {"image_heatmap": self.heatmaps[0]}
        return {f"image_heatmap_{n}": heat for n, heat in enumerate(self.heatmaps, 1)}


def image_heatmaps(maps: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """An Explanation's heatmaps, one per image in order (none: not an image's Explanation)."""
    if "image_heatmap" in maps:
        return [maps["image_heatmap"]]
    found: list[np.ndarray] = []
    while f"image_heatmap_{len(found) + 1}" in maps:
        found.append(maps[f"image_heatmap_{len(found) + 1}"])
    return found


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


def _shares(
    values: np.ndarray, visual: np.ndarray, images: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """
    Each image's share of ``|values|`` along the last axis, ``(..., count)``, and the text's.

    ``images``: each visual token's image (from 0), in the order of the ``visual`` positions.
    """
    magnitude = np.abs(values)
    total = magnitude.sum(axis=-1)[..., None]
    on_visual = magnitude[..., visual]
    per_image = np.stack([on_visual[..., images == k].sum(axis=-1) for k in range(count)], -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(total > 0, per_image / total, 0.0)
    return shares, np.where(total[..., 0] > 0, 1.0 - shares.sum(axis=-1), 0.0)


def image_text_parts(inputs: ImageTextInputs, scores: np.ndarray) -> ImageTextParts:
    """``scores`` ``(T,)`` (one per position of ``inputs``) split into images and text."""
    visual = inputs.visual_tokens.cpu().numpy()
    sizes = [image.shape[:2] for image in inputs.images]
    values = np.asarray(scores, dtype=np.float64)
    return _parts(values, visual, inputs.regions, inputs.region_images, sizes)


def map_parts(maps: Mapping[str, np.ndarray], scores: np.ndarray) -> ImageTextParts:
    """
    ``scores`` ``(T,)`` split as the Explanation whose ``maps`` these are splits its own.

    ``maps``: an image and a prompt's Explanation's (``visual_mask``, ``visual_regions``, the
    heatmaps for the images' sizes, ``visual_image`` for several); ``scores``: one value per
    position, such as a row of ``maps["steps"]`` (one answer step's map).

    Raises:
        ValueError: maps without an image part, or scores of another length.
    """
    heatmaps = image_heatmaps(maps)
    if not heatmaps or not {"visual_mask", "visual_regions"} <= maps.keys():
        raise ValueError("an image part needs the Explanation of an image and a prompt")
    visual = np.asarray(maps["visual_mask"]) == 1
    values = np.asarray(scores, dtype=np.float64)
    if values.shape != visual.shape:
        raise ValueError(f"{values.shape[-1]} scores for a map of {visual.shape[0]} positions")
    numbers = maps.get("visual_image", np.ones(int(visual.sum())))
    images = np.asarray(numbers).astype(int) - 1
    sizes = [heat.shape[:2] for heat in heatmaps]
    return _parts(values, visual, maps["visual_regions"], images, sizes)


def _parts(
    values: np.ndarray,
    visual: np.ndarray,
    regions: np.ndarray,
    images: np.ndarray,
    sizes: list[tuple[int, ...]],
) -> ImageTextParts:
    """
    ``values`` split at the ``visual`` positions, each painted over ``regions`` of its image.

    ``images``: each visual token's image (from 0); ``sizes``: each image's ``(H, W)``.
    """
    shares, text_share = _shares(values, visual, images, len(sizes))
    text = np.where(visual, 0.0, values)
    tokens, boxes = values[visual], np.asarray(regions)
    return ImageTextParts(
        visual=tokens,
        heatmaps=tuple(
            region_heatmap(boxes[images == k], tokens[images == k], (size[0], size[1]))
            for k, size in enumerate(sizes)
        ),
        text=text,
        image_shares=tuple(float(share) for share in shares),
        text_share=float(text_share),
        image_sums=tuple(float(tokens[images == k].sum()) for k in range(len(sizes))),
        text_sum=float(text.sum()),
    )


def step_shares(inputs: ImageTextInputs, steps: np.ndarray) -> dict[str, np.ndarray]:
    """
    Per answer step (rows of ``steps``, ``(S, T)``): the images' and the text's shares.

    With several images, each image's too (``step_image_1_share``, ...).
    """
    visual = inputs.visual_tokens.cpu().numpy()
    count = len(inputs.images)
    values = np.asarray(steps, dtype=np.float64)
    shares, text_share = _shares(values, visual, inputs.region_images, count)
    found = {"step_image_share": shares.sum(axis=-1), "step_text_share": text_share}
    if count > 1:
        found.update({f"step_image_{k + 1}_share": shares[:, k] for k in range(count)})
    return found
