"""
The one loop over inputs × methods (:mod:`attribution.inputs.runs`) and the one JSONL row reader
(:mod:`attribution.inputs.rows`): every caller's rows are ``explain`` run per input and method, and
every path that reads a target refuses JSON's ``true`` in the same words.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pandas as pd
import pytest
import torch
from _jobs import job_settings, wait_for_job
from _model_state import model_state
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.ui.files import uploaded_rows
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import AttrlabError, InvalidInputError, JobCancelledError
from attrlab.attribution.inputs.rows import dataset_line, numbered_lines, target_problem
from attrlab.attribution.inputs.runs import explain_rows
from attrlab.attribution.layers import DatasetItem, analyze_dataset, analyze_layers
from attrlab.attribution.metrics import EvalItem, evaluate_methods, faithfulness
from attrlab.attribution.request import BatchRequest, Instance
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import output_target, target_record

TEXT_MODEL = "tiny-random-bert"
METHODS = ("gradient_x_input", "occlusion")
PARAMS = {"occlusion": {"window": 2}}
TEXTS = ("the cat sat on the mat", "a fine day for a walk", "rain again today")
#: Per text: the target to explain (the last one the model does not have).
TARGETS = (None, 1, 7)
BOOL_TARGET = '{"text": "the cat sat", "target": true}'
#: What every reader says of ``"target": true``.
REFUSAL = "target must be a label or an index"


@pytest.fixture(scope="module")
def worker():
    worker = ExplainWorker(device="cpu")
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def bert(worker):
    """The worker's own loaded model: the expected rows are computed on the same weights."""
    return worker.adapter(TEXT_MODEL)


def _expected(adapter, text, target, method):
    """One explanation computed directly, or the error ``explain`` raises for it."""
    try:
        record = target_record(adapter, target)
        return explain(adapter, method, adapter.preprocess(text), record, PARAMS.get(method))
    except AttrlabError as err:
        return err


def _assert_same(outcome, expected):
    """The same map (or the same error message) as ``explain`` gives alone."""
    if isinstance(expected, AttrlabError):
        assert isinstance(outcome, AttrlabError) and str(outcome) == str(expected)
        return
    assert not isinstance(outcome, AttrlabError), outcome
    assert outcome.target.index == expected.target.index
    np.testing.assert_allclose(outcome.scores, expected.scores, rtol=1e-6, atol=1e-9)


def test_the_workers_batch_is_explain_per_input_and_method_with_errors_as_rows(worker, bert):
    instances = tuple(Instance(text=t, target=g) for t, g in zip(TEXTS, TARGETS, strict=True))
    seen: list[tuple[int, int]] = []
    request = BatchRequest(model=TEXT_MODEL, instances=instances, methods=METHODS, params=PARAMS)
    results = worker.explain(request, progress=lambda done, total: seen.append((done, total)))
    assert len(results) == len(TEXTS)
    for text, target, outcomes in zip(TEXTS, TARGETS, results, strict=True):
        assert list(outcomes) == list(METHODS)
        for method in METHODS:
            _assert_same(outcomes[method], _expected(bert, text, target, method))
    assert "out of range" in str(results[2]["occlusion"])  # the bad target is its row's error
    assert seen == [(2 * n, 6) for n in range(4)]  # before each input, then done


