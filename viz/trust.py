"""
Figures and cards of the evidence for a map.

The randomisation check, agreement between methods, LRP's relevance balance and the
faithfulness scores against random orders; the trust card shows each check's verdict
(:mod:`attribution.verdicts`), computed in the library.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.metrics.faithfulness import SCORES
from attrlab.attribution.verdicts import LRP_PARTS, THRESHOLDS, Verdict
from attrlab.viz.evaluate import METHOD_COLOUR, score_bars
from attrlab.viz.layers import agreement_figure
from attrlab.viz.theme import TEMPLATE

__all__ = [
    "conservation_figure",
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


def conservation_figure(explanation: Explanation) -> go.Figure:
    """
    LRP's relevance balance as a waterfall: from the input's share to the target logit.

    Bars: Σ input relevance, then each part the rules keep by design
    (:data:`~attribution.verdicts.LRP_PARTS`) and the unaccounted rest, ending at the logit.
    Explanations without the balance (files written before it) show the input's share and
    the rest of the logit in one bar. Needs ``input_relevance`` and ``target_logit`` in
    ``metrics`` (AttnLRP, PA-LRP).
    """
    metrics = explanation.metrics
    if "input_relevance" not in metrics or "target_logit" not in metrics:
        raise ValueError(
            f"{explanation.method!r} has no conservation metrics (input_relevance, "
            "target_logit); the figure is for LRP methods"
        )
    total, logit = float(metrics["input_relevance"]), float(metrics["target_logit"])
    steps = [("Σ input relevance", total)]
    if "unaccounted_relevance" in metrics:
        steps += [(name, float(metrics[key])) for key, (name, _) in LRP_PARTS.items()]
        steps.append(("unaccounted", float(metrics["unaccounted_relevance"])))
    else:
        steps.append(("rest of the logit", logit - total))
    scale = abs(logit) or 1.0
    # A waterfall drawn with floating bars (each starts where the last ended), which Plotly's
    # cartesian build draws: the export bundle then needs no full Plotly.
    names = [name for name, _ in steps] + ["target logit"]
    values = [value for _, value in steps] + [logit]
    bases = [float(v) for v in np.cumsum([0.0, *values[:-2]])] + [0.0]
    colours = [METHOD_COLOUR if v >= 0 else "#d62728" for v in values[:-1]] + ["#444444"]
    figure = go.Figure(
        go.Bar(
            x=names,
            y=values,
            base=bases,
            marker_color=colours,
            text=[f"{value / scale:+.1%}" for value in values[:-1]] + ["100%"],
            textposition="outside",
            hovertemplate="%{x}: %{y:.4g}<extra></extra>",
        )
    )
    title = f"{explanation.method}: where the target logit's relevance went"
    conservation = next((v for v in explanation.verdicts if v.check == "lrp_conservation"), None)
    if conservation is not None:
        title += f"<br><span style='font-size:0.8em'>{conservation.status}: unaccounted "
        title += f"{_share(conservation.value)} of the logit</span>"
    figure.update_layout(title=title, yaxis_title="relevance", template=TEMPLATE, showlegend=False)
    return figure


def _number(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4g}"


def _share(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.1%}" if abs(value) >= 1e-3 else f"{value:.1e}"


def _measured(verdict: Verdict) -> str:
    """The value judged against its threshold, in the check's own terms."""
    if verdict.value is None:
        return "—"
    if verdict.check == "randomisation":
        return f"max |ρ| {verdict.value:.2f} (pass ≤ {verdict.threshold:g})"
    if verdict.check in THRESHOLDS:  # an error as a share
        return f"{_share(verdict.value)} (pass ≤ {_share(verdict.threshold)})"
    return f"p = {verdict.value:.2g} (α = {verdict.threshold:g})"  # a test


#: A verdict's colour on the card, by status.
_STATUS_COLOUR = {
    "pass": "#1a7f37",
    "warn": "#9a6700",
    "fail": "#cf222e",
    "inconclusive": "#57606a",
}


def _verdict_row(verdict: Verdict) -> str:
    reason = html.escape(verdict.reason)
    if verdict.advice:
        reason += f"<br><i>{html.escape(verdict.advice)}</i>"
    return (
        f'<tr class="verdict" data-check="{html.escape(verdict.check)}" '
        f'data-status="{verdict.status}">'
        f"<td>{html.escape(verdict.title)}</td>"
        f'<td style="color:{_STATUS_COLOUR[verdict.status]};font-weight:600">'
        f"{verdict.status}</td>"
        f"<td>{html.escape(_measured(verdict))}</td><td>{reason}</td></tr>"
    )


def _balance_rows(metrics: Mapping[str, float]) -> str:
    """LRP's relevance balance: the input, each part kept by design, the unaccounted rest."""
    scale = abs(float(metrics["target_logit"])) or 1.0
    parts = [("Σ input relevance (the map)", metrics["input_relevance"])]
    parts += [(what, metrics[key]) for key, (_, what) in LRP_PARTS.items() if key in metrics]
    parts.append(
        ("unaccounted (rounding, or a rule losing relevance)", metrics["unaccounted_relevance"])
    )
    parts.append(("target logit", metrics["target_logit"]))
    return "".join(
        f'<tr class="balance"><td>{html.escape(name)}</td><td>{_number(value)}</td>'
        f"<td>{_share(value / scale)}</td></tr>"
        for name, value in parts
    )


#: A sampling method's convergence metrics, as the trust card names them.
_CONVERGENCE = {
    "masks_used": "masks used",
    "evals_used": "evaluations used",
    "top_decile_error": "top-decile relative error",
    "noise_ratio": "noise ratio",
}


#: Convergence metrics that count (masks, evaluations): shown whole.
_COUNTS = ("masks_used", "evals_used")

#: Verdicts that judge a method's completeness, one of which covers its convergence delta.
_COMPLETENESS = ("integral_convergence", "summation_to_delta", "lrp_conservation")


def trust_card_html(explanation: Explanation, extra: Sequence[Verdict] = ()) -> str:
    """
    A small card of how far to trust one map: a verdict per check, then the numbers behind.

    One row per verdict of ``explanation`` and ``extra`` (e.g. its randomisation check's):
    the check, its status, the value judged against its threshold, the reason and what to
    do. Then, for LRP, where the target logit's relevance went; for sampling methods, the
    standard error of the map and how far the sampling converged.
    """
    metrics = explanation.metrics
    verdicts = [*explanation.verdicts, *extra]
    scored = any(s in metrics for s, _, _ in SCORES.get(explanation.model.modality, ()))
    # a layer analysis has no map order to score: its checks are the heads' re-check
    notes = [] if scored or explanation.layers is not None else [_NO_SCORES]
    if "convergence_delta" in metrics and not {v.check for v in verdicts} & set(_COMPLETENESS):
        notes.append(f"convergence delta {_number(metrics['convergence_delta'])} (no verdict)")
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
    rows = "".join(_verdict_row(v) for v in verdicts)
    table = f'<table class="verdicts" style="font-size:0.85em">{rows}</table>' if rows else ""
    if "unaccounted_relevance" in metrics:
        table += (
            '<div style="font-size:0.85em;margin-top:4px">where the target logit\'s relevance '
            f'went</div><table class="balance" style="font-size:0.85em">{_balance_rows(metrics)}'
            "</table>"
        )
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
