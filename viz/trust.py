"""
Figures and cards of the evidence for a map.

The randomisation check, agreement between methods, LRP's conservation and the faithfulness
scores against random orders.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.metrics.leaderboard import SCORES
from attrlab.viz.evaluate import METHOD_COLOUR, score_bars, score_label
from attrlab.viz.layers import agreement_figure
from attrlab.viz.theme import TEMPLATE

__all__ = [
    "conservation_gauge",
    "method_agreement_figure",
    "randomisation_figure",
    "trust_card_html",
    "trust_figure",
]

_NO_SCORES = "no faithfulness scores: tick 'Trust cards' and run again"


def method_agreement_figure(pairs: pd.DataFrame) -> go.Figure:
    """Spearman's ρ between the methods' maps of one input (``map_agreement``'s table)."""
    return agreement_figure(pairs, title="agreement between methods' maps")


def randomisation_figure(table: pd.DataFrame) -> go.Figure:
    """
    Spearman's ρ between each method's map and its map after each cascading step.

    ``table``: columns ``method, step, layer, spearman, spearman_abs`` (the randomisation
    check). Solid lines are signed ρ, dashed ones ρ of magnitudes; a map that depends on the
    weights falls towards 0 as more layers are randomised.
    """
    figure = go.Figure()
    for method, rows in table.groupby("method", sort=False):
        rows = rows.sort_values("step")
        for column, dash in (("spearman", "solid"), ("spearman_abs", "dash")):
            figure.add_trace(
                go.Scatter(
                    x=rows["layer"],
                    y=rows[column],
                    mode="lines+markers",
                    name=f"{method} ({'|ρ|' if column == 'spearman_abs' else 'ρ'})",
                    line={"dash": dash},
                    hovertemplate="%{x}<br>ρ = %{y:.3f}<extra>" + str(method) + "</extra>",
                )
            )
    figure.update_layout(
        title="cascading randomisation: rank correlation with the original map",
        xaxis_title="randomised down to",
        yaxis={"title": "Spearman ρ", "range": [-1.05, 1.05]},
        template=TEMPLATE,
    )
    return figure


def conservation_gauge(explanation: Explanation) -> go.Figure:
    """
    LRP's conservation as a linear gauge: Σ input relevance as a bar, the target logit a mark.

    The axis runs from 0 to ``max(2·|logit|, |Σ|)`` on the side of the logit and Σ (both
    sides when their signs differ). Needs ``input_relevance`` and ``target_logit`` in
    ``metrics`` (AttnLRP, PA-LRP). Bars and marks only: Plotly's cartesian build draws it.
    """
    metrics = explanation.metrics
    if "input_relevance" not in metrics or "target_logit" not in metrics:
        raise ValueError(
            f"{explanation.method!r} has no conservation metrics (input_relevance, "
            "target_logit); the gauge is for LRP methods"
        )
    total, logit = float(metrics["input_relevance"]), float(metrics["target_logit"])
    bound = max(2 * abs(logit), abs(total)) or 1.0
    low = -bound if min(total, logit) < 0 else 0.0
    high = bound if max(total, logit) > 0 else 0.0
    error = metrics.get("conservation_error")
    # a deviation from the logit, neither good nor bad by its sign
    numbers = f"Σ {total:.4g} vs logit {logit:.4g} (Δ {total - logit:+.4g})"
    if error is not None and math.isfinite(error):
        numbers += f", conservation error {error:.1%}"
    row = ["Σ input relevance"]
    figure = go.Figure(
        [
            go.Bar(
                x=[total],
                y=row,
                orientation="h",
                width=0.5,
                marker_color=METHOD_COLOUR,
                name="Σ input relevance",
                hovertemplate="Σ input relevance %{x:.4g}<extra></extra>",
            ),
            go.Scatter(
                x=[logit],
                y=row,
                mode="markers",
                marker={"symbol": "line-ns", "size": 46, "line": {"color": "#d62728", "width": 4}},
                name="target logit",
                hovertemplate="target logit %{x:.4g}<extra></extra>",
            ),
        ]
    )
    figure.update_layout(
        title={
            "text": f"{explanation.method}: Σ input relevance vs target logit<br>"
            f"<span style='font-size:0.8em'>{numbers}</span>"
        },
        xaxis={"range": [low, high], "zeroline": True},
        yaxis={"visible": False},
        legend={"orientation": "h", "y": -0.25},
        template=TEMPLATE,
        height=260,
        margin={"l": 30, "r": 30, "t": 80, "b": 20},
    )
    return figure


def _number(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4g}"


def _verdict(value: float, random: float | None, higher: bool) -> str:
    if random is None or not (math.isfinite(value) and math.isfinite(random)):
        return "no random orders to compare"
    better = value > random if higher else value < random
    return "better than random" if better else "not better than random"


def _row(cells: list[str]) -> str:
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


#: A sampling method's convergence metrics, as the trust card names them.
_CONVERGENCE = {
    "masks_used": "masks used",
    "evals_used": "evaluations used",
    "top_decile_error": "top-decile relative error",
    "noise_ratio": "noise ratio",
}


#: Convergence metrics that count (masks, evaluations): shown whole.
_COUNTS = ("masks_used", "evals_used")


def trust_card_html(explanation: Explanation) -> str:
    """
    A small card of how far to trust one map.

    Each faithfulness score present in ``metrics`` against its random-order counterpart,
    LRP's conservation error, the convergence delta and, for sampling methods, the standard
    error of the map and how far the sampling converged.
    """
    metrics = explanation.metrics
    rows = []
    for score, random, higher in SCORES.get(explanation.model.modality, ()):
        if score in metrics:
            value, baseline = metrics[score], metrics.get(random)
            rows.append(
                _row(
                    [
                        score_label(score, higher),
                        _number(value),
                        f"random {_number(baseline)}",
                        _verdict(value, baseline, higher),
                    ]
                )
            )
    notes = [] if rows else [_NO_SCORES]
    if "conservation_error" in metrics:
        error = metrics["conservation_error"]
        shown = f"{error:.1%}" if math.isfinite(error) else "undefined"
        notes.append(f"conservation error {shown} (Σ input relevance vs target logit)")
    if "convergence_delta" in metrics:
        notes.append(f"convergence delta {_number(metrics['convergence_delta'])}")
    if "std_error" in explanation.maps:
        largest = float(np.max(explanation.maps["std_error"]))
        peak = float(np.abs(explanation.scores).max())
        share = f" ({largest / peak:.1%} of the largest |score|)" if peak > 0 else ""
        notes.append(f"sampled map: largest standard error {largest:.4g}{share}")
    sampled = [
        f"{_CONVERGENCE[k]} " + (f"{metrics[k]:,.0f}" if k in _COUNTS else _number(metrics[k]))
        for k in _CONVERGENCE
        if k in metrics
    ]
    if sampled:  # how far a sampling method converged
        notes.append("convergence: " + ", ".join(sampled))
    table = f'<table style="font-size:0.85em">{"".join(rows)}</table>' if rows else ""
    items = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    method = html.escape(explanation.method)
    return (
        f'<div class="trust-card" data-method="{method}" '
        'style="border:1px solid #8884;border-radius:6px;padding:8px;margin:4px 0">'
        f'<div style="font-weight:600">{method}</div>{table}'
        f'<ul style="margin:4px 0;padding-left:18px;font-size:0.85em">{items}</ul></div>'
    )


def trust_figure(explanations: Mapping[str, Explanation]) -> go.Figure:
    """
    Each method's faithfulness scores next to their random-order counterparts.

    One subplot per score of the explanations' modality (:data:`SCORES`), grouped bars per
    method; methods without the score leave a gap.
    """
    modalities = {e.model.modality for e in explanations.values()}
    if len(modalities) > 1:
        raise ValueError(f"trust_figure needs one modality; got {', '.join(sorted(modalities))}")
    scores = SCORES.get(next(iter(modalities)), ()) if modalities else ()
    present = [s for s in scores if any(s[0] in e.metrics for e in explanations.values())]
    if not present:
        raise ValueError(_NO_SCORES)
    return score_bars(
        present,
        list(explanations),
        lambda key: ([e.metrics.get(key) for e in explanations.values()], None),
        "faithfulness against random orders",
    )
