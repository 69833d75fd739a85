"""
A patching study as a durable job (``POST /api/v1/patch/jobs``), beside the batch jobs.

The job's report is checked against :func:`attribution.patching.patching_report` run directly
on the same tiny model; a forward hook holds the worker mid-study where a test needs a running
job (to poll it, cancel it, or stop the server under it).
"""

from __future__ import annotations

import dataclasses
import io
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import pytest
import torch
from _jobs import job_settings, wait_for_job
from _model_state import model_state
from fastapi.testclient import TestClient

from attrlab.app.jobs import DamagedResultsError, JobStore
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.patching import patching_problem, patching_report
from attrlab.attribution.request.calibration import calibrate

MODEL = "tiny-random-gpt2"
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
STUDY = {"estimators": ["exact", "atp"], "components": ["residual", "head"]}
BODY = {"model": MODEL, "clean": CLEAN, "corrupted": CORRUPT, "answer": " Mary"}
BODY |= {"contrast": " John", **STUDY}


@pytest.fixture(scope="module")
def expected(load_model):
    problem = patching_problem(load_model(MODEL), CLEAN, CORRUPT, " Mary", " John")
    return patching_report(load_model(MODEL), problem, **STUDY)


@contextmanager
def held(model: torch.nn.Module, at: int = 3) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the model's ``at``-th forward until released: ``(reached, release)``."""
    reached, release = threading.Event(), threading.Event()
    calls = [0]

    def hold(*_: object) -> None:
        calls[0] += 1
        if calls[0] == at:
            reached.set()
            assert release.wait(60)

    handle = model.register_forward_hook(hold)
    try:
        yield reached, release
    finally:
        release.set()
        handle.remove()


def _same_table(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns)
    for column in ("estimator", "direction", "component", "layer"):
        assert list(got[column]) == list(expected[column])
    for column in ("effect", "normalised"):
        pd.testing.assert_series_equal(
            got[column].astype(float), expected[column].astype(float), rtol=1e-6, atol=1e-9
        )


def _worker(tmp_path) -> ExplainWorker:
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, MODEL))
    # calibrated before any hold: the held forward is the study's, whichever test ran first
    # (calibrations are kept per model for the process)
    calibrate(worker.adapter(MODEL)).measure_all()
    return worker


def test_a_patch_job_shows_its_steps_and_ends_with_the_direct_studys_report(tmp_path, expected):
    worker = _worker(tmp_path)
    with TestClient(create_app(worker)) as client, held(worker.adapter(MODEL).model) as hold:
        reached, release = hold
        submitted = client.post("/api/v1/patch/jobs", json=BODY)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        assert submitted.json()["kind"] == "patch" and submitted.json()["total"] == 1
        assert reached.wait(60), "the study never ran"
        running = client.get(f"/api/v1/jobs/{job_id}").json()
        assert running["status"] == "running" and running["done"] == 0
        assert running["steps"]["total"] > 0  # the study's own stages, while it runs
        release.set()
        status = wait_for_job(client, job_id)
        assert status["status"] == "done" and status["done"] == 1 and status["steps"] is None
        (line,) = client.get(f"/api/v1/jobs/{job_id}/results").text.splitlines()
        row = json.loads(line)
        assert row["index"] == 0
        report = row["report"]
        assert report["target"] == expected.target
        assert report["clean_score"] == pytest.approx(expected.clean_score, rel=1e-6)
        assert report["corrupted_score"] == pytest.approx(expected.corrupted_score, rel=1e-6)
        _same_table(pd.DataFrame(report["table"]), expected.table)
        assert len(report["agreement"]) == len(expected.agreement)
        parquet = client.get(f"/api/v1/jobs/{job_id}/results", params={"format": "parquet"})
        _same_table(pd.read_parquet(io.BytesIO(parquet.content)), expected.table)
        batch = {"model": MODEL, "next_token": True, "method": "gradient_x_input"}
        batch_job = client.post("/api/v1/jobs", json={**batch, "instances": [{"text": CLEAN}]})
        assert batch_job.status_code == 202, batch_job.text
        assert wait_for_job(client, batch_job.json()["job_id"])["kind"] == "batch"
    worker.close()


def test_a_cancelled_patch_job_leaves_the_model_unpatched_and_the_queue_moving(tmp_path):
    worker = _worker(tmp_path)
    adapter = worker.adapter(MODEL)
    ids = adapter.preprocess(CLEAN).input_ids
    with TestClient(create_app(worker)) as client:
        warm = client.post("/api/v1/patch/jobs", json=BODY).json()["job_id"]
        assert wait_for_job(client, warm)["status"] == "done"  # lazy hooks installed once
        state, logits = model_state(adapter.model), adapter.model(ids).logits
        with held(adapter.model) as (reached, release):
            job_id = client.post("/api/v1/patch/jobs", json=BODY).json()["job_id"]
            assert reached.wait(60), "the study never ran"
            assert client.delete(f"/api/v1/jobs/{job_id}").json()["status"] == "cancelled"
            release.set()
            follow = client.post("/api/v1/patch/jobs", json=BODY).json()["job_id"]
            assert wait_for_job(client, follow)["status"] == "done"  # the queue is not stuck
        assert client.get(f"/api/v1/jobs/{job_id}").json()["status"] == "cancelled"
        assert client.get(f"/api/v1/jobs/{job_id}/results").text == ""  # no report written
        assert model_state(adapter.model) == state  # every patching hook removed
        assert torch.equal(adapter.model(ids).logits, logits)
    worker.close()


