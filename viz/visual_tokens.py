"""
Figures and text of a visual-token study, drawn from its tables alone.

The curves per metric (the answer's ``log_prob``, ``exact_match`` and ``kl`` against the share
of the visual tokens dropped): each scorer beside the random orders' band (their lowest to
highest draw, their mean dashed); each scorer's agreement with the exact effects; and, when
asked, ShortV's contribution of each block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attrlab.attribution.engine.verification import RANDOM
from attrlab.viz.bands import agreement_bars, orders_against_random, study_files

if TYPE_CHECKING:
    from attrlab.attribution.visual_tokens.request import VisualTokenReport

__all__ = [
    "answer_origin",
    "dropped_where",
    "visual_tokens_figures",
    "visual_tokens_files",
    "visual_tokens_text",
]

#: Where a study's answer came from (its ``answer["origin"]``), in words.
_ORIGINS = {
    "given": "given",
    "next_token": "the model's next token",
    "generated": "the model's greedy answer",
}
#: Each metric's axis title.
_TITLES = {
    "log_prob": "answer log-probability",
    "exact_match": "greedy exact match",
    "kl": "KL from the full model",
}


def dropped_where(report: VisualTokenReport) -> str:
    """Where the tokens are dropped, in words."""
    layer = report.study.layer
    return "at the input" if layer == 0 else f"from block {layer} on"


def answer_origin(report: VisualTokenReport) -> str:
    """Where the study's answer came from, in words: given, the next token, generated."""
    return _ORIGINS[report.answer["origin"]]


def visual_tokens_figures(report: VisualTokenReport) -> dict[str, go.Figure]:
    """
    ``visual_tokens_<metric>`` per metric, then ``visual_tokens_agreement`` and ``shortv``.

    The curves' points are the ``curves`` table's rows (``random``: its mean, its ``low`` and
    ``high`` as the band); the agreement's bars the ``agreement`` table's; ShortV's bars its
    layer table's ``shortv_kl`` per block.
    """
    study = report.study
    where = dropped_where(report)
    figures = {
        f"visual_tokens_{metric}": orders_against_random(
            rows,
            RANDOM,
            f"{_TITLES.get(str(metric), metric)} as visual tokens are dropped ({where})",
            "share of the visual tokens dropped",
            _TITLES.get(str(metric), str(metric)),
        )
        for metric, rows in study.curves.curves.groupby("metric", sort=False)
    }
    if not study.agreement.empty:
        figures["visual_tokens_agreement"] = agreement_bars(
            study.agreement,
            "each scorer's agreement with dropping each visual token alone (exact effects)",
        )
    if report.layers is not None:
        figures["shortv"] = _shortv_figure(report.layers)
    return figures


def visual_tokens_files(report: VisualTokenReport) -> dict[str, str]:
    """
    A visual-token study's data as an export's files (:func:`~viz.bands.study_files`).

    ``visual_tokens_study.json`` (the record of ``POST /api/v1/visual-tokens``), its curves,
    areas, agreement and verdicts as CSV, and ShortV's layer table as ``shortv.csv`` when asked.
    """
    study = report.study
    files = study_files("visual_tokens", report.to_dict(), study.curves, study.agreement)
    if report.layers is not None:
        files["shortv.csv"] = report.layers.to_csv(index=False)
    return files


def _shortv_figure(layers: pd.DataFrame) -> go.Figure:
    """ShortV's KL per block: what leaving the block out of the visual tokens changes."""
    kl = layers[layers["measure"] == "shortv_kl"]
    figure = go.Figure([go.Bar(x=kl["layer"], y=kl["value"], name="shortv_kl")])
    figure.update_layout(
        title="ShortV: KL from the full model with each block's update of the visual tokens "
        "left out",
        xaxis_title="block",
        yaxis_title="mean KL over the answer",
    )
    return figure


def visual_tokens_text(report: VisualTokenReport) -> str:
    """
    Terminal view of a visual-token study (``attrlab visual-tokens --format table``).

    The answer and the full model, each order's area per metric, the agreement table, the
    verdicts, then ShortV's contribution of each block.
    """
    study = report.study
    how = answer_origin(report)
    where = dropped_where(report)
    lines = [
        f"visual tokens  dropped {where}, attention of block {study.attention_layer}, "
        "keep ratios " + ", ".join(f"{r:g}" for r in study.ratios),
        f"answer    {report.answer['text']!r} ({how})",
        f"full      log_prob {study.full['log_prob']:.4g}, exact_match "
        f"{study.full['exact_match']:.3g} ({', '.join(map(str, study.tokens))} visual tokens); "
        f"{study.forward_passes} forward passes",
    ]
    for metric, rows in study.curves.scores.groupby("metric", sort=False):
        cells = "  ".join(f"{r.order} {r.auc:.4g}" for r in rows.itertuples(index=False))
        lines.append(f"area      {metric}: {cells}")
    for row in study.agreement.itertuples(index=False):
        lines.append(
            f"agreement {row.scorer:<18} {row.awareness:<15} ρ {_number(row.spearman)}  "
            f"top-k {_number(row.top_k_overlap)}"
        )
    lines += [f"verdict   {v.summary()}" for v in study.curves.verdicts]
    lines += [f"n/a       {name}: {why}" for name, why in study.not_applicable.items()]
    if report.layers is not None:
        table = report.layers.pivot(index="layer", columns="measure", values="value")
        for block, row in table.iterrows():
            cells = "  ".join(f"{measure} {row[measure]:.4g}" for measure in table.columns)
            lines.append(f"shortv    block {block}: {cells}")
    return "\n".join(lines)


def _number(value: Any) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{value:.3f}"
