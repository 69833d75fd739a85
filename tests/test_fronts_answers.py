"""
Answers and contrasts of a decoder LM through every front end: CLI, REST, batch, jobs, KServe.

The maps are checked against gradient × input written out here with autograd on the model
itself (one backward per step and for the whole answer), so a field that got lost on the way
(an answer explained as the next token, a contrast dropped) shows as a different map.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from _jobs import job_settings, wait_for_job
from fastapi.testclient import TestClient

from attrlab.app.batch import DatasetRow
from attrlab.app.cli import main
from attrlab.app.engine_ray import ExplainActor, ray_items
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError, JobCancelledError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.inputs.rows import dataset_line
from attrlab.attribution.inputs.runs import prepare_input
from attrlab.attribution.request import ExplainRequest
from attrlab.attribution.request.answers import MAX_NEW_TOKENS, AnswerSpec, answer_request

LM, CLASSIFIER = "tiny-random-gpt2", "tiny-random-bert"
PROMPT, ANSWER, CONTRAST = "The capital of France is", " Paris city", " Lyon"


def _log_probs(adapter, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax of every position of ``ids``, and the token embeddings (they need grad)."""
    embeddings = adapter.model.get_input_embeddings()(torch.tensor([ids])).detach()
    embeddings.requires_grad_(True)
    logits = adapter.model(inputs_embeds=embeddings).logits[0]
    return logits.float().log_softmax(-1), embeddings


def _gxi(score: torch.Tensor, embeddings: torch.Tensor) -> np.ndarray:
    (grad,) = torch.autograd.grad(score, embeddings, retain_graph=True)
    return (grad * embeddings)[0].sum(-1).detach().numpy()


def _reference(adapter) -> tuple[float, np.ndarray, np.ndarray]:
    """
    ``log p(answer) − log p(contrast)``, its gradient × input map and one row per step.

    Written out here: the prompt's tokens as the model reads them, the answer's after them,
    each step read at the position before its token; the one-token contrast read where the
    answer's first token is.
    """
    tokenizer = adapter.tokenizer
    prompt = adapter.preprocess(PROMPT).input_ids[0].tolist()
    answer = tokenizer.encode(ANSWER, add_special_tokens=False)
    (contrast,) = tokenizer.encode(CONTRAST, add_special_tokens=False)
    log_probs, embeddings = _log_probs(adapter, prompt + answer)
    at = len(prompt) - 1
    steps = [log_probs[at + k, token] for k, token in enumerate(answer)]
    steps.append(-log_probs[at, contrast])
    score = torch.stack(steps).sum()
    rows = np.stack([_gxi(step, embeddings) for step in steps])
    return score.item(), _gxi(score, embeddings), rows


