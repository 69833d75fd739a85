"""The one figure-selection rule (:func:`viz.figures.figures_for`), and its callers follow it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from attrlab.app import cli
from attrlab.app.ui.explain import ExplainTab, TabSpec
from attrlab.app.ui.layers import layers_tab
from attrlab.app.ui.runner import PageRunner
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.explanation import Explanation, ModelInfo, Prediction, TargetValues
from attrlab.viz import figures

TOKENS = ["[CLS]", "good", "film", "[SEP]"]
CONSERVED = {"input_relevance": 0.9, "target_logit": 1.0}


def _explanation(method: str, **fields: Any) -> Explanation:
    text = fields.get("tokens") is not None
    return Explanation(
        model=ModelInfo("toy", None, "text" if text else "image"),
        method=method,
        params=fields.pop("params", {}),
        target=TargetValues(1, "positive", 2.0, 0.8),
        predictions=[Prediction(1, "positive", 0.8), Prediction(0, "negative", 0.2)],
        scores=fields.pop("scores", np.linspace(-1, 1, 4) if text else np.eye(4)),
        **fields,
    )


def _rows(measure: str, layers: int = 2, heads: int = 0) -> list[tuple]:
    """Layer-table rows of ``measure``: one per layer, or one per head of each layer."""
    if not heads:
        return [(layer, None, None, "block", measure, 0.1 * layer) for layer in range(layers)]
    return [
        (layer, head, head, "attention", measure, 0.1 * layer - 0.05 * head)
        for layer in range(layers)
        for head in range(heads)
    ]


def _table(*rows: list[tuple]) -> pd.DataFrame:
    columns = ["layer", "head", "kv_head", "component", "measure", "value"]
    return pd.DataFrame([r for part in rows for r in part], columns=columns)


def _analysis(*rows: list[tuple]) -> Explanation:
    """The ``layers`` method's Explanation over a hand-written table."""
    return _explanation("layers", tokens=TOKENS, params={"top_k": 3}, layers=_table(*rows))


#: Each kind of result, and the figures it gets, written out by hand.
RESULTS = {
    "text classification, gradient map": (
        _explanation("integrated_gradients", tokens=TOKENS),
        ["scores"],
    ),
    "text, AttnLRP: conservation, and residual rows that make no layer analysis": (
        _explanation(
            "attnlrp",
            tokens=TOKENS,
            metrics=CONSERVED,
            layers=_table(_rows("residual_relevance")),
        ),
        ["scores", "conservation"],
    ),
    "next token on an LLM, PA-LRP's positional relevance": (
        _explanation("attnlrp", tokens=TOKENS, positional_scores=np.ones(4) / 4, metrics=CONSERVED),
        ["scores", "token and positional relevance", "conservation"],
    ),
    "image, Grad-CAM map": (_explanation("gradcam"), ["map"]),
    "image, RISE with its standard error": (
        _explanation("rise", maps={"std_error": np.full((4, 4), 0.1)}),
        ["map", "standard error"],
    ),
    "image, positional relevance (shown for text only)": (
        _explanation("attnlrp", positional_scores=np.eye(4), metrics=CONSERVED),
        ["map", "conservation"],
    ),
    "layer analysis, whole layers only": (
        _analysis(_rows("block_influence"), _rows("skip")),
        ["layers"],
    ),
    "layer analysis, one head estimator": (
        _analysis(_rows("gradient"), _rows("head_lrp", heads=3)),
        ["layers", "heads_head_lrp", "top_heads"],
    ),
    "layer analysis, two estimators and PA-LRP": (
        _analysis(
            _rows("head_gradient", heads=2),
            _rows("ablation_zero", heads=2),
            _rows("lrp_block"),
            _rows("positional_relevance"),
        ),
        [
            "layers",
            "heads_head_gradient",
            "heads_ablation_zero",
            "positional",
            "top_heads",
            "agreement",
        ],
    ),
}


