"""Figures of a bits study: the sensitivity table as a heatmap, and the allocation curves."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

if TYPE_CHECKING:
    from attrlab.attribution.bits import BitsStudy

__all__ = ["bits_figures"]


def bits_figures(study: BitsStudy) -> dict[str, go.Figure]:
    """``bits_sensitivity`` (parts × widths, per scheme) and ``bits_allocation`` (the curves)."""
    value = "loss_change" if study.measure == "loss" else "kl"
    figures: dict[str, go.Figure] = {}
    for scheme, rows in study.table.groupby("scheme", sort=False):
        grid = rows.pivot(index="part", columns="bits", values=value)
        grid = grid.loc[list(dict.fromkeys(rows["part"]))]
        figure = go.Figure(
            go.Heatmap(
                z=grid.to_numpy(),
                x=[f"{b} bits" for b in grid.columns],
                y=list(grid.index),
                colorscale="Reds",
                colorbar={"title": value},
            )
        )
        figure.update_layout(
            title=f"{study.model}: each part quantised alone ({scheme})",
            yaxis={"autorange": "reversed"},
            height=max(300, 16 * len(grid) + 120),
        )
        figures[f"bits_sensitivity_{scheme}"] = figure
    curves = study.curves
    figure = go.Figure()
    random = curves[curves["allocation"] == "random"]
    figure.add_trace(
        go.Scatter(
            x=random["average_bits"],
            y=random["value"],
            error_y={"type": "data", "array": random["std"]},
            mode="markers+lines",
            name="random (mean ± std)",
            line={"dash": "dot", "color": "grey"},
        )
    )
    for name, rows in curves[curves["allocation"] != "random"].groupby("allocation", sort=False):
        figure.add_trace(
            go.Scatter(x=rows["average_bits"], y=rows["value"], mode="markers+lines", name=name)
        )
    figure.update_layout(
        title=f"{study.model}: {study.measure} against average bits per weight, by allocation",
        xaxis_title="average bits per weight",
        yaxis_title=study.measure,
    )
    figures["bits_allocation"] = figure
    return figures