def test_cli_explains_an_answer_against_a_contrast_per_step(capsys, tmp_path, load_model):
    score, whole, rows = _reference(load_model(LM))
    argv = ["explain", "--model", LM, "--device", "cpu", "--text", PROMPT]
    argv += ["--answer", ANSWER, "--contrast", CONTRAST, "--per-step"]
    figures = tmp_path / "figures"
    code = main([*argv, "--methods", "gradient_x_input,occlusion", "--format", "json"])
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    gxi, occlusion = (Explanation.from_dict(e) for e in shown)
    for e in (gxi, occlusion):
        record = e.target_record.to_json()
        assert record["kind"] == "contrast"
        assert record["answer"]["label"] == ANSWER and record["alternative"]["label"] == CONTRAST
        assert e.target.log_probability_difference == pytest.approx(score, abs=1e-4)
        # the rows of the per-step matrix (separate runs) sum to the whole map (linear methods)
        assert e.maps["steps"].shape == (3, len(e.tokens))
        np.testing.assert_allclose(e.maps["steps"].sum(0), e.scores, atol=1e-5)
    tolerance = 1e-4 * np.abs(whole).max()
    np.testing.assert_allclose(gxi.scores, whole, atol=tolerance)
    np.testing.assert_allclose(gxi.maps["steps"], rows, atol=tolerance)

    # the table: what was explained, then one row per answer step over the input's tokens
    assert main([*argv, "--method", "gradient_x_input", "--figures", str(figures)]) == 0
    table = capsys.readouterr().out
    assert f"answer    '{ANSWER}'" in table and f"contrast  '{CONTRAST}'" in table
    after = table.split("per step")[1].splitlines()
    labels = gxi.target_record.step_labels()  # '+ Paris', '+ city', '− Lyon'
    step_lines = [line for line in after if line.startswith(tuple(labels))]
    assert len(step_lines) == 3 and labels[2].startswith("−")
    for line, row in zip(step_lines, gxi.maps["steps"], strict=True):
        printed = [float(v) for v in line.split()[-len(gxi.tokens) :]]
        np.testing.assert_allclose(printed, row, rtol=5e-3, atol=5e-3 * np.abs(row).max())
    drawn = (figures / "gradient_x_input_scores.html").read_text(encoding="utf-8")
    assert "France" in drawn  # the whole answer's map over the input's tokens


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--answer", " Paris", "--generate", "3"], "not both"),
        (["--generate", "0"], f"1 to {MAX_NEW_TOKENS}"),
        (["--answer", ""], "the answer is empty"),
        (["--per-step"], "per_step splits an answer"),
        (["--model", CLASSIFIER, "--contrast", " Lyon"], "decoder LM"),
        (["--chat", "--answer", " Paris"], "no chat template"),
    ],
)
def test_cli_refuses_a_bad_answer_with_exit_2(capsys, flags, words):
    argv = ["explain", "--model", LM, "--method", "gradient_x_input", "--text", PROMPT]
    assert main([*argv, "--device", "cpu", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_layers_takes_the_answer_options_through_the_same_request(capsys):
    argv = ["layers", "--model", LM, "--device", "cpu", "--text", PROMPT, "--format", "json"]
    code = main([*argv, "--answer", ANSWER, "--contrast", CONTRAST, "--measures", "entropy"])
    out, err = capsys.readouterr()
    # the library's layer analysis takes the contrast (issue 26), or refuses it by name
    if code == 0:
        assert json.loads(out)["target_record"]["kind"] == "contrast"
    else:
        assert code == 2 and "not a contrast target" in err and "Traceback" not in err
    assert main([*argv, "--answer", " Paris", "--generate", "2"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    settings = job_settings(tmp_path_factory.mktemp("data"), f"{LM},{CLASSIFIER}")
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as client:
        yield client, worker
    worker.close()


def test_rest_explains_a_contrast_per_step(served, load_model):
    client, _ = served
    score, whole, rows = _reference(load_model(LM))
    body = {"model": LM, "method": "gradient_x_input", "text": PROMPT, "answer": ANSWER}
    response = client.post("/api/v1/explain", json={**body, "contrast": CONTRAST, "per_step": True})
    assert response.status_code == 200, response.text
    e = response.json()
    assert e["target_record"]["kind"] == "contrast"
    assert e["target"]["log_probability_difference"] == pytest.approx(score)
    tolerance = 1e-4 * np.abs(whole).max()
    np.testing.assert_allclose(e["scores"], whole, atol=tolerance)
    np.testing.assert_allclose(e["maps"]["steps"], rows, atol=tolerance)
    kserve = client.post(
        f"/v1/models/{LM}:explain",
        json={
            "instances": [PROMPT, {"text": PROMPT, "answer": ANSWER, "contrast": CONTRAST}],
            "parameters": {"method": "gradient_x_input"},
        },
    )
    plain, contrasted = kserve.json()["explanations"]
    assert plain["target_record"]["kind"] == "next_token"
    np.testing.assert_allclose(contrasted["scores"], whole, atol=tolerance)


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({"answer": " Paris", "generate": 3}, 400, "not both"),
        ({"model": CLASSIFIER, "contrast": " Lyon"}, 400, "decoder LM"),
        ({"generate": 0}, 422, f"1 to {MAX_NEW_TOKENS}"),
        ({"generate": MAX_NEW_TOKENS + 1}, 422, f"1 to {MAX_NEW_TOKENS}"),
        ({"answer": ""}, 400, "the answer is empty"),
        ({"contrast": ""}, 400, "the contrast is empty"),
        ({"stop": "."}, 400, "'stop' ends a generated answer"),
        ({"per_step": True}, 400, "per_step splits an answer"),
        ({"answer": " Paris", "target": 3}, 400, "leave out the target"),
        ({"generate": "3"}, 422, "generate"),
    ],
)
def test_rest_refuses_each_bad_combination_by_name(served, fields, status, words):
    client, worker = served
    body = {"model": LM, "method": "gradient_x_input", "text": PROMPT, **fields}
    response = client.post("/api/v1/explain", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]
    assert worker.status()["queued"] == 0  # a refused request leaves nothing behind


def test_openapi_documents_the_answer_fields(served):
    client, _ = served
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    fields = {"answer", "generate", "stop", "contrast", "chat", "per_step"}
    for name in ("ExplainBody", "InstanceBody", "JobBody"):
        assert fields <= set(schemas[name]["properties"]), name
        generate = schemas[name]["properties"]["generate"]
        assert (generate["minimum"], generate["maximum"]) == (1, MAX_NEW_TOKENS)
    assert fields - {"per_step"} <= set(schemas["LayersBody"]["properties"])


def test_a_job_and_a_batch_row_carry_their_answer(served, load_model, tmp_path, capsys):
    client, _ = served
    adapter = load_model(LM)
    _, whole, _ = _reference(adapter)
    instances = [
        {"text": PROMPT, "answer": ANSWER, "contrast": CONTRAST},
        {"text": "The cat", "generate": 3, "per_step": True},
        {"text": "The cat", "answer": " sat", "generate": 2},
    ]
    body = {"model": LM, "method": "gradient_x_input", "instances": instances}
    submitted = client.post("/api/v1/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    status = wait_for_job(client, submitted.json()["job_id"])
    assert status["done"] == 3 and status["instance_errors"] == 1
    lines = client.get(f"/api/v1/jobs/{status['job_id']}/results").text.splitlines()
    job = [json.loads(line)["explanations"]["gradient_x_input"] for line in lines]
    tolerance = 1e-4 * np.abs(whole).max()
    np.testing.assert_allclose(job[0]["scores"], whole, atol=tolerance)
    generated = job[1]["target_record"]
    assert generated["kind"] == "answer" and generated["generated"] is True
    assert np.asarray(job[1]["maps"]["steps"]).shape == (len(generated["tokens"]), 5)
    assert "not both" in job[2]["error"]["message"]

    # attrlab batch: the same rows from a file give the library's own maps
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"id": str(i), **r}) for i, r in enumerate(instances)))
    out = tmp_path / "out.parquet"
    argv = ["batch", "--model", LM, "--methods", "gradient_x_input", "--device", "cpu"]
    assert main([*argv, "--input", str(data), "--output", str(out)]) == 0
    capsys.readouterr()
    rows = pd.read_parquet(out).sort_values("id").reset_index(drop=True)
    for row, asked in zip(rows.itertuples(), instances[:2], strict=False):
        spec = AnswerSpec.from_json(asked)
        inputs, target = answer_request(
            adapter, asked["text"], spec.answer, spec.generate, spec.contrast
        )
        library = explain(adapter, "gradient_x_input", inputs, target, per_step=spec.per_step)
        kept = Explanation.from_json(row.explanation_json)
        assert kept.target_record == library.target_record
        np.testing.assert_allclose(row.scores, library.scores, rtol=1e-5, atol=1e-7)
        assert kept.maps.keys() == library.maps.keys()
    assert "not both" in rows.iloc[2].error


