"""
The leaderboard for people: its score columns labelled and rounded, and as a figure.

:func:`score_labels` is the one table of what each score column is called where people read
it: the Evaluate tab, ``attrlab evaluate``, the trust cards and the figures (and so the export
bundle). The tables themselves keep their short column names (CSV, JSON, Parquet).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attrlab.attribution.metrics.leaderboard import SCORES
from attrlab.attribution.verdicts import MIN_SIGN_TRIALS
from attrlab.viz.theme import TEMPLATE

__all__ = [
    "leaderboard_figure",
    "leaderboard_text",
    "readable_table",
    "score_bars",
    "score_label",
    "score_labels",
]

#: The colour of a method's own bars (random orders are grey).
METHOD_COLOUR = "#4c72b0"
_RANDOM_COLOUR = "#b0b0b0"


#: What each faithfulness score measures, in words (its column names are short).
_SCORE_NAMES = {
    "comprehensiveness": "comprehensiveness",
    "sufficiency": "sufficiency",
    "deletion_morf_auc": "deletion AUC",
    "insertion_morf_auc": "insertion AUC",
}
#: Columns of every leaderboard and per-item table, whatever the modality.
_COMMON_LABELS = {
    "method": "method",
    "item": "item",
    "items": "items",
    "forward_passes": "forward passes per item",
    "seconds": "seconds per item",
}
#: Decimals shown per column; every other number gets three.
_DECIMALS = {"forward_passes": 1, "seconds": 2}


def score_label(score: str, higher: bool) -> str:
    """A score's label with the direction that is better: ``deletion AUC (lower is better)``."""
    return f"{_SCORE_NAMES.get(score, score)} ({'higher' if higher else 'lower'} is better)"


def score_labels(modality: str) -> dict[str, str]:
    """
    Column -> label, for :func:`~attribution.metrics.summarise`'s and the per-item tables.

    Each score of :data:`SCORES` ``[modality]``: the score with its better direction, its
    comparison with random orders (the verdict, the share of items beating them, the sign
    test), the random orders' own score and the least-relevant-first curve's area (images).
    """
    labels = dict(_COMMON_LABELS)
    for score, random, higher in SCORES[modality]:
        name = _SCORE_NAMES.get(score, score)
        labels[score] = score_label(score, higher)
        labels[f"{score}_against_random"] = f"{name}: against random orders"
        labels[random] = f"{name}: random orders"
        if score.endswith("_morf_auc"):  # the curve's other order, least relevant first
            labels[score.replace("_morf_", "_lerf_")] = f"{name}: least relevant first"
    if modality == "text":  # the token curves beside the ERASER scores
        for curve in ("deletion", "insertion"):
            labels[f"{curve}_morf_auc"] = f"token {curve} AUC"
            labels[f"{curve}_lerf_auc"] = f"token {curve} AUC: least relevant first"
            labels[f"{curve}_random_auc"] = f"token {curve} AUC: random orders"
    return labels


def readable_table(table: pd.DataFrame, modality: str) -> pd.DataFrame:
    """
    A leaderboard or per-item table for people: labelled columns, rounded numbers.

    Numbers keep three decimals (forward passes one, seconds two); a leaderboard's mean and
    its 95 % interval share one cell, ``0.164 [-0.010, 0.493]``, as a score is read, and its
    comparison with random orders another, ``pass: 80 % of items, p 0.031`` (the verdict, the
    share of items beating them, the sign test's p), so the table fits a page. Columns without
    a label keep their name.
    """
    shown = table.copy()
    for score, _, _ in SCORES[modality]:
        parts = [f"{score}_{part}" for part in ("verdict", "wins", "sign_p")]
        if all(part in shown for part in parts):
            at = shown.columns.get_loc(parts[1])  # where the share of items stood
            verdict, wins, p = (shown.pop(part) for part in parts)
            untied = shown.pop(f"{score}_untied") if f"{score}_untied" in shown else None
            if untied is not None:  # no sign test can pass on so few: said, not a bare verdict
                too_few = f"too few items to decide (need ≥ {MIN_SIGN_TRIALS})"
                verdict = verdict.where(untied >= MIN_SIGN_TRIALS, too_few)
            # a p-value reads in significant digits: 3e-05, 0.41
            cells = [
                f"{v}: {w:.0%} of items, " + (f"p {q:.2g}" if pd.notna(q) else "every item tied")
                for v, w, q in zip(verdict, wins, p, strict=True)
            ]
            shown.insert(at, f"{score}_against_random", cells)
    for column in shown.select_dtypes("number").columns:
        shown[column] = shown[column].round(_DECIMALS.get(column, 3))
    for score, _, _ in SCORES[modality]:
        interval = f"{score}_ci"
        if score in shown and interval in shown:
            means = shown.pop(score).map(lambda value: f"{value:.3f}")
            shown.insert(shown.columns.get_loc(interval), score, means + " " + shown[interval])
            shown = shown.drop(columns=interval)
    return shown.rename(columns=score_labels(modality))


