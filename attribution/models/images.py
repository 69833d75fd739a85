"""
Image decoding for untrusted bytes, and the resize-normalise transform.

Images arrive as encoded bytes (an upload, a base64 field, a file the CLI read), a decoded
array or a PIL image; never as a path: the library opens no files on behalf of a request.
Encoded data is size-checked from its header before any pixel is decoded: its pixels, and its
bytes as decoded (width × height × channels × bytes per channel), against a byte limit derived
from the pixel limit (:func:`max_image_bytes`).
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFile, ImageMode, ImageOps

from attrlab.attribution.errors import InputTooLargeError, InvalidInputError, InvalidParameterError
from attrlab.attribution.models.base import ImageInputs

__all__ = ["ImageTransform", "load_image", "max_image_bytes", "max_image_pixels"]

log = logging.getLogger(__name__)

_DEFAULT_MAX_PIXELS = 40_000_000
_FORMAT_NAMES = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP")
_FORMATS = "PNG, JPEG, BMP, GIF, TIFF or WebP"
# Pillow's own bomb guard (a warning, then an error at twice the limit) stays as a backstop;
# our limit is checked first from the header and is far lower.
_WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # 16/32-bit integer, float
#: Bytes per pixel the byte limit is counted in: 8-bit RGB, so such images meet the pixel limit
#: and the byte limit together (as before there was a byte limit).
_RGB_BYTES = 3
# A decoder's raw mode with 16-bit samples ("RGBA;16B", "RGB;16L", "LA;16B", "I;16N"): Pillow
# keeps such PNG/TIFF colour images in 8-bit modes, so the mode alone would hide the file's depth.
_SIXTEEN_BIT_RAW = re.compile(r";16[BLN]")


def max_image_pixels(env: Mapping[str, str] | None = None) -> int:
    """Largest accepted image in pixels (``ATTRLAB_MAX_IMAGE_PIXELS``, default 40 MP)."""
    value = (os.environ if env is None else env).get("ATTRLAB_MAX_IMAGE_PIXELS", "").strip()
    if not value:
        return _DEFAULT_MAX_PIXELS
    if not value.isdigit() or int(value) < 1:
        raise InvalidParameterError(
            f"ATTRLAB_MAX_IMAGE_PIXELS must be a positive whole number; got {value!r}"
        )
    return int(value)


def max_image_bytes(max_pixels: int) -> int:
    """
    Largest decoded image in bytes for a pixel limit: as many bytes as 8-bit RGB at that limit.

    An image's bytes are width × height × channels × bytes per channel: a 16-bit RGBA image
    counts 8 bytes a pixel, so it meets the limit at 3/8 of the pixels of an 8-bit RGB one.
    """
    return _RGB_BYTES * max_pixels


def load_image(raw: Any, max_pixels: int | None = None) -> Image.Image:
    """
    Decode encoded bytes, a PIL image or an array into an RGB image.

    Bytes are checked against ``max_pixels`` and :func:`max_image_bytes` of it from the header
    alone, before decoding; an array by its own shape and item size. Animated images give their
    first frame; EXIF orientation is applied; 16-bit, palette, CMYK and transparent images are
    converted to 8-bit RGB (transparency over white).

    Raises:
        InvalidInputError: not an image (a str is refused: paths are never opened here).
        InputTooLargeError: more pixels than ``max_pixels``, or more decoded bytes than
            :func:`max_image_bytes` of it.
    """
    limit = max_image_pixels() if max_pixels is None else max_pixels
    if isinstance(raw, Image.Image):
        return _to_rgb(raw)
    if isinstance(raw, np.ndarray):
        return _from_array(raw, limit)
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return _decode(bytes(raw), limit)
    if isinstance(raw, str):
        raise InvalidInputError(
            "got text where an image was expected; send the image's bytes (files are read "
            "only by the command line, never by the library or the server)"
        )
    raise InvalidInputError(f"expected image bytes or an array; got {type(raw).__name__}")


def _check_size(width: int, height: int, channels: int, channel_bytes: int, limit: int) -> None:
    """Refuse an image over ``limit`` pixels or over :func:`max_image_bytes` of it decoded."""
    if width < 1 or height < 1:
        raise InvalidInputError("the image has no pixels")
    if width * height > limit:
        raise InputTooLargeError(
            f"image is {width}×{height} = {_megapixels(width * height)} megapixels, above the "
            f"limit of {_megapixels(limit)} megapixels; resize it first"
        )
    decoded, byte_limit = width * height * channels * channel_bytes, max_image_bytes(limit)
    if decoded > byte_limit:
        raise InputTooLargeError(
            f"image is {width}×{height} × {_count(channels, 'channel')} × "
            f"{_count(channel_bytes, 'byte')} = "
            f"{_bytes(decoded)} decoded, above the limit of {_bytes(byte_limit)} "
            f"({_megapixels(limit)} megapixels of 8-bit RGB); resize it or save it with fewer "
            "channels or 8 bits per channel"
        )


def _decoded_layout(image: ImageFile.ImageFile) -> tuple[int, int]:
    """(channels, bytes per channel) of a lazily opened image, from its header."""
    channels = len(image.getbands())
    channel_bytes = np.dtype(ImageMode.getmode(image.mode).typestr).itemsize
    for tile in image.tile:  # the raw mode: PNG's is the tile's argument, TIFF's its first
        raw = tile.args[0] if isinstance(tile.args, tuple) and tile.args else tile.args
        if isinstance(raw, str) and _SIXTEEN_BIT_RAW.search(raw):
            channel_bytes = max(channel_bytes, 2)
    return channels, channel_bytes


def _megapixels(pixels: int) -> str:
    return f"{pixels / 1e6:,.2f}".rstrip("0").rstrip(".")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("s" if number != 1 else "")


def _bytes(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:,.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"


def _decode(data: bytes, limit: int) -> Image.Image:
    if not data:
        raise InvalidInputError("the image is empty (0 bytes)")
    try:
        # Lazy: parses the header, decodes nothing. Only the common formats: Pillow's other
        # decoders (TGA, PCX, SGI, EPS via Ghostscript, ...) are attack surface nobody needs here.
        image = Image.open(io.BytesIO(data), formats=_FORMAT_NAMES)
    except Image.DecompressionBombError as err:
        claimed = re.search(r"\((\d+) pixels\)", str(err))
        size = f"{_megapixels(int(claimed.group(1)))} megapixels" if claimed else "more pixels"
        raise InputTooLargeError(
            f"the image header claims {size}, above the limit of {_megapixels(limit)} megapixels"
        ) from None
    except Exception as err:  # Pillow's parsers raise many types on hostile bytes
        log.info("image header rejected: %r", err)
        raise InvalidInputError(f"the data is not a readable image (expected {_FORMATS})") from None
    _check_size(*image.size, *_decoded_layout(image), limit)
    try:
        # Open positions animated GIF/WebP/APNG and multi-page TIFF on their first frame.
        ImageOps.exif_transpose(image, in_place=True)  # in place: no second copy of the pixels
        return _to_rgb(image)
    except InputTooLargeError:
        raise
    except Exception as err:  # truncated or corrupt pixel data, bad EXIF, odd modes
        log.info("image decoding failed: %r", err)
        raise InvalidInputError(
            "the image could not be decoded (truncated or corrupt file?)"
        ) from None


def _to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB: scale 16-bit data, composite transparency over white."""
    if image.mode in _WIDE_MODES:
        image = _from_array(np.asarray(image), limit=None)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def _from_array(array: np.ndarray, limit: int | None) -> Image.Image:
    wrong_channels = array.ndim == 3 and array.shape[-1] not in (3, 4)
    if array.ndim not in (2, 3) or wrong_channels or 0 in array.shape:
        raise InvalidInputError(f"image array must be H×W, H×W×3 or H×W×4; got {array.shape}")
    if limit is not None:
        channels = 1 if array.ndim == 2 else array.shape[2]
        _check_size(array.shape[1], array.shape[0], channels, array.itemsize, limit)
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    if array.dtype == np.bool_:
        array = array.astype(np.uint8) * 255
    elif np.issubdtype(array.dtype, np.floating):
        finite = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
        array = np.clip(finite * 255.0 if finite.max() <= 1.0 else finite, 0, 255)
    elif np.issubdtype(array.dtype, np.integer) and array.max() > 255:
        # 16-bit data: scale its range to 0..255 rather than clip it to white
        top = 65535.0 if array.max() <= 65535 else float(array.max())
        array = array.astype(np.float64) * (255.0 / top)
    elif not np.issubdtype(array.dtype, np.number):
        raise InvalidInputError(f"image array must be numeric; got dtype {array.dtype}")
    image = Image.fromarray(np.clip(array, 0, 255).astype(np.uint8))
    return _to_rgb(image) if image.mode == "RGBA" else image


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
        resized = np.asarray(
            image.resize(self.size[::-1], Image.Resampling.BILINEAR), dtype=np.uint8
        )
        pixels = torch.from_numpy(resized.copy()).permute(2, 0, 1).float().div(255.0)
        mean = torch.tensor(self.mean).view(3, 1, 1)
        std = torch.tensor(self.std).view(3, 1, 1)
        normalised = ((pixels - mean) / std).unsqueeze(0).to(device)
        return ImageInputs(pixel_values=normalised, image=resized, original_size=original)
