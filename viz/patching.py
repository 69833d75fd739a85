"""
Figures of a patching study (``attribution.patching``) and of pruning curves.

Pure functions of the plain results: a :class:`~attribution.patching.PatchingReport`'s table
and agreement, a :class:`~attribution.engine.verification.PruningCurves`. Effects are drawn on the
study's normalised scale (0 = the corrupted score, 1 = the clean one), each direction's panel
with diverging colours centred on its baseline (denoising 0, noising 1): white is a patch that
changes nothing, red moves the score towards (or past) the clean one, blue towards the
corrupted one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attrlab.attribution.engine import PruningCurves
from attrlab.attribution.engine.score_views import effect_scatters, ranking_table, score_grids
from attrlab.attribution.engine.study import PruningStudy
from attrlab.attribution.patching import COMPONENTS, DIRECTIONS, ESTIMATORS, PatchingReport
from attrlab.attribution.patching.visual import position_effects
from attrlab.viz.image import _map_trace, display_copy, picture_uri
from attrlab.viz.layers import _DIVERGING, _token_axis
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_tick
from attrlab.viz.weights import effect_scatter_figure, score_map_figure

__all__ = [
    "PRUNING_FIGURE_ROLES",
    "estimator_scatter",
    "patching_figure_names",
    "patching_figures",
    "patching_files",
    "patching_head_grid",
    "patching_heatmaps",
    "patching_image_figure",
    "pruning_figure",
    "pruning_figure_names",
    "pruning_figures",
    "pruning_files",
]

#: Each direction's baseline on the normalised scale: the score of the run patched into.
_BASELINE = {"denoising": 0.0, "noising": 1.0}
#: Cells a heatmap writes its values into (beyond that the hover alone has them).
_MOST_LABELLED = 160
#: Rows (or columns) beyond which a heatmap's cells are drawn without borders.
_MOST_GAPS = 60
#: Metrics of the pruning curves, for people.
_METRICS = {
    "log_prob": "log p(target) (higher is better)",
    "top1_agreement": "top-1 agreement with the full model (higher is better)",
    "next_token_loss": "next-token loss (lower is better)",
}


@dataclass(frozen=True)
class _Panel:
    """One direction's heatmap: values, axes, and what the hover says of each cell."""

    direction: str
    z: np.ndarray
    x: list
    y: list
    customdata: np.ndarray
    text: list[list[str]] | None = None


def _rows(report: PatchingReport, estimator: str, component: str) -> pd.DataFrame:
    table = report.table
    rows = table[(table["estimator"] == estimator) & (table["component"] == component)]
    if rows.empty:
        found = sorted(set(table.loc[table["component"] == component, "estimator"]))
        raise ValueError(
            f"the report has no {estimator!r} rows of {component!r}; "
            f"estimators there: {', '.join(found) or 'none'}"
        )
    return rows


def _directions(rows: pd.DataFrame) -> list[str]:
    present = set(rows["direction"])
    return [d for d in _BASELINE if d in present]


def _position_ticks(report: PatchingReport) -> list[str]:
    """Each clean token; ``clean→corrupted`` where the corrupted prompt's token differs."""
    corrupted = report.corrupted_tokens or report.tokens
    return [
        token_tick(clean) if clean == other else f"<b>{token_tick(clean)}→{token_tick(other)}</b>"
        for clean, other in zip(report.tokens, corrupted, strict=True)
    ]


def _span(values: Sequence[tuple[str, np.ndarray]]) -> float:
    """
    Half the colour range: the largest distance from a baseline, at least the gap 0 → 1.

    ``values``: each direction's normalised effects.
    """
    peaks = [np.nanmax(np.abs(z - _BASELINE[direction]), initial=0.0) for direction, z in values]
    return float(max(1.0, *peaks))