def test_a_patch_job_interrupted_by_a_restart_runs_again_to_the_direct_report(tmp_path, expected):
    worker = _worker(tmp_path)
    # the server stops (the client's exit) while the study is held mid-way
    with (
        held(worker.adapter(MODEL).model) as (reached, release),
        TestClient(create_app(worker)) as client,
    ):
        job_id = client.post("/api/v1/patch/jobs", json=BODY).json()["job_id"]
        assert reached.wait(60), "the study never ran"
        threading.Timer(0.5, release.set).start()  # the stop waits for the study's next step
    worker.close()
    assert JobStore(tmp_path / "jobs").get(job_id).status == "queued"  # back in the queue
    restarted = _worker(tmp_path)
    with TestClient(create_app(restarted)) as client:
        status = wait_for_job(client, job_id)
        assert status["status"] == "done", status
        (line,) = client.get(f"/api/v1/jobs/{job_id}/results").text.splitlines()
        _same_table(pd.DataFrame(json.loads(line)["report"]["table"]), expected.table)
    restarted.close()


def test_bad_patch_jobs_are_refused_in_json_or_fail_naming_why(tmp_path):
    worker = _worker(tmp_path)
    with TestClient(create_app(worker)) as client:
        for bad, named in (
            ({k: v for k, v in BODY.items() if k != "corrupted"}, "corrupted prompt, or noise"),
            ({**BODY, "noise_positions": [1]}, "corrupted prompt, or noise"),  # both
            ({**BODY, "components": ["everything"]}, "unknown component(s) 'everything'"),
            ({**BODY, "estimators": ["guess"]}, "unknown estimator(s) 'guess'"),
            ({**BODY, "noise_seeds": 0}, "noise_seeds"),
            ({**BODY, "clean": ""}, "clean"),
        ):
            response = client.post("/api/v1/patch/jobs", json=bad)
            assert 400 <= response.status_code < 500, response.text
            assert named in json.dumps(response.json()["error"]), response.text
        # what only the model can tell (another token length) ends the job, in words
        shorter = client.post("/api/v1/patch/jobs", json={**BODY, "corrupted": "When Mary went"})
        status = wait_for_job(client, shorter.json()["job_id"])
        assert status["status"] == "failed" and "token" in status["message"]
    worker.close()
    settings = dataclasses.replace(job_settings(tmp_path, MODEL), data_dir=None)
    keepless = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(keepless)) as client:
        response = client.post("/api/v1/patch/jobs", json=BODY)
        assert response.status_code == 404, response.text
        assert "no data folder" in response.json()["error"]["message"]
    keepless.close()


def test_a_report_line_is_checked_as_a_report_when_read(tmp_path):
    store = JobStore(tmp_path)
    job_id = store.create({"kind": "patch", "body": {}}, total=1, limit=4)
    store.claim_next()
    assert store.append(job_id, {"index": 0, "report": {"table": [{"effect": 0.5}]}})
    assert [row["report"]["table"] for row in store.results(job_id)] == [[{"effect": 0.5}]]
    assert store.get(job_id).errors == 0  # a report's line lists no instance errors
    other = store.create({"kind": "patch", "body": {}}, total=1, limit=4)
    store.results_path(other).write_text('{"index": 0, "report": {"table": "cut"}}\n')
    with pytest.raises(DamagedResultsError, match="line 1 does not hold a patching report"):
        list(store.results(other))


def test_a_prune_job_ends_with_the_direct_studys_curves(tmp_path, load_model):
    """A pruning study is a durable job on the same routes: status, results, Parquet."""
    from attrlab.attribution.engine import pruning_study

    texts = ["The cat sat on the mat", "Mary gave John a"]
    adapter = load_model(MODEL)
    options = {"units": ["neuron"], "draws": 2, "sparsity": "per_layer", "allocation": "owl"}
    expected = pruning_study(adapter, adapter.preprocess(CLEAN), None, texts=texts, **options)
    worker = _worker(tmp_path)
    body = {"model": MODEL, "text": CLEAN, "next_token": True, "texts": texts, **options}
    with TestClient(create_app(worker)) as client:
        submitted = client.post("/api/v1/prune/jobs", json=body)
        assert submitted.status_code == 202, submitted.text
        assert submitted.json()["kind"] == "prune" and submitted.json()["total"] == 1
        status = wait_for_job(client, submitted.json()["job_id"])
        assert status["status"] == "done" and status["kind"] == "prune"
        job = submitted.json()["job_id"]
        (line,) = client.get(f"/api/v1/jobs/{job}/results").text.splitlines()
        study = json.loads(line)["study"]
        got = pd.DataFrame(study["allocated"]["neuron"]["curves"])
        want = expected.allocated["neuron"].curves
        assert list(got["order"]) == list(want["order"])
        pd.testing.assert_series_equal(got["value"].astype(float), want["value"], rtol=1e-6)
        parquet = client.get(f"/api/v1/jobs/{job}/results", params={"format": "parquet"})
        table = pd.read_parquet(io.BytesIO(parquet.content))
        assert list(table.columns[:2]) == ["unit", "order"]
        assert set(table["unit"]) == {"neuron", "neuron@owl"}
        assert len(table) == len(expected.curve_table())
        refused = client.post("/api/v1/prune/jobs", json={**body, "units": ["expert"]})
        assert refused.status_code == 422  # refused before it is stored
    worker.close()
