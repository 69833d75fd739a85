"""Rendering: overlays put colour where the scores are; figures and highlights are scaled."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attribution.explanation import Explanation, ModelInfo, Target
from attribution.layers import HEAD_ESTIMATORS, agreement, analyze_layers
from viz import (
    agreement_figure,
    export_figure,
    head_heatmap,
    heatmap_overlay,
    image_figure,
    layer_lines,
    positional_figure,
    token_figure,
    token_highlights,
    top_heads_figure,
)
from viz.image import robust_peak
from viz.table import explanation_table


def _explanation(scores: np.ndarray, tokens: list[str] | None = None) -> Explanation:
    return Explanation(
        model=ModelInfo("toy", None, "text" if tokens else "image"),
        method="toy",
        params={},
        target=Target(0, "a", 1.0, 0.5),
        predictions=[],
        scores=scores,
        tokens=tokens,
        image_size=None if tokens else scores.shape,
    )


def test_overlay_colours_positive_red_negative_blue_and_leaves_zero_alone():
    scores = np.zeros((8, 8))
    scores[1, 1], scores[6, 6] = 2.0, -2.0
    grey = np.full((16, 16, 3), 128, dtype=np.uint8)  # overlay resizes the map to the image
    overlay = heatmap_overlay(_explanation(scores), grey)
    assert overlay.shape == grey.shape
    red, blue = overlay[2, 2].astype(int), overlay[13, 13].astype(int)
    assert red[0] > red[2] and blue[2] > blue[0]
    assert (overlay[0, 15] == 128).all()


def test_robust_peak_ignores_a_single_outlier():
    scores = np.ones((100, 100))
    scores[0, 0] = 1e6
    assert robust_peak(scores) == 1.0
    assert robust_peak(np.zeros((4, 4))) == 0.0


def test_image_figure_is_symmetric_around_zero():
    scores = np.linspace(-1, 3, 64).reshape(8, 8)
    figure = image_figure(_explanation(scores), np.zeros((8, 8, 3), dtype=np.uint8))
    heatmap = figure.data[1]
    assert heatmap.zmin == -heatmap.zmax and heatmap.zmax > 0


def test_token_views():
    e = _explanation(np.array([0.5, -2.0, 1.0]), ["a", "b", "c"])
    assert token_highlights(e) == [("a", 0.25), ("b", -1.0), ("c", 0.5)]
    assert list(token_figure(e).data[0].y) == [0.5, -2.0, 1.0]
    table = explanation_table(e)
    assert "b  -2.000000  --------------------" in table


@pytest.fixture(scope="module")
def layer_tables(load_model):
    """The full layer table (every measure that applies) on each kind of transformer."""
    tables = {}
    for spec in ("tiny-random-bert", "tiny-random-gpt2", "tiny-random-llama", "tiny-random-vit"):
        adapter = load_model(spec)
        raw = np.zeros((32, 32, 3), np.uint8) if adapter.modality == "image" else "a short text"
        inputs = adapter.preprocess(raw)
        tables[spec] = (adapter, analyze_layers(adapter, inputs, 0))
    minilm = load_model("minilm-zeroshot")
    tables["minilm-zeroshot"] = (minilm, analyze_layers(minilm, minilm.preprocess("good"), 0))
    return tables


def test_layer_figures_build_for_every_measure(layer_tables):
    for spec, (adapter, table) in layer_tables.items():
        for measure in table["measure"].unique():
            is_head = table[table["measure"] == measure]["head"].notna().all()
            if is_head:
                figure = head_heatmap(table, measure)
                z = np.asarray(figure.data[0].z)
                assert z.shape == (adapter.num_layers, adapter.num_heads), (spec, measure)
                expected = table[
                    (table.measure == measure) & (table.layer == 1) & (table["head"] == 0)
                ]
                assert z[1, 0] == pytest.approx(float(expected.value.iloc[0]))
            else:
                figure = layer_lines(table, [measure], normalise=True)
                assert len(figure.data[0].x) == len(table[table.measure == measure])
        assert len(layer_lines(table).data) == table[table["head"].isna()]["measure"].nunique()
        assert positional_figure(table).data[1].y is not None
        top = top_heads_figure(table, HEAD_ESTIMATORS, k=3)
        assert np.asarray(top.data[0].z).shape == (3, len(HEAD_ESTIMATORS))
        pairs = agreement(table, HEAD_ESTIMATORS)
        matrix = np.asarray(agreement_figure(pairs).data[0].z)
        assert matrix.shape == (len(HEAD_ESTIMATORS),) * 2 and np.allclose(np.diag(matrix), 1)


def test_layer_figures_export_to_html_and_png(layer_tables, tmp_path):
    _, table = layer_tables["tiny-random-llama"]
    figure = head_heatmap(table, "head_gradient")
    html = export_figure(figure, tmp_path / "heads.html").read_text()
    assert "plotly" in html.lower() and "head_gradient" in html
    png = export_figure(figure, tmp_path / "heads.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000
    with pytest.raises(ValueError, match=r"html or \.png"):
        export_figure(figure, tmp_path / "heads.svg")


def test_check_figures_plot_the_tables_values():
    from viz import method_agreement_figure, randomisation_figure

    steps = pd.DataFrame(
        {
            "method": ["a", "a", "b", "b"],
            "step": [0, 1, 0, 1],
            "layer": ["none", "output", "none", "output"],
            "spearman": [1.0, 0.2, 1.0, 0.9],
            "spearman_abs": [1.0, 0.4, 1.0, 0.95],
        }
    )
    figure = randomisation_figure(steps)
    lines = {trace.name: list(trace.y) for trace in figure.data}
    assert lines == {
        "a (ρ)": [1.0, 0.2],
        "a (|ρ|)": [1.0, 0.4],
        "b (ρ)": [1.0, 0.9],
        "b (|ρ|)": [1.0, 0.95],
    }
    pairs = pd.DataFrame(
        {"first": ["a"], "second": ["b"], "spearman": [0.5], "top_k_overlap": [0.25], "k": [2]}
    )
    (heatmap,) = method_agreement_figure(pairs).data
    np.testing.assert_array_equal(heatmap.z, [[1.0, 0.5], [0.5, 1.0]])
    np.testing.assert_array_equal(heatmap.customdata, [[1.0, 0.25], [0.25, 1.0]])
