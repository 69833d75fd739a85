"""
Figures of the layer table (``attribution.layers``): pure functions of the DataFrame.

Each takes the long table (columns ``layer, head, kv_head, component, measure, value``) or the
agreement table and returns a Plotly figure; :func:`export_figure` writes one to standalone
HTML or, through kaleido (which drives a Chromium), to PNG.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attrlab.attribution.layers.agreement import head_ranking
from attrlab.viz.stills import write_stills
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_label, token_tick, token_ticks

__all__ = [
    "ablation_figure",
    "ablation_note",
    "agreement_figure",
    "attention_figure",
    "export_figure",
    "head_heatmap",
    "head_rank_table",
    "layer_lines",
    "measure_note",
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


#: What each measure's value means, and its sign; ``{target}`` is the explained output.
_NOTES = {
    "head_gradient": (
        "|∂ log p({target}) / ∂ξ| for a gate ξ scaling the head's output (Michel et al. 2019): "
        "how strongly p({target}) reacts to the head. Never negative; larger = more important."
    ),
    "head_lrp": (
        "AttnLRP relevance for {target} passing through the head. Positive (red): the head "
        "supports {target}; negative (blue): it speaks against {target}."
    ),
    "ablation_zero": (
        "Change of the logit of {target} when the head's output is zeroed (without the head "
        "minus as is). Negative (blue): the head supported {target}, whose logit falls without "
        "it; positive (red): the head worked against {target}."
    ),
    "ablation_mean": (
        "Change of the logit of {target} when the head's output is replaced by its mean over "
        "the sequence (ablated minus as is). Negative (blue): the head's token-specific output "
        "supported {target}; positive (red): it worked against {target}."
    ),
    "entropy": (
        "Attention entropy ÷ log(visible keys), mean over queries: 0 = each query looks at one "
        "token, 1 = attention spread evenly. It does not depend on the target."
    ),
    "sink_share": (
        "Share of attention on the first token, mean over queries (0 to 1). It does not depend "
        "on the target."
    ),
    "block_influence": "1 − cos(input, output) of the block on the residual stream.",
    "skip_logprob": (
        "Change of log p({target}) with the block bypassed: negative = the block supported "
        "{target}."
    ),
    "skip_kl": "KL(p ‖ p with the block bypassed): how much the whole prediction changes.",
    "lrp_block": "AttnLRP relevance for {target} entering the block.",
    "lrp_attention": "AttnLRP relevance for {target} through the block's attention.",
    "lrp_mlp": "AttnLRP relevance for {target} through the block's MLP.",
    "positional_relevance": "PA-LRP relevance for {target} on the positional encoding.",
    "lens_probability": "p({target}) read from the block's output (logit lens).",
    "lens_rank": "Rank of {target} read from the block's output (logit lens; 1 = top).",
    "lens_score": (
        "log p({target}) read from the block's output (logit lens): an answer's tokens summed, "
        "a contrast's difference of two."
    ),
}


def measure_note(measure: str, target: str | None = None) -> str:
    """
    One or two sentences on what ``measure``'s values mean, its sign included.

    ``target`` (the explained output's label) is named in them; without it, "the target".
    An unknown measure gets an empty note.
    """
    named = "the target" if target is None else f"'{token_label(target)}'"
    return _NOTES.get(measure, "").format(target=named)


def ablation_note(heads: str, target: str, before: float, after: float) -> str:
    """
    The change of the target's probability when ``heads`` are ablated, and its sign's meaning.

    Markdown: the heads and the change in bold, then one sentence on the sign; the target's
    label is named (as :func:`viz.tokens.token_label` shows it, quoted) and escaped.
    """
    change = after - before
    named = html.escape(f"'{token_label(target)}'", quote=False)
    if change < 0:
        meaning = (
            f"negative: together these heads supported {named}; without them it is less likely"
        )
    elif change > 0:
        meaning = f"positive: these heads worked against {named}; without them it is more likely"
    else:
        meaning = f"no change: these heads do not move {named}"
    return (
        f"**{html.escape(heads, quote=False)}** ablated: probability of {named} "
        f"{before:.4f} → {after:.4f} (**{change:+.4f}**, {meaning})."
    )


def head_heatmap(table: pd.DataFrame, measure: str, target: str | None = None) -> go.Figure:
    """
    Layers × heads heatmap of one head measure; hover shows value, layer, head and kv head.

    A signed measure is drawn on a diverging scale centred on 0. Its height grows with the
    number of layers, so each row stays clickable.
    """
    rows = _rows(table, measure, heads=True)
    grid = rows.pivot(index="layer", columns="head", values="value").sort_index()
    kv = rows.pivot(index="layer", columns="head", values="kv_head").reindex_like(grid)
    values = grid.to_numpy(dtype=float)
    signed = bool(np.nanmin(values) < 0 < np.nanmax(values))
    peak = float(np.nanmax(np.abs(values))) if values.size else 0.0
    layers, heads = values.shape
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
            xgap=1,
            ygap=1,
            hovertemplate=(
                "layer %{y}, head %{x} (kv head %{customdata})<br>"
                + measure
                + " = %{z:.6g}<br>click: choose this head<extra></extra>"
            ),
            colorbar={"title": {"text": measure, "side": "right"}},
        )
    )
    about = "" if target is None else f" for '{token_tick(target)}'"
    figure.update_layout(
        title={"text": f"{measure} per head{about}", "font": {"size": 15}},
        xaxis={"title": "head", "dtick": 1 if heads <= 16 else None},
        yaxis={"title": "layer", "dtick": 1 if layers <= 16 else None},
        height=int(min(760, max(360, 18 * layers + 150))),
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        template=TEMPLATE,
    )
    return figure


def head_rank_table(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    """
    One head measure as a narrow table to read and click: heads ranked by ``|value|``.

    Columns ``head`` (``L2H3``), ``value`` (4 significant digits) and ``rank`` (1 = largest
    magnitude; ties share the best rank).
    """
    rows = _rows(table, measure, heads=True)
    magnitude = rows["value"].abs()
    ranked = rows.assign(rank=magnitude.rank(ascending=False, method="min").astype(int))
    ranked = ranked.loc[magnitude.sort_values(ascending=False, kind="stable").index]
    return pd.DataFrame(
        {
            "head": [f"L{int(r.layer)}H{int(r.head)}" for r in ranked.itertuples(index=False)],
            "value": [float(f"{v:.4g}") for v in ranked["value"]],
            "rank": ranked["rank"].tolist(),
        }
    )


def layer_lines(
    table: pd.DataFrame, measures: Sequence[str] | None = None, target: str | None = None
) -> go.Figure:
    """
    Small multiples: one panel per layer measure across layers, each on its own y scale.

    Panels are laid out four to a row; the hover of each point gives its value and what the
    measure means (:func:`measure_note`, with ``target`` named).
    """
    layer_rows = table[table["head"].isna()]
    names = list(measures) if measures is not None else list(dict.fromkeys(layer_rows["measure"]))
    if not names:
        raise ValueError("the table has no per-layer measures")
    columns = min(4, len(names))
    count = -(-len(names) // columns)
    figure = make_subplots(
        rows=count,
        cols=columns,
        subplot_titles=names,
        horizontal_spacing=0.07,
        vertical_spacing=0.5 / count if count > 1 else 0.0,
    )
    for index, name in enumerate(names):
        rows = _rows(table, name, heads=False).sort_values("layer")
        note = "<br>".join(textwrap.wrap(html.escape(measure_note(name, target)), 60))
        figure.add_trace(
            go.Scatter(
                x=rows["layer"].tolist(),
                y=rows["value"].to_numpy(dtype=float),
                mode="lines+markers",
                name=name,
                showlegend=False,
                hovertemplate=f"{name} at layer %{{x}}: %{{y:.6g}}<br><i>{note}</i><extra></extra>",
            ),
            row=index // columns + 1,
            col=index % columns + 1,
        )
    last = float(layer_rows["layer"].max()) if not layer_rows.empty else 0.0
    figure.update_xaxes(title_text="layer", title_standoff=4, range=[-0.5, last + 0.5])
    figure.update_annotations(font_size=13)
    figure.update_layout(
        title={"text": "per-layer measures, each on its own scale", "font": {"size": 15}},
        height=90 + 230 * count,
        margin={"l": 50, "r": 20, "t": 70, "b": 40},
        hoverlabel={"align": "left"},
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


#: The most token labels an axis shows; longer prompts show every k-th (the hover has all).
_MOST_TICKS = 40


def _token_axis(tokens: Sequence[str]) -> dict:
    """A token axis: every token's label, or every k-th one for a long prompt."""
    step = -(-len(tokens) // _MOST_TICKS)
    shown = range(0, len(tokens), step)
    ticks = token_ticks(tokens)
    return {
        "tickmode": "array",
        "tickvals": list(shown),
        "ticktext": [ticks[i] for i in shown],
        "tickangle": -60 if len(tokens) > 12 else 0,
        "tickfont": {"size": 11},
    }


def _clipped(token: str, most: int = 24) -> str:
    """A token for a title or legend (:func:`viz.tokens.token_tick`), cut to ``most`` characters."""
    text = token_label(token)
    return token_tick(text if len(text) <= most else text[: most - 1] + "…")


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
        yaxis={**_token_axis(tokens), "title": "query", "autorange": "reversed", "tickangle": 0},
        height=int(min(640, max(380, 12 * len(tokens) + 200))),
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
                name=f"{_clipped(tokens[token])} (position {token})",
                text=where,
                hovertemplate="%{text}: %{y:.4g}<extra></extra>",
            ),
        ]
    )
    figure.update_layout(
        title=f"relevance of {_clipped(tokens[token])} through the layers",
        xaxis={
            "tickmode": "auto",
            "nticks": min(len(steps), 12),
            "tickformat": "d",
            "title": f"0 = entering block 0 … {blocks} = leaving block {blocks - 1}",
        },
        yaxis_title="relevance",
        legend={"orientation": "h", "y": -0.3},
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
        height=int(max(260, 140 + 40 * len(labels))),
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
        write_stills([figure], [target], [None], [None])
    else:
        raise ValueError(f"export to .html or .png; got {target.name!r}")
    return target
