"""
Figures, files and text of an eviction study, drawn from its tables alone.

The curves per metric (the answer's ``log_prob``, ``exact_match`` and ``kl`` against the share
of the context evicted): each scorer beside the random evictions' band (their lowest to highest
draw, their mean dashed); each scorer's agreement with the exact effects; and one item's prompt
coloured by a scorer's per-position scores, or by the share of each token's entries kept at a
keep ratio.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from attrlab.attribution.engine.verification import RANDOM
from attrlab.viz.bands import agreement_bars, orders_against_random, study_files
from attrlab.viz.text import diverging_colour, text_colour
from attrlab.viz.tokens import token_html

if TYPE_CHECKING:
    from attrlab.attribution.eviction.study import EvictionStudy

__all__ = [
    "eviction_figures",
    "eviction_files",
    "eviction_text",
    "kept_html",
    "scores_html",
    "verdict_lines",
]

#: Each metric's axis title.
_TITLES = {
    "log_prob": "answer log-probability",
    "exact_match": "greedy exact match",
    "kl": "KL from the full cache",
}


def eviction_figures(study: EvictionStudy) -> dict[str, go.Figure]:
    """
    ``eviction_<metric>`` per metric of the curves, then ``eviction_agreement`` (with any rows).

    The curves' points are the ``curves`` table's rows (``random``: its mean, its ``low`` and
    ``high`` as the band); the agreement's bars the ``agreement`` table's.
    """
    curves = study.curves.curves
    figures = {
        f"eviction_{metric}": orders_against_random(
            rows,
            RANDOM,
            f"{_TITLES.get(str(metric), metric)} as the cache loses entries ({study.unit}, "
            f"{study.split} split; {study.items} items)",
            "share of the context evicted",
            _TITLES.get(str(metric), str(metric)),
        )
        for metric, rows in curves.groupby("metric", sort=False)
    }
    if not study.agreement.empty:
        figures["eviction_agreement"] = agreement_bars(
            study.agreement,
            "each scorer's agreement with evicting each token alone (exact effects)",
        )
    return figures


def verdict_lines(study: EvictionStudy) -> list[str]:
    """Each scorer's verdict per metric against the random evictions, in words."""
    return [v.summary() for v in study.curves.verdicts]


def eviction_files(study: EvictionStudy) -> dict[str, str]:
    """
    An eviction study's data as an export's files: its JSON, and each table as CSV.

    ``eviction_study.json``, ``eviction_curves.csv``, ``eviction_areas.csv`` (each order's area
    and verdict), ``eviction_agreement.csv`` and ``eviction_verdicts.csv``
    (:func:`~viz.bands.study_files`).
    """
    return study_files("eviction", study.to_dict(), study.curves, study.agreement)


def eviction_text(study: EvictionStudy) -> str:
    """
    Terminal view of an eviction study (``attrlab evict --format table``).

    The full cache, each scorer's area per metric, the agreement table and the verdicts.
    """
    lines = [
        f"eviction  {study.unit}, {study.split} split, keep ratios "
        + ", ".join(f"{r:g}" for r in study.ratios),
        f"full      log_prob {study.full['log_prob']:.4g}, exact_match "
        f"{study.full['exact_match']:.3g} over {study.items} items "
        f"(contexts {', '.join(map(str, study.context))} tokens); "
        f"{study.forward_passes} forward passes",
    ]
    for metric, rows in study.curves.scores.groupby("metric", sort=False):
        cells = "  ".join(f"{r.order} {r.auc:.4g}" for r in rows.itertuples(index=False))
        lines.append(f"area      {metric}: {cells}")
    for row in study.agreement.itertuples(index=False):
        lines.append(
            f"agreement {row.scorer:<22} {row.awareness:<15} ρ {_number(row.spearman)}  "
            f"top-k {_number(row.top_k_overlap)}"
        )
    lines += [f"verdict   {line}" for line in verdict_lines(study)]
    return "\n".join(lines)


def _number(value: Any) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{value:.3f}"


def _tokens_html(tokens: list[str], values: list[float], titles: list[str], css: str) -> str:
    spans = []
    for token, value, title in zip(tokens, values, titles, strict=True):
        background = diverging_colour(float(np.clip(value, -1.0, 1.0)))
        spans.append(
            f'<span title="{html.escape(title)}" style="background:rgb{background};'
            f'color:{text_colour(background)};white-space:pre">{token_html(token)}</span>'
        )
    return f'<div class="{css}" style="line-height:1.9">{"".join(spans)}</div>'


def scores_html(view: dict[str, Any], scorer: str) -> str:
    """
    One item's prompt coloured by ``scorer``'s per-position scores (a view of the study's).

    Scaled by the largest finite magnitude (a position a policy always keeps scores ``inf``
    and is shown at the top of the scale); red keeps, blue evicts first.

    Raises:
        ValueError: the item was not judged, or the scorer is not in it.
    """
    if scorer not in view["scores"]:
        raise ValueError(f"no scores of {scorer!r} on this item (judged: {view['judged']})")
    values = np.asarray(view["scores"][scorer], dtype=np.float64)
    finite = np.abs(values[np.isfinite(values)])
    scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    shown = np.nan_to_num(values / scale, nan=0.0, posinf=1.0, neginf=-1.0)
    titles = [f"{scorer}: {v:.4g}" for v in values]
    return _tokens_html(view["tokens"], list(shown), titles, "attrlab-eviction-scores")


def kept_html(view: dict[str, Any], scorer: str, ratio_index: int, ratio: float) -> str:
    """
    One item's prompt at a keep ratio: each token by the share of its entries ``scorer`` keeps.

    Red: every entry kept; blue: every one evicted; between, a share of its layers and heads.

    Raises:
        ValueError: the item was not judged, or the scorer is not in it.
    """
    if scorer not in view["kept"]:
        raise ValueError(f"no evictions by {scorer!r} on this item (judged: {view['judged']})")
    kept = np.asarray(view["kept"][scorer][ratio_index], dtype=np.float64)
    titles = [f"{share:.0%} of its entries kept at ratio {ratio:g}" for share in kept]
    return _tokens_html(view["tokens"], list(2 * kept - 1), titles, "attrlab-eviction-kept")
