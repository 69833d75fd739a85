"""
A job's results entry replaced behind the server's back by something that is not a file of its
own (a link, a folder, a pipe), and job ids that are no job's: each is a named answer, never a
file read elsewhere, a request that hangs or a 500 with a trace.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from _jobs import job_settings, wait_for_job
from fastapi.testclient import TestClient

from attrlab.app.jobs import DamagedResultsError, JobStore
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker

TEXT_MODEL = "tiny-random-bert"
BODY = {
    "model": TEXT_MODEL,
    "method": "gradient_x_input",
    "instances": [{"text": f"sentence number {i} of the job"} for i in range(3)],
}
NOT_A_FILE = "the job's results are damaged: the results file is not a regular file"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str, bytes]:
    """A data folder with one finished job (server stopped): folder, job id, its results."""
    data = tmp_path_factory.mktemp("finished")
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        job_id = client.post("/api/v1/jobs", json=BODY).json()["job_id"]
        assert wait_for_job(client, job_id)["status"] == "done"
    worker.close()
    written = (data / "jobs" / "results" / f"{job_id}.jsonl").read_bytes()
    assert [json.loads(line)["index"] for line in written.splitlines()] == [0, 1, 2]
    return data, job_id, written


def _link_to_a_copy_outside(path: Path, outside: Path) -> None:
    """The very bytes that were written, but in a file outside the data folder."""
    copy = outside / "copy.jsonl"
    shutil.copy(path, copy)
    path.unlink()
    path.symlink_to(copy)


def _link_to_etc_passwd(path: Path, _: Path) -> None:
    path.unlink()
    path.symlink_to("/etc/passwd")


def _a_folder(path: Path, _: Path) -> None:
    path.unlink()
    path.mkdir()


def _a_pipe(path: Path, _: Path) -> None:  # opening it to read waits for a writer
    path.unlink()
    os.mkfifo(path)


ENTRIES = [_link_to_a_copy_outside, _link_to_etc_passwd, _a_folder, _a_pipe]


def _answers(client: TestClient, job_id: str) -> dict[str, tuple[int, dict]]:
    """Status, both downloads and a cancel, each in a thread that must end within 20 s."""
    calls: dict[str, Callable[[], object]] = {
        "status": lambda: client.get(f"/api/v1/jobs/{job_id}"),
        "jsonl": lambda: client.get(f"/api/v1/jobs/{job_id}/results"),
        "parquet": lambda: client.get(f"/api/v1/jobs/{job_id}/results?format=parquet"),
        "cancel": lambda: client.delete(f"/api/v1/jobs/{job_id}"),
    }
    answers: dict[str, tuple[int, dict]] = {}

    def ask() -> None:
        for name, call in calls.items():
            response = call()
            answers[name] = (response.status_code, response.json())

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(20)
    assert not asking.is_alive(), f"hung after answering {sorted(answers)}"
    return answers


@pytest.mark.parametrize("plant", ENTRIES, ids=[plant.__name__ for plant in ENTRIES])
def test_a_results_entry_that_is_not_a_file_of_its_own_is_damage(finished, tmp_path, plant):
    data = tmp_path / "data"
    shutil.copytree(finished[0], data)
    job_id = finished[1]
    outside = tmp_path / "outside"
    outside.mkdir()
    plant(data / "jobs" / "results" / f"{job_id}.jsonl", outside)
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with TestClient(create_app(worker), raise_server_exceptions=False) as client:
        answers = _answers(client, job_id)
    worker.close()
    refused = {"error": {"code": "results_damaged", "message": NOT_A_FILE}}
    assert answers["jsonl"] == answers["parquet"] == (500, refused)
    for name in ("status", "cancel"):  # the job had finished: a cancel changes nothing
        code, status = answers[name]
        assert (code, status["status"], status["message"]) == (200, "damaged", NOT_A_FILE)
        assert (status["done"], status["total"]) == (3, 3)


def test_a_running_jobs_results_replaced_by_a_pipe_fail_the_append(finished, tmp_path):
    """The runner's append neither waits on the pipe nor writes through it: the job fails."""
    data = tmp_path / "data"
    shutil.copytree(finished[0], data)
    store = JobStore(data / "jobs")
    job_id = store.create({"placeholder": True}, total=3, limit=5)
    assert store.claim_next().id == job_id
    path = store.results_path(job_id)
    os.mkfifo(path)
    outcome: list[object] = []

    def append() -> None:
        try:
            outcome.append(store.append(job_id, {"index": 0, "explanations": {}}))
        except DamagedResultsError as err:
            outcome.append(str(err))

    appending = threading.Thread(target=append, daemon=True)
    appending.start()
    appending.join(20)
    assert not appending.is_alive(), "the append waits on the pipe"
    assert outcome == ["the results file is not a regular file"]
    assert store.get(job_id).done == 0  # nothing counted


@pytest.mark.parametrize(
    "job_id",
    ["%00", "a%00b", "..%00", "0" * 31 + "%00"],  # a NUL byte cannot be in a path
)
def test_a_job_id_that_is_no_jobs_is_a_404_on_every_job_route(finished, tmp_path, job_id):
    data = tmp_path / "data"
    shutil.copytree(finished[0], data)
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with TestClient(create_app(worker), raise_server_exceptions=False) as client:
        answers = [
            client.get(f"/api/v1/jobs/{job_id}"),
            client.get(f"/api/v1/jobs/{job_id}/results"),
            client.delete(f"/api/v1/jobs/{job_id}"),
        ]
        assert wait_for_job(client, finished[1])["status"] == "done"  # the real job is untouched
    worker.close()
    for answer in answers:
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert error["code"] == "not_found" and error["message"].startswith("no job '")


def test_a_job_table_locked_by_another_process_is_a_503_and_then_serves(
    finished, tmp_path, monkeypatch
):
    monkeypatch.setattr("attrlab.app.jobs._LOCK_WAIT_S", 0.5)  # the server's wait, shortened
    data = tmp_path / "data"
    shutil.copytree(finished[0], data)
    job_id = finished[1]
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with TestClient(create_app(worker), raise_server_exceptions=False) as client:
        holder = sqlite3.connect(data / "jobs" / "jobs.sqlite", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # as another process holding the table would
        try:
            answers = [
                client.get(f"/api/v1/jobs/{job_id}"),
                client.get(f"/api/v1/jobs/{job_id}/results"),
                client.post("/api/v1/jobs", json=BODY),
            ]
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        for answer in answers:
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"]
            error = answer.json()["error"]
            assert error["code"] == "jobs_unavailable"
            assert error["message"].startswith("the job table cannot be used now (database is")
        assert client.get(f"/api/v1/jobs/{job_id}").json()["status"] == "done"
        assert client.get(f"/api/v1/jobs/{job_id}/results").content == finished[2]
    worker.close()
