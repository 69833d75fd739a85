"""Rendering: overlays put colour where the scores are; figures and highlights are scaled."""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re
import zipfile

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest
import torch
from _figures import drawn_picture, extent
from _toy_explanations import toy_explanation as _explanation
from PIL import Image

from attrlab.attribution import explain
from attrlab.attribution.explanation import Explanation, Prediction
from attrlab.attribution.layers import HEAD_ESTIMATORS, agreement, analyze_layers
from attrlab.attribution.metrics.leaderboard import SCORES, EvalItem, evaluate_methods
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import output_target
from attrlab.attribution.verdicts import Verdict
from attrlab.viz import (
    ablation_figure,
    ablation_note,
    agreement_figure,
    attention_figure,
    conservation_figure,
    export_figure,
    head_heatmap,
    head_rank_table,
    heatmap_overlay,
    image_figure,
    image_grid_figure,
    layer_lines,
    leaderboard_figure,
    measure_note,
    positional_figure,
    positional_figure_tokens,
    scale_legend_html,
    std_error_figure,
    token_columns_html,
    token_figure,
    token_highlights,
    token_layers_figure,
    top_heads_figure,
    trust_card_html,
    trust_figure,
    write_bundle,
)
from attrlab.viz.bundle import safe_name
from attrlab.viz.image import picture_uri, robust_peak
from attrlab.viz.table import explanation_table


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
        tables[spec] = (adapter, analyze_layers(adapter, inputs, output_target(adapter, 0)))
    minilm = load_model("minilm-zeroshot")
    tables["minilm-zeroshot"] = (
        minilm,
        analyze_layers(minilm, minilm.preprocess("good"), output_target(minilm, 0)),
    )
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
                figure = layer_lines(table, [measure])
                assert len(figure.data[0].x) == len(table[table.measure == measure])
        assert len(layer_lines(table).data) == table[table["head"].isna()]["measure"].nunique()
        assert positional_figure(table).data[1].y is not None
        top = top_heads_figure(table, HEAD_ESTIMATORS, k=3)
        assert np.asarray(top.data[0].z).shape == (3, len(HEAD_ESTIMATORS))
        pairs = agreement(table, HEAD_ESTIMATORS)
        matrix = np.asarray(agreement_figure(pairs).data[0].z)
        assert matrix.shape == (len(HEAD_ESTIMATORS),) * 2 and np.allclose(np.diag(matrix), 1)