def leaderboard_text(summary: pd.DataFrame, modality: str) -> str:
    """
    :func:`~attribution.metrics.summarise`'s table for a terminal: a column per method.

    The labels are long, so they head the rows, and the table stays as narrow as its methods.
    """
    shown = readable_table(summary, modality).set_index(score_labels(modality)["method"])
    return shown.T.to_string()


def _mean_and_error(per_item: pd.DataFrame, column: str, methods: list[str]) -> pd.DataFrame:
    """Per method: mean and standard error (0 for a single item) of ``column``."""
    stats = per_item.groupby("method")[column].agg(["mean", "std", "count"]).reindex(methods)
    error = stats["std"].fillna(0.0) / np.sqrt(stats["count"])
    return pd.DataFrame({"mean": stats["mean"], "error": error.fillna(0.0)})


def score_bars(
    scores: Sequence[tuple[str, str, bool]],
    methods: Sequence[str],
    heights: Callable[[str], tuple[Sequence[float | None], Sequence[float] | None] | None],
    title: str,
) -> go.Figure:
    """
    One subplot per ``(score, random counterpart, higher is better)``: grouped bars per method.

    ``heights(key)`` gives the bars of a score and their error bars (None: no error bars), or
    None where the key has no values (it is left out).
    """
    figure = make_subplots(
        rows=1,
        cols=len(scores),
        subplot_titles=[score_label(s, h) for s, _, h in scores],
    )
    for column, (score, random, _) in enumerate(scores, start=1):
        for name, key, colour in (
            ("method", score, METHOD_COLOUR),
            ("random", random, _RANDOM_COLOUR),
        ):
            found = heights(key)
            if found is None:
                continue
            values, errors = found
            figure.add_trace(
                go.Bar(
                    x=list(methods),
                    y=list(values),
                    error_y=None if errors is None else {"type": "data", "array": list(errors)},
                    name=name,
                    marker_color=colour,
                    legendgroup=name,
                    showlegend=column == 1,
                    hovertemplate="%{x}: %{y:.4g}<extra>" + key + "</extra>",
                ),
                row=1,
                col=column,
            )
    figure.update_layout(barmode="group", title=title, template=TEMPLATE)
    return figure


def leaderboard_figure(per_item: pd.DataFrame, modality: str) -> go.Figure:
    """
    Per method, the mean of each score over the items next to its random-order counterpart.

    ``per_item``: :func:`~attribution.metrics.leaderboard.evaluate_methods`'s table. One
    subplot per score of :data:`SCORES` ``[modality]``; error bars are the standard error over
    items (for display, not a test).
    """
    if modality not in SCORES:
        raise ValueError(f"unknown modality {modality!r}; choose from {', '.join(SCORES)}")
    if per_item.empty:
        raise ValueError("the leaderboard table is empty: evaluate some methods first")
    scores = [s for s in SCORES[modality] if s[0] in per_item]
    if not scores:
        raise ValueError(f"the table has none of the {modality} scores")
    methods = list(dict.fromkeys(per_item["method"]))

    def heights(key: str) -> tuple[list, list] | None:
        if key not in per_item:  # no random orders were drawn
            return None
        stats = _mean_and_error(per_item, key, methods)
        return stats["mean"].tolist(), stats["error"].tolist()

    items = per_item["item"].nunique() if "item" in per_item else len(per_item)
    figure = score_bars(scores, methods, heights, f"faithfulness over {items} items")
    return figure
