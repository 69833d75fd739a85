"""
Features and the LM tab's target through the front ends: batches by words and spans, the picked
next token as a contrast's answer, Predict in the chat template, greyed template tokens.

Scores by word are checked against the token-level run of the same row, its tokens grouped
into words here from their texts; the chat template's prediction against the model's own
forward on the template's text.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from _jobs import job_settings
from fastapi.testclient import TestClient

from attrlab.app.batch import DatasetRow
from attrlab.app.cli import main
from attrlab.app.engine_ray import ExplainActor, ray_items
from attrlab.app.server import create_app
from attrlab.app.ui.answers import AskedAnswer
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.explain import preview
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.inputs.features import read_spans
from attrlab.attribution.inputs.rows import dataset_line
from attrlab.attribution.inputs.runs import prepare_input
from attrlab.attribution.request.answers import AnswerSpec, answer_request
from attrlab.viz.answer import answer_html, step_row_html, steps_figure
from attrlab.viz.text import token_columns_html

LM = "tiny-random-gpt2"
#: "unbelievably" and "marmalade" are several WordPiece tokens each.
TEXT = "the unbelievably sweet marmalade sat"
PROMPT = "the cat sat on the"
#: A chat template of the kind tokenizers carry: the user's turn, then the assistant's opening.
TEMPLATE = (
    "{% for m in messages %}<|user|> {{ m['content'] }} <|end|>{% endfor %}"
    "{% if add_generation_prompt %} <|assistant|>{% endif %}"
)


def _words(token_texts: list[str]) -> list[list[int]]:
    """The tokens of each whitespace-separated word: a new word where a text starts with a space."""
    words: list[list[int]] = []
    for i, text in enumerate(token_texts):
        if not words or text[:1].isspace():
            words.append([])
        words[-1].append(i)
    return words


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    settings = job_settings(tmp_path_factory.mktemp("data"), LM)
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as client:
        yield client
    worker.close()


def _check_words(by_word: dict, by_token: dict) -> None:
    """A word's score is the sum of its tokens' scores from the token-level run."""
    words = _words(by_token["token_texts"])
    assert len(words) == len(TEXT.split()) and any(len(w) > 1 for w in words)
    expected = [sum(by_token["scores"][i] for i in word) for word in words]
    assert [f["text"] for f in by_word["features"]] == TEXT.split()
    np.testing.assert_allclose(by_word["feature_scores"], expected, rtol=1e-5, atol=1e-9)
    assert by_token["features"] is None and by_word["granularity"] == "word"


def test_a_rest_batch_explains_each_instance_at_its_own_granularity(served):
    instances = [
        {"text": TEXT, "granularity": "word"},
        {"text": TEXT},
        {"text": TEXT, "granularity": "span", "spans": [[4, 16], [33, 36]]},
    ]
    body = {"model": LM, "method": "gradient_x_input", "instances": instances}
    response = served.post("/api/v1/explain", json=body)
    assert response.status_code == 200, response.text
    by_word, by_token, by_span = (e["gradient_x_input"] for e in response.json()["explanations"])
    _check_words(by_word, by_token)
    assert [f["text"] for f in by_span["features"]] == ["unbelievably", "sat"]


@pytest.mark.parametrize(
    ("instance", "status", "words"),
    [
        ({"granularity": "span", "spans": [[0, 99]]}, 400, "instances[1]: span 1 [0, 99] must"),
        ({"granularity": "span", "spans": [[0, 5], [3, 9]]}, 400, "instances[1]: spans [0, 5]"),
        ({"granularity": "span"}, 422, "instances[1]: granularity=span needs spans"),
        ({"granularity": "paragraph"}, 422, "instances[1]: granularity must be one of"),
    ],
)
def test_a_rest_batch_refuses_a_bad_span_by_name(served, instance, status, words):
    # as a single request refuses it (400 invalid input, 422 invalid parameter), nothing queued
    instances = [{"text": TEXT}, {"text": TEXT, **instance}]
    body = {"model": LM, "method": "gradient_x_input", "instances": instances}
    for route in ("/api/v1/explain", "/api/v1/jobs"):
        response = served.post(route, json=body)
        assert response.status_code == status, response.text
        assert words in response.json()["error"]["message"]


def test_openapi_documents_the_features_of_an_instance(served):
    schemas = served.get("/openapi.json").json()["components"]["schemas"]
    for name in ("InstanceBody", "ExplainBody", "JobBody"):
        assert {"granularity", "spans"} <= set(schemas[name]["properties"]), name


def test_a_cli_batch_row_carries_its_granularity_and_a_bad_one_exits_2(tmp_path, capsys):
    data, out = tmp_path / "rows.jsonl", tmp_path / "out.parquet"
    rows = [{"id": "a", "text": TEXT, "granularity": "word"}, {"id": "b", "text": TEXT}]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    argv = ["batch", "--model", LM, "--methods", "gradient_x_input", "--device", "cpu"]
    assert main([*argv, "--input", str(data), "--output", str(out)]) == 0
    kept = pd.read_parquet(out).sort_values("id")
    by_word, by_token = (json.loads(e) for e in kept.explanation_json)
    _check_words(by_word, by_token)
    capsys.readouterr()
    data.write_text(json.dumps({"id": "c", "text": TEXT, "granularity": "span", "spans": [[5, 2]]}))
    assert main([*argv, "--input", str(data), "--output", str(tmp_path / "bad.parquet")]) == 2
    assert "row 'c': span 1 [5, 2] must satisfy" in capsys.readouterr().err


def test_typed_spans_read_one_a_line_or_as_json():
    assert read_spans("0-4\n\n 10 - 20 ") == [[0, 4], [10, 20]]
    assert read_spans("[[1, 2]]") == [[1, 2]]
    assert read_spans("  ") is None
    with pytest.raises(InvalidInputError, match="spans line 2 'ten' is not start-end"):
        read_spans("0-4\nten")


def test_a_contrast_without_an_answer_compares_the_picked_token(load_model):
    adapter = load_model(LM)
    with torch.no_grad():
        logits = adapter.logits(**adapter.preprocess(PROMPT).model_kwargs())[0]
    second = int(logits.topk(2).indices[1])  # not the greedy token
    word = adapter.tokenizer.decode([second])
    picked = prepare_input(adapter, PROMPT, second, AnswerSpec(contrast=" floor"))
    assert picked.target.answer.tokens == (second,)
    # the same map as that token given as the answer
    inputs, target = answer_request(adapter, PROMPT, answer=" " + word, contrast=" floor")
    assert target.answer.tokens == (second,)
    a = explain(adapter, "gradient_x_input", picked.inputs, picked.target)
    b = explain(adapter, "gradient_x_input", inputs, target)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    greedy = prepare_input(adapter, PROMPT, None, AnswerSpec(contrast=" floor"))
    assert greedy.target.answer.tokens == (int(logits.argmax()),)
    with pytest.raises(InvalidInputError, match="leave out the target"):
        prepare_input(adapter, PROMPT, second, AnswerSpec(answer=" mat"))
    # the page keeps the menu's token beside a contrast; a typed answer replaces it
    assert AskedAnswer(contrast=" floor").request_fields() == {
        "answer": AnswerSpec(contrast=" floor", per_step=True)
    }
    assert AskedAnswer(answer=" mat").request_fields()["target"] is None


@contextmanager
def _chat_template(adapter):
    """The tiny model's tokenizer with a chat template, for the block only."""
    tokenizer = adapter.tokenizer
    before = tokenizer.chat_template
    tokenizer.chat_template = TEMPLATE
    try:
        yield tokenizer
    finally:
        tokenizer.chat_template = before


