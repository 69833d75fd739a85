"""The random draws' band every curve against random orders is drawn with."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

__all__ = ["add_random_band"]

#: The band's fill: grey, faint, under every curve.
BAND = "rgba(127, 127, 127, 0.2)"
_GREY = "#7f7f7f"


def add_random_band(
    figure: go.Figure, x: Sequence[float] | pd.Series, random: pd.DataFrame
) -> None:
    """
    The random draws on ``figure``: a band from their lowest to highest, their mean dashed.

    ``random``: one row per ``x``, with the draws' ``low``, ``high`` and mean ``value``.
    """
    for bound, fill in (("high", None), ("low", "tonexty")):
        figure.add_trace(
            go.Scatter(
                x=x,
                y=random[bound],
                mode="lines",
                line={"width": 0, "color": _GREY},
                fill=fill,
                fillcolor=BAND,
                name=f"random {bound}est draw",
                showlegend=False,
                hovertemplate=f"random, {bound}est draw: %{{y:.4g}}<extra></extra>",
            )
        )
    figure.add_trace(
        go.Scatter(
            x=x,
            y=random["value"],
            mode="markers+lines",
            name="random (mean; band: lowest to highest draw)",
            line={"dash": "dash", "color": _GREY},
        )
    )