def test_a_failed_or_cancelled_answer_leaves_nothing_behind(load_model):
    adapter = load_model(LM)
    hooks = dict(adapter.model._forward_pre_hooks)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(JobCancelledError):  # generation stops at its first forward
        prepare_input(adapter, PROMPT, None, AnswerSpec(generate=MAX_NEW_TOKENS), cancel)
    assert adapter.model._forward_pre_hooks == hooks
    worker = ExplainWorker(device="cpu", max_models=1)
    try:
        refused = ExplainRequest(
            model=CLASSIFIER,
            method="gradient_x_input",
            text=PROMPT,
            answer=AnswerSpec(contrast=CONTRAST, per_step=True),
        )
        with pytest.raises(InvalidInputError, match="decoder LM"):
            worker.explain(refused)
        assert worker.status()["queued"] == 0
        plain = ExplainRequest(model=CLASSIFIER, method="gradient_x_input", text=PROMPT)
        assert worker.explain(plain).target_record.kind == "class"
    finally:
        worker.close()


def test_answer_fields_survive_a_dataset_line_and_the_ray_engines_rows():
    line = dataset_line(1, json.dumps({"text": PROMPT, "generate": 4, "stop": ".", "chat": True}))
    assert line.answer == AnswerSpec(generate=4, stop=".", chat=True)
    both = dataset_line(2, json.dumps({"text": PROMPT, "answer": "x", "generate": 1}))
    assert both.answer is None and "line 2: give an answer or ask" in both.problem
    image = dataset_line(3, json.dumps({"image": "a.png", "answer": "x"}))
    assert "line 3: an answer follows a text" in image.problem
    rows = [
        DatasetRow(id="a", text=PROMPT, answer=line.answer),
        DatasetRow(id="b", text=PROMPT, target=2),
        DatasetRow(id="c", text=PROMPT, answer=AnswerSpec(answer=ANSWER, per_step=True)),
        # an image and its prompt (a vision-language model's row), with an answer
        DatasetRow(id="d", text=PROMPT, image=b"\x89PNG...", answer=AnswerSpec(answer=ANSWER)),
    ]
    # as Ray hands a batch to an actor: the items through Arrow, then pandas
    batch = pa.Table.from_pylist(ray_items(rows)).to_pandas()
    assert ExplainActor.dataset_rows(batch) == rows
