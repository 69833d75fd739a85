"""Token-level views of a text Explanation."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attribution.explanation import Explanation

__all__ = ["token_figure", "token_highlights"]


def _normalised(scores: np.ndarray) -> np.ndarray:
    peak = float(np.abs(scores).max()) if scores.size else 0.0
    return scores / peak if peak > 0 else np.zeros_like(scores)


def token_highlights(explanation: Explanation) -> list[tuple[str, float]]:
    """(token, score in [-1, 1]) pairs, scaled by the largest absolute score."""
    if explanation.tokens is None:
        raise ValueError("token_highlights needs a text explanation")
    scores = _normalised(explanation.scores)
    return [(token, float(s)) for token, s in zip(explanation.tokens, scores, strict=True)]


def token_figure(explanation: Explanation) -> go.Figure:
    """Bar chart of token scores (red positive, blue negative), tokens in reading order."""
    if explanation.tokens is None:
        raise ValueError("token_figure needs a text explanation")
    scores = explanation.scores
    positions = list(range(len(scores)))
    figure = go.Figure(
        go.Bar(
            x=positions,
            y=scores,
            marker_color=["#d62728" if s >= 0 else "#1f77b4" for s in scores],
            hovertext=explanation.tokens,
        )
    )
    figure.update_layout(
        title=f"{explanation.method} → {explanation.target.label}",
        xaxis={"tickmode": "array", "tickvals": positions, "ticktext": explanation.tokens},
        yaxis_title="relevance",
        margin={"l": 40, "r": 10, "t": 40, "b": 80},
        height=320,
    )
    return figure