def _toy_table() -> pd.DataFrame:
    """Two layers of three heads (one measure, values written out) and two layer measures."""
    heads = [0.2, -0.7, 0.05, 0.7, -0.1, 0.3]  # L0H0..L0H2, L1H0..L1H2
    rows = [(i // 3, i % 3, i % 3, "attention", "ablation_zero", v) for i, v in enumerate(heads)]
    rows += [(0, None, None, "block", "block_influence", 0.1)]
    rows += [(1, None, None, "block", "block_influence", 0.4)]
    rows += [(0, None, None, "block", "skip_kl", 30.0), (1, None, None, "block", "skip_kl", 2.0)]
    return pd.DataFrame(rows, columns=["layer", "head", "kv_head", "component", "measure", "value"])


def test_head_rank_table_ranks_heads_by_magnitude():
    ranked = head_rank_table(_toy_table(), "ablation_zero")
    assert list(ranked.columns) == ["head", "value", "rank"]
    assert list(ranked["head"]) == ["L0H1", "L1H0", "L1H2", "L0H0", "L1H1", "L0H2"]
    assert list(ranked["value"]) == [-0.7, 0.7, 0.3, 0.2, -0.1, 0.05]
    assert list(ranked["rank"]) == [1, 1, 3, 4, 5, 6]  # a tie shares the best rank


def test_layer_lines_draws_each_measure_in_its_own_panel_and_scale():
    figure = layer_lines(_toy_table(), target="positive")
    influence, kl = figure.data
    assert (influence.name, kl.name) == ("block_influence", "skip_kl")
    assert list(influence.y) == [0.1, 0.4] and list(kl.y) == [30.0, 2.0]  # raw, not rescaled
    assert influence.yaxis != kl.yaxis and influence.xaxis != kl.xaxis  # one panel each
    titles = [a.text for a in figure.layout.annotations]
    assert titles == ["block_influence", "skip_kl"]
    assert "KL(p" in kl.hovertemplate
    with pytest.raises(ValueError, match="no per-layer"):
        layer_lines(_toy_table()[lambda t: t["head"].notna()])


def test_the_notes_name_the_target_and_what_the_sign_means():
    note = measure_note("ablation_zero", "positive")
    assert "Negative (blue): the head supported 'positive'" in note
    assert "positive (red): the head worked against 'positive'" in note
    assert "'↵'" in measure_note("head_lrp", "\n")  # a whitespace token stays visible
    assert measure_note("no such measure", "x") == ""
    fell = ablation_note("L2H3", "positive", 0.9, 0.6)
    assert "0.9000 → 0.6000" in fell and "**-0.3000**" in fell
    assert "negative: together these heads supported 'positive'" in fell
    assert "positive: these heads worked against" in ablation_note("L1H0", "a", 0.2, 0.5)
    assert "no change" in ablation_note("L1H0", "a", 0.2, 0.2)
    assert "&lt;b&gt;" in ablation_note("L1H0", "<b>", 0.2, 0.1)  # labels are data


def test_a_long_prompts_attention_axis_shows_every_kth_token():
    tokens = [f"t{i}" for i in range(100)]
    weights = np.tril(np.ones((100, 100)))
    figure = attention_figure(weights / weights.sum(axis=1, keepdims=True), tokens, 0, 1)
    shown = list(figure.layout.xaxis.ticktext)
    assert 20 <= len(shown) <= 40 and shown[:2] == ["t0", "t3"]
    assert [tokens[i] for i in figure.layout.xaxis.tickvals] == shown
    assert figure.data[0].text[5][99] == "t5 → t99"  # every pair in the hover


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
    from attrlab.viz import method_agreement_figure, randomisation_figure

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


# --- page views on real explanations of every method family --------------------------------

_TEXT_METHODS = {
    "gradient_x_input": None,
    "integrated_gradients": {"n_steps": 8},
    "rise": {"n_masks": 64},
    "occlusion": None,
    "rollout": None,
    "attnlrp": None,
    "pa_lrp": None,
    "layers": {"measures": "gradient,lrp"},
}
_IMAGE_METHODS = {"integrated_gradients": {"n_steps": 8}, "rise": {"n_masks": 64}, "attnlrp": None}
_RED, _WHITE, _BLUE = (103, 0, 31), (247, 247, 247), (5, 48, 97)  # ColorBrewer RdBu's ends
_SPAN = re.compile(
    r'<span data-score="([^"]*)" title="[^"]*" style="background:rgb\((\d+), (\d+), (\d+)\);'
    r'color:([^;]*);[^"]*">(.*?)</span>'
)


@pytest.fixture(scope="module")
def bert_text(load_model):
    adapter = load_model("tiny-random-bert")
    return adapter, adapter.preprocess("a short <b> text")


#: "a short <b> text" as its tokens read on the page: a word's leading space kept.
BERT_TEXTS = ["[CLS]", "a", " short", " <", "b", ">", " text", "[SEP]"]
#: The same as Plotly labels: a word's leading space a light ␣, the text escaped.
_SPACE = '<span style="color:#a0a0a0">␣</span>'
BERT_TICKS = [
    "[CLS]",
    "a",
    f"{_SPACE}short",
    f"{_SPACE}&lt;",
    "b",
    "&gt;",
    f"{_SPACE}text",
    "[SEP]",
]


@pytest.fixture(scope="module")
def text_explanations(bert_text):
    adapter, inputs = bert_text
    return {
        name: explain(
            adapter,
            name,
            inputs,
            None,
            params,
            settings=RunSettings(evaluate=name == "gradient_x_input"),
        )
        for name, params in _TEXT_METHODS.items()
    }


@pytest.fixture(scope="module")
def picture():
    return np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def image_explanations(load_model, picture):
    adapter = load_model("tiny-random-vit")
    inputs = adapter.preprocess(picture)
    return {
        name: explain(adapter, name, inputs, None, params, settings=RunSettings(evaluate=True))
        for name, params in _IMAGE_METHODS.items()
    }


def _with(explanation: Explanation, **changes) -> Explanation:
    return dataclasses.replace(explanation, **changes)


def _spans(page: str) -> list[tuple[float, tuple[int, int, int], str, str]]:
    return [
        (float(score), (int(r), int(g), int(b)), text_colour, text)
        for score, r, g, b, text_colour, text in _SPAN.findall(page)
    ]


def test_token_columns_colour_each_method_on_its_own_signed_scale():
    first = _explanation(np.array([2.0, -2.0, 0.0, 1.0]), ["up", "down", "<b>", "half"])
    second = _explanation(np.array([100.0, -50.0]), ["x", "y"])
    page = token_columns_html({"first": first, "se<c>ond": second})
    assert page.count('class="attr-columns"') == 1 and page.count('class="attr-legend"') == 1
    assert page.count('class="attr-column"') == 2
    assert 'data-method="first"' in page and 'data-method="se&lt;c&gt;ond"' in page
    assert "<b>" not in page and "&lt;b&gt;" in page
    spans = _spans(page)
    assert [s[0] for s in spans] == [2.0, -2.0, 0.0, 1.0, 100.0, -50.0]
    (_, up, on_red, _), (_, down, on_blue, _), (_, zero, on_white, text), *_ = spans
    assert up == _RED and down == _BLUE and zero == _WHITE and text == "&lt;b&gt;"
    assert on_red == on_blue == "#ffffff" and on_white == "#111111"  # dark ends: light text
    half, x, y = spans[3][1], spans[4][1], spans[5][1]
    assert half[0] > half[2] and x == _RED  # per-method scale: 100 is the second method's +1
    assert y[2] > y[0] and y != _BLUE  # -50 is half the second method's scale
    legend = scale_legend_html()
    assert "largest |score|" in legend and "−1" in legend and "+1" in legend
    with pytest.raises(ValueError):
        token_columns_html({})


def test_token_columns_of_every_text_method(text_explanations):
    # [CLS] and [SEP] are greyed, outside the scale: the coloured spans are the words'
    page = token_columns_html(text_explanations)
    assert page.count('class="attr-column"') == len(text_explanations)
    spans = _spans(page)
    words = slice(1, -1)
    expected = np.concatenate([e.scores[words] for e in text_explanations.values()])
    np.testing.assert_allclose([s[0] for s in spans], expected, rtol=1e-5, atol=1e-300)
    texts = [html.escape(t) for t in BERT_TEXTS[words]]
    assert [s[3] for s in spans] == texts * len(text_explanations)
    greyed = re.findall(r'<span class="kept-out" data-score="([^"]*)"[^>]*>([^<]*)<', page)
    assert [t for _, t in greyed] == ["[CLS]", "[SEP]"] * len(text_explanations)
    for explanation in text_explanations.values():
        peak = np.abs(explanation.scores[words]).max()
        target = html.escape(explanation.target.label)
        assert f"→ {target} (p={explanation.target.probability:.3f})" in page
        if peak > 0:
            top = int(np.argmax(np.abs(explanation.scores[words])))
            colour = _RED if explanation.scores[words][top] > 0 else _BLUE
            assert _spans(token_columns_html({"m": explanation}))[top][1] == colour, (
                explanation.method
            )


def test_positional_bars_stack_token_and_positional_relevance(text_explanations):
    pa = text_explanations["pa_lrp"]
    figure = positional_figure_tokens(pa)
    assert figure.layout.barmode == "relative"
    np.testing.assert_array_equal(figure.data[0].y, pa.scores)
    np.testing.assert_array_equal(figure.data[1].y, pa.positional_scores)
    assert list(figure.layout.xaxis.ticktext) == BERT_TICKS
    # PA-LRP's input relevance is token plus positional relevance
    total = pa.scores.sum() + pa.positional_scores.sum()
    assert total == pytest.approx(pa.metrics["input_relevance"], rel=1e-6, abs=1e-12)
    with pytest.raises(ValueError, match="positional"):
        positional_figure_tokens(text_explanations["attnlrp"])


def test_conservation_figure_walks_from_the_input_to_the_logit(text_explanations):
    for name in ("attnlrp", "pa_lrp"):
        e = text_explanations[name]
        (waterfall,) = conservation_figure(e).data
        assert list(waterfall.x) == [
            "Σ input relevance",
            "positions",
            "attention",
            "biases",
            "unaccounted",
            "target logit",
        ]
        steps = np.asarray(waterfall.y, dtype=float)
        assert steps[0] == e.metrics["input_relevance"]
        # the steps end at the logit LRP explained, which is the model's own
        assert steps[-1] == pytest.approx(e.target.logit, rel=1e-6, abs=1e-9)
        assert steps[:-1].sum() == pytest.approx(steps[-1], rel=1e-9, abs=1e-12)
        # each step floats where the last ended; the logit stands on zero
        bases = np.asarray(waterfall.base, dtype=float)
        assert bases[0] == 0 and bases[-1] == 0
        assert bases[1:-1] == pytest.approx(np.cumsum(steps[:-2]), rel=1e-12, abs=1e-12)
        assert "pass: unaccounted" in conservation_figure(e).layout.title.text
    with pytest.raises(ValueError, match="LRP"):
        conservation_figure(text_explanations["gradient_x_input"])
    # a file written before the balance: the input's share and the rest of the logit
    toy = _explanation(np.zeros(2), ["a", "b"])
    (old,) = conservation_figure(
        _with(toy, metrics={"input_relevance": 1.5, "target_logit": 2.0})
    ).data
    assert list(old.x) == ["Σ input relevance", "rest of the logit", "target logit"]
    assert list(old.y) == [1.5, 0.5, 2.0]


def _verdict_rows(card: str) -> dict[str, list[str]]:
    """Per verdict row (by check): its cells' text, tags stripped (title, status, value, reason)."""
    found = {}
    for check, status, body in re.findall(
        r'<tr class="verdict" data-check="([^"]*)" data-status="([^"]*)">(.*?)</tr>', card
    ):
        cells = [re.sub(r"<[^>]+>", " ", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body)]
        assert cells[1] == status  # the status shown is the row's
        found[check] = cells
    return found


def test_the_trust_card_shows_each_verdict_with_its_threshold_reason_and_advice():
    text = _explanation(np.zeros(2), ["a", "b"])
    verdicts = [
        Verdict(
            "integral_convergence",
            "integral convergence",
            "fail",
            1.256,
            0.05,
            "the integral has not converged",
            "raise n_steps (this run: 50)",
        ),
        Verdict(
            "comprehensiveness",
            "comprehensiveness against random orders",
            "inconclusive",
            0.31,
            0.05,
            "within noise <b>",
        ),
    ]
    metrics = {"comprehensiveness": 0.008, "convergence_delta": 12.9}
    randomised = Verdict("randomisation", "randomisation check (toy)", "pass", 0.12, 0.3, "depends")
    card = trust_card_html(_with(text, metrics=metrics, verdicts=verdicts), [randomised])
    assert 'class="trust-card"' in card and 'data-method="toy"' in card
    rows = _verdict_rows(card)
    assert list(rows) == ["integral_convergence", "comprehensiveness", "randomisation"]
    title, status, measured, reason = rows["integral_convergence"]
    assert (title, status, measured) == ("integral convergence", "fail", "125.6% (pass ≤ 5.0%)")
    assert "the integral has not converged" in reason and "raise n_steps (this run: 50)" in reason
    assert rows["comprehensiveness"][2] == "p = 0.31 (α = 0.05)"
    assert "&lt;b&gt;" in rows["comprehensiveness"][3]  # reasons are escaped
    assert rows["randomisation"][:3] == [
        "randomisation check (toy)",
        "pass",
        "max |ρ| 0.12 (pass ≤ 0.3)",
    ]
    assert "convergence delta" not in card  # the verdict covers it
    assert "no faithfulness scores" not in card
    # a file written before verdicts: the bare delta, said to have none
    old = trust_card_html(_with(text, metrics={"convergence_delta": 12.9}))
    assert "convergence delta 12.9 (no verdict)" in old and "no faithfulness scores" in old


def test_the_trust_card_shows_where_lrps_relevance_went():
    text = _explanation(np.zeros(2), ["a", "b"])
    metrics = {
        "target_logit": 17.37,
        "input_relevance": 6.43,
        "positional_absorbed": 0.0,
        "softmax_absorbed": 10.94,
        "bias_absorbed": 0.0,
        "unaccounted_relevance": -1e-6,
    }
    card = trust_card_html(_with(text, metrics=metrics))
    balance = re.findall(
        r'<tr class="balance"><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>', card
    )
    shown = {name.split(" ")[0]: (value, share) for name, value, share in balance}
    assert shown["Σ"] == ("6.43", "37.0%")
    assert shown["attention&#x27;s"] == ("10.94", "63.0%")
    assert shown["unaccounted"] == ("-1e-06", "-5.8e-08")
    assert shown["target"] == ("17.37", "100.0%")


def test_trust_cards_of_real_explanations(text_explanations, image_explanations):
    for e in [*text_explanations.values(), *image_explanations.values()]:
        card = trust_card_html(e)
        rows = _verdict_rows(card)
        assert list(rows) == [v.check for v in e.verdicts]
        for verdict in e.verdicts:
            assert rows[verdict.check][1] == verdict.status
        scores = [s for s, _, _ in SCORES[e.model.modality] if s in e.metrics]
        assert all(s in rows for s in scores)  # each faithfulness score has its verdict
        completeness = {
            "integrated_gradients": "integral_convergence",
            "attnlrp": "lrp_conservation",
            "pa_lrp": "lrp_conservation",
            "deeplift": "summation_to_delta",
        }
        if e.method in completeness:
            assert completeness[e.method] in rows, e.method
        assert ("where the target logit" in card) == ("unaccounted_relevance" in e.metrics)
        assert ("standard error" in card) == ("std_error" in e.maps), e.method
    rise = image_explanations["rise"]
    assert f"masks used {rise.metrics['masks_used']:,.0f}" in trust_card_html(rise)
    assert "no faithfulness scores" in trust_card_html(text_explanations["rollout"])


def test_a_cam_map_draws_like_the_others(effnet):
    """Grad-CAM, the family the tiny ViT cannot give, on the embedded CNN."""
    from skimage import data

    cat = data.chelsea()
    gradcam = explain(effnet, "gradcam", effnet.preprocess(cat))
    heat = next(t for t in image_grid_figure({"gradcam": gradcam}, cat).data if t.type == "heatmap")
    shown = np.asarray(heat.z)
    assert shown.shape == gradcam.scores.shape == (224, 224)  # the model's cells...
    assert extent(heat) == pytest.approx(cat.shape[:2])  # ...stretched over the photograph
    assert shown.min() >= 0.0  # Grad-CAM's ReLU: the map has no negative evidence
    assert np.percentile(shown, 99) == pytest.approx(1.0, abs=5e-4)  # the hover's 3 decimals
    assert "no faithfulness scores" in trust_card_html(gradcam)


def test_trust_figure_puts_each_score_next_to_random(image_explanations, text_explanations):
    figure = trust_figure(image_explanations)
    methods = list(image_explanations)
    bars = {(t.name, t.xaxis): list(t.y) for t in figure.data}
    assert bars[("method", "x")] == [
        image_explanations[m].metrics["deletion_morf_auc"] for m in methods
    ]
    assert bars[("random", "x2")] == [
        image_explanations[m].metrics["insertion_random_auc"] for m in methods
    ]
    assert sum(t.showlegend for t in figure.data) == 2
    with pytest.raises(ValueError, match="no faithfulness scores"):
        trust_figure({"rollout": text_explanations["rollout"]})
    with pytest.raises(ValueError, match="one modality"):
        trust_figure({"a": text_explanations["rollout"], "b": image_explanations["rise"]})


def test_image_grid_scales_each_map_by_its_robust_peak(image_explanations, picture):
    figure = image_grid_figure(image_explanations, picture, opacity=0.3)
    heatmaps = [t for t in figure.data if t.type == "heatmap"]
    images = [t for t in figure.data if t.type == "image"]
    assert len(heatmaps) == len(images) == len(image_explanations)
    for heatmap, e in zip(heatmaps, image_explanations.values(), strict=True):
        assert e.scores.shape == picture.shape[:2]
        # the default view: each map over its 99th percentile of |score|, clipped beyond it
        expected = np.clip(e.scores / np.percentile(np.abs(e.scores), 99), -1, 1)
        # to the 3 decimals the hover shows
        np.testing.assert_allclose(np.asarray(heatmap.z), expected, rtol=0, atol=5e-4 + 1e-12)
        assert "%{z:.3f}" in heatmap.hovertemplate
        assert heatmap.opacity == 0.3 and (heatmap.zmin, heatmap.zmax) == (-1, 1)
    assert [h.showscale for h in heatmaps] == [True] + [False] * (len(heatmaps) - 1)
    assert "99th percentile" in heatmaps[0].colorbar.title.text
    titles = [a.text for a in figure.layout.annotations]
    assert titles == [f"{m} → {e.target.label}" for m, e in image_explanations.items()]
    assert figure.layout.yaxis2.scaleanchor == "x2" and figure.layout.xaxis3.visible is False
    # a larger picture: the map keeps its 32² cells, stretched over it
    larger = image_grid_figure(image_explanations, np.zeros((64, 48, 3), np.uint8)).data[1]
    assert np.asarray(larger.z).shape == (32, 32) and extent(larger) == (64, 48)
    # a smaller one: no more cells than its pixels (the figure's size stays bounded)
    smaller = image_grid_figure(image_explanations, np.zeros((16, 24, 3), np.uint8)).data[1]
    assert np.asarray(smaller.z).shape == (16, 24) and extent(smaller) == (16, 24)
    with pytest.raises(ValueError, match="opacity"):
        image_grid_figure(image_explanations, picture, opacity=1.5)


def test_a_photograph_is_drawn_as_a_jpeg_and_a_drawing_as_an_exact_png():
    from skimage import data

    cat = data.chelsea()
    photo = picture_uri(cat)
    assert photo.startswith("data:image/jpeg;base64,")
    as_png = io.BytesIO()
    Image.fromarray(cat).save(as_png, "PNG")
    assert len(photo) * 3 / 4 < len(as_png.getvalue()) / 3  # several times smaller than a PNG
    decoded = drawn_picture({"source": photo}).astype(int)
    assert decoded.shape == cat.shape and np.abs(decoded - cat).mean() < 2  # of 255
    drawing = np.zeros((60, 80, 3), np.uint8)
    drawing[10:30, 20:50] = (200, 30, 30)  # flat colours, sharp edges
    flat = picture_uri(drawing)
    assert flat.startswith("data:image/png;base64,")
    np.testing.assert_array_equal(drawn_picture({"source": flat}), drawing)  # exact


def test_std_error_figure_draws_the_sampling_error(image_explanations, picture):
    rise = image_explanations["rise"]
    heatmap = std_error_figure(rise, picture).data[1]
    np.testing.assert_allclose(np.asarray(heatmap.z), rise.maps["std_error"])
    assert heatmap.colorscale[0][1] == "#440154"  # Viridis
    with pytest.raises(ValueError, match="standard-error"):
        std_error_figure(image_explanations["integrated_gradients"], picture)


def test_attention_figure_of_a_real_head(bert_text):
    adapter, inputs = bert_text
    with torch.no_grad():
        weights = adapter.attentions(**inputs.model_kwargs())[1][0, 2].numpy()
    figure = attention_figure(weights, inputs.token_texts, layer=1, head=2)
    (heatmap,) = figure.data
    np.testing.assert_allclose(np.asarray(heatmap.z).sum(axis=1), 1.0, rtol=1e-5)  # softmax rows
    assert heatmap.zmin == 0 and figure.layout.yaxis.autorange == "reversed"
    assert list(figure.layout.xaxis.ticktext) == BERT_TICKS
    assert figure.layout.title.text == "layer 1, head 2: attention"
    with pytest.raises(ValueError):
        attention_figure(weights[:, :-1], inputs.token_texts, 1, 2)


def test_token_layers_figure_follows_one_token():
    matrix = np.array([[1.0, -3.0, 0.0], [2.0, 1.0, -1.0], [0.5, 0.5, 2.0]])
    figure = token_layers_figure(matrix, ["a", "b", "c"], token=1)
    mean, token = figure.data
    assert list(token.y) == [-3.0, 1.0, 0.5] and list(token.x) == [0, 1, 2]
    np.testing.assert_allclose(mean.y, [4 / 3, 4 / 3, 1.0])
    assert list(token.text) == ["entering block 0", "entering block 1", "leaving block 1"]
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="token index"):
            token_layers_figure(matrix, ["a", "b", "c"], token=bad)


def test_ablation_figure_compares_the_top_predictions(text_explanations):
    plain = text_explanations["rollout"].predictions
    target = plain[0].label
    ablated = [Prediction(9, "other", 0.7), Prediction(plain[0].index, target, 0.2)]
    figure = ablation_figure(plain, ablated, target)
    before, after = figure.data
    labels = [p.label for p in plain] + ["other"]
    assert list(before.y) == labels and before.orientation == "h"
    assert list(before.x) == [p.probability for p in plain] + [None]
    assert after.x[0] == 0.2 and after.x[-1] == 0.7 and after.x[1] is None
    change = (0.2 - plain[0].probability) * 100
    assert f"({change:+.1f} points)" in figure.layout.title.text


def test_layers_method_tables_draw(text_explanations):
    e = text_explanations["layers"]
    table = e.layers
    figure = head_heatmap(table, "head_gradient")
    assert np.asarray(figure.data[0].z).shape == (2, 4)
    stacked = positional_figure(table)
    lrp_block = table[(table.measure == "lrp_block")].sort_values("layer")
    np.testing.assert_allclose(stacked.data[0].y, lrp_block.value)
    per_layer = e.maps["token_per_layer"]  # (layers + 1, tokens): the residual stream per token
    assert per_layer.shape == (len(lrp_block) + 1, len(e.tokens))
    np.testing.assert_allclose(per_layer[:-1].sum(axis=1), lrp_block.value, rtol=1e-6)
    through = token_layers_figure(per_layer, e.token_texts, token=1)
    np.testing.assert_array_equal(through.data[1].y, per_layer[:, 1])
    assert list(through.data[1].x) == list(range(len(per_layer)))


def test_leaderboard_figure_bars_are_the_per_item_means(bert_text):
    adapter, _ = bert_text
    items = [EvalItem("good movie"), EvalItem("bad film"), EvalItem("fine")]
    per_item = evaluate_methods(adapter, items, ["gradient_x_input", "occlusion"], steps=5)
    figure = leaderboard_figure(per_item, "text")
    for trace in figure.data:
        column = {"x": "comprehensiveness", "x2": "sufficiency"}[trace.xaxis]
        column += "_random" if trace.name == "random" else ""
        for method, height, error in zip(trace.x, trace.y, trace.error_y.array, strict=True):
            values = [r[column] for r in per_item.to_dict("records") if r["method"] == method]
            assert height == pytest.approx(sum(values) / len(values))
            assert error == pytest.approx(np.std(values, ddof=1) / np.sqrt(len(values)))
    assert len(figure.data) == 4
    with pytest.raises(ValueError, match="empty"):
        leaderboard_figure(per_item.iloc[:0], "text")


def test_bundle_zip_holds_everything_and_reads_back(text_explanations, tmp_path):
    explanations = {
        "gradient_x_input": text_explanations["gradient_x_input"],
        "../rise <sampled>": text_explanations["rise"],
    }
    figures = {
        "tokens": token_figure(text_explanations["gradient_x_input"]),
        "gauge/../x y": conservation_figure(text_explanations["attnlrp"]),
    }
    path = write_bundle(
        explanations,
        figures,
        tmp_path / "bundle",
        extra={"text": "a short <b> text", "n": np.int64(3)},
    )
    assert path == tmp_path / "bundle.zip"
    with zipfile.ZipFile(path) as zipped:
        names = set(zipped.namelist())
        assert all(
            re.fullmatch(r"bundle/(figures/)?[A-Za-z0-9_-][A-Za-z0-9_.-]*", n) for n in names
        )
        assert names == {
            "bundle/manifest.json",
            "bundle/gradient_x_input.json",
            "bundle/gradient_x_input.npz",
            "bundle/_rise__sampled_.json",
            "bundle/_rise__sampled_.npz",
            "bundle/figures/tokens.html",
            "bundle/figures/tokens.png",
            "bundle/figures/gauge_.._x_y.html",
            "bundle/figures/gauge_.._x_y.png",
            "bundle/index.html",
            "bundle/plotly.min.js",  # one copy, every figure's page loads it
        }
        manifest = json.loads(zipped.read("bundle/manifest.json"))
        rise = Explanation.from_json(zipped.read("bundle/_rise__sampled_.json").decode())
        with zipped.open("bundle/_rise__sampled_.npz") as handle:
            arrays = dict(np.load(io.BytesIO(handle.read())))
        html_page = zipped.read("bundle/figures/tokens.html").decode()
        png = zipped.read("bundle/figures/gauge_.._x_y.png")
    original = text_explanations["rise"]
    np.testing.assert_array_equal(rise.scores, original.scores)
    np.testing.assert_array_equal(arrays["scores"], original.scores)
    np.testing.assert_array_equal(arrays["map__std_error"], original.maps["std_error"])
    assert '<script src="../plotly.min.js"' in html_page and png[:8] == b"\x89PNG\r\n\x1a\n"
    entry = manifest["methods"]["../rise <sampled>"]
    assert entry["versions"] == original.versions and entry["versions"]["torch"]
    assert entry["params"] == original.params and entry["seed"] == original.seed
    assert entry["target"]["label"] == original.target.label
    assert manifest["extra"] == {"text": "a short <b> text", "n": 3}
    assert "png_error" not in manifest


def test_bundle_holds_a_layer_table_as_csv_parquet_and_json(text_explanations, tmp_path):
    analysis = text_explanations["layers"]
    path = write_bundle({"layers": analysis}, {}, tmp_path / "b", png=False)
    with zipfile.ZipFile(path) as zipped:
        manifest = json.loads(zipped.read("b/manifest.json"))
        csv = pd.read_csv(io.BytesIO(zipped.read("b/layers_layers.csv")))
        parquet = pd.read_parquet(io.BytesIO(zipped.read("b/layers_layers.parquet")))
        records = pd.DataFrame(json.loads(zipped.read("b/layers_layers.json")))
    assert "b/layers_layers.csv" in {f"b/{f}" for f in manifest["methods"]["layers"]["files"]}
    expected = analysis.layers.reset_index(drop=True)
    for read in (csv, parquet, records):
        assert list(read.columns) == list(expected.columns)
        np.testing.assert_allclose(read["value"], expected["value"], rtol=1e-12)
        assert list(read["measure"]) == list(expected["measure"])
        np.testing.assert_array_equal(read["head"].isna(), expected["head"].isna())


def test_bundle_without_a_browser_keeps_the_html(text_explanations, tmp_path, monkeypatch):
    def no_chromium(*_args, **_kwargs):
        raise RuntimeError("Kaleido requires Google Chrome to be installed")

    monkeypatch.setattr(pio, "write_images", no_chromium)
    e = text_explanations["occlusion"]
    path = write_bundle(
        {"occlusion": e}, {"a": token_figure(e), "a_": token_figure(e)}, tmp_path / "b"
    )
    with zipfile.ZipFile(path) as zipped:
        names = set(zipped.namelist())
        manifest = json.loads(zipped.read("b/manifest.json"))
    assert {"b/figures/a.html", "b/figures/a_.html"} <= names
    assert not any(n.endswith(".png") for n in names)
    assert manifest["png_error"] == "RuntimeError: Kaleido requires Google Chrome to be installed"
    assert safe_name("..") == "_" and safe_name("a/b c") == "a_b_c"


def test_change_views_show_each_tokens_change_and_the_edited_ones():
    from attrlab.attribution.compare import compare_explanations
    from attrlab.viz import change_figure, change_html

    before = _explanation(np.array([0.0, 1.0, 2.0]), ["a", "<b>", "film"])
    after = _explanation(np.array([0.0, -1.0, 3.0, 1.0]), ["a", "new", "<b>", "film"])
    html = change_html({"toy": compare_explanations(before, after)})
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert 'data-change="0"' in html and 'data-change="2"' in html  # "a", "<b>"
    assert 'data-change="-1"' in html  # "film": 1 after, 2 before
    assert html.count('data-edited="true"') == 1 and ">new<" in html
    image_before = _explanation(np.zeros((8, 8)))
    moved = np.zeros((8, 8))
    moved[2:4, 2:4] = 4.0
    figure = change_figure(
        {"toy": compare_explanations(image_before, _explanation(moved))},
        np.full((8, 8, 3), 128, dtype=np.uint8),
    )
    heat = np.asarray(next(t for t in figure.data if t.type == "heatmap").z)
    assert (heat[2:4, 2:4] > 0.9).all()  # the occluded block gained, at full colour
    heat[2:4, 2:4] = 0.0
    assert not heat.any()  # nothing else changed
