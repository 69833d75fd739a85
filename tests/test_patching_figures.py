"""Patching and pruning figures show exactly the study's numbers, where a reader looks for them."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from attrlab.attribution.engine import pruning_curves
from attrlab.attribution.patching import patching_problem, patching_report
from attrlab.attribution.request.answers import answer_request
from attrlab.viz import (
    estimator_scatter,
    export_figure,
    patching_figures,
    patching_head_grid,
    patching_heatmaps,
    pruning_figure,
)
from attrlab.viz.tokens import token_tick

CLEAN = "mary and john met and john gave it to"
CORRUPTED = CLEAN.replace("and john gave", "and mary gave")


@pytest.fixture(scope="module")
def gpt2(load_model):
    return load_model("tiny-random-gpt2")


@pytest.fixture(scope="module")
def report(gpt2):
    problem = patching_problem(gpt2, CLEAN, CORRUPTED, answer=" mary", contrast=" john")
    return patching_report(gpt2, problem)


@pytest.fixture(scope="module")
def curves(gpt2):
    items = [answer_request(gpt2, CLEAN, answer=" mary", contrast=" john")]
    return pruning_curves(gpt2, items, {"first": [2.0, 1.0], "last": [1.0, 2.0]}, draws=2)


def _cell(trace, y, x) -> tuple[float, float]:
    """The (normalised, raw effect) a heatmap trace draws at row label ``y``, column ``x``."""
    row, column = list(trace.y).index(y), list(trace.x).index(x)
    return trace.z[row][column], trace.customdata[row][column][0]


def _site(row) -> tuple[int, int, int]:
    """A table row's layer, head and position (-1 where it has none)."""
    return tuple(-1 if pd.isna(v) else int(v) for v in (row.layer, row.head, row.position))


def test_heatmap_cells_are_the_tables_effects_under_the_prompts_tokens(report):
    figures = patching_heatmaps(report)
    assert list(figures) == ["residual", "attention", "mlp", "head_position"]
    table = report.table[report.table["estimator"] == "exact"]
    for component, figure in figures.items():
        assert len(figure.data) == 2, component  # one panel per direction
        for trace, direction in zip(figure.data, ("denoising", "noising"), strict=True):
            rows = table[(table["component"] == component) & (table["direction"] == direction)]
            assert np.asarray(trace.z).size == len(rows) > 0
            for row in rows.itertuples(index=False):
                label = f"L{row.layer} H{row.head}" if component == "head_position" else row.layer
                assert _cell(trace, label, row.position) == (row.normalised, row.effect)
    # the tokens under the columns: the clean prompt's, the swapped name as clean→corrupted
    axis = figures["residual"].layout.xaxis
    # the word that differs; one token per word in this vocabulary
    swapped = [a != b for a, b in zip(CLEAN.split(), CORRUPTED.split(), strict=True)].index(True)
    assert report.tokens[swapped] == " john" and report.corrupted_tokens[swapped] == " mary"
    for position, text in zip(axis.tickvals, axis.ticktext, strict=True):
        token = token_tick(report.tokens[position])
        if position == swapped:
            assert text == f"<b>{token}→{token_tick(' mary')}</b>"
        else:
            assert text == token
    assert list(axis.tickvals) == list(range(len(report.tokens)))


def test_each_direction_is_coloured_around_its_unpatched_score(report):
    figure = patching_heatmaps(report)["residual"]
    layout = figure.layout
    denoising, noising = layout.coloraxis, layout.coloraxis2
    assert (denoising.cmin + denoising.cmax) / 2 == pytest.approx(0.0)
    assert (noising.cmin + noising.cmax) / 2 == pytest.approx(1.0)
    # the same strength of colour for the same distance in both, nothing clipped
    assert denoising.cmax - denoising.cmin == pytest.approx(noising.cmax - noising.cmin)
    for trace, base in zip(figure.data, (0.0, 1.0), strict=True):
        assert np.nanmax(np.abs(np.asarray(trace.z, dtype=float) - base)) <= denoising.cmax


def test_head_grid_is_the_per_head_rows_with_their_kv_heads(report):
    figure = patching_head_grid(report)
    table = report.table[
        (report.table["estimator"] == "exact") & (report.table["component"] == "head")
    ]
    for trace, direction in zip(figure.data, ("denoising", "noising"), strict=True):
        rows = table[table["direction"] == direction]
        assert np.asarray(trace.z).size == len(rows) == 8  # 2 layers × 4 heads
        for row in rows.itertuples(index=False):
            assert _cell(trace, row.layer, row.head) == (row.normalised, row.effect)
            cell = trace.customdata[list(trace.y).index(row.layer)][list(trace.x).index(row.head)]
            assert cell[2] == row.kv_head
    with pytest.raises(ValueError, match="no 'nope' rows of 'head'; estimators there: atp"):
        patching_head_grid(report, "nope")


