"""
Figures and files of a bits study, drawn from its tables alone.

The sensitivity table as a heatmap (parts × bits, per scheme), the proxies' rank agreement with
it (proxies × bits and scheme), and the allocation curves: the study's measure against the
average bits per weight, each proxy's allocation beside uniform bits and the random
allocations' band (their lowest to highest draw, their mean dashed).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from attrlab.viz.bands import add_random_band

if TYPE_CHECKING:
    from attrlab.attribution.bits import BitsStudy

__all__ = ["bits_figures", "bits_files", "sensitivity_grids"]


def sensitivity_grids(study: BitsStudy) -> dict[str, pd.DataFrame]:
    """Per scheme, the sensitivity (``loss_change`` or ``kl``): parts × bits, in table order."""
    value = "loss_change" if study.measure == "loss" else "kl"
    grids = {}
    for scheme, rows in study.table.groupby("scheme", sort=False):
        grid = rows.pivot(index="part", columns="bits", values=value)
        grids[str(scheme)] = grid.loc[
            list(dict.fromkeys(rows["part"])), list(dict.fromkeys(rows["bits"]))
        ]
    return grids


def bits_figures(study: BitsStudy) -> dict[str, go.Figure]:
    """
    ``bits_sensitivity_<scheme>`` per scheme, ``bits_agreement`` and ``bits_allocation``.

    The heatmaps' cells are the table's values as they are; the curves' points are the
    ``curves`` table's rows (``random``: its mean, its ``low`` and ``high`` as the band).
    """
    value = "loss_change" if study.measure == "loss" else "kl"
    figures: dict[str, go.Figure] = {}
    for scheme, grid in sensitivity_grids(study).items():
        figure = go.Figure(
            go.Heatmap(
                z=grid.to_numpy(),
                x=[f"{b} bits" for b in grid.columns],
                y=list(grid.index),
                colorscale="Reds",
                colorbar={"title": value},
                hovertemplate=f"%{{y}} at %{{x}}: {value} %{{z:.4g}}<extra></extra>",
            )
        )
        figure.update_layout(
            title=f"{study.model}: each part quantised alone ({scheme})",
            yaxis={"autorange": "reversed"},
            height=max(300, 16 * len(grid) + 120),
        )
        figures[f"bits_sensitivity_{scheme}"] = figure
    figures["bits_agreement"] = _agreement_figure(study, value)
    figures["bits_allocation"] = _allocation_figure(study)
    return figures


def _agreement_figure(study: BitsStudy, value: str) -> go.Figure:
    """Each proxy's Spearman ρ with the measured sensitivity, per width and scheme."""
    agreement = study.agreement
    columns = list(dict.fromkeys(zip(agreement["bits"], agreement["scheme"], strict=True)))
    grid = agreement.pivot_table(
        index="proxy", columns=["bits", "scheme"], values="spearman", sort=False, dropna=False
    ).reindex(index=list(dict.fromkeys(agreement["proxy"])), columns=columns)
    figure = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(dtype=float),
            x=[f"{b} bits, {s}" for b, s in columns],
            y=list(grid.index),
            zmin=-1,
            zmax=1,
            colorscale="RdBu",
            colorbar={"title": "ρ"},
            hovertemplate="%{y} at %{x}: ρ %{z:.3g}<extra></extra>",
        )
    )
    figure.update_layout(
        title=f"{study.model}: each proxy's Spearman ρ with the measured {value}",
        yaxis={"autorange": "reversed"},
        height=max(300, 28 * len(grid) + 140),
    )
    return figure


def _allocation_figure(study: BitsStudy) -> go.Figure:
    curves = study.curves
    figure = go.Figure()
    random = curves[curves["allocation"] == "random"].sort_values("average_bits")
    add_random_band(figure, random["average_bits"], random)
    for name, rows in curves[curves["allocation"] != "random"].groupby("allocation", sort=False):
        rows = rows.sort_values("average_bits")
        figure.add_trace(
            go.Scatter(x=rows["average_bits"], y=rows["value"], mode="markers+lines", name=name)
        )
    figure.update_layout(
        title=f"{study.model}: {study.measure} against average bits per weight, by allocation",
        xaxis_title="average bits per weight",
        yaxis_title=study.measure,
    )
    return figure


def bits_files(study: BitsStudy) -> dict[str, str]:
    """
    A bits study's data as an export's files: its JSON, and each table as CSV.

    ``bits_table.csv`` (the sensitivity table), ``bits_proxies.csv``, ``bits_agreement.csv``,
    ``bits_curves.csv`` and ``bits_verdicts.csv`` (one row per proxy and budget).
    """
    verdicts = pd.DataFrame(
        [{"allocation": key, **v.to_dict()} for key, v in study.verdicts.items()],
        columns=["allocation", "check", "status", "value", "threshold", "reason", "advice"],
    )
    return {
        "bits_study.json": json.dumps(study.to_dict(), indent=1, allow_nan=False),
        "bits_table.csv": study.table.to_csv(index=False),
        "bits_proxies.csv": study.proxies.to_csv(index=False),
        "bits_agreement.csv": study.agreement.to_csv(index=False),
        "bits_curves.csv": study.curves.to_csv(index=False),
        "bits_verdicts.csv": verdicts.to_csv(index=False),
    }
