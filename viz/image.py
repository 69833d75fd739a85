"""
Pixel-level views of an image Explanation.

Every figure draws a display copy of the image (:func:`display_copy`, longest side at most
:data:`DISPLAY_MAX_SIDE`), encoded as a JPEG or a PNG (:func:`picture_uri`), with each map over
it at the model's resolution (never finer than the copy), stretched over the picture and smoothed
by the browser: a figure's size is bounded whatever the image's, and a figure of panels shares
one copy's area between them, so its size does not grow with their number either. The
Explanation keeps its own map, at the model's resolution.
"""

from __future__ import annotations

import base64
import io
import math
import textwrap
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from PIL import Image
from plotly.subplots import make_subplots

from attrlab.attribution.explanation import Explanation
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.view import IMAGE_VIEW, View, robust_peak

__all__ = [
    "DISPLAY_MAX_SIDE",
    "display_copy",
    "fit_map",
    "heatmap_overlay",
    "image_figure",
    "image_grid_figure",
    "map_panels_figure",
    "picture_uri",
    "robust_peak",
    "scaled_overlay",
    "scores_overlay",
    "std_error_figure",
]

#: Longest side, in pixels, of the image a figure draws (a figure's payload grows with its area).
DISPLAY_MAX_SIDE = 1024
#: JPEG quality of a photograph under the maps (the cat: a sixth of its PNG, no artefact seen).
JPEG_QUALITY = 90
#: Decimals of a scaled map's hover value; the map is stored rounded to them.
HOVER_DECIMALS = 3


def display_copy(image: np.ndarray | Image.Image, max_side: int = DISPLAY_MAX_SIDE) -> np.ndarray:
    """
    ``image`` (H×W×3 uint8 or a PIL image) reduced, aspect kept, to at most ``max_side`` a side.

    An image within the bound comes back as it is; a larger one is resampled (bilinear, with
    Pillow's fast box reduction first) without a full-size array being made of a PIL image.
    """
    if max_side < 1:
        raise ValueError(f"max_side must be at least 1; got {max_side}")
    if isinstance(image, Image.Image):
        width, height = image.size
    else:
        height, width = image.shape[:2]
    if max(height, width) <= max_side:
        return np.asarray(image)
    scale = max_side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    picture = image if isinstance(image, Image.Image) else Image.fromarray(image)
    return np.asarray(picture.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0))


