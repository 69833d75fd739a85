"""The leaderboard's per-item table as a figure: each method's mean score against random."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attribution.metrics.leaderboard import SCORES

__all__ = ["leaderboard_figure"]

_METHOD_COLOUR = "#4c72b0"
_RANDOM_COLOUR = "#b0b0b0"


def _mean_and_error(per_item: pd.DataFrame, column: str, methods: list[str]) -> pd.DataFrame:
    """Per method: mean and standard error (0 for a single item) of ``column``."""
    stats = per_item.groupby("method")[column].agg(["mean", "std", "count"]).reindex(methods)
    error = stats["std"].fillna(0.0) / np.sqrt(stats["count"])
    return pd.DataFrame({"mean": stats["mean"], "error": error.fillna(0.0)})


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
    figure = make_subplots(
        rows=1,
        cols=len(scores),
        subplot_titles=[f"{s} ({'higher' if h else 'lower'} is better)" for s, _, h in scores],
    )
    for column, (score, random, _) in enumerate(scores, start=1):
        shown = [("method", score, _METHOD_COLOUR)]
        if random in per_item:
            shown.append(("random", random, _RANDOM_COLOUR))
        for name, key, colour in shown:
            stats = _mean_and_error(per_item, key, methods)
            figure.add_trace(
                go.Bar(
                    x=methods,
                    y=stats["mean"].to_numpy(),
                    error_y={"type": "data", "array": stats["error"].to_numpy()},
                    name=name,
                    marker_color=colour,
                    legendgroup=name,
                    showlegend=column == 1,
                    hovertemplate="%{x}: %{y:.4g}<extra>" + key + "</extra>",
                ),
                row=1,
                col=column,
            )
    items = per_item["item"].nunique() if "item" in per_item else len(per_item)
    figure.update_layout(
        barmode="group", title=f"faithfulness over {items} items", template="plotly_white"
    )
    return figure
