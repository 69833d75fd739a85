"""Pixel-level views of an image Explanation."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from attribution.explanation import Explanation

__all__ = ["heatmap_overlay", "image_figure", "robust_peak"]

_POSITIVE = np.array([214, 39, 40], dtype=np.float64)
_NEGATIVE = np.array([31, 119, 180], dtype=np.float64)


def _fit(scores: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    if scores.shape == shape:
        return scores
    image = Image.fromarray(scores.astype(np.float32), mode="F")
    return np.asarray(image.resize(shape[::-1], Image.BILINEAR), dtype=np.float64)


def robust_peak(scores: np.ndarray, percentile: float = 99.0) -> float:
    """Scale of a map: a high percentile of |scores|, so one outlier pixel cannot wash it out."""
    peak = float(np.percentile(np.abs(scores), percentile))
    return peak if peak > 0 else float(np.abs(scores).max())


def heatmap_overlay(explanation: Explanation, image: np.ndarray, alpha: float = 0.6) -> np.ndarray:
    """
    Blend the score map onto ``image`` (H×W×3 uint8): red positive, blue negative.

    Colour strength is |score| over the map's 99th percentile of |score|, clipped to 1.
    """
    scores = _fit(explanation.scores, image.shape[:2])
    peak = robust_peak(scores)
    strength = (np.abs(scores) / peak if peak > 0 else np.zeros_like(scores)).clip(0, 1)[..., None]
    colour = np.where(scores[..., None] >= 0, _POSITIVE, _NEGATIVE)
    weight = alpha * strength
    blended = image.astype(np.float64) * (1 - weight) + colour * weight
    return blended.clip(0, 255).astype(np.uint8)


def image_figure(explanation: Explanation, image: np.ndarray) -> go.Figure:
    """The image with the score map as a semi-transparent diverging heatmap on top."""
    scores = _fit(explanation.scores, image.shape[:2])
    peak = robust_peak(scores) or 1.0
    figure = go.Figure(go.Image(z=image))
    figure.add_trace(
        go.Heatmap(
            z=scores,
            colorscale="RdBu_r",
            zmin=-peak,
            zmax=peak,
            opacity=0.55,
            colorbar={"title": "relevance"},
        )
    )
    figure.update_layout(
        title=f"{explanation.method} → {explanation.target.label}",
        yaxis={"autorange": "reversed", "scaleanchor": "x", "visible": False},
        xaxis={"visible": False},
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        height=420,
    )
    return figure