def _panels_figure(
    panels: Sequence[_Panel], stacked: bool, hover: str, title: str, height: int
) -> go.Figure:
    """
    Direction panels (stacked or side by side), each on its own colours centred on its baseline.

    Both colour ranges have the same width, so a colour's strength reads the same in both.
    """
    count = len(panels)
    rows, columns = (count, 1) if stacked else (1, count)
    figure = make_subplots(
        rows=rows,
        cols=columns,
        shared_xaxes=stacked,
        shared_yaxes=not stacked,
        subplot_titles=[f"{p.direction} ({_BASELINE[p.direction]:g} = unpatched)" for p in panels],
        vertical_spacing=min(0.12, 90 / height) if stacked else 0.0,  # about 90 px
        horizontal_spacing=0.0 if stacked else 0.2,
    )
    span = _span([(p.direction, p.z) for p in panels])
    labelled = all(p.z.size <= _MOST_LABELLED for p in panels)
    for index, panel in enumerate(panels):
        axis = "coloraxis" if index == 0 else f"coloraxis{index + 1}"
        figure.add_trace(
            go.Heatmap(
                z=panel.z,
                x=panel.x,
                y=panel.y,
                customdata=panel.customdata,
                text=panel.text,
                texttemplate="%{z:.2f}" if labelled else None,
                textfont={"size": 10},
                coloraxis=axis,
                # cell borders only while cells are large enough to keep their colour
                xgap=1 if panel.z.shape[1] <= _MOST_GAPS else 0,
                ygap=1 if panel.z.shape[0] <= _MOST_GAPS else 0,
                hovertemplate=hover,
            ),
            row=index + 1 if stacked else 1,
            col=1 if stacked else index + 1,
        )
        _direction_colours(figure, index, panel.direction, span)
    figure.update_annotations(font_size=13)
    figure.update_layout(
        title={"text": title, "font": {"size": 15}},
        height=height,
        margin={"l": 70, "r": 110, "t": 80, "b": 60},
        hoverlabel={"align": "left"},
        template=TEMPLATE,
    )
    return figure


def _direction_colours(figure: go.Figure, index: int, direction: str, span: float) -> None:
    """
    Panel ``index``'s colour axis: diverging, centred on ``direction``'s baseline, ± ``span``.

    Its colour bar stands just right of the panel (the subplot's axes ``index + 1``).
    """
    base = _BASELINE[direction]
    reference = "" if index == 0 else str(index + 1)
    x_domain = figure.layout[f"xaxis{reference}"].domain
    y_domain = figure.layout[f"yaxis{reference}"].domain
    middle, length = (y_domain[0] + y_domain[1]) / 2, y_domain[1] - y_domain[0]
    place = {"x": x_domain[1] + 0.01, "y": middle, "len": length, "xanchor": "left"}
    ticks = {0.0: "0 corrupted", 1.0: "1 clean"}
    for end in (base - span, base + span):
        if min(abs(end), abs(end - 1.0)) > 0.3:
            ticks[end] = f"{end:.2g}"
    figure.update_layout(
        {
            f"coloraxis{reference}": {
                "colorscale": _DIVERGING,
                "cmin": base - span,
                "cmax": base + span,
                "colorbar": {
                    **place,
                    "thickness": 12,
                    "tickvals": list(ticks),
                    "ticktext": list(ticks.values()),
                },
            }
        }
    )


def _grids(
    part: pd.DataFrame, index: list[str], columns: str, across: Sequence[int] | None = None
) -> tuple[pd.DataFrame, np.ndarray]:
    """
    The normalised effects as a grid, and ``(effect, patched, kv_head)`` in each cell.

    ``across``: the columns to show (missing ones empty); by default those the rows have.
    """

    def grid(values: str) -> pd.DataFrame:
        return part.pivot_table(index=index, columns=columns, values=values, dropna=False)

    z = grid("normalised")
    z = z if across is None else z.reindex(columns=list(across))
    cells = [
        grid(c).reindex_like(z).to_numpy(dtype=float) for c in ("effect", "patched", "kv_head")
    ]
    return z, np.stack(cells, axis=-1)


def _what(report: PatchingReport, estimator: str) -> str:
    """``exact patching of 'target'`` for a title."""
    name = ESTIMATORS[estimator].title if estimator in ESTIMATORS else estimator
    return f"{name}, target {token_tick(report.target)}"


