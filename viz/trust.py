"""Figures of the evidence for a map: the randomisation check and agreement between methods."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from viz.layers import agreement_figure

__all__ = ["method_agreement_figure", "randomisation_figure"]


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
        template="plotly_white",
    )
    return figure
