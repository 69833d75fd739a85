"""An image and a prompt's map: the image part over the pixels, the text part beside it."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.image_text import map_parts
from attrlab.viz.answer import answer_layout
from attrlab.viz.image import (
    HOVER_DECIMALS,
    _map_trace,
    display_copy,
    picture_uri,
    scores_overlay,
)
from attrlab.viz.text import diverging_colour
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_tick, token_ticks
from attrlab.viz.view import IMAGE_VIEW, View

__all__ = ["image_part_html", "image_text_figure"]


def image_text_figure(
    explanation: Explanation, image: np.ndarray, view: View = IMAGE_VIEW, step: int | None = None
) -> go.Figure:
    """
    Left: ``image`` with the visual tokens' values over their regions; right: the text tokens.

    The heatmap is ``maps["image_heatmap"]`` (:mod:`attribution.image_text`), in ``view``'s
    scale; pixels no region reaches stay bare. The bars are the other positions' scores (the
    visual ones left out). The title gives the image's and the text's shares of |relevance|.
    ``step``: that answer step's map instead (a row of ``maps["steps"]``, split by
    :func:`~attribution.image_text.map_parts`).

    Raises:
        ValueError: an Explanation without an image part (not of an image and a prompt), or
            without that step.
    """
    heat = explanation.maps.get("image_heatmap")
    if heat is None or "visual_mask" not in explanation.maps or explanation.token_texts is None:
        raise ValueError("image_text_figure needs the Explanation of an image and a prompt")
    scores = explanation.scores
    shares = [explanation.metrics.get(f"{part}_share", float("nan")) for part in ("image", "text")]
    target = token_tick(explanation.target.label)
    if step is not None:
        steps = explanation.maps.get("steps")
        if steps is None or not 0 <= step < len(steps):
            count = 0 if steps is None else len(steps)
            raise ValueError(f"the map has {count} answer steps; there is no step {step + 1}")
        parts = map_parts(explanation.maps, steps[step])
        heat, scores = parts.heatmap, steps[step]
        shares = [parts.image_share, parts.text_share]
        layout = answer_layout(explanation)
        said = layout.steps[step].label if layout and step < len(layout.steps) else ""
        target = f"step {step + 1}: {token_tick(said)}"
    picture = display_copy(image)
    shape = picture.shape[:2]
    reached = ~np.isnan(heat)
    scaled = view.scaled({"": np.where(reached, heat, 0.0)})[""]
    cells = np.where(reached, scaled, np.nan).astype(np.float32)
    low, high = view.colour_range
    figure = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        subplot_titles=(
            f"image: {shares[0]:.0%} of |relevance|",
            f"text: {shares[1]:.0%} of |relevance|",
        ),
    )
    figure.add_trace(go.Image(source=picture_uri(picture), hoverinfo="skip"), row=1, col=1)
    figure.add_trace(
        _map_trace(
            cells,
            shape,
            None,
            colorscale=view.colorscale,
            zmin=low,
            zmax=high,
            opacity=0.55,
            showscale=False,
            hovertemplate=f"(%{{x:.0f}}, %{{y:.0f}}): %{{z:.{HOVER_DECIMALS}f}}<extra></extra>",
        ),
        row=1,
        col=1,
    )
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
        col=2,
    )
    figure.update_xaxes(visible=False, row=1, col=1)
    figure.update_yaxes(autorange="reversed", scaleanchor="x", visible=False, row=1, col=1)
    figure.update_xaxes(
        tickmode="array",
        tickvals=list(range(len(positions))),
        ticktext=[ticks[i] for i in positions],
        row=1,
        col=2,
    )
    figure.update_layout(
        template=TEMPLATE,
        title=f"{explanation.method} → {target}",
        showlegend=False,
        margin={"l": 10, "r": 10, "t": 60, "b": 80},
        height=420,
    )
    return figure


def image_part_html(explanation: Explanation, image: np.ndarray, view: View = IMAGE_VIEW) -> str:
    """
    The image part for a notebook: ``maps["image_heatmap"]`` blended over ``image``, the shares.

    Pixels no region reaches stay bare, as in :func:`image_text_figure`.
    """
    heat = explanation.maps["image_heatmap"]
    picture = display_copy(image)
    uri = picture_uri(scores_overlay(np.where(np.isnan(heat), 0.0, heat), picture, view=view))
    shares = ", ".join(
        f"{part}: {explanation.metrics.get(part + '_share', float('nan')):.0%}"
        for part in ("image", "text")
    )
    return (
        '<figure class="attrlab-image-part" style="margin:0 0 8px 0">'
        f'<img src="{uri}" alt="image part of the map" style="width:224px">'
        f"<figcaption>{shares} of |relevance|</figcaption></figure>"
    )
