"""
Figures of a pruning study's weight units: per-layer score maps and the agreement scatter.

Pure functions of the library's data (:mod:`attribution.engine.score_views`): a channel or
expert kind's scores as one layers × index heatmap per estimator (:func:`score_map_figure`),
and each estimator's score at the sites removed alone against their exact effect, its panel
titled with Pearson's r and Spearman's ρ, each site marked by why it was removed
(:func:`effect_scatter_figure`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attrlab.attribution.engine.score_views import EffectScatter, ScoreGrid
from attrlab.viz.theme import TEMPLATE

__all__ = ["effect_scatter_figure", "score_map_figure"]

#: Panels side by side before a new row starts.
_COLUMNS = 2
#: How each reason a site was removed is drawn: its name for people, its marker.
_CHOSEN = {
    "all": ("every site", "circle", "#4c72b0"),
    "sample": ("uniform sample", "circle", "#4c72b0"),
    "top": ("an estimator's highest", "triangle-up", "#c44e52"),
    "bottom": ("an estimator's lowest", "triangle-down", "#55a868"),
}


def _grid(panels: int) -> tuple[int, int]:
    columns = min(_COLUMNS, panels)
    return math.ceil(panels / columns), columns


def _rate(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def score_map_figure(grids: Mapping[str, ScoreGrid], unit: str) -> go.Figure:
    """
    Each estimator's scores of ``unit`` as a layers × channel (or expert) heatmap.

    One panel per estimator, each on its own colour scale (estimators' scores are in different
    units): its title gives its range; the hover gives each site and its score.

    Raises:
        ValueError: no grids.
    """
    if not grids:
        raise ValueError(f"no score grid of {unit}s to draw")
    rows, columns = _grid(len(grids))
    titles = [
        f"{name} ({np.nanmin(g.values):.3g} … {np.nanmax(g.values):.3g})"
        for name, g in grids.items()
    ]
    figure = make_subplots(
        rows=rows,
        cols=columns,
        subplot_titles=titles,
        horizontal_spacing=0.08,
        vertical_spacing=0.3 / rows,
    )
    for i, (name, grid) in enumerate(grids.items()):
        row, col = divmod(i, columns)
        figure.add_trace(
            go.Heatmap(
                z=grid.values,
                x=np.arange(grid.values.shape[1]),
                y=grid.layers,
                colorscale="Viridis",
                showscale=False,
                name=name,
                hovertemplate=(
                    f"{name}: layer %{{y}}, {grid.axis} %{{x}}: %{{z:.4g}}<extra></extra>"
                ),
            ),
            row=row + 1,
            col=col + 1,
        )
    axis = next(iter(grids.values())).axis
    figure.update_xaxes(title_text=axis)
    figure.update_yaxes(title_text="layer", autorange="reversed")
    figure.update_layout(
        title={"text": f"{unit} scores per layer, by each estimator", "font": {"size": 15}},
        height=120 + 260 * rows,
        width=520 * columns,
        margin={"l": 60, "r": 20, "t": 90, "b": 50},
        template=TEMPLATE,
    )
    return figure


def effect_scatter_figure(scatters: Mapping[str, EffectScatter], unit: str) -> go.Figure:
    """
    Each estimator's score (x) at the ``unit`` sites removed alone against their exact effect (y).

    One panel per estimator titled with Pearson's r and Spearman's ρ (of the importances, as
    the agreement table's); a site's marker says why it was removed (every site, the uniform
    sample, an estimator's highest or lowest).

    Raises:
        ValueError: no scatters.
    """
    if not scatters:
        raise ValueError(f"no agreement with exact removal of {unit}s to draw")
    rows, columns = _grid(len(scatters))
    titles = [
        f"{name}: r = {_rate(s.pearson)}, ρ = {_rate(s.spearman)}" for name, s in scatters.items()
    ]
    figure = make_subplots(
        rows=rows,
        cols=columns,
        subplot_titles=titles,
        horizontal_spacing=0.1,
        vertical_spacing=0.3 / rows,
    )
    shown: set[str] = set()
    for i, (name, scatter) in enumerate(scatters.items()):
        row, col = divmod(i, columns)
        chosen = np.array(scatter.chosen)
        for why, (label, symbol, colour) in _CHOSEN.items():
            picked = np.flatnonzero(chosen == why)
            if not picked.size:
                continue
            figure.add_trace(
                go.Scatter(
                    x=scatter.scores[picked],
                    y=scatter.effects[picked],
                    mode="markers",
                    marker={"size": 6, "opacity": 0.7, "symbol": symbol, "color": colour},
                    text=[str(scatter.sites[j]) for j in picked],
                    name=label,
                    legendgroup=why,
                    showlegend=why not in shown,
                    hovertemplate=(
                        f"{unit} %{{text}} ({label})<br>{name} %{{x:.4g}}"
                        "<br>exact effect %{y:.4g}<extra></extra>"
                    ),
                ),
                row=row + 1,
                col=col + 1,
            )
            shown.add(why)
    figure.update_xaxes(title_text="estimator's score")
    figure.update_yaxes(title_text="exact effect (drop of log p)")
    figure.update_layout(
        title={
            "text": f"each {unit} removed alone: its exact effect against each estimator's score",
            "font": {"size": 15},
        },
        height=120 + 300 * rows,
        width=520 * columns,
        margin={"l": 70, "r": 20, "t": 90, "b": 50},
        template=TEMPLATE,
    )
    return figure