def patching_heatmaps(report: PatchingReport, estimator: str = "exact") -> dict[str, go.Figure]:
    """
    Layer × position heatmaps of the normalised effect, one per per-position component.

    ``residual``, ``attention`` and ``mlp`` have a row per layer; ``head_position`` a row per
    layer and head (``L2 H5``). The directions are stacked, sharing the clean prompt's tokens
    on the x axis (``clean→corrupted`` where the corrupted prompt's token differs); the hover
    gives layer (and head), position, token, the normalised and the raw effect and the
    patched score.

    Args:
        report: A patching study.
        estimator: Whose effects to draw (``exact``, or an estimator's).

    Returns:
        Component name -> figure, for the per-position components the report holds.

    Raises:
        ValueError: the report has no per-position rows of ``estimator``.
    """
    ticks = _position_ticks(report)
    positions = list(range(len(report.tokens)))
    kinds = [c for c in COMPONENTS.values() if c.per_position]
    present = set(report.table.loc[report.table["estimator"] == estimator, "component"])
    if not any(c.name in present for c in kinds):
        raise ValueError(f"the report has no per-position rows of {estimator!r}")
    figures = {}
    for component in (c for c in kinds if c.name in present):
        rows = _rows(report, estimator, component.name)
        index = ["layer", "head"] if component.per_head else ["layer"]
        panels = []
        for direction in _directions(rows):
            part = rows[rows["direction"] == direction]
            z, data = _grids(part, index, "position", positions)
            labels = [f"L{k[0]} H{k[1]}" for k in z.index] if component.per_head else list(z.index)
            panels.append(
                _Panel(
                    direction,
                    z.to_numpy(dtype=float),
                    positions,
                    labels,
                    data,
                    [ticks for _ in labels],
                )
            )
        where = "%{y}" if component.per_head else "layer %{y}"
        kv_line = " (kv head %{customdata[2]})" if component.per_head else ""
        hover = (
            f"{where}{kv_line}, position %{{x}}: %{{text}}<br>"
            "normalised %{z:.4g} (0 corrupted, 1 clean)<br>"
            "effect %{customdata[0]:.4g}, patched score %{customdata[1]:.4g}<extra></extra>"
        )
        count = len(panels[0].y)
        figure = _panels_figure(
            panels,
            stacked=True,
            hover=hover,
            title=f"{component.description}: {_what(report, estimator)}",
            # heads × layers rows get more room, still under a screen's height each
            height=int(
                len(panels) * min(900 if component.per_head else 520, max(180, 22 * count + 60))
                + 160
            ),
        )
        axis = _token_axis(report.tokens)
        axis["ticktext"] = [ticks[i] for i in axis["tickvals"]]
        figure.update_xaxes(axis)
        figure.update_xaxes(
            title_text="position (clean token, →corrupted where it differs)", row=len(panels), col=1
        )
        figure.update_yaxes(
            title_text="layer, head" if component.per_head else "layer",
            dtick=1 if count <= 16 and not component.per_head else None,
        )
        figures[component.name] = figure
    return figures


def patching_head_grid(report: PatchingReport, estimator: str = "exact") -> go.Figure:
    """
    Layer × head heatmap of each head's effect, patched at every position; directions side by side.

    The hover gives layer, head, kv head, the normalised and the raw effect and the patched score.

    Raises:
        ValueError: the report has no ``head`` rows of ``estimator``.
    """
    rows = _rows(report, estimator, "head")
    panels = []
    for direction in _directions(rows):
        part = rows[rows["direction"] == direction]
        z, data = _grids(part, ["layer"], "head")
        panels.append(
            _Panel(direction, z.to_numpy(dtype=float), list(z.columns), list(z.index), data)
        )
    layers, heads = panels[0].z.shape
    hover = (
        "layer %{y}, head %{x} (kv head %{customdata[2]})<br>"
        "normalised %{z:.4g} (0 corrupted, 1 clean)<br>"
        "effect %{customdata[0]:.4g}, patched score %{customdata[1]:.4g}<extra></extra>"
    )
    figure = _panels_figure(
        panels,
        stacked=False,
        hover=hover,
        title=f"each head at every position: {_what(report, estimator)}",
        height=int(min(760, max(380, 26 * layers + 170))),
    )
    figure.update_xaxes(title_text="head", dtick=1 if heads <= 16 else None)
    figure.update_yaxes(dtick=1 if layers <= 16 else None)
    figure.update_yaxes(title_text="layer", col=1)
    return figure


