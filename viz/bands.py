"""The random draws' band every curve against random orders is drawn with, and those curves."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import plotly.graph_objects as go

if TYPE_CHECKING:
    from attrlab.attribution.engine.verification import PruningCurves

__all__ = ["add_random_band", "agreement_bars", "orders_against_random", "study_files"]

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


def orders_against_random(
    rows: pd.DataFrame, random_order: str, title: str, x_title: str, y_title: str
) -> go.Figure:
    """
    One metric's curves: each order's ``value`` against ``removed``, over the random band.

    ``rows``: a study's curve rows of one metric (``order``, ``removed``, ``value``, ``low``,
    ``high``), the random draws' under the order named ``random_order``.
    """
    figure = go.Figure()
    random = rows[rows["order"] == random_order].sort_values("removed")
    add_random_band(figure, random["removed"], random)
    for name, order in rows[rows["order"] != random_order].groupby("order", sort=False):
        order = order.sort_values("removed")
        figure.add_trace(
            go.Scatter(x=order["removed"], y=order["value"], mode="markers+lines", name=name)
        )
    figure.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    return figure


def agreement_bars(agreement: pd.DataFrame, title: str) -> go.Figure:
    """Each scorer's Spearman ρ and top-k overlap with the exact effects (``agreement`` rows)."""
    names = [f"{s} ({a})" for s, a in zip(agreement["scorer"], agreement["awareness"], strict=True)]
    figure = go.Figure(
        [
            go.Bar(x=names, y=agreement["spearman"], name="Spearman ρ"),
            go.Bar(x=names, y=agreement["top_k_overlap"], name="top-10% overlap"),
        ]
    )
    figure.update_layout(title=title, barmode="group", yaxis={"range": [-1, 1]})
    return figure


def study_files(
    name: str, record: Mapping[str, Any], curves: PruningCurves, agreement: pd.DataFrame
) -> dict[str, str]:
    """
    A study's data as an export's files: its JSON ``record``, and its tables as CSV.

    ``<name>_study.json``, ``<name>_curves.csv``, ``<name>_areas.csv`` (each order's area and
    verdict), ``<name>_agreement.csv`` and ``<name>_verdicts.csv``.
    """
    verdicts = pd.DataFrame(
        [v.to_dict() for v in curves.verdicts],
        columns=["check", "status", "value", "threshold", "reason", "advice"],
    )
    return {
        f"{name}_study.json": json.dumps(record, indent=1, allow_nan=False),
        f"{name}_curves.csv": curves.curves.to_csv(index=False),
        f"{name}_areas.csv": curves.scores.to_csv(index=False),
        f"{name}_agreement.csv": agreement.to_csv(index=False),
        f"{name}_verdicts.csv": verdicts.to_csv(index=False),
    }
