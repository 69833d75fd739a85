"""
Figures of the layer table (``attribution.layers``): pure functions of the DataFrame.

Each takes the long table (columns ``layer, head, kv_head, component, measure, value``) or the
agreement table and returns a Plotly figure; :func:`export_figure` writes one to standalone
HTML or, through kaleido (which drives a Chromium), to PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attrlab.attribution.layers.agreement import head_ranking
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_tick, token_ticks

__all__ = [
    "ablation_figure",
    "agreement_figure",
    "attention_figure",
    "export_figure",
    "head_grid_table",
    "head_heatmap",
    "layer_lines",
    "positional_figure",
    "token_layers_figure",
    "top_heads_figure",
]

_DIVERGING = "RdBu_r"


class _Scored(Protocol):
    """What the ablation figure reads of a prediction (``Prediction`` has it)."""

    @property
    def label(self) -> str: ...

    @property
    def probability(self) -> float: ...


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
        template=TEMPLATE,
    )
    return figure


def head_grid_table(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    """
    One head measure as a layers × heads table to read and click (values to 4 decimals).

    The first column names the layer (``L0``, ...); the others are ``H0``, ``H1``, ....
    """
    grid = (
        _rows(table, measure, heads=True)
        .pivot(index="layer", columns="head", values="value")
        .sort_index()
    )
    grid.columns = [f"H{int(h)}" for h in grid.columns]
    grid.insert(0, "layer", [f"L{int(layer)}" for layer in grid.index])
    return grid.round(4).reset_index(drop=True)


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
        template=TEMPLATE,
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
        template=TEMPLATE,
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
        template=TEMPLATE,
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
    figure.update_layout(title=title, template=TEMPLATE)
    return figure


def _token_axis(tokens: Sequence[str]) -> dict:
    return {
        "tickmode": "array",
        "tickvals": list(range(len(tokens))),
        "ticktext": token_ticks(tokens),
    }


def attention_figure(
    attention: np.ndarray, tokens: Sequence[str], layer: int, head: int
) -> go.Figure:
    """One head's attention weights: queries (rows) × keys (columns), token texts as ticks."""
    weights = np.asarray(attention, dtype=float)
    if weights.shape != (len(tokens), len(tokens)):
        raise ValueError(
            f"attention must be (tokens, tokens) = {(len(tokens),) * 2}; got {weights.shape}"
        )
    shown = token_ticks(tokens)
    pairs = [[f"{query} → {key}" for key in shown] for query in shown]
    figure = go.Figure(
        go.Heatmap(
            z=weights,
            colorscale="Viridis",
            zmin=0.0,
            text=pairs,
            hovertemplate="%{text}: %{z:.4f}<extra></extra>",
            colorbar={"title": "weight"},
        )
    )
    figure.update_layout(
        title=f"layer {layer}, head {head}: attention",
        xaxis={**_token_axis(tokens), "title": "key"},
        yaxis={**_token_axis(tokens), "title": "query", "autorange": "reversed"},
        template=TEMPLATE,
    )
    return figure


def token_layers_figure(
    token_per_layer: np.ndarray, tokens: Sequence[str], token: int
) -> go.Figure:
    """
    One token's relevance through the residual stream, against all tokens' mean |relevance|.

    ``token_per_layer``: ``(layers + 1, tokens)``, row ``i < N`` entering block ``i`` and row
    ``N`` leaving block ``N - 1``.
    """
    values = np.asarray(token_per_layer, dtype=float)
    if values.ndim != 2 or values.shape[1] != len(tokens) or values.shape[0] < 2:
        raise ValueError(
            f"token_per_layer must be (layers + 1, {len(tokens)} tokens); got {values.shape}"
        )
    if not 0 <= token < len(tokens):
        raise ValueError(f"token index {token} is out of range for {len(tokens)} tokens")
    blocks = values.shape[0] - 1
    steps = list(range(blocks + 1))
    where = [f"entering block {i}" for i in range(blocks)] + [f"leaving block {blocks - 1}"]
    figure = go.Figure(
        [
            go.Scatter(
                x=steps,
                y=np.abs(values).mean(axis=1),
                mode="lines",
                name="mean |relevance| of all tokens",
                line={"color": "#b0b0b0", "dash": "dot"},
                text=where,
                hovertemplate="%{text}: %{y:.4g}<extra>mean |relevance|</extra>",
            ),
            go.Scatter(
                x=steps,
                y=values[:, token],
                mode="lines+markers",
                name=f"{token_tick(tokens[token])} (position {token})",
                text=where,
                hovertemplate="%{text}: %{y:.4g}<extra></extra>",
            ),
        ]
    )
    figure.update_layout(
        title=f"relevance of {token_tick(tokens[token])} through the layers",
        xaxis={
            "tickmode": "array",
            "tickvals": steps,
            "title": f"0 = entering block 0 … {blocks} = leaving block {blocks - 1}",
        },
        yaxis_title="relevance",
        template=TEMPLATE,
    )
    return figure


def ablation_figure(
    plain: Sequence[_Scored], ablated: Sequence[_Scored], target_label: str
) -> go.Figure:
    """
    Top predictions before and after an ablation, as grouped horizontal bars.

    Labels are the union of both lists; a label missing from one list (outside its top
    predictions) has no bar there. The title gives the target's change.
    """
    before = {token_tick(p.label): float(p.probability) for p in plain}
    after = {token_tick(p.label): float(p.probability) for p in ablated}
    target_label = token_tick(target_label)
    labels = list(dict.fromkeys([*before, *after]))
    if target_label in before and target_label in after:
        old, new = before[target_label], after[target_label]
        change = f"{old:.1%} → {new:.1%} ({(new - old) * 100:+.1f} points)"
    elif target_label in before:
        change = f"{before[target_label]:.1%} → outside the top predictions"
    elif target_label in after:
        change = f"outside the top predictions → {after[target_label]:.1%}"
    else:
        change = "outside the top predictions"
    figure = go.Figure(
        [
            go.Bar(
                y=labels,
                x=[probabilities.get(label) for label in labels],
                orientation="h",
                name=name,
                marker_color=colour,
                hovertemplate="%{y}: %{x:.2%}<extra>" + name + "</extra>",
            )
            for name, probabilities, colour in (
                ("before", before, "#4c72b0"),
                ("after ablation", after, "#dd8452"),
            )
        ]
    )
    figure.update_layout(
        barmode="group",
        title=f"target <b>{target_label}</b>: {change}",
        xaxis={"title": "probability", "tickformat": ".0%"},
        yaxis={"autorange": "reversed"},
        template=TEMPLATE,
    )
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