def _image_component(report: PatchingReport, estimator: str) -> str | None:
    """The component an image figure draws: the first per-position one of whole layers."""
    present = set(report.table.loc[report.table["estimator"] == estimator, "component"])
    return next(
        (
            c.name
            for c in COMPONENTS.values()
            if c.per_position and not c.per_head and c.name in present
        ),
        None,
    )


def patching_image_figure(
    report: PatchingReport, image: np.ndarray | None = None, estimator: str = "exact"
) -> go.Figure:
    """
    One component's normalised effect at each visual position, painted over the image.

    A vision-language study's (:attr:`PatchingReport.visual`): each visual token's effect over
    its box of ``image`` (:meth:`~attribution.patching.visual.VisualPositions.heatmap`), one
    panel per direction with the colours of the heatmaps (centred on the direction's
    baseline), a slider over the layers. The component is the residual stream where the
    study patched it, else the first per-position one it did (attention, MLP). ``image``:
    the clean image (default: the one the study holds).

    Raises:
        ValueError: not a vision-language study, no image, an image of another size than the
            study's, or no per-position component of whole layers for ``estimator``.
    """
    visual = report.visual
    image = image if image is not None or visual is None else visual.image
    if visual is None or image is None:
        raise ValueError("patching_image_figure draws a vision-language study over its image")
    component = _image_component(report, estimator)
    if component is None:
        raise ValueError(f"the report has no per-position rows of {estimator!r} to draw")
    if tuple(image.shape[:2]) != tuple(visual.size):
        raise ValueError(
            f"the image is {image.shape[1]} × {image.shape[0]} px; the study's "
            f"{visual.size[1]} × {visual.size[0]}"
        )
    rows = _rows(report, estimator, component)
    directions = _directions(rows)
    layers = sorted(int(layer) for layer in set(rows["layer"]))
    heat = {
        (direction, layer): visual.heatmap(
            position_effects(rows, estimator, direction, component, layer, column="normalised")
        )
        for direction in directions
        for layer in layers
    }
    span = _span([(d, h) for (d, _), h in heat.items()])
    picture = display_copy(image)
    figure = make_subplots(
        rows=1,
        cols=len(directions),
        subplot_titles=[f"{d} ({_BASELINE[d]:g} = unpatched)" for d in directions],
        horizontal_spacing=0.16,
    )
    layer_of: list[int | None] = []
    for column, direction in enumerate(directions, start=1):
        figure.add_trace(go.Image(source=picture_uri(picture), hoverinfo="skip"), row=1, col=column)
        layer_of.append(None)
        for layer in layers:
            figure.add_trace(
                _map_trace(
                    heat[direction, layer],
                    picture.shape[:2],
                    None,
                    coloraxis="coloraxis" if column == 1 else f"coloraxis{column}",
                    opacity=0.6,
                    visible=layer == layers[0],
                    name=f"layer {layer}",
                    hovertemplate=(
                        f"{direction}, layer {layer}, (%{{x:.0f}}, %{{y:.0f}}): "
                        "normalised %{z:.3f}<extra></extra>"
                    ),
                ),
                row=1,
                col=column,
            )
            layer_of.append(layer)
        figure.update_xaxes(visible=False, row=1, col=column)
        figure.update_yaxes(
            autorange="reversed",
            scaleanchor=f"x{'' if column == 1 else column}",
            visible=False,
            row=1,
            col=column,
        )
        _direction_colours(figure, column - 1, direction, span)
    steps = [
        {
            "label": str(layer),
            "method": "update",
            "args": [{"visible": [shown in (None, layer) for shown in layer_of]}],
        }
        for layer in layers
    ]
    name = COMPONENTS[component].description
    figure.update_layout(
        template=TEMPLATE,
        title={"text": f"{name}, over the image: {_what(report, estimator)}", "font": {"size": 15}},
        sliders=[{"active": 0, "currentvalue": {"prefix": "layer "}, "steps": steps}]
        if len(layers) > 1
        else [],
        margin={"l": 10, "r": 110, "t": 80, "b": 60},
        height=480,
    )
    return figure


