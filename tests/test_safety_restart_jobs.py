"""
A restarted server resumes stored work with care: an instance in whose runs the server died
(killed for memory, say) is retried once, then failed with the reason while the job goes on;
a stop asked for is no death; and stored work passes the gate new work passes, under the
settings of the server that resumes it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _dying_runner import KILLED, STOPPED
from _jobs import job_settings, wait_for_job
from fastapi.testclient import TestClient

from attrlab.app.jobs import JobStore
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.request import ExplainRequest

TEXT_MODEL = "tiny-random-bert"
METHOD = "gradient_x_input"
TEXTS = [f"sentence number {i} of the job" for i in range(5)]
BODY = {"model": TEXT_MODEL, "method": METHOD, "instances": [{"text": t} for t in TEXTS]}
RUNNER = Path(__file__).with_name("_dying_runner.py")
#: The words an instance failed after two deaths of the server is reported with.
TWICE = "the server stopped while this instance ran, twice"


def _serve_until_it_ends(data: Path, job_id: str, index: int, marks: Path, how: str) -> int:
    """Run the folder's jobs in a process of their own until instance ``index`` ends it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [sys.executable, str(RUNNER), str(data), TEXT_MODEL, job_id, str(index), str(marks)]
    ended = subprocess.run([*argv, how], env=env, capture_output=True, timeout=300)
    assert ended.returncode in (0, KILLED, STOPPED), ended.stderr.decode()[-3000:]
    return ended.returncode


def _results(data: Path, job_id: str) -> tuple[dict, list[dict], np.ndarray]:
    """A server's view of the job: status, result rows; and TEXTS[3] explained afresh."""
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        status = client.get(f"/api/v1/jobs/{job_id}").json()
        lines = client.get(f"/api/v1/jobs/{job_id}/results").content.splitlines()
    fresh = worker.explain(ExplainRequest(model=TEXT_MODEL, text=TEXTS[3], method=METHOD))
    worker.close()
    return status, [json.loads(line) for line in lines], fresh.scores


@pytest.mark.slow
def test_an_instance_the_server_died_in_twice_is_failed_and_the_job_goes_on(tmp_path):
    job_id = JobStore(tmp_path / "jobs").create(BODY, total=len(TEXTS), limit=4)
    marks = tmp_path / "runs-of-instance-2"
    ends = [_serve_until_it_ends(tmp_path, job_id, 2, marks, "kill") for _ in range(3)]
    # killed in its first run and in its one retry; the third start runs the rest of the job
    assert ends == [KILLED, KILLED, 0]
    assert marks.read_text().splitlines() == [TEXTS[2], TEXTS[2]]
    status, rows, fresh = _results(tmp_path, job_id)
    assert (status["status"], status["done"], status["instance_errors"]) == ("done", 5, 1)
    (error,) = status["errors"]
    assert (error["index"], error["method"], error["code"]) == (2, METHOD, "instance_interrupted")
    assert error["message"].startswith(TWICE)
    assert [row["index"] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[2]["explanations"][METHOD]["error"] == {
        "code": "instance_interrupted",
        "message": error["message"],
    }
    for row in (rows[0], rows[1], rows[3], rows[4]):
        assert "error" not in row["explanations"][METHOD]
    # the instance after the failed one ran as a request of its own explains it
    np.testing.assert_allclose(rows[3]["explanations"][METHOD]["scores"], fresh, rtol=1e-5)


@pytest.mark.slow
def test_stops_asked_for_while_an_instance_runs_are_not_deaths(tmp_path):
    job_id = JobStore(tmp_path / "jobs").create(BODY, total=len(TEXTS), limit=4)
    marks = tmp_path / "runs-of-instance-2"
    ends = [_serve_until_it_ends(tmp_path, job_id, 2, marks, "stop") for _ in range(2)]
    assert ends == [STOPPED, STOPPED]
    assert _serve_until_it_ends(tmp_path, job_id, -1, marks, "kill") == 0  # nothing dies now
    assert marks.read_text().splitlines() == [TEXTS[2], TEXTS[2]]
    status, rows, fresh = _results(tmp_path, job_id)
    assert (status["status"], status["done"], status["instance_errors"]) == ("done", 5, 0)
    assert [row["index"] for row in rows] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(rows[3]["explanations"][METHOD]["scores"], fresh, rtol=1e-5)


def _interrupted(data: Path, body: dict) -> str:
    """A job the server was running when it stopped, nothing on file yet; its id."""
    store = JobStore(data / "jobs")
    job_id = store.create(body, total=len(body["instances"]), limit=4)
    store.claim_next()
    return job_id


#: Settings a restarted server has that refuse a stored job, and the gate's words for it.
REFUSALS = [
    (
        {"max_job_instances": 3},
        BODY,
        "a job holds at most 3 instances on this server; got 5",
    ),
    (
        {"param_limits": {"n_steps": 8}},
        {**BODY, "method": "integrated_gradients", "params": {"n_steps": 32}},
        "parameter 'n_steps' = 32 is above this server's limit of 8 for integrated_gradients",
    ),
]


@pytest.mark.parametrize(("settings", "body", "words"), REFUSALS, ids=["instances", "params"])
def test_resumed_work_the_settings_refuse_is_refused_with_the_gates_reason(
    tmp_path, settings, body, words
):
    job_id = _interrupted(tmp_path, body)
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, TEXT_MODEL, **settings))
    with TestClient(create_app(worker)) as client:
        status = wait_for_job(client, job_id)
        # the same body sent now is refused by the same words, before it is stored
        fresh = client.post("/api/v1/jobs", json=body)
    worker.close()
    assert fresh.status_code == 422 and words in fresh.json()["error"]["message"]
    assert (status["status"], status["done"]) == ("failed", 0)
    assert (
        status["message"] == f"this server refuses the job now: {fresh.json()['error']['message']}"
    )
    assert worker.model_loads[TEXT_MODEL] == 0  # not run: the model was never even loaded
    assert not (tmp_path / "jobs" / "results" / f"{job_id}.jsonl").exists()


#: The job table as the server before counting runs made it (no run_instance, open_runs).
_PREVIOUS_TABLE = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, status TEXT NOT NULL, request TEXT NOT NULL, total INTEGER NOT NULL,
    done INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL,
    started REAL, finished REAL, message TEXT, done_at_start INTEGER NOT NULL DEFAULT 0,
    result_lines INTEGER, result_bytes INTEGER, result_digest TEXT
);
CREATE TABLE instance_errors (
    job_id TEXT NOT NULL, instance INTEGER NOT NULL, method TEXT NOT NULL, code TEXT NOT NULL,
    message TEXT NOT NULL
);
"""


def test_a_previous_servers_interrupted_job_gains_the_run_count_and_finishes(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    with sqlite3.connect(jobs / "jobs.sqlite") as db:
        db.executescript(_PREVIOUS_TABLE)
        db.execute(
            "INSERT INTO jobs VALUES ('old', 'running', ?, 5, 0, 0, 1.0, 2.0, NULL, NULL, 0, 0, "
            "0, 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855')",
            (json.dumps(BODY),),
        )
    db.close()
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        status = wait_for_job(client, "old")
    worker.close()
    assert (status["status"], status["done"], status["instance_errors"]) == ("done", 5, 0)
    with sqlite3.connect(jobs / "jobs.sqlite") as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    db.close()
    assert {"run_instance", "open_runs"} <= columns