def test_a_batch_file_and_a_job_give_the_rows_of_explain_per_input_and_method(
    tmp_path, worker, bert
):
    pairs = enumerate(zip(TEXTS, TARGETS, strict=True))
    lines = [{"id": f"r{n}", "text": t, "target": g} for n, (t, g) in pairs]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["batch", "--model", TEXT_MODEL, "--methods", ",".join(METHODS), "--input", str(data)]
    assert main([*argv, "--param", "occlusion.window=2", "--output", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    body = {
        "model": TEXT_MODEL,
        "methods": list(METHODS),
        "params": PARAMS,
        "instances": [{"text": t, "target": g} for t, g in zip(TEXTS, TARGETS, strict=True)],
    }
    with TestClient(create_app(ExplainWorker(device="cpu", settings=_served(tmp_path)))) as client:
        job_id = client.post("/api/v1/jobs", json=body).json()["job_id"]
        assert wait_for_job(client, job_id)["status"] == "done"
        served = client.get(f"/api/v1/jobs/{job_id}/results").text.splitlines()
    job_rows = [json.loads(line) for line in served]
    assert [row["index"] for row in job_rows] == [0, 1, 2]
    for n, (text, target) in enumerate(zip(TEXTS, TARGETS, strict=True)):
        for method in METHODS:
            expected = _expected(bert, text, target, method)
            (row,) = [r for r in written if r["id"] == f"r{n}" and r["method"] == method]
            in_job = job_rows[n]["explanations"][method]
            if isinstance(expected, AttrlabError):
                assert row["error"] == str(expected) == in_job["error"]["message"]
                continue
            assert row["error"] is None and row["target"] == expected.target.index
            np.testing.assert_allclose(row["scores"], expected.scores, rtol=1e-6)
            np.testing.assert_allclose(in_job["scores"], expected.scores, rtol=1e-6)


def _served(tmp_path):
    return job_settings(tmp_path / "data", TEXT_MODEL)


def test_the_leaderboard_scores_explain_per_item_and_method(bert):
    items = [EvalItem(text, None, f"item {n}") for n, text in enumerate(TEXTS)]
    seen: list[int] = []
    table = evaluate_methods(
        bert,
        items,
        METHODS,
        PARAMS,
        steps=4,
        random_orders=1,
        settings=RunSettings(seed=3),
        progress=seen.append,
    )
    assert seen == [1, 2, 3]
    expected = []
    for done, item in enumerate(items, start=1):
        inputs = bert.preprocess(item.raw)
        orders = RunContext(seed=3 + done)  # the random orders of the item, method after method
        for method in METHODS:
            alone = explain(bert, method, inputs, None, PARAMS.get(method), RunSettings(seed=3))
            scored = faithfulness(bert, inputs, alone.scores, alone.target_record, 4, 1, run=orders)
            expected.append({"item": item.name, "method": method, **scored.metrics})
            expected[-1]["forward_passes"] = alone.timings.forward_passes
    expected_table = pd.DataFrame(expected)
    # where every subset costs no more than the one order allowed, an item's reference is a random
    # order's exact expectation (tests/test_random_reference.py), not the order drawn here
    drawn = table["random_orders"] > 0
    assert drawn.any() and not drawn.all()
    reference = [c for c in expected_table if "random" in c or c.endswith("_p")]
    own = [c for c in expected_table if c not in reference]
    pd.testing.assert_frame_equal(table[own], expected_table[own], rtol=1e-9)
    pd.testing.assert_frame_equal(
        table.loc[drawn, reference], expected_table.loc[drawn, reference], rtol=1e-9
    )


def test_dataset_mode_sums_analyze_layers_per_input(load_model):
    llama = load_model("tiny-random-llama")
    measures = ["sink", "block_influence"]
    items = [DatasetItem(text, target) for text, target in zip(TEXTS, (None, 3, "5"), strict=True)]
    seen: list[int] = []
    table = analyze_dataset(llama, iter(items), measures, progress=seen.append)
    assert seen == [1, 2, 3]
    singles = []
    for item in items:
        inputs = llama.preprocess(item.raw)
        with torch.no_grad():
            target = llama.target_index(item.target, llama.logits(**inputs.model_kwargs())[0])
        singles.append(analyze_layers(llama, inputs, output_target(llama, target), measures))
    grouped = pd.concat(singles).groupby(["layer", "head", "measure"], dropna=False).value
    expected = grouped.agg(["mean", "count"]).sort_index()
    got = table.set_index(["layer", "head", "measure"])[["mean", "count"]].sort_index()
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_index_type=False)


def test_the_loop_reports_each_row_and_a_cancel_stops_before_the_next_leaving_the_model(bert):
    before = model_state(bert.model)
    cancel = threading.Event()
    prepared: list[str] = []
    done: list[int] = []

    def prepare(item):
        prepared.append(item.raw)
        return bert.preprocess(item.raw)

    rows = explain_rows(
        bert,
        [EvalItem(text) for text in TEXTS],
        METHODS,
        prepare,
        params=PARAMS,
        settings=RunSettings(cancel=cancel),
        progress=done.append,
    )
    first = next(rows)
    inputs, explanations = first.explained()
    assert inputs.tokens == bert.preprocess(TEXTS[0]).tokens
    for method in METHODS:
        _assert_same(explanations[method], _expected(bert, TEXTS[0], None, method))
    assert done == []  # a row counts once the caller has taken it
    second = next(rows)
    assert done == [1] and second.row.raw == TEXTS[1]
    cancel.set()
    with pytest.raises(JobCancelledError):
        next(rows)
    assert prepared == list(TEXTS[:2])  # the third row never started
    assert done == [1, 2]
    assert model_state(bert.model) == before


def test_a_cancel_inside_a_method_stops_the_run_and_leaves_the_model(bert):
    before = model_state(bert.model)
    cancel = threading.Event()
    calls = 0

    def cancel_in_the_first_methods_pass(_module, _args):
        nonlocal calls
        calls += 1  # the first is the prediction, the second occlusion's first batch
        if calls == 2:
            cancel.set()

    handle = bert.model.register_forward_pre_hook(cancel_in_the_first_methods_pass)
    try:
        rows = explain_rows(
            bert,
            [Instance(text=text) for text in TEXTS],
            ("occlusion",),
            lambda instance: bert.preprocess(instance.text),
            record_errors=lambda number, method: InvalidInputError("not recorded"),
            settings=RunSettings(cancel=cancel),
        )
        with pytest.raises(JobCancelledError):  # never recorded as a row's result
            list(rows)
    finally:
        handle.remove()
    assert calls == 2  # that very pass stopped it: nothing ran after
    assert model_state(bert.model) == before


@pytest.mark.parametrize("command", ["layers", "evaluate"])
def test_the_command_line_refuses_a_true_target_naming_line_and_field(tmp_path, capsys, command):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "fine"}\n' + BOOL_TARGET + "\n", encoding="utf-8")
    model = "tiny-random-llama" if command == "layers" else TEXT_MODEL
    assert main([command, "--model", model, "--input", str(data)]) == 2
    assert f"{data} line 2: {REFUSAL}" in capsys.readouterr().err


