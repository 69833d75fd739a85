"""`import attrlab`: the five-line Python API and what a notebook shows for its results."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest
from _small_budgets import SMALL_BUDGETS
from PIL import Image

import attrlab
from attrlab.attribution import available_methods
from attrlab.attribution.errors import (
    InvalidInputError,
    InvalidParameterError,
    UnknownMethodError,
)
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.metrics.check import MethodCheck
from attrlab.attribution.request.target import target_record

TEXT = "A wonderful, heartwarming story."
#: Elements HTML allows without an end tag.
VOID = {"br", "img", "hr", "input", "meta", "link", "wbr", "col", "source"}


class _Balance(HTMLParser):
    """Every element closed in order; records each element's attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(markup: str) -> _Balance:
    """``markup`` parsed; fails unless every element is closed, in order."""
    parser = _Balance()
    parser.feed(markup)
    parser.close()
    assert not parser.open, f"unclosed: {parser.open}"
    return parser


def with_class(parser: _Balance, name: str) -> list[dict[str, str | None]]:
    return [a for _, a in parser.elements if name in (a.get("class") or "").split()]


def test_importing_attrlab_loads_neither_torch_nor_the_web_stack():
    code = (
        "import sys, attrlab\n"
        "heavy = {'torch', 'gradio', 'fastapi', 'transformers'} & set(sys.modules)\n"
        "print(sorted(heavy), attrlab.explain.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[0] == "[] attrlab"


@pytest.fixture(scope="module")
def minilm():
    return attrlab.load("minilm-zeroshot", device="cpu")


def test_explain_takes_a_spec_and_text_and_returns_the_librarys_explanation(minilm):
    from attrlab.attribution import explain

    got = attrlab.explain(minilm, TEXT, "gradient_x_input", target="positive")
    expected = explain(
        minilm,
        "gradient_x_input",
        minilm.preprocess(TEXT),
        target=target_record(minilm, "positive"),
    )
    assert isinstance(got, Explanation) and got.target.label == "positive"
    np.testing.assert_allclose(got.scores, expected.scores, rtol=1e-6)
    # the top features are the highest scores, special tokens ([CLS], [SEP]) left out
    kept = [
        (t, s)
        for t, s, out in zip(got.token_texts, got.scores, got.special_tokens, strict=True)
        if not out
    ]
    assert got.top_features(2) == sorted(kept, key=lambda p: -p[1])[:2]
    assert "[CLS]" not in {t for t, _ in got.top_features(len(kept))}


def test_word_level_top_features_are_the_words_summed(minilm):
    e = attrlab.explain(minilm, TEXT, "gradient_x_input", target="positive", granularity="word")
    words = {f.text: float(e.scores[f.start : f.stop].sum()) for f in e.features}
    assert len(words) == 4  # A / wonderful, / heartwarming / story.
    top = e.top_features(4)
    assert [t for t, _ in top] == sorted(words, key=lambda w: -words[w])
    for text, score in top:
        assert score == pytest.approx(words[text])


def test_several_methods_are_compared_with_each_pairs_agreement(minilm):
    check = attrlab.explain(minilm, TEXT, methods=["gradient_x_input", "gradient"])
    assert isinstance(check, MethodCheck)
    assert set(check.explanations) == {"gradient_x_input", "gradient"}
    (pair,) = check.agreement.itertuples(index=False)
    from scipy.stats import spearmanr

    a, b = (check.explanations[m].scores for m in (pair.first, pair.second))
    # importance is |score|: ranks of the magnitudes
    assert pair.spearman == pytest.approx(spearmanr(abs(a), abs(b)).statistic, abs=1e-9)
    page = parsed(check._repr_html_())
    assert [c["data-method"] for c in with_class(page, "attr-column")] == list(check.explanations)
    assert with_class(page, "attrlab-agreement") and with_class(page, "attr-legend")


def test_bad_calls_are_refused_by_name(minilm):
    with pytest.raises(UnknownMethodError, match="unknown method 'saliency'"):
        attrlab.explain(minilm, TEXT, "saliency")
    with pytest.raises(InvalidParameterError, match="not both"):
        attrlab.explain(minilm, TEXT, "gradient", methods=["gradient", "gradient_x_input"])
    with pytest.raises(InvalidParameterError, match="randomise"):
        attrlab.explain(minilm, TEXT, "gradient", randomise=True)
    with pytest.raises(InvalidInputError, match="corrupted prompt, or noise positions"):
        attrlab.patch("tiny-random-gpt2", "The capital of France is")
    with pytest.raises(InvalidInputError, match="reads a text"):
        attrlab.layers(minilm, np.zeros((8, 8, 3), dtype=np.uint8))


def test_an_answer_against_a_contrast_is_log_p_answer_minus_log_p_contrast():
    import torch

    model = attrlab.load("tiny-random-gpt2", device="cpu")
    e = attrlab.explain(
        model, "The capital of France is", "gradient_x_input", answer=" Paris", contrast=" Lyon"
    )
    tok = model.tokenizer
    prompt = model.preprocess("The capital of France is").model_kwargs()
    with torch.no_grad():
        logits = model.model(**prompt).logits[0, -1].log_softmax(-1)
    (paris,) = tok(" Paris", add_special_tokens=False)["input_ids"]  # one token each: the
    (lyon,) = tok(" Lyon", add_special_tokens=False)["input_ids"]  # target is one forward's
    difference = float(logits[paris] - logits[lyon])
    assert e.target.log_probability_difference == pytest.approx(difference, abs=1e-5)
    assert e.target.probability_ratio == pytest.approx(math.exp(difference), rel=1e-5)
    assert e.target.logit is None and e.target.probability is None  # no class's values
    page = parsed(e._repr_html_())
    assert with_class(page, "answer-token") and with_class(page, "alternative-token")


def _image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)