def estimator_scatter(report: PatchingReport, direction: str = "denoising") -> go.Figure:
    """
    Each estimator's effect (y) against exact patching's (x), site by site, in one direction.

    A panel per estimator (rows) and component (columns), with the diagonal ``y = x`` across
    the data; each panel's title gives Pearson's r and Spearman's ρ from the report's agreement
    table. A magnitude estimator (AtP*) is drawn against ``|exact|``, as it is compared.

    Raises:
        ValueError: the report has no exact rows in ``direction``, or no estimator beside them.
    """
    table = report.table[report.table["direction"] == direction]
    exact = table[table["estimator"] == "exact"]
    estimators = [e for e in dict.fromkeys(table["estimator"]) if e != "exact"]
    if exact.empty or not estimators:
        raise ValueError(
            f"the scatter needs exact patching and an estimator in the {direction} direction"
        )
    components = [c for c in COMPONENTS if c in set(exact["component"])]
    scores = report.agreement.set_index(["estimator", "direction", "component"])
    titles = []
    for estimator in estimators:
        for component in components:
            key = (estimator, direction, component)
            found = scores.loc[key] if key in scores.index else None
            titles.append(
                f"{component}: r = {found['pearson']:.3f}, ρ = {found['spearman']:.3f}"
                if found is not None
                else f"{component}: no agreement"
            )
    figure = make_subplots(
        rows=len(estimators),
        cols=len(components),
        subplot_titles=titles,
        horizontal_spacing=0.05,
        vertical_spacing=0.12 / max(1, len(estimators) - 1) + 0.05,
    )
    site = ["component", "layer", "head", "position"]
    for r, estimator in enumerate(estimators, start=1):
        magnitude = estimator in ESTIMATORS and ESTIMATORS[estimator].magnitude
        rows = table[table["estimator"] == estimator]
        pairs = rows.merge(exact, on=site, suffixes=("", "_exact"))
        for c, component in enumerate(components, start=1):
            part = pairs[pairs["component"] == component]
            x = part["effect_exact"].to_numpy(dtype=float)
            x = np.abs(x) if magnitude else x
            y = part["effect"].to_numpy(dtype=float)
            where = [
                f"L{row.layer}"
                + ("" if pd.isna(row.head) else f" H{row.head}")
                + (
                    ""
                    if pd.isna(row.position)
                    else f", position {row.position}: "
                    + token_tick(report.tokens[int(row.position)])
                )
                for row in part.itertuples(index=False)
            ]
            figure.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="markers",
                    marker={"size": 6, "opacity": 0.7, "color": "#4c72b0"},
                    text=where,
                    name=estimator,
                    showlegend=False,
                    hovertemplate=(
                        "%{text}<br>exact "
                        + ("|effect|" if magnitude else "effect")
                        + " %{x:.4g}<br>"
                        + estimator
                        + " %{y:.4g}<extra></extra>"
                    ),
                ),
                row=r,
                col=c,
            )
            both = np.concatenate([x, y])
            low, high = (float(np.nanmin(both)), float(np.nanmax(both))) if both.size else (0, 0)
            figure.add_trace(
                go.Scatter(
                    x=[low, high],
                    y=[low, high],
                    mode="lines",
                    line={"color": "#a0a0a0", "dash": "dot", "width": 1},
                    name="y = x",
                    showlegend=False,
                    hoverinfo="skip",
                ),
                row=r,
                col=c,
            )
        title = ESTIMATORS[estimator].title if estimator in ESTIMATORS else estimator
        against = "<br>against |exact|" if magnitude else ""
        figure.update_yaxes(title_text=title + against, title_font_size=12, row=r, col=1)
    for c in range(1, len(components) + 1):
        figure.update_xaxes(
            title_text="exact effect", title_font_size=12, row=len(estimators), col=c
        )
    figure.update_xaxes(exponentformat="e")
    figure.update_yaxes(exponentformat="e")
    figure.update_annotations(font_size=12)
    figure.update_layout(
        title={
            "text": f"estimators against exact patching ({direction}), target "
            f"{token_tick(report.target)}; dotted: y = x",
            "font": {"size": 15},
        },
        height=int(120 + 260 * len(estimators)),
        width=int(max(700, 240 * len(components) + 120)),
        margin={"l": 80, "r": 20, "t": 90, "b": 60},
        hoverlabel={"align": "left"},
        template=TEMPLATE,
    )
    return figure