def test_predict_in_the_chat_template_reads_after_the_assistants_opening(load_model):
    adapter = load_model(LM)
    asked = AskedAnswer(chat=True).preview_fields()
    assert asked == {"answer": AnswerSpec(chat=True), "target": None}
    with _chat_template(adapter) as tokenizer:
        prepared = prepare_input(adapter, PROMPT, asked["target"], asked["answer"])
        shown = preview(adapter, prepared.inputs)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
        )
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        expected = adapter.model(input_ids=ids).logits[0, -1].double().softmax(-1)
    top = expected.topk(5)
    assert [p.index for p in shown.predictions] == top.indices.tolist()
    np.testing.assert_allclose([p.probability for p in shown.predictions], top.values, rtol=1e-5)
    plain = preview(adapter, adapter.preprocess(PROMPT))
    assert [p.probability for p in plain.predictions] != pytest.approx(top.values.tolist())


def test_a_chat_templates_tokens_are_greyed_in_the_maps_and_the_heatmap(load_model):
    adapter = load_model(LM)
    with _chat_template(adapter):
        inputs, target = answer_request(adapter, PROMPT, answer=" mat and slept", chat=True)
    e = explain(adapter, "gradient_x_input", inputs, target, per_step=True)
    template = [not t.strip() or "|" in t for t in e.token_texts]  # <|user|>, spaces, ...
    assert e.special_tokens is not None and e.special_tokens == inputs.special_tokens.tolist()
    assert sum(e.special_tokens) >= 3 and any(template)
    assert Explanation.from_json(e.to_json()).special_tokens == e.special_tokens
    older = {k: v for k, v in e.to_dict().items() if k != "special_tokens"}
    assert Explanation.from_dict(older).special_tokens is None  # files before the field
    for page in (answer_html(e), token_columns_html({"gxi": e}), step_row_html(e, 2)):
        greyed = page.count('class="kept-out"')
        assert greyed == sum(e.special_tokens)  # shown, not coloured
        assert len(re.findall("<span[^>]* title=", page)) == len(e.token_texts)  # none hidden
    assert answer_html(e).count("data-score=") == len(e.token_texts)
    heatmap = steps_figure(e).data[0]
    columns = np.isnan(np.asarray(heatmap.z, dtype=float)).all(axis=0)
    assert columns[np.asarray(e.special_tokens)].all()  # blank columns under greyed ticks
    ticks = steps_figure(e).layout.xaxis.ticktext
    assert all(("#9ca3af" in t) == s for t, s in zip(ticks, e.special_tokens, strict=True))


def test_a_rows_features_survive_a_dataset_line_and_the_ray_engines_rows():
    line = dataset_line(1, json.dumps({"text": TEXT, "granularity": "span", "spans": [[4, 16]]}))
    assert (line.granularity, line.spans, line.problem) == ("span", [[4, 16]], None)
    bad = dataset_line(2, json.dumps({"text": TEXT, "granularity": "span", "spans": "4-16"}))
    assert "line 2: spans must be a list" in bad.problem
    rows = [
        DatasetRow(id="a", text=TEXT, granularity=line.granularity, spans=line.spans),
        DatasetRow(id="b", text=TEXT, granularity="sentence"),
        DatasetRow(id="c", text=TEXT),
    ]
    # as Ray hands a batch to an actor: the items through Arrow, then pandas
    batch = pa.Table.from_pylist(ray_items(rows)).to_pandas()
    assert ExplainActor.dataset_rows(batch) == rows
    assert [r.instance().spans for r in rows] == [[[4, 16]], None, None]