@pytest.mark.slow
def test_every_method_familys_display_is_valid_html_with_its_parts():
    """Every method on a tiny text and image model: valid HTML holding the map and legend."""
    text_model = attrlab.load("tiny-random-bert", device="cpu")
    image_model = attrlab.load("tiny-random-vit", device="cpu")
    shown = set()
    for model, data in ((text_model, "a fine film"), (image_model, _image())):
        for method in available_methods():
            # SHAP's text masker costs ~20 s even at 20 evaluations: its family is shown on
            # the image (and by occlusion, RISE and Sobol on the text)
            if method.unsupported_reason(model) is not None or (
                method.name == "shap" and model is text_model
            ):
                continue
            params = dict(SMALL_BUDGETS.get(method.name, {}))
            if method.name == "occlusion" and model is image_model:
                params = {"window": 8}
            e = attrlab.explain(model, data, method.name, params=params)
            page = parsed(e._repr_html_())
            heading = " ".join(page.text)
            assert method.name in heading and e.target.label in heading
            if method.name == "layers":
                grids = with_class(page, "attrlab-head-grid")
                assert {g["data-measure"] for g in grids} == set(
                    e.layers.loc[e.layers["head"].notna(), "measure"]
                )
                assert "measure's largest |value|" in heading  # not a method's scores' legend
            elif e.token_texts is not None:
                boxes = [
                    a for _, a in page.elements if a.get("data-score") or a.get("title")
                ]  # one box per token, its raw score on it
                assert len(boxes) >= len(e.token_texts)
            else:
                (img,) = [a for tag, a in page.elements if tag == "img"]
                assert img["src"].startswith("data:image/")
                # drawn over the image the model saw (the explanation keeps it in memory)
                assert e.image is not None and e.image.shape[:2] == e.scores.shape
            assert with_class(page, "attr-legend")
            shown.add(method.name)
    assert shown == {m.name for m in available_methods()} - {"gradcam"}  # gradcam: CNNs only


def test_an_explanation_read_from_a_file_draws_its_map_without_the_image(tmp_path):
    model = attrlab.load("tiny-random-vit", device="cpu")
    e = attrlab.explain(model, Image.fromarray(_image()), "gradient")
    e.save_npz(tmp_path / "e.npz")
    read = Explanation.load(tmp_path / "e.npz")
    assert read.image is None and "image" not in read.to_dict()
    (img,) = [a for tag, a in parsed(read._repr_html_()).elements if tag == "img"]
    assert img["src"].startswith("data:image/")
    with pytest.raises(ValueError, match="no features"):
        read.top_features()


def test_figure_gives_the_plotly_figure_by_name(minilm):
    e = attrlab.explain(minilm, TEXT, "attnlrp", target="positive")
    assert e.figures()[0] == "scores"
    figure = e.figure()
    assert list(figure.data[0].y if figure.data[0].y is not None else figure.data[0].x)
    assert "conservation" in e.figures()  # LRP's relevance balance
    with pytest.raises(ValueError, match="no figure 'nope'"):
        e.figure("nope")


def test_layers_returns_the_layer_table_and_shows_a_grid_per_head_measure():
    e = attrlab.layers("tiny-random-gpt2", "The capital of France is", measures="gradient")
    heads = e.layers[e.layers["head"].notna()]
    assert set(heads["measure"]) == {"head_gradient"}
    grid = with_class(parsed(e._repr_html_()), "attrlab-head-grid")
    assert [g["data-measure"] for g in grid] == ["head_gradient"]
    cells = re.findall(r'title="L(\d+)H(\d+): ', e._repr_html_())
    assert {(int(a), int(b)) for a, b in cells} == {
        (int(r.layer), int(r.head)) for r in heads.itertuples()
    }


def test_patch_is_the_librarys_patching_report():
    from attrlab.attribution.patching import patching_problem, patching_report

    clean = "When Mary and John went to the store, John gave a drink to"
    corrupted = "When Mary and John went to the store, Mary gave a drink to"
    chosen = {"components": ["residual"], "estimators": ["exact", "atp"]}
    report = attrlab.patch(
        "tiny-random-gpt2", clean, corrupted, answer=" Mary", contrast=" John", **chosen
    )
    model = attrlab.load("tiny-random-gpt2", device="cpu")
    problem = patching_problem(model, clean, corrupted, " Mary", " John")
    expected = patching_report(model, problem, chosen["estimators"], chosen["components"])
    assert set(report.table["estimator"]) == {"exact", "atp"}
    np.testing.assert_allclose(report.table["effect"], expected.table["effect"], rtol=1e-6)
    assert report.clean_score == pytest.approx(expected.clean_score)


def test_the_docstrings_examples_run():
    """Every example in `attrlab`'s docstrings (the five lines among them) gives what it shows."""
    import doctest

    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(attrlab, optionflags=flags)
    assert result.failed == 0 and result.attempted >= 12
