"""
An eviction study as a durable job (``POST /api/v1/evict/jobs``), on the routes every job uses.

The job's study is checked against :func:`attribution.eviction.request.run_eviction` run
directly on the same tiny model and tasks; a forward hook holds the worker mid-study (attention
routed through the eviction's masks) where a test cancels it, and the attention modules'
configs are read after.
"""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from _jobs import job_settings, wait_for_job
from fastapi.testclient import TestClient
from test_patch_jobs import held

from attrlab.app.jobs import DamagedResultsError, JobStore
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.eviction.request import EvictionRequest, run_eviction
from attrlab.attribution.eviction.study import EvictionStudy
from attrlab.attribution.inputs.long_context import ContextTask
from attrlab.attribution.methods._routing import _RoutedConfig
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.calibration import calibrate

MODEL = "tiny-random-llama"
TASKS = [
    {
        "context": "The red door is at the end of the hall. The key is under the mat.",
        "question": "Where is the key?",
        "answer": "under the mat",
    },
    {
        "context": "Anna keeps her bike in the shed. Her brother keeps his in the garage.",
        "question": "Where is Anna's bike?",
        "answer": "in the shed",
    },
]
ASKED = {"scorers": ["h2o", "knorm", "exact_loo"], "ratios": [1.0, 0.5, 0.2], "draws": 3}
BODY = {"model": MODEL, "tasks": TASKS, "solved_only": False, **ASKED}


def direct_study(adapter: Adapter) -> EvictionStudy:
    """The study of :data:`BODY`, run by the library itself."""
    tasks = tuple(
        ContextTask(t["context"], t["question"], t["answer"], "jsonl", details={"line": n})
        for n, t in enumerate(TASKS, start=1)
    )
    asked = EvictionRequest(
        tasks=tasks,
        scorers=tuple(ASKED["scorers"]),
        ratios=tuple(ASKED["ratios"]),
        draws=ASKED["draws"],
        solved_only=False,
    )
    return run_eviction(adapter, asked)


@pytest.fixture(scope="module")
def expected(load_model):
    return direct_study(load_model(MODEL))


def _worker(tmp_path, **overrides) -> ExplainWorker:
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, MODEL, **overrides))
    calibrate(worker.adapter(MODEL)).measure_all()  # before any hold: the held forward is the job's
    return worker


def _same(got: pd.DataFrame, expected: pd.DataFrame, column: str) -> None:
    pd.testing.assert_series_equal(
        got[column].astype(float), expected[column].astype(float), rtol=1e-6, atol=1e-9
    )


def test_an_evict_job_ends_with_the_direct_studys_curves_and_agreement(tmp_path, expected):
    worker = _worker(tmp_path)
    with TestClient(create_app(worker)) as client:
        submitted = client.post("/api/v1/evict/jobs", json=BODY)
        assert submitted.status_code == 202, submitted.text
        assert submitted.json()["kind"] == "evict" and submitted.json()["total"] == 1
        job = submitted.json()["job_id"]
        status = wait_for_job(client, job)
        assert status["status"] == "done" and status["kind"] == "evict" and status["done"] == 1
        (line,) = client.get(f"/api/v1/jobs/{job}/results").text.splitlines()
        row = json.loads(line)
        assert row["index"] == 0
        study = row["evict"]
        curves = pd.DataFrame(study["curves"]["curves"])
        assert list(curves["order"]) == list(expected.curves.curves["order"])
        _same(curves, expected.curves.curves, "value")
        _same(pd.DataFrame(study["agreement"]), expected.agreement, "spearman")
        assert [v["tokens"] for v in study["views"]] == [v["tokens"] for v in expected.views]
        parquet = client.get(f"/api/v1/jobs/{job}/results", params={"format": "parquet"})
        stored = pd.read_parquet(io.BytesIO(parquet.content))
        assert list(stored.columns) == list(expected.curves.curves.columns)
        _same(stored, expected.curves.curves, "value")
    worker.close()


