"""
A bits study as a durable job (``POST /api/v1/bits/jobs``), on the routes every job uses.

The job's study is checked against :func:`attribution.bits.bits_study` run directly on the same
tiny model and texts; a forward hook holds the worker mid-table (a part quantised) where a test
cancels it, and every parameter's bytes are compared with a copy taken before.
"""

from __future__ import annotations

import io
import json
import threading

import pandas as pd
import pytest
import torch
from _jobs import job_settings, wait_for_job
from fastapi.testclient import TestClient
from test_patch_jobs import held

from attrlab.app.jobs import DamagedResultsError, JobStore
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.bits import bits_study
from attrlab.attribution.request.calibration import calibrate

MODEL = "tiny-random-llama"
TEXTS = ("The cat sat on the mat and looked at the rain.", "Mary gave John a book about rivers.")
ASKED = {"kinds": ["mlp"], "bits": [4, 2], "group_sizes": [16], "budgets": [3.0], "draws": 3}
BODY = {"model": MODEL, "texts": list(TEXTS), **ASKED}


@pytest.fixture(scope="module")
def expected(load_model):
    return bits_study(load_model(MODEL), TEXTS, **ASKED)


def _worker(tmp_path, **overrides) -> ExplainWorker:
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, MODEL, **overrides))
    calibrate(worker.adapter(MODEL)).measure_all()  # before any hold: the held forward is the job's
    return worker


def _weights(model: torch.nn.Module) -> dict[str, bytes]:
    """Every parameter's bytes (a copy: the model's own tensors are never kept)."""
    return {
        name: parameter.detach().contiguous().view(torch.uint8).numpy().tobytes()
        for name, parameter in model.named_parameters()
    }


def _same(got: pd.DataFrame, expected: pd.DataFrame, column: str) -> None:
    pd.testing.assert_series_equal(
        got[column].astype(float), expected[column].astype(float), rtol=1e-6, atol=1e-9
    )


def test_a_bits_job_ends_with_the_direct_studys_table_and_curves(tmp_path, expected):
    worker = _worker(tmp_path)
    with TestClient(create_app(worker)) as client:
        submitted = client.post("/api/v1/bits/jobs", json=BODY)
        assert submitted.status_code == 202, submitted.text
        assert submitted.json()["kind"] == "bits" and submitted.json()["total"] == 1
        job = submitted.json()["job_id"]
        status = wait_for_job(client, job)
        assert status["status"] == "done" and status["kind"] == "bits" and status["done"] == 1
        (line,) = client.get(f"/api/v1/jobs/{job}/results").text.splitlines()
        row = json.loads(line)
        assert row["index"] == 0
        study = row["bits"]
        assert study["measure"] == "loss"
        assert study["base_loss"] == pytest.approx(expected.base_loss, rel=1e-6)
        table = pd.DataFrame(study["table"])
        assert list(table["part"]) == list(expected.table["part"])
        for column in ("loss", "loss_change", "kl", "log_prob_change"):
            _same(table, expected.table, column)
        _same(pd.DataFrame(study["curves"]), expected.curves, "value")
        assert study["verdicts"].keys() == expected.verdicts.keys()
        parquet = client.get(f"/api/v1/jobs/{job}/results", params={"format": "parquet"})
        stored = pd.read_parquet(io.BytesIO(parquet.content))
        assert list(stored.columns) == list(expected.table.columns)
        _same(stored, expected.table, "loss_change")
    worker.close()


def test_a_cancelled_bits_job_leaves_every_weight_as_it_was_and_the_queue_moving(tmp_path):
    worker = _worker(tmp_path)
    model = worker.adapter(MODEL).model
    before = _weights(model)
    with TestClient(create_app(worker)) as client:
        # forwards 1 and 2 read the texts unquantised; the 4th is the first entry's second text
        with held(model, at=4) as (reached, release):
            job = client.post("/api/v1/bits/jobs", json=BODY).json()["job_id"]
            assert reached.wait(60), "the study never ran"
            held_weights = _weights(model)
            changed = [name for name in before if held_weights[name] != before[name]]
            assert changed and all(".mlp." in name for name in changed)  # a part is quantised
            assert client.delete(f"/api/v1/jobs/{job}").json()["status"] == "cancelled"
            release.set()
            follow = client.post("/api/v1/bits/jobs", json=BODY).json()["job_id"]
            assert wait_for_job(client, follow)["status"] == "done"  # the queue is not stuck
        assert client.get(f"/api/v1/jobs/{job}").json()["status"] == "cancelled"
        assert client.get(f"/api/v1/jobs/{job}/results").text == ""  # no study written
    assert _weights(model) == before  # every parameter's bytes
    worker.close()


