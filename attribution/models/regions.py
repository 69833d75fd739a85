"""
Visual tokens back to pixels: each visual token's region of the original image.

A vision-language model's processor pads, resizes and crops the image, its vision tower cuts
the result into patches, and some families merge neighbouring patches into one token. Each
step is an axis-aligned affine map, so a token's patch box in the processed image goes back
to a box of the original image exactly (continuous pixel coordinates: pixel ``i`` spans
``[i, i + 1)``, as resizing without aligned corners reads them). A resize blends pixels within
its kernel's reach of a box's edge, so a region's pixels reach its token through that margin
too; a pad or a crop moves boxes by whole pixels.

The layout of a family's tokens is named in its row (:class:`~attribution.models.families.
VisionLanguage`):

- ``patch_grid``: the vision tower's patches, row-major, after its CLS token when the family
  keeps it (LLaVA 1.5, PaliGemma);
- ``merged_grid``: each token one ``m × m`` block of patches, blocks row-major (Qwen2-VL,
  Qwen2.5-VL);
- ``pooled_grid``: the patches average-pooled to ``n × n`` tokens, row-major (Gemma 3);
- ``tiled_grid``: tiles of the image, then the whole image, each pixel-shuffled into ``s × s``
  patch blocks, so a pixel reaches a tile's token and the whole image's (Idefics3, SmolVLM);
- ``anyres_grid``: the whole image's patches, then the any-resolution canvas's, with row-end
  newline tokens that stand for no region: rows of NaN (LLaVA-NeXT).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attrlab.attribution.errors import UnsupportedMethodError

__all__ = ["box_pixels", "visual_regions"]


@dataclass(frozen=True)
class _ToOriginal:
    """``original = processed · scale + offset`` along (y, x)."""

    scale: tuple[float, float] = (1.0, 1.0)
    offset: tuple[float, float] = (0.0, 0.0)

    def then(self, scale: tuple[float, float], offset: tuple[float, float]) -> _ToOriginal:
        """The map after one more processing step, whose own inverse is ``scale, offset``."""
        return _ToOriginal(
            (scale[0] * self.scale[0], scale[1] * self.scale[1]),
            (
                offset[0] * self.scale[0] + self.offset[0],
                offset[1] * self.scale[1] + self.offset[1],
            ),
        )

    def boxes(self, boxes: np.ndarray, size: tuple[int, int]) -> np.ndarray:
        """``(N, 4)`` processed ``(x0, y0, x1, y1)`` boxes as original ones, within ``size``."""
        (sy, sx), (oy, ox) = self.scale, self.offset
        out = boxes * np.array([sx, sy, sx, sy]) + np.array([ox, oy, ox, oy])
        height, width = size
        return np.clip(out, 0.0, np.array([width, height, width, height], dtype=float))


def _entry(size: Any, key: str) -> int | None:
    """A size field of an image processor (a dict, or transformers' ``SizeDict``)."""
    value = size.get(key) if isinstance(size, Mapping) else getattr(size, key, None)
    return int(value) if value else None


def _patch_boxes(rows: int, cols: int, side: float) -> np.ndarray:
    """``(rows · cols, 4)`` boxes of a grid of squares of ``side`` pixels, row-major."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    return np.stack([c * side, r * side, (c + 1) * side, (r + 1) * side], axis=1).astype(float)


def _clip_processing(processor: Any, size: tuple[int, int]) -> tuple[_ToOriginal, tuple[int, int]]:
    """
    The pad-to-square, resize and centre-crop of a CLIP / LLaVA image processor, inverted.

    Sizes follow transformers' own rules: the shortest edge to ``S`` and the longest to
    ``int(S · long / short)``; a crop's corner at ``((h - ch) // 2, (w - cw) // 2)``; a square
    pad's at ``((side - h) // 2, (side - w) // 2)``.
    """
    height, width = size
    to_original = _ToOriginal()
    if getattr(processor, "do_pad", False):
        side = max(height, width)
        to_original = to_original.then(
            (1.0, 1.0), (-((side - height) // 2), -((side - width) // 2))
        )
        height = width = side
    if getattr(processor, "do_resize", True):
        shortest = _entry(processor.size, "shortest_edge")
        if shortest is not None:
            short, long = sorted((height, width))
            new_long = int(shortest * long / short)
            resized = (shortest, new_long) if height <= width else (new_long, shortest)
        elif _entry(processor.size, "height") and _entry(processor.size, "width"):
            resized = (_entry(processor.size, "height") or 0, _entry(processor.size, "width") or 0)
        else:
            raise UnsupportedMethodError(f"image processor size {processor.size} is not mapped")
        to_original = to_original.then((height / resized[0], width / resized[1]), (0.0, 0.0))
        height, width = resized
    if getattr(processor, "do_center_crop", False):
        crop_h, crop_w = _entry(processor.crop_size, "height"), _entry(processor.crop_size, "width")
        if crop_h is None or crop_w is None or crop_h > height or crop_w > width:
            raise UnsupportedMethodError(
                f"a centre crop of {processor.crop_size} from {height}×{width} pixels is not mapped"
            )
        to_original = to_original.then((1.0, 1.0), ((height - crop_h) // 2, (width - crop_w) // 2))
        height, width = crop_h, crop_w
    return to_original, (height, width)


def _patch_grid(
    processor: Any, config: Any, size: tuple[int, int], outputs: Mapping[str, torch.Tensor]
) -> np.ndarray:
    to_original, processed = _clip_processing(processor.image_processor, size)
    if tuple(outputs["pixel_values"].shape[-2:]) != processed:
        raise UnsupportedMethodError(
            f"the processor gave a {tuple(outputs['pixel_values'].shape[-2:])} image where its "
            f"settings say {processed}: this layout is not mapped (tiling?)"
        )
    patch = int(config.vision_config.patch_size)
    boxes = _patch_boxes(processed[0] // patch, processed[1] // patch, patch)
    # LLaVA's "full" features keep the CLS token, which reads the whole image (SigLIP has none)
    if getattr(config, "vision_feature_select_strategy", None) == "full":
        whole = np.array([[0.0, 0.0, processed[1], processed[0]]])
        boxes = np.concatenate([whole, boxes])
    return to_original.boxes(boxes, size)


def _merged_grid(
    processor: Any, config: Any, size: tuple[int, int], outputs: Mapping[str, torch.Tensor]
) -> np.ndarray:
    image_processor = processor.image_processor
    patch, merge = int(image_processor.patch_size), int(image_processor.merge_size)
    _, rows, cols = (int(n) for n in outputs["image_grid_thw"][0])
    resized = (rows * patch, cols * patch)  # the processor resizes straight to this
    to_original = _ToOriginal((size[0] / resized[0], size[1] / resized[1]))
    return to_original.boxes(_patch_boxes(rows // merge, cols // merge, merge * patch), size)


def _pooled_grid(
    processor: Any, config: Any, size: tuple[int, int], outputs: Mapping[str, torch.Tensor]
) -> np.ndarray:
    image_processor = processor.image_processor
    if outputs["pixel_values"].shape[0] != 1:  # the image, then its crops
        raise UnsupportedMethodError(
            "Gemma 3's pan-and-scan crops are not mapped back to pixels: turn pan and scan "
            "off (do_pan_and_scan)"
        )
    to_original, processed = _clip_processing(image_processor, size)
    per_side = round(int(config.mm_tokens_per_image) ** 0.5)
    if processed[0] != processed[1] or processed[0] % per_side:
        raise UnsupportedMethodError(
            f"a {processed} image pooled to {per_side}² tokens is not mapped"
        )
    return to_original.boxes(_patch_boxes(per_side, per_side, processed[0] // per_side), size)


#: Idefics3's bound on an image's longest side after its first resize.
_IDEFICS3_MAX_SIDE = 4096


def _idefics3_tiled_size(size: tuple[int, int], longest: int, tile: int) -> tuple[int, int]:
    """
    The size Idefics3's image processor cuts into tiles, after its two resizes.

    The longest side to ``longest`` (an odd other side made even), bounded by 4096; then each
    side up to whole tiles, the second from the first through the aspect ratio, as transformers
    does it (floats included, so the sizes are its own).
    """
    height, width = size
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > _IDEFICS3_MAX_SIDE:
        width, height = _IDEFICS3_MAX_SIDE, int(_IDEFICS3_MAX_SIDE / aspect)
    elif height > width and height > _IDEFICS3_MAX_SIDE:
        height, width = _IDEFICS3_MAX_SIDE, int(_IDEFICS3_MAX_SIDE * aspect)
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height:
        tiled_w = math.ceil(width / tile) * tile
        tiled_h = math.ceil(int(tiled_w / aspect) / tile) * tile
    else:
        tiled_h = math.ceil(height / tile) * tile
        tiled_w = math.ceil(int(tiled_h * aspect) / tile) * tile
    return tiled_h, tiled_w


def _tiled_grid(
    processor: Any, config: Any, size: tuple[int, int], outputs: Mapping[str, torch.Tensor]
) -> np.ndarray:
    """
    Idefics3 / SmolVLM: tiles of the resized image row-major, then the whole image as one tile.

    Each tile's patches are pixel-shuffled: a token is an ``s × s`` block of patches
    (``s = config.scale_factor``), row-major within its tile.
    """
    image_processor = processor.image_processor
    tile = int(image_processor.max_image_size["longest_edge"])
    side = int(config.vision_config.patch_size) * int(config.scale_factor)
    if not getattr(image_processor, "do_resize", True):
        raise UnsupportedMethodError("an Idefics3 processor that does not resize is not mapped")
    tiled_h, tiled_w = _idefics3_tiled_size(size, int(image_processor.size["longest_edge"]), tile)
    tiles = _patch_boxes(tile // side, tile // side, side)
    boxes = []
    if getattr(image_processor, "do_image_splitting", False):
        rows, cols = tiled_h // tile, tiled_w // tile
        if rows * cols > 1:  # else the one tile is the whole image
            to_original = _ToOriginal((size[0] / tiled_h, size[1] / tiled_w))
            for row in range(rows):
                for col in range(cols):
                    corner = np.array([col * tile, row * tile, col * tile, row * tile])
                    boxes.append(to_original.boxes(tiles + corner, size))
    if len(boxes) + 1 != outputs["pixel_values"].shape[1]:
        raise UnsupportedMethodError("the processor's tiles are not the ones this map expects")
    boxes.append(_ToOriginal((size[0] / tile, size[1] / tile)).boxes(tiles, size))
    return np.concatenate(boxes)


def _anyres_grid(
    processor: Any, config: Any, size: tuple[int, int], outputs: Mapping[str, torch.Tensor]
) -> np.ndarray:
    """
    LLaVA-NeXT: the whole image's patches, then those of its any-resolution canvas.

    The canvas is the grid resolution transformers picks, holding the image resized to fit and
    centred; the model drops the token rows (or columns) that hold only padding, as its
    ``unpad_image`` does, and ends each kept row with a newline token, which stands for no
    region (a row of NaN).
    """
    image_processor = processor.image_processor
    if getattr(config, "vision_feature_select_strategy", "default") != "default":
        raise UnsupportedMethodError("LLaVA-NeXT keeping its CLS tokens is not mapped")
    height, width = size
    tile = int(image_processor.crop_size["height"])
    side = int(config.vision_config.image_size) // int(config.vision_config.patch_size)
    patch = tile / side  # a token's side in canvas pixels
    base = _ToOriginal((height / tile, width / tile)).boxes(_patch_boxes(side, side, patch), size)
    # transformers' own choice of canvas; imported here: a CNN's run loads no transformers code
    from transformers.image_processing_utils import select_best_resolution

    canvas_h, canvas_w = select_best_resolution(size, image_processor.image_grid_pinpoints)
    # the image resized to fit the canvas (transformers' get_patch_output_size), then centred
    if canvas_w / width < canvas_h / height:
        fit_h, fit_w = min(math.ceil(height * canvas_w / width), canvas_h), canvas_w
    else:
        fit_h, fit_w = canvas_h, min(math.ceil(width * canvas_h / height), canvas_w)
    to_original = _ToOriginal(
        (height / fit_h, width / fit_w),
        (-((canvas_h - fit_h) // 2) * height / fit_h, -((canvas_w - fit_w) // 2) * width / fit_w),
    )
    rows, cols = canvas_h // tile * side, canvas_w // tile * side
    kept_rows, kept_cols = range(rows), range(cols)
    if width / height > cols / rows:  # the model's unpad_image, in tokens
        padding = (rows - int(round(height * cols / width, 7))) // 2
        kept_rows = range(padding, rows - padding)
    else:
        padding = (cols - int(round(width * rows / height, 7))) // 2
        kept_cols = range(padding, cols - padding)
    newline = np.full((1, 4), np.nan)
    grid = []
    for row in kept_rows:
        for col in kept_cols:
            box = np.array([[col * patch, row * patch, (col + 1) * patch, (row + 1) * patch]])
            grid.append(to_original.boxes(box, size))
        grid.append(newline)
    return np.concatenate([base, *grid])


_REGIONS = {
    "anyres_grid": _anyres_grid,
    "patch_grid": _patch_grid,
    "merged_grid": _merged_grid,
    "pooled_grid": _pooled_grid,
    "tiled_grid": _tiled_grid,
}


def box_pixels(box: np.ndarray, size: tuple[int, int]) -> tuple[slice, slice]:
    """
    The rows and columns of the pixels whose centres lie in ``box`` ``(x0, y0, x1, y1)``.

    Pixel ``(r, c)`` has its centre at ``(r + 0.5, c + 0.5)``; a box holds it when
    ``x0 ≤ c + 0.5 < x1`` and ``y0 ≤ r + 0.5 < y1``, within an image of ``size`` ``(H, W)``.
    A box narrower than a pixel may hold none (empty slices).
    """
    x0, y0, x1, y1 = (float(v) for v in box)
    height, width = size

    def span(low: float, high: float, end: int) -> slice:
        start, stop = (min(end, max(0, math.ceil(edge - 0.5))) for edge in (low, high))
        return slice(start, stop)

    return span(y0, y1, height), span(x0, x1, width)


def visual_regions(
    layout: str,
    processor: Any,
    config: Any,
    size: tuple[int, int],
    outputs: Mapping[str, torch.Tensor],
) -> np.ndarray:
    """
    Each visual token's box ``(x0, y0, x1, y1)`` in the original image, in token order.

    Args:
        layout: The family's token layout (``patch_grid``, ``merged_grid``, ``pooled_grid``,
            ``tiled_grid``, ``anyres_grid``).
        processor: The family's processor (its image processor's settings are read).
        config: The model's config (patch size, which vision features it keeps).
        size: The original image's ``(height, width)``.
        outputs: What the processor gave for this one image.

    Raises:
        UnsupportedMethodError: processing this module cannot map back (tiling, say).
    """
    return _REGIONS[layout](processor, config, size, outputs)
