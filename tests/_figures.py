"""What a figure of an image draws, read back: its picture (a data URI) and a map's extent."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image


def _field(trace: Any, name: str) -> Any:
    """A trace's field, from a plotly trace or its JSON (a dict)."""
    return trace.get(name) if isinstance(trace, dict) else getattr(trace, name)


def drawn_picture(trace: Any) -> np.ndarray:
    """An image trace's picture, decoded from its ``source`` (H×W×3 uint8)."""
    header, _, data = str(_field(trace, "source")).partition(",")
    assert header in {"data:image/png;base64", "data:image/jpeg;base64"}, header
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))


def extent(trace: Any) -> tuple[float, float]:
    """The (height, width) in the picture's pixels that a heatmap's cells cover."""
    rows, columns = np.asarray(_field(trace, "z")).shape[:2]
    return rows * (_field(trace, "dy") or 1.0), columns * (_field(trace, "dx") or 1.0)