def test_scatter_points_are_the_tables_pairs_and_titles_the_agreement(report):
    figure = estimator_scatter(report, "denoising")
    table = report.table[report.table["direction"] == "denoising"]
    exact = table[table["estimator"] == "exact"]
    components = ["residual", "attention", "mlp", "head", "head_position"]
    titles = iter(a.text for a in figure.layout.annotations)
    for r, estimator in enumerate(["atp", "atp_star", "relp"], start=1):
        for c, component in enumerate(components, start=1):
            points, diagonal = figure.select_traces(row=r, col=c)
            # the pairs, matched site by site here in a plain loop
            truth = {
                _site(row): row.effect
                for row in exact[exact["component"] == component].itertuples(index=False)
            }
            mine = table[(table["estimator"] == estimator) & (table["component"] == component)]
            expected = [
                (abs(t) if estimator == "atp_star" else t, row.effect)
                for row in mine.itertuples(index=False)
                for t in [truth[_site(row)]]
            ]
            assert sorted(zip(points.x, points.y, strict=True)) == sorted(expected)
            values = [v for pair in expected for v in pair]
            assert list(diagonal.x) == list(diagonal.y) == [min(values), max(values)]
            agreement = report.agreement.set_index(["estimator", "direction", "component"])
            found = agreement.loc[(estimator, "denoising", component)]
            title = next(titles)
            r_shown = float(re.search(r"r = (-?[\d.]+)", title).group(1))
            rho_shown = float(re.search(r"ρ = (-?[\d.]+)", title).group(1))
            assert r_shown == pytest.approx(found["pearson"], abs=5e-4)
            assert rho_shown == pytest.approx(found["spearman"], abs=5e-4)


def test_pruning_figure_draws_the_curves_the_random_band_and_names_their_areas(curves):
    figure = pruning_figure(curves)
    table, scores = curves.curves, curves.scores
    metrics = ["log_prob", "top1_agreement", "next_token_loss"]
    for c, metric in enumerate(metrics, start=1):
        every = list(figure.select_traces(row=1, col=c))
        band = [t for t in every if t.showlegend is False]
        random = table[(table["order"] == "random") & (table["metric"] == metric)]
        # the band runs from the lowest to the highest random draw at each k, filled between
        assert [list(t.y) for t in band] == [list(random["high"]), list(random["low"])]
        assert band[1].fill == "tonexty"
        traces = [t for t in every if t.showlegend is not False]
        assert [t.name.split(" (")[0] for t in traces] == ["first", "last", "random"]
        random_area = scores[(scores["order"] == "random") & (scores["metric"] == metric)]
        assert f"± {float(random_area['std'].iloc[0]):#.2g}" in traces[-1].name
        for trace in traces:
            order = trace.name.split(" (")[0]
            rows = table[(table["order"] == order) & (table["metric"] == metric)]
            by_removed = dict(zip(rows["removed"], rows["value"], strict=True))
            assert list(trace.x) == [0, 1]
            assert list(trace.y) == [by_removed[0], by_removed[1]]
            area = float(re.search(r"area (-?[\d.e+-]+)", trace.name).group(1))
            auc = scores[(scores["order"] == order) & (scores["metric"] == metric)]["auc"]
            # the trapezoid over k = 0, 1: the mean of the two ends
            assert area == pytest.approx((by_removed[0] + by_removed[1]) / 2, rel=1e-3)
            assert area == pytest.approx(float(auc.iloc[0]), rel=1e-3)
        assert {t.legend for t in traces} == {"legend" if c == 1 else f"legend{c}"}


def test_a_study_gets_the_figures_it_has_data_for(gpt2, report):
    names = [
        "patching_residual",
        "patching_attention",
        "patching_mlp",
        "patching_head_position",
        "patching_heads",
        "estimators_denoising",
        "estimators_noising",
    ]
    assert list(patching_figures(report)) == names
    problem = patching_problem(gpt2, CLEAN, CORRUPTED, answer=" mary", contrast=" john")
    small = patching_report(gpt2, problem, ["exact"], ["mlp", "head"], ["noising"])
    figures = patching_figures(small)
    assert list(figures) == ["patching_mlp", "patching_heads"]
    assert [p.text for p in figures["patching_mlp"].layout.annotations] == [
        "noising (1 = unpatched)"
    ]


def test_every_figure_exports_to_standalone_html(report, curves, tmp_path):
    figures = {
        **patching_figures(report),
        **{f"atp_{k}": f for k, f in patching_heatmaps(report, "atp").items()},
        "pruning": pruning_figure(curves),
    }
    for name, figure in figures.items():
        page = export_figure(figure, tmp_path / f"{name}.html").read_text(encoding="utf-8")
        assert page.lstrip().lower().startswith("<!doctype html>") and "Plotly.newPlot" in page
        assert len(page) > 1_000_000  # Plotly's script inlined: opens offline
    assert "Attribution patching (AtP)" in figures["atp_residual"].layout.title.text