def test_a_batch_file_and_a_page_upload_record_a_true_target_as_the_lines_error(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(BOOL_TARGET + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "gradient_x_input"]
    assert main([*argv, "--input", str(data), "--output", str(out)]) == 0
    (row,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert row["error"] == f"line 1: {REFUSAL}"
    (upload,) = uploaded_rows(str(data), max_bytes=10**6, max_rows=None)
    assert upload.problem == f"line 1: {REFUSAL}"


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/explain"])
def test_a_job_or_request_with_a_true_target_is_refused_with_the_same_words(tmp_path, path):
    body = {"model": TEXT_MODEL, "method": "gradient_x_input"}
    body["instances"] = [{"text": "the cat sat", "target": True}]
    with TestClient(create_app(ExplainWorker(device="cpu", settings=_served(tmp_path)))) as client:
        refused = client.post(path, json=body)
        alone = client.post(path, json={**body, "instances": None, "text": "a", "target": False})
    for response in (refused, alone):
        assert response.status_code == 422
        assert REFUSAL in response.json()["error"]["message"]


#: Any character, lone surrogates too (JSON can escape them).
_TEXT = st.text(st.characters(exclude_categories=()))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
_FIELDS = st.sampled_from(["id", "text", "image", "target", "other"])
_LINES = st.one_of(
    st.dictionaries(_FIELDS, _JSON, max_size=4).map(json.dumps),
    _JSON.map(json.dumps),
    _TEXT,
    st.just('{"text": "a", "id": ' + "9" * 5000 + "}"),  # more digits than Python reads
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINES, min_size=1, max_size=4))
def test_every_line_reads_as_a_row_of_the_documented_types_or_as_its_problem(lines):
    text = "\n".join(line.replace("\n", " ") for line in lines)
    for number, line in numbered_lines(text):
        read = dataset_line(number, line)
        assert isinstance(read.id, str)
        if read.problem is not None:
            assert read.problem.startswith(f"line {number}: ")
            assert read.text is read.image is read.target is None
            continue
        # a text, an image's name, or both: an image and its prompt (a vision-language model's)
        assert read.text is not None or read.image is not None
        assert all(isinstance(v, str) for v in (read.text, read.image) if v is not None)  # ''
        assert target_problem(read.target) is None
        assert read.target is None or type(read.target) in (int, str)
        record = json.loads(line)  # what was read is what the line says
        assert read.target == record.get("target")
        assert read.text == record.get("text") and read.image == record.get("image")


def test_a_line_with_an_image_and_a_text_is_an_image_and_its_prompt():
    both = dataset_line(1, json.dumps({"image": "a.png", "text": "what is it", "answer": " a cat"}))
    assert both.problem is None
    assert (both.image, both.text, both.answer.answer) == ("a.png", "what is it", " a cat")
    alone = dataset_line(2, json.dumps({"image": "a.png", "answer": " a cat"}))
    assert "line 2: an answer follows a text, not an image" in alone.problem
    neither = dataset_line(3, json.dumps({"target": 1}))
    assert 'line 3: give an object with "text" or "image" (a path), or both' in neither.problem
    wrong = dataset_line(4, json.dumps({"image": "a.png", "text": 5}))
    assert wrong.problem == "line 4: text must be a string"
