"""
Figures of the layer table (``attribution.layers``): pure functions of the DataFrame.

Each takes the long table (columns ``layer, head, kv_head, component, measure, value``) or the
agreement table and returns a Plotly figure; :func:`export_figure` writes one to standalone
HTML or, through kaleido (which drives a Chromium), to PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attribution.layers.agreement import head_ranking

__all__ = [
    "agreement_figure",
    "export_figure",
    "head_heatmap",
    "layer_lines",
    "positional_figure",
    "top_heads_figure",
]

_DIVERGING = "RdBu_r"


def _rows(table: pd.DataFrame, measure: str, heads: bool) -> pd.DataFrame:
    rows = table[(table["measure"] == measure) & (table["head"].notna() == heads)]
    if rows.empty:
        raise ValueError(f"the table has no {'head' if heads else 'layer'} rows of {measure!r}")
    return rows


def head_heatmap(table: pd.DataFrame, measure: str) -> go.Figure:
    """Layers × heads heatmap of one head measure; hover shows value, layer, head and kv head."""
    rows = _rows(table, measure, heads=True)
    grid = rows.pivot(index="layer", columns="head", values="value").sort_index()
    kv = rows.pivot(index="layer", columns="head", values="kv_head").reindex_like(grid)
    values = grid.to_numpy(dtype=float)
    signed = bool(np.nanmin(values) < 0 < np.nanmax(values))
    peak = float(np.nanmax(np.abs(values))) if values.size else 0.0
    figure = go.Figure(
        go.Heatmap(
            z=values,
            x=[int(h) for h in grid.columns],
            y=[int(layer) for layer in grid.index],
            customdata=kv.to_numpy(dtype=float),
            colorscale=_DIVERGING if signed else "Viridis",
            zmid=0.0 if signed else None,
            zmin=-peak if signed else None,
            zmax=peak if signed else None,
            hovertemplate=(
                "layer %{y}, head %{x} (kv head %{customdata})<br>"
                + measure
                + " = %{z:.6g}<extra></extra>"
            ),
            colorbar={"title": measure},
        )
    )
    figure.update_layout(
        title=f"{measure} per head",
        xaxis_title="head",
        yaxis_title="layer",
        template="plotly_white",
    )
    return figure


def layer_lines(
    table: pd.DataFrame, measures: Sequence[str] | None = None, normalise: bool = False
) -> go.Figure:
    """
    One line per layer measure across layers.

    ``normalise`` divides each line by its largest absolute value, so measures of different
    scales share the axis.
    """
    layer_rows = table[table["head"].isna()]
    names = list(measures) if measures is not None else list(dict.fromkeys(layer_rows["measure"]))
    figure = go.Figure()
    for name in names:
        rows = _rows(table, name, heads=False).sort_values("layer")
        values = rows["value"].to_numpy(dtype=float)
        peak = float(np.abs(values).max()) if values.size else 0.0
        shown = values / peak if normalise and peak > 0 else values
        figure.add_trace(
            go.Scatter(
                x=rows["layer"].tolist(),
                y=shown,
                mode="lines+markers",
                name=name,
                customdata=values,
                hovertemplate=name + " at layer %{x}: %{customdata:.6g}<extra></extra>",
            )
        )
    figure.update_layout(
        title="per-layer measures"
        + (" (each scaled to its largest magnitude)" if normalise else ""),
        xaxis_title="layer",
        yaxis_title="relative value" if normalise else "value",
        template="plotly_white",
    )
    return figure


def positional_figure(table: pd.DataFrame) -> go.Figure:
    """
    Token and positional relevance per layer, stacked.

    Token: the relevance entering each block (``lrp_block``); positional: PA-LRP's
    ``positional_relevance`` of that layer.
    """
    token = _rows(table, "lrp_block", heads=False).sort_values("layer")
    positional = _rows(table, "positional_relevance", heads=False).sort_values("layer")
    figure = go.Figure(
        [
            go.Bar(x=token["layer"].tolist(), y=token["value"].tolist(), name="token (residual)"),
            go.Bar(
                x=positional["layer"].tolist(), y=positional["value"].tolist(), name="positional"
            ),
        ]
    )
    figure.update_layout(
        barmode="relative",
        title="token and positional relevance per layer",
        xaxis_title="layer",
        yaxis_title="relevance",
        template="plotly_white",
    )
    return figure


def top_heads_figure(table: pd.DataFrame, estimators: Sequence[str], k: int = 10) -> go.Figure:
    """
    The ``k`` heads with the best mean rank over ``estimators``, ranked by each.

    Ranks are by ``|value|`` (1 = most important), shown as a table-like heatmap.
    """
    ranks = {}
    for name in estimators:
        magnitude = head_ranking(table, name)
        if not magnitude.empty:
            ranks[name] = magnitude.rank(ascending=False, method="min")
    if not ranks:
        raise ValueError("the table has none of these estimators: " + ", ".join(estimators))
    frame = pd.DataFrame(ranks)
    top = frame.assign(mean_rank=frame.mean(axis=1)).sort_values("mean_rank").head(k)
    labels = [f"L{int(layer)} H{int(head)}" for layer, head in top.index]
    values = top[list(ranks)].to_numpy(dtype=float)
    figure = go.Figure(
        go.Heatmap(
            z=values,
            x=list(ranks),
            y=labels,
            text=values.astype(int).astype(str),
            texttemplate="%{text}",
            colorscale="Blues_r",
            hovertemplate="%{y}: rank %{z} by %{x}<extra></extra>",
            colorbar={"title": "rank"},
        )
    )
    figure.update_layout(
        title=f"top {len(labels)} heads and their rank by each estimator",
        yaxis={"autorange": "reversed"},
        template="plotly_white",
    )
    return figure


def agreement_figure(
    pairs: pd.DataFrame, title: str = "agreement of head-importance estimators"
) -> go.Figure:
    """
    Spearman's ρ between estimators or methods (an agreement table), top-k overlap in the hover.

    ``pairs``: columns ``first, second, spearman, top_k_overlap``, one row per pair.
    """
    names = list(dict.fromkeys([*pairs["first"], *pairs["second"]]))
    size = len(names)
    rho, overlap = np.eye(size), np.eye(size)
    for row in pairs.itertuples(index=False):
        i, j = names.index(row.first), names.index(row.second)
        rho[i, j] = rho[j, i] = row.spearman
        overlap[i, j] = overlap[j, i] = row.top_k_overlap
    figure = go.Figure(
        go.Heatmap(
            z=rho,
            x=names,
            y=names,
            customdata=overlap,
            zmin=-1.0,
            zmax=1.0,
            colorscale=_DIVERGING,
            text=np.round(rho, 2).astype(str),
            texttemplate="%{text}",
            hovertemplate=(
                "%{y} vs %{x}<br>Spearman ρ = %{z:.3f}<br>top-k overlap = %{customdata:.2f}"
                "<extra></extra>"
            ),
            colorbar={"title": "ρ"},
        )
    )
    figure.update_layout(title=title, template="plotly_white")
    return figure


def export_figure(figure: go.Figure, path: str | Path) -> Path:
    """
    Write ``figure`` to ``path`` by its suffix.

    ``.html``: standalone, Plotly's JavaScript inlined; ``.png``: rendered by kaleido in a
    headless Chromium.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix == ".html":
        figure.write_html(target, include_plotlyjs=True, full_html=True)
    elif suffix == ".png":
        figure.write_image(target, format="png")
    else:
        raise ValueError(f"export to .html or .png; got {target.name!r}")
    return target