def test_a_bits_job_interrupted_by_a_restart_runs_again_to_the_direct_table(tmp_path, expected):
    worker = _worker(tmp_path)
    model = worker.adapter(MODEL).model
    before = _weights(model)
    # the server stops (the client's exit) while a part is held quantised mid-table
    with held(model, at=4) as (reached, release), TestClient(create_app(worker)) as client:
        job = client.post("/api/v1/bits/jobs", json=BODY).json()["job_id"]
        assert reached.wait(60), "the study never ran"
        threading.Timer(0.5, release.set).start()  # the stop waits for the study's next step
    worker.close()
    assert _weights(model) == before  # the stopped run put every weight back
    assert JobStore(tmp_path / "jobs").get(job).status == "queued"  # back in the queue
    restarted = _worker(tmp_path)
    with TestClient(create_app(restarted)) as client:
        assert wait_for_job(client, job)["status"] == "done"
        (line,) = client.get(f"/api/v1/jobs/{job}/results").text.splitlines()
        _same(pd.DataFrame(json.loads(line)["bits"]["table"]), expected.table, "loss_change")
    restarted.close()


def test_a_bits_job_over_the_servers_seconds_fails_before_any_weight_changes(tmp_path):
    worker = _worker(tmp_path, max_seconds=1e-6)
    model = worker.adapter(MODEL).model
    before = _weights(model)
    with TestClient(create_app(worker)) as client:
        plain = client.post("/api/v1/bits", json=BODY)
        assert plain.status_code >= 400 and "this bits study would take" in plain.text
        job = client.post("/api/v1/bits/jobs", json=BODY).json()["job_id"]
        status = wait_for_job(client, job)
        assert status["status"] == "failed", status
        assert "this bits study would take" in status["message"]  # the plain route's words
    assert _weights(model) == before
    worker.close()


def test_bad_bits_jobs_are_refused_in_json_and_not_stored(tmp_path):
    worker = _worker(tmp_path)
    with TestClient(create_app(worker)) as client:
        for bad, named in (
            ({**BODY, "kinds": ["heads"]}, "unknown part kind"),
            ({**BODY, "budgets": [1.5]}, "a bit budget lies between"),
            ({**BODY, "draws": 1}, "draws"),
            ({**BODY, "bits": [1]}, "bit widths are 2 to 16"),
            ({**BODY, "texts": []}, "texts"),
            ({**BODY, "group_sizes": ["channel"]}, "group_sizes"),
            ({**BODY, "unknown": 1}, "unknown"),
        ):
            response = client.post("/api/v1/bits/jobs", json=bad)
            assert 400 <= response.status_code < 500, response.text
            assert response.headers["content-type"] == "application/json"
            assert named in json.dumps(response.json()["error"]), response.text
        assert "/api/v1/bits/jobs" in client.get("/openapi.json").json()["paths"]
    worker.close()
    assert JobStore(tmp_path / "jobs").claim_next() is None  # nothing was stored


def test_a_bits_line_is_checked_as_a_bits_study_when_read(tmp_path):
    store = JobStore(tmp_path)
    job_id = store.create({"kind": "bits", "body": {}}, total=1, limit=4)
    store.claim_next()
    row = {"index": 0, "bits": {"measure": "kl", "table": [{"part": "head", "kl": 0.5}]}}
    assert store.append(job_id, row)
    assert [r["bits"]["table"] for r in store.results(job_id)] == [[{"part": "head", "kl": 0.5}]]
    assert store.get(job_id).errors == 0
    for damaged in ('{"index": 0, "bits": {"measure": "kl"}}', '{"index": 0, "bits": [1]}'):
        other = store.create({"kind": "bits", "body": {}}, total=1, limit=4)
        store.results_path(other).write_text(damaged + "\n")
        with pytest.raises(DamagedResultsError, match="line 1 does not hold a bits study"):
            list(store.results(other))
