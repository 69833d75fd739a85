"""Image loading with a size check before decoding, and the resize-normalise transform."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from attribution.errors import InvalidInputError
from attribution.models.base import ImageInputs

__all__ = ["ImageTransform", "load_image", "max_image_pixels"]

_DEFAULT_MAX_PIXELS = 40_000_000


def max_image_pixels() -> int:
    """Largest accepted image in pixels (``ATTRLAB_MAX_IMAGE_PIXELS``, default 40 MP)."""
    return int(os.environ.get("ATTRLAB_MAX_IMAGE_PIXELS", _DEFAULT_MAX_PIXELS))


def load_image(raw: Any, max_pixels: int | None = None) -> Image.Image:
    """Open a path, bytes, PIL image or array as RGB, refusing oversized images undecoded."""
    limit = max_image_pixels() if max_pixels is None else max_pixels
    if isinstance(raw, Image.Image):
        image = raw
    elif isinstance(raw, np.ndarray):
        image = _from_array(raw)
    elif isinstance(raw, (str, Path, bytes, bytearray)):
        image = _open(raw)
    else:
        raise InvalidInputError(f"expected an image file, bytes or array; got {type(raw).__name__}")
    width, height = image.size
    if width * height > limit:
        raise InvalidInputError(
            f"image is {width}×{height} = {width * height / 1e6:.1f} megapixels, above the "
            f"limit of {limit / 1e6:.1f} megapixels; resize it first"
        )
    if width < 1 or height < 1:
        raise InvalidInputError("image has no pixels")
    try:
        return image.convert("RGB")
    except OSError as err:
        raise InvalidInputError(f"image could not be decoded: {err}") from None


def _open(raw: str | Path | bytes | bytearray) -> Image.Image:
    name = "the uploaded data" if isinstance(raw, (bytes, bytearray)) else f"'{raw}'"
    source = io.BytesIO(raw) if isinstance(raw, (bytes, bytearray)) else raw
    if not isinstance(raw, (bytes, bytearray)) and not Path(raw).is_file():
        raise InvalidInputError(f"image file {name} does not exist or is not a regular file")
    try:
        return Image.open(source)  # lazy: reads the header only, so the size check is cheap
    except (UnidentifiedImageError, OSError, ValueError):
        raise InvalidInputError(
            f"{name} is not a readable image (expected PNG, JPEG, BMP, GIF, TIFF or WebP)"
        ) from None


def _from_array(array: np.ndarray) -> Image.Image:
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    if array.ndim != 3 or array.shape[-1] not in (3, 4):
        raise InvalidInputError(f"image array must be H×W, H×W×3 or H×W×4; got {array.shape}")
    if np.issubdtype(array.dtype, np.floating):
        array = np.clip(array * 255.0 if array.max() <= 1.0 else array, 0, 255)
    return Image.fromarray(array.astype(np.uint8))


@dataclass(frozen=True)
class ImageTransform:
    """Resize to the model's input size and normalise with its mean and std."""

    size: tuple[int, int]  # (H, W)
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __call__(self, raw: Any, device: torch.device) -> ImageInputs:
        """Load, resize (bilinear) and normalise one image."""
        image = load_image(raw)
        original = (image.height, image.width)
        resized = np.asarray(image.resize(self.size[::-1], Image.BILINEAR), dtype=np.uint8)
        pixels = torch.from_numpy(resized.copy()).permute(2, 0, 1).float().div(255.0)
        mean = torch.tensor(self.mean).view(3, 1, 1)
        std = torch.tensor(self.std).view(3, 1, 1)
        normalised = ((pixels - mean) / std).unsqueeze(0).to(device)
        return ImageInputs(pixel_values=normalised, image=resized, original_size=original)