def fit_map(scores: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``scores`` resized (bilinear) to an image of ``shape``."""
    if scores.shape == shape:
        return scores
    image = Image.fromarray(scores.astype(np.float32), mode="F")
    return np.asarray(image.resize(shape[::-1], Image.Resampling.BILINEAR), dtype=np.float64)


def heatmap_overlay(
    explanation: Explanation, image: np.ndarray, alpha: float = 0.6, view: View = IMAGE_VIEW
) -> np.ndarray:
    """
    Blend the score map onto ``image`` (H×W×3 uint8) in ``view``'s colours.

    Each pixel takes its scaled score's colour, weighted by ``alpha`` times its strength
    (|scaled score|, in [0, 1]): a zero score leaves the pixel as it was. By default red is
    positive, blue negative, strength |score| over the 99th percentile of |score|, clipped.
    """
    return scores_overlay(explanation.scores, image, alpha, view)


def scores_overlay(
    scores: np.ndarray, image: np.ndarray, alpha: float = 0.6, view: View = IMAGE_VIEW
) -> np.ndarray:
    """A map of ``scores`` (any H×W, resized to ``image``) blended as :func:`heatmap_overlay`."""
    scaled = view.scaled({"": fit_map(scores, image.shape[:2])})[""]
    return scaled_overlay(scaled, image, alpha, view)


def scaled_overlay(
    scaled: np.ndarray, image: np.ndarray, alpha: float = 0.6, view: View = IMAGE_VIEW
) -> np.ndarray:
    """Values already in ``view``'s scale (H×W of ``image``) blended as :func:`heatmap_overlay`."""
    weight = alpha * np.abs(scaled)[..., None]
    blended = image.astype(np.float64) * (1 - weight) + view.colours(scaled) * weight
    return blended.clip(0, 255).astype(np.uint8)


def picture_uri(image: np.ndarray) -> str:
    """
    ``image`` (H×W×3 uint8) as the data URI a figure draws: a PNG or a JPEG, whichever is smaller.

    A photograph is several times smaller as a JPEG (quality :data:`JPEG_QUALITY`); a drawing
    (flat colours, sharp edges) is smaller as a PNG, which is also exact.
    """
    picture = Image.fromarray(np.ascontiguousarray(image)).convert("RGB")
    encoded = {}
    for kind, options in (("png", {}), ("jpeg", {"quality": JPEG_QUALITY})):
        buffer = io.BytesIO()
        picture.save(buffer, format=kind.upper(), **options)
        encoded[kind] = buffer.getvalue()
    kind = min(encoded, key=lambda k: len(encoded[k]))
    return f"data:image/{kind};base64,{base64.b64encode(encoded[kind]).decode('ascii')}"


def _cells(scores: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A map at its own resolution, reduced (bilinear) only where it is finer than ``shape``."""
    return fit_map(scores, (min(scores.shape[0], shape[0]), min(scores.shape[1], shape[1])))


def _map_trace(
    cells: np.ndarray, shape: tuple[int, int], decimals: int | None, **style: object
) -> go.Heatmap:
    """
    A heatmap of ``cells`` stretched over a picture of ``shape`` (in its pixel coordinates).

    The browser smooths the cells (bilinear, as the map was resized before). With
    ``decimals`` (what the hover shows) the values are those decimals, written as numbers: the
    hover reads as before, and the text deflates to well under float32's base64 (a noisy 224²
    map: 87 against 124 kB). Without, float32 as they are.
    """
    height, width = shape
    dy, dx = height / cells.shape[0], width / cells.shape[1]
    values = cells.astype(np.float32) if decimals is None else cells.round(decimals).tolist()
    return go.Heatmap(
        z=values, x0=(dx - 1) / 2, dx=dx, y0=(dy - 1) / 2, dy=dy, zsmooth="best", **style
    )


def _hover(name: str = "") -> str:
    """A scaled map's hover: the picture's pixel and the value, to :data:`HOVER_DECIMALS`."""
    return f"(%{{x:.0f}}, %{{y:.0f}}): %{{z:.{HOVER_DECIMALS}f}}<extra>{name}</extra>"


def image_figure(explanation: Explanation, image: np.ndarray, view: View = IMAGE_VIEW) -> go.Figure:
    """The image (its display copy) with the score map, in ``view``, as a heatmap on top."""
    image = display_copy(image)
    low, high = view.colour_range
    heatmap = _map_trace(
        view.scaled({"": _cells(explanation.scores, image.shape[:2])})[""],
        image.shape[:2],
        HOVER_DECIMALS,
        colorscale=view.colorscale,
        zmin=low,
        zmax=high,
        opacity=0.55,
        colorbar={"title": _wrapped(view.describe())},
        hovertemplate=_hover(),
    )
    return _over_image(image, heatmap, f"{explanation.method} → {explanation.target.label}")


def _over_image(image: np.ndarray, heatmap: go.Heatmap, title: str) -> go.Figure:
    """``image`` with ``heatmap`` on top, in the image's own aspect, axes hidden."""
    figure = go.Figure(go.Image(source=picture_uri(image), hoverinfo="skip"))
    figure.add_trace(heatmap)
    figure.update_layout(
        template=TEMPLATE,
        title=title,
        yaxis={"autorange": "reversed", "scaleanchor": "x", "visible": False},
        xaxis={"visible": False},
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        height=420,
    )
    return figure


def image_grid_figure(
    explanations: Mapping[str, Explanation],
    image: np.ndarray,
    opacity: float = 0.55,
    view: View = IMAGE_VIEW,
) -> go.Figure:
    """
    One panel per method: ``image`` with the method's map over it, side by side.

    The maps are scaled by ``view`` (by default each over its own 99th percentile of |score|,
    since methods have different units) and drawn on one colour scale with one colour bar
    saying which view it is.
    """
    if not explanations:
        raise ValueError("image_grid_figure needs at least one explanation")
    if any(e.tokens is not None for e in explanations.values()):
        raise ValueError("image_grid_figure needs image explanations")
    panels = {f"{m} → {e.target.label}": (m, e.scores) for m, e in explanations.items()}
    return map_panels_figure(panels, image, opacity, view=view)


def map_panels_figure(
    panels: Mapping[str, tuple[str, np.ndarray]],
    image: np.ndarray,
    opacity: float = 0.55,
    quantity: str = "relevance",
    view: View = IMAGE_VIEW,
) -> go.Figure:
    """
    Panels side by side, each ``image`` under a map, keyed by title: (name, map).

    Each map is drawn at its own resolution (reduced where finer than the panel's copy) over
    the copy and scaled by ``view`` (by default signed, each over its own robust peak), on one
    colour scale with one colour bar naming the view and the ``quantity`` the maps hold. The
    panels share one display copy's area (:data:`DISPLAY_MAX_SIDE` squared): each copy's side
    is that over √(panels).
    """
    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f"opacity must lie in [0, 1]; got {opacity}")
    if not panels:
        raise ValueError("map_panels_figure needs at least one panel")
    image = display_copy(image, max(1, math.isqrt(DISPLAY_MAX_SIDE**2 // len(panels))))
    scaled = view.scaled(
        {title: _cells(scores, image.shape[:2]) for title, (_, scores) in panels.items()}
    )
    low, high = view.colour_range
    picture = picture_uri(image)
    figure = make_subplots(
        rows=1, cols=len(panels), subplot_titles=list(panels), horizontal_spacing=0.02
    )
    for column, (title, (name, _)) in enumerate(panels.items(), start=1):
        figure.add_trace(go.Image(source=picture, hoverinfo="skip"), row=1, col=column)
        figure.add_trace(
            _map_trace(
                scaled[title],
                image.shape[:2],
                HOVER_DECIMALS,
                colorscale=view.colorscale,
                zmin=low,
                zmax=high,
                opacity=opacity,
                showscale=column == 1,
                colorbar={"title": _wrapped(view.describe(quantity))},
                name=name,
                hovertemplate=_hover(name),
            ),
            row=1,
            col=column,
        )
        figure.update_yaxes(scaleanchor="x" if column == 1 else f"x{column}", row=1, col=column)
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False, autorange="reversed")
    figure.update_layout(height=360, margin={"l": 10, "r": 10, "t": 40, "b": 10}, template=TEMPLATE)
    return figure


def _wrapped(text: str, width: int = 24) -> str:
    """A colour bar's title broken into lines (Plotly does not wrap it)."""
    return "<br>".join(textwrap.wrap(text, width))


def std_error_figure(explanation: Explanation, image: np.ndarray) -> go.Figure:
    """A sampling method's standard error map (``maps["std_error"]``) over ``image``'s copy."""
    if "std_error" not in explanation.maps or explanation.tokens is not None:
        raise ValueError(f"{explanation.method!r} has no standard-error map of an image")
    image = display_copy(image)
    heatmap = _map_trace(
        _cells(explanation.maps["std_error"], image.shape[:2]),
        image.shape[:2],
        None,
        colorscale="Viridis",
        zmin=0.0,
        opacity=0.6,
        colorbar={"title": "standard error"},
    )
    return _over_image(image, heatmap, f"{explanation.method}: standard error of the map")
