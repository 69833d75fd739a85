"""An image and a prompt's map: the image part over the pixels, the text part beside it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.image_text import image_heatmaps, map_parts
from attrlab.viz.answer import answer_layout
from attrlab.viz.image import (
    HOVER_DECIMALS,
    _map_trace,
    display_copy,
    fit_map,
    picture_uri,
    scaled_overlay,
)
from attrlab.viz.text import diverging_colour
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_tick, token_ticks
from attrlab.viz.view import IMAGE_VIEW, View

__all__ = ["image_part_html", "image_text_figure"]


def image_text_figure(
    explanation: Explanation,
    image: np.ndarray | Sequence[np.ndarray],
    view: View = IMAGE_VIEW,
    step: int | None = None,
) -> go.Figure:
    """
    Left: each image with its visual tokens' values over their regions; right: the text tokens.

    ``image``: the image, or the images of a prompt that holds several (one panel each). The
    heatmaps are ``maps["image_heatmap"]`` (``maps["image_heatmap_1"]``, ... for several:
    :mod:`attribution.image_text`), in ``view``'s scale, one for all the panels of the map (an
    image the answer rests on less looks paler); pixels no region reaches stay bare.
    The bars are the other positions' scores (the visual ones left out). The panels' titles
    give each image's and the text's shares of |relevance|. ``step``: that answer step's map
    instead (a row of ``maps["steps"]``, split by :func:`~attribution.image_text.map_parts`).

    Raises:
        ValueError: an Explanation without an image part (not of an image and a prompt), as
            many images as its map has heatmaps, or without that step.
    """
    heats = image_heatmaps(explanation.maps)
    if not heats or "visual_mask" not in explanation.maps or explanation.token_texts is None:
        raise ValueError("image_text_figure needs the Explanation of an image and a prompt")
    pictures = [image] if isinstance(image, np.ndarray) else list(image)
    if len(pictures) != len(heats):
        raise ValueError(f"{len(pictures)} images given for a map of {len(heats)}")
    several = len(heats) > 1
    keys = [f"image_{n}" for n in range(1, len(heats) + 1)] if several else ["image"]
    nan = float("nan")
    shares = [explanation.metrics.get(f"{key}_share", nan) for key in [*keys, "text"]]
    scores = explanation.scores
    target = token_tick(explanation.target.label)
    if step is not None:
        steps = explanation.maps.get("steps")
        if steps is None or not 0 <= step < len(steps):
            count = 0 if steps is None else len(steps)
            raise ValueError(f"the map has {count} answer steps; there is no step {step + 1}")
        parts = map_parts(explanation.maps, steps[step])
        heats, scores = list(parts.heatmaps), steps[step]
        shares = [*parts.image_shares, parts.text_share]
        layout = answer_layout(explanation)
        said = layout.steps[step].label if layout and step < len(layout.steps) else ""
        target = f"step {step + 1}: {token_tick(said)}"
    low, high = view.colour_range
    names = [key.replace("_", " ") for key in keys]
    figure = make_subplots(
        rows=1,
        cols=len(heats) + 1,
        column_widths=[0.45 / len(heats)] * len(heats) + [0.55],
        subplot_titles=[
            f"{name}: {share:.0%} of |relevance|"
            for name, share in zip([*names, "text"], shares, strict=True)
        ],
    )
    scaled = _one_scale(heats, view)
    for col, (picture, heat) in enumerate(zip(pictures, heats, strict=True), 1):
        shown = display_copy(picture)
        cells = np.where(np.isnan(heat), np.nan, scaled[col - 1]).astype(np.float32)
        figure.add_trace(go.Image(source=picture_uri(shown), hoverinfo="skip"), row=1, col=col)
        figure.add_trace(
            _map_trace(
                cells,
                shown.shape[:2],
                None,
                colorscale=view.colorscale,
                zmin=low,
                zmax=high,
                opacity=0.55,
                showscale=False,
                hovertemplate=(
                    f"(%{{x:.0f}}, %{{y:.0f}}): %{{z:.{HOVER_DECIMALS}f}}<extra></extra>"
                ),
            ),
            row=1,
            col=col,
        )
        figure.update_xaxes(visible=False, row=1, col=col)
        anchor = "x" if col == 1 else f"x{col}"
        figure.update_yaxes(autorange="reversed", scaleanchor=anchor, visible=False, row=1, col=col)
    text_col = len(heats) + 1
    positions = np.flatnonzero(explanation.maps["visual_mask"] == 0).tolist()
    ticks = token_ticks(explanation.token_texts)
    scores = scores[positions]
    figure.add_trace(
        go.Bar(
            x=list(range(len(positions))),
            y=scores,
            marker_color=[f"rgb{diverging_colour(1.0 if s >= 0 else -1.0)}" for s in scores],
            hovertext=[ticks[i] for i in positions],
        ),
        row=1,
        col=text_col,
    )
    figure.update_xaxes(
        tickmode="array",
        tickvals=list(range(len(positions))),
        ticktext=[ticks[i] for i in positions],
        row=1,
        col=text_col,
    )
    figure.update_layout(
        template=TEMPLATE,
        title=f"{explanation.method} → {target}",
        showlegend=False,
        margin={"l": 10, "r": 10, "t": 60, "b": 80},
        height=420,
    )
    return figure


def image_part_html(
    explanation: Explanation, image: np.ndarray | Sequence[np.ndarray], view: View = IMAGE_VIEW
) -> str:
    """
    The image part for a notebook: each heatmap blended over its image, the shares.

    ``image``: the image, or the images of a prompt that holds several. Pixels no region
    reaches stay bare, and the images share one scale, as in :func:`image_text_figure`.
    """
    heats = image_heatmaps(explanation.maps)
    pictures = [image] if isinstance(image, np.ndarray) else list(image)
    several = len(heats) > 1
    nan = float("nan")
    copies = [display_copy(picture) for picture in pictures]
    fitted = [
        fit_map(np.where(np.isnan(heat), 0.0, heat), copy.shape[:2])
        for heat, copy in zip(heats, copies, strict=True)
    ]
    shown = []
    scales = _one_scale(fitted, view)
    for number, (scaled, copy) in enumerate(zip(scales, copies, strict=True), 1):
        uri = picture_uri(scaled_overlay(scaled, copy, view=view))
        share = explanation.metrics.get(f"image_{number}_share", nan)
        caption = f"<figcaption>image {number}: {share:.0%}</figcaption>" if several else ""
        shown.append(f'<img src="{uri}" alt="image part of the map" style="width:224px">{caption}')
    shares = ", ".join(
        f"{part}: {explanation.metrics.get(part + '_share', nan):.0%}" for part in ("image", "text")
    )
    return (
        '<figure class="attrlab-image-part" style="margin:0 0 8px 0">'
        f"{''.join(shown)}<figcaption>{shares} of |relevance|</figcaption></figure>"
    )


def _one_scale(heats: Sequence[np.ndarray], view: View) -> list[np.ndarray]:
    """
    One map's image parts (NaN as 0) in ``view``'s scale, one for all the images.

    The scale ends at the largest of their ends, so an image the answer rests on less looks
    paler than the others.
    """
    cleared = {str(k): np.where(np.isnan(heat), 0.0, heat) for k, heat in enumerate(heats)}
    scaled = replace(view, shared_scale=True).scaled(cleared)
    return [scaled[str(k)] for k in range(len(heats))]