def pruning_figure(curves: PruningCurves) -> go.Figure:
    """
    Pruning curves: a panel per metric, a line per ranking beside the random orders.

    The random orders are drawn as their mean (dashed) inside the band from their lowest to
    their highest draw. Each panel has its own legend, naming each ranking's area under the
    curve (the mean over ``k = 0 … K`` removed units) and its verdict against the random
    draws' areas, and the random draws' mean area and standard deviation.
    """
    table, scores = curves.curves, curves.scores
    metrics = [
        m
        for m in dict.fromkeys(table["metric"])
        if table.loc[table["metric"] == m, "value"].notna().any()
    ]
    orders = list(dict.fromkeys(table["order"]))
    areas = scores.set_index(["order", "metric"])
    figure = make_subplots(
        rows=1,
        cols=len(metrics),
        subplot_titles=[_METRICS.get(m, m) for m in metrics],
        horizontal_spacing=0.08,
    )
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"]
    rankings = [o for o in orders if o != "random"]
    colours = {o: palette[i % len(palette)] for i, o in enumerate(rankings)} | {"random": "#7f7f7f"}
    unit = curves.unit
    for m, metric in enumerate(metrics, start=1):
        legend = "legend" if m == 1 else f"legend{m}"
        for order in orders:
            rows = table[(table["order"] == order) & (table["metric"] == metric)].sort_values(
                "removed"
            )
            x = rows["removed"].tolist()
            area = areas.loc[(order, metric)]
            if order == "random":
                for bound, fill in (("high", None), ("low", "tonexty")):
                    figure.add_trace(
                        go.Scatter(
                            x=x,
                            y=rows[bound].to_numpy(dtype=float),
                            mode="lines",
                            line={"width": 0, "color": colours[order]},
                            fill=fill,
                            fillcolor="rgba(127, 127, 127, 0.2)",
                            name=f"random {bound}est draw",
                            legend=legend,
                            showlegend=False,
                            hovertemplate=f"random, {bound}est draw: %{{y:.4g}}<extra></extra>",
                        ),
                        row=1,
                        col=m,
                    )
                name = f"random (area {area['auc']:#.4g} ± {area['std']:#.2g})"
            else:
                name = f"{order} (area {area['auc']:#.4g}, {area['status']})"
            figure.add_trace(
                go.Scatter(
                    x=x,
                    y=rows["value"].to_numpy(dtype=float),
                    mode="lines+markers",
                    name=name,
                    legend=legend,
                    line={
                        "color": colours[order],
                        "dash": "dash" if order == "random" else "solid",
                    },
                    hovertemplate=f"{order}: %{{y:.4g}} with %{{x}} {unit}s removed<extra></extra>",
                ),
                row=1,
                col=m,
            )
        domain = figure.layout[f"xaxis{'' if m == 1 else m}"].domain
        figure.update_layout(
            {
                legend: {
                    "x": domain[0],
                    "y": -0.25,
                    "xanchor": "left",
                    "yanchor": "top",
                    "font": {"size": 11},
                }
            }
        )
    figure.update_xaxes(title_text=f"{unit}s removed", dtick=1 if unit == "layer" else None)
    figure.update_annotations(font_size=13)
    figure.update_layout(
        title={
            "text": f"{unit} pruning, least important first by each ranking; random orders: "
            "mean (dashed) and lowest to highest draw (band)",
            "font": {"size": 15},
        },
        height=500,
        width=480 * len(metrics),
        margin={"l": 60, "r": 20, "t": 90, "b": 170},
        template=TEMPLATE,
    )
    return figure


def patching_figure_names(image: bool = False) -> list[str]:
    """
    Every name :func:`patching_figures` may give, in its order (a front end's places).

    ``image``: a vision-language study's, whose effects are drawn over the image first.
    """
    heatmaps = [f"patching_{c.name}" for c in COMPONENTS.values() if c.per_position]
    over = ["patching_image"] if image else []
    return [*over, *heatmaps, "patching_heads", *(f"estimators_{d}" for d in DIRECTIONS)]


def patching_files(report: PatchingReport) -> dict[str, str]:
    """
    A study's data as an export's files: the report's JSON, its table and agreement as CSV.

    ``patching_report.json`` is :meth:`PatchingReport.to_dict`; the CSVs hold every column.
    """
    return {
        "patching_report.json": json.dumps(report.to_dict(), indent=1, allow_nan=False),
        "patching_table.csv": report.table.to_csv(index=False),
        "patching_agreement.csv": report.agreement.to_csv(index=False),
    }