@pytest.mark.parametrize(("explanation", "expected"), RESULTS.values(), ids=RESULTS.keys())
def test_each_kind_of_result_gets_the_figures_of_the_table(explanation, expected):
    image = np.full((8, 8, 3), 128, dtype=np.uint8)
    chosen = figures.figures_for(explanation, image)
    assert list(chosen) == expected
    assert all(isinstance(draw(), go.Figure) for draw in chosen.values())


def test_an_images_figures_are_not_drawn_without_the_image():
    chosen = figures.figures_for(_explanation("rise", maps={"std_error": np.eye(4)}))
    for name in ("map", "standard error"):
        with pytest.raises(ValueError, match="drawn on the image"):
            chosen[name]()


@pytest.fixture
def probe(monkeypatch) -> Iterator[dict[str, Any]]:
    """The rule replaced by one naming a single figure of each name, recording its callers."""
    drawn = {"asked": [], "figures": {}}

    def rule(
        explanation: Explanation, image: np.ndarray | None = None, view: Any = None
    ) -> dict[str, Any]:
        drawn["asked"].append(explanation.method)
        names = ["layers", "positional", "agreement"] if explanation.method == "layers" else []
        made = {name: go.Figure(layout={"title": name}) for name in [*names, "probe"]}
        drawn["figures"].update(made)
        return {name: (lambda figure=figure: figure) for name, figure in made.items()}

    monkeypatch.setattr(figures, "figures_for", rule)
    yield drawn


def test_the_cli_writes_the_figures_the_rule_names(probe, tmp_path: Path):
    analysis = _analysis(_rows("head_lrp", heads=2), _rows("lrp_block"))
    attribution = _explanation("integrated_gradients", tokens=TOKENS)
    chosen = cli._explanation_figures([analysis, attribution], None)  # explain --figures
    cli._write_figures(chosen, tmp_path, "html")
    assert probe["asked"] == ["layers", "integrated_gradients"]
    assert {p.name for p in tmp_path.iterdir()} == {
        "layers_layers.html",
        "layers_positional.html",
        "layers_agreement.html",
        "layers_probe.html",
        "integrated_gradients_probe.html",
    }


def _handler(demo: gr.Blocks, api_name: str) -> Any:
    return next(f.fn for f in demo.fns.values() if f.api_name == api_name)


def _page(answer: Explanation, build: Any) -> tuple[gr.Blocks, ExplainWorker]:
    """A tab built by ``build(runner)`` whose requests all answer ``answer``."""
    worker = ExplainWorker(device="cpu", max_models=1)
    runner = PageRunner(worker, run=lambda request, report: answer)
    with gr.Blocks() as demo:
        build(runner)
    return demo, worker


def test_the_explain_tab_offers_the_details_the_rule_names(probe):
    answer = _explanation("integrated_gradients", tokens=TOKENS, metrics=CONSERVED)
    spec = TabSpec("text", "Text classification", "text")
    demo, worker = _page(answer, lambda runner: ExplainTab(spec, runner, lambda _: ""))
    try:
        explain = _handler(demo, "explain_text")
        request = SimpleNamespace(session_hash="s", headers={})
        fields = ["minilm-zeroshot", "", "good film", "", ["integrated_gradients"], False, False]
        shown = explain(*fields, 0, {}, False, None, request)
    finally:
        worker.close()
    menu, detail = shown[2], shown[3]
    assert probe["asked"] and set(probe["asked"]) == {"integrated_gradients"}
    assert menu["choices"] == ["integrated_gradients · probe"]
    assert detail is probe["figures"]["probe"]


def test_the_layers_tab_shows_the_figures_the_rule_names(probe):
    answer = _analysis(_rows("block_influence"))  # by itself, it gets no positional view
    demo, worker = _page(answer, layers_tab)
    try:
        analyse = _handler(demo, "layers_analyse")
        request = SimpleNamespace(session_hash="s", headers={})
        shown = analyse(
            True, "minilm-zeroshot", "good film", "", "", False, "", "", ["skip"], None, request
        )
    finally:
        worker.close()
    assert probe["asked"] == ["layers"]
    for name, update in zip(["layers", "positional", "agreement"], shown[3:6], strict=True):
        assert update["visible"] and update["value"] is probe["figures"][name]