def test_a_cancelled_evict_job_leaves_no_attention_routed_and_the_queue_moving(tmp_path):
    worker = _worker(tmp_path)
    adapter = worker.adapter(MODEL)
    with TestClient(create_app(worker)) as client:
        # forward 1 is the first prefill; the 3rd reads answers against an evicted cache
        with held(adapter.model, at=3) as (reached, release):
            job = client.post("/api/v1/evict/jobs", json=BODY).json()["job_id"]
            assert reached.wait(60), "the study never ran"
            assert any(isinstance(m.config, _RoutedConfig) for m in adapter.attention_modules())
            assert client.delete(f"/api/v1/jobs/{job}").json()["status"] == "cancelled"
            release.set()
            follow = client.post("/api/v1/evict/jobs", json=BODY).json()["job_id"]
            assert wait_for_job(client, follow)["status"] == "done"  # the queue is not stuck
        assert client.get(f"/api/v1/jobs/{job}").json()["status"] == "cancelled"
        assert client.get(f"/api/v1/jobs/{job}/results").text == ""  # no study written
    assert not any(isinstance(m.config, _RoutedConfig) for m in adapter.attention_modules())
    worker.close()


def test_an_evict_job_over_the_servers_passes_fails_before_any_prefill(tmp_path):
    worker = _worker(tmp_path, max_forward_passes=5)
    adapter = worker.adapter(MODEL)
    with TestClient(create_app(worker)) as client:
        plain = client.post("/api/v1/evict", json=BODY)
        assert 400 <= plain.status_code < 500 and "forward passes" in plain.text
        job = client.post("/api/v1/evict/jobs", json=BODY).json()["job_id"]
        status = wait_for_job(client, job)
        assert status["status"] == "failed", status
        assert "forward passes" in status["message"]  # the plain route's words
    assert not any(isinstance(m.config, _RoutedConfig) for m in adapter.attention_modules())
    worker.close()


def test_bad_evict_jobs_are_refused_in_json_and_not_stored(tmp_path):
    worker = _worker(tmp_path)
    with TestClient(create_app(worker)) as client:
        for bad, named in (
            ({**BODY, "scorers": ["nope"]}, "scorer"),
            ({**BODY, "ratios": [0.5, 0.2]}, "keep ratios start at 1.0"),
            ({**BODY, "unit": "layer"}, "eviction unit"),
            ({**BODY, "split": "global"}, "budget split"),
            ({**BODY, "draws": 1}, "draws"),
            ({**BODY, "tasks": []}, "tasks"),
            ({**BODY, "tasks": [{"context": "a", "question": "b"}]}, "answer"),
            ({**BODY, "tasks": [{**TASKS[0], "answer": "  "}]}, "answer"),
            ({**BODY, "tasks": [{**TASKS[0], "path": "/etc/passwd"}]}, "path"),
            ({"model": MODEL, "task": "sudoku"}, "task"),
            ({**BODY, "unknown": 1}, "unknown"),
        ):
            response = client.post("/api/v1/evict/jobs", json=bad)
            assert 400 <= response.status_code < 500, response.text
            assert response.headers["content-type"] == "application/json"
            assert named in json.dumps(response.json()["error"]), response.text
        assert "/api/v1/evict/jobs" in client.get("/openapi.json").json()["paths"]
    worker.close()
    assert JobStore(tmp_path / "jobs").claim_next() is None  # nothing was stored


def test_an_evict_line_is_checked_as_an_eviction_study_when_read(tmp_path):
    store = JobStore(tmp_path)
    job_id = store.create({"kind": "evict", "body": {}}, total=1, limit=4)
    store.claim_next()
    row = {"index": 0, "evict": {"curves": {"curves": [{"order": "h2o"}]}, "views": []}}
    assert store.append(job_id, row)
    assert [r["evict"]["curves"] for r in store.results(job_id)] == [row["evict"]["curves"]]
    for damaged in ('{"index": 0, "evict": {"views": []}}', '{"index": 0, "evict": [1]}'):
        other = store.create({"kind": "evict", "body": {}}, total=1, limit=4)
        store.results_path(other).write_text(damaged + "\n")
        with pytest.raises(DamagedResultsError, match="line 1 does not hold an eviction study"):
            list(store.results(other))