def pruning_files(study: PruningStudy) -> dict[str, str]:
    """
    A pruning study's data as an export's files: its JSON, its curves and areas as CSV.

    And each estimator's score of each site (``pruning_rankings.csv``: what the score maps and
    the agreement scatter draw, beside the exact effects in the JSON's agreements).
    """
    return {
        "pruning_study.json": json.dumps(study.to_dict(), indent=1, allow_nan=False),
        "pruning_curves.csv": study.curve_table().to_csv(index=False),
        "pruning_scores.csv": study.score_table().to_csv(index=False),
        "pruning_rankings.csv": ranking_table(study).to_csv(index=False),
    }


#: What each of a unit's pruning figures shows (:func:`pruning_figure_names`' keys).
PRUNING_FIGURE_ROLES = ("curves", "allocated", "scores", "agreement")


def pruning_figure_names(unit: str, allocation: str | None = None) -> dict[str, str]:
    """
    The names :func:`pruning_figures` gives ``unit``'s figures, by what each shows.

    ``curves`` (``pruning_neurons``), ``allocated`` (under ``allocation``:
    ``pruning_neurons_owl``), ``scores`` (per-layer score maps: ``scores_neurons``) and
    ``agreement`` (the scatter against exact removal: ``agreement_neurons``).
    """
    names = {
        "curves": f"pruning_{unit}s",
        "scores": f"scores_{unit}s",
        "agreement": f"agreement_{unit}s",
    }
    return names | ({"allocated": f"pruning_{unit}s_{allocation}"} if allocation else {})


def pruning_figures(study: PruningStudy) -> dict[str, go.Figure]:
    """
    Every figure a pruning study has data for, by name (:func:`pruning_figure_names`).

    Each unit's curves (``pruning_layers``, ``pruning_heads``), under an allocation its curves
    too (``pruning_neurons_owl``), a channel or expert kind's per-layer score maps
    (``scores_neurons``) and, where the agreement with exact removal was measured, its scatter
    (``agreement_neurons``).
    """
    figures = {
        pruning_figure_names(unit)["curves"]: pruning_figure(curves)
        for unit, curves in study.curves().items()
    }
    for unit, curves in study.allocated.items():
        figures[pruning_figure_names(unit, study.allocation)["allocated"]] = pruning_figure(curves)
    for unit in study.curves():
        names = pruning_figure_names(unit)
        if grids := score_grids(study, unit):
            figures[names["scores"]] = score_map_figure(grids, unit)
        if scatters := effect_scatters(study, unit):
            figures[names["agreement"]] = effect_scatter_figure(scatters, unit)
    return figures


def patching_figures(report: PatchingReport) -> dict[str, go.Figure]:
    """
    Every figure a patching study has data for, by name (what a front end shows or writes).

    Exact patching's heatmaps (``patching_<component>``; an estimator's where the study ran
    no exact patching), its head grid (``patching_heads``) when heads were patched, and with
    exact patching and an estimator, one scatter per direction (``estimators_<direction>``).
    A vision-language study that holds its image (:attr:`PatchingReport.visual`) draws the
    effects over the image first (``patching_image``, :func:`patching_image_figure`).
    """
    table = report.table
    ran = list(dict.fromkeys(table["estimator"]))
    if not ran:
        return {}
    shown = "exact" if "exact" in ran else ran[0]
    components = set(table.loc[table["estimator"] == shown, "component"])
    figures: dict[str, go.Figure] = {}
    visual = report.visual
    if visual is not None and visual.image is not None and _image_component(report, shown):
        figures["patching_image"] = patching_image_figure(report, estimator=shown)
    if any(COMPONENTS[c].per_position for c in components):
        heatmaps = patching_heatmaps(report, shown)
        figures |= {f"patching_{name}": figure for name, figure in heatmaps.items()}
    if "head" in components:
        figures["patching_heads"] = patching_head_grid(report, shown)
    if shown == "exact" and len(ran) > 1:
        for direction in _directions(table):
            figures[f"estimators_{direction}"] = estimator_scatter(report, direction)
    return figures
