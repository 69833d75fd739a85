"""The views of a decoder LM's answer: the marked whole map, the step × source matrix, a row."""

from __future__ import annotations

import html
import json
import re
import zipfile

import numpy as np
import pytest

from attrlab.app.ui.results import Result, export_bundle
from attrlab.attribution import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.request.answers import answer_request
from attrlab.viz.answer import answer_html, step_row_html, steps_figure
from attrlab.viz.figures import STEPS, figures_for
from attrlab.viz.text import token_columns_html
from attrlab.viz.tokens import token_html, token_tick

PROMPT, ANSWER, CONTRAST = "the cat sat on the", " mat and slept", " floor"


@pytest.fixture(scope="module")
def contrast(load_model):
    """Gradient × input of an answer against a one-token alternative, per step."""
    adapter = load_model("tiny-random-llama")
    inputs, target = answer_request(adapter, PROMPT, answer=ANSWER, contrast=CONTRAST)
    explanation = explain(adapter, "gradient_x_input", inputs, target, per_step=True)
    prompt = len(inputs.tokens) - inputs.answer_length
    return explanation, prompt, inputs.answer_length


def test_the_heatmap_has_a_row_per_step_and_hover_names_both_tokens(contrast):
    explanation, prompt, answer = contrast
    steps = explanation.maps["steps"]
    texts = explanation.token_texts
    record = explanation.target_record
    labels = [*record.answer.token_labels, *record.alternative.token_labels]
    assert steps.shape == (answer + 1, len(texts))  # the answer's steps, then the alternative's
    heatmap = steps_figure(explanation).data[0]
    z = np.array(heatmap.z, dtype=float)
    assert z.shape == steps.shape
    for i, label in enumerate(labels):
        sign = "+" if i < answer else "−"
        # step k of the answer reads the prompt and the answer's k earlier tokens; the
        # alternative (one token) reads the prompt
        sources = prompt + (i if i < answer else 0)
        np.testing.assert_array_equal(z[i, :sources], steps[i, :sources])
        assert np.isnan(z[i, sources:]).all()
        # causal attention: a token after a step's position has no gradient into it
        assert not steps[i, sources:].any()
        for j in range(sources):
            hover = heatmap.text[i][j]
            assert f"step {i + 1}: {sign}{token_tick(label)}" in hover
            assert f"source {j + 1}: {token_tick(texts[j])}" in hover
            assert f"relevance = {steps[i, j]:.4g}" in hover
    ticks = steps_figure(explanation).layout.yaxis.ticktext
    assert list(ticks) == [
        ("+" if i < answer else "−") + token_tick(s) for i, s in enumerate(labels)
    ]
    assert STEPS in figures_for(explanation)


def test_the_answer_view_marks_the_answer_and_offers_every_step(contrast):
    explanation, prompt, answer = contrast
    view = answer_html(explanation, chosen=1)
    scores = [float(s) for s in re.findall(r'data-score="([^"]+)"', view)]
    np.testing.assert_allclose(scores, explanation.scores, rtol=1e-5, atol=1e-12)
    marked = re.findall(r'class="answer-token" data-step="(\d+)"[^>]*>([^<]*)<', view)
    assert [int(step) for step, _ in marked] == list(range(answer))
    assert [html.unescape(text) for _, text in marked] == [
        html.unescape(token_html(t)) for t in explanation.token_texts[prompt:]
    ]
    assert re.search(rf'class="alternative-token" data-step="{answer}"', view)
    chosen = re.findall(r'data-step="(\d+)"[^>]*outline:2px', view)
    assert chosen == ["1"]
    difference = explanation.target.log_probability_difference  # log p(answer) − log p(alt.)
    assert difference is not None and f"= {difference:.4g}" in view
    # the token columns say the contrast's odds, not a probability above 1
    odds = f"p(answer) / p(contrast) = {np.exp(difference):.3g}"
    assert odds in token_columns_html({"gxi": explanation})


def test_a_steps_row_is_coloured_over_its_sources_only(contrast):
    explanation, prompt, _ = contrast
    steps = explanation.maps["steps"]
    row = step_row_html(explanation, 2)
    scores = [float(s) for s in re.findall(r'data-score="([^"]+)"', row)]
    np.testing.assert_allclose(scores, steps[2, : prompt + 2], rtol=1e-5, atol=1e-12)
    assert row.count("not read by this step") == 0 and "this step's token" in row
    with pytest.raises(ValueError, match="no step 9"):
        step_row_html(explanation, 8)


def test_a_next_token_has_no_answer_views(load_model):
    adapter = load_model("tiny-random-llama")
    explanation = explain(adapter, "gradient_x_input", adapter.preprocess(PROMPT))
    assert STEPS not in figures_for(explanation)
    with pytest.raises(ValueError, match="needs an answer's explanation"):
        answer_html(explanation)


def test_an_answers_tokens_read_as_its_words_after_a_wordpiece_decoding(contrast):
    # WordPiece decodes " mat" as "mat": the labels must still be the typed words, each with
    # its leading space (a decoding that drops the space shifted every later token's text)
    explanation, prompt, _ = contrast
    assert explanation.token_texts[prompt:] == [" mat", " and", " slept"]
    assert explanation.target_record.alternative.token_labels == (" floor",)


def test_the_export_carries_the_question_the_answers_page_and_its_heatmap(contrast):
    explanation, _, _ = contrast
    asked = {"tab": "next", "text": PROMPT, "answer": ANSWER, "contrast": CONTRAST}
    bundle = zipfile.ZipFile(export_bundle(Result({"gxi": explanation}, fields=asked), png=False))
    read = {name.split("/", 1)[1]: name for name in bundle.namelist()}
    assert json.loads(bundle.read(read["manifest.json"]))["extra"]["inputs"] == asked
    page = bundle.read(read["pages/answer.html"]).decode()
    assert page.count('class="answer-token"') == 3 and 'class="alternative-token"' in page
    assert "figures/gxi_steps.html" in read
    back = Explanation.from_dict(json.loads(bundle.read(read["gxi.json"])))
    np.testing.assert_array_equal(back.maps["steps"], explanation.maps["steps"])
    assert back.target_record == explanation.target_record


@pytest.mark.slow
def test_a_chat_templates_tokens_read_as_the_templates_text(smollm2):
    # the template's tokens are kept out of maps, but each reads as its own characters: the
    # first word of the user's text is not the whole template before it, nor a token `Ġare`
    inputs, _ = answer_request(smollm2, "The capital of France is", answer=" Paris", chat=True)
    assert "".join(inputs.token_texts) == inputs.text
    marked = inputs.special_tokens.tolist()
    user = [t for t, s in zip(inputs.token_texts, marked, strict=True) if not s]
    assert user == ["The", " capital", " of", " France", " is", " Paris"]
