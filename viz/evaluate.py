"""The leaderboard's per-item table as a figure: each method's mean score against random."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attrlab.attribution.metrics.leaderboard import SCORES
from attrlab.viz.theme import TEMPLATE

__all__ = ["leaderboard_figure", "score_bars"]

#: The colour of a method's own bars (random orders are grey).
METHOD_COLOUR = "#4c72b0"
_RANDOM_COLOUR = "#b0b0b0"


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
        subplot_titles=[f"{s} ({'higher' if h else 'lower'} is better)" for s, _, h in scores],
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
