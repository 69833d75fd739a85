"""
Job results damaged behind the server's back (planted with it stopped): a restarted server
reports the job ``damaged`` and answers its downloads with a named JSON error before any
body, never a truncated 200; a job table that was lost or cannot be read refuses to start
unless the user asks to start afresh.
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from _jobs import job_settings, wait_for_job
from fastapi.testclient import TestClient

from attrlab.app.cli import main
from attrlab.app.jobs import JobStore
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings, SettingsError
from attrlab.app.worker import ExplainWorker

TEXT_MODEL = "tiny-random-bert"
INSTANCES = 12
BODY = {
    "model": TEXT_MODEL,
    "method": "gradient_x_input",
    "instances": [{"text": f"sentence number {i} of the job"} for i in range(INSTANCES)],
}
PARQUET = "application/vnd.apache.parquet"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str, bytes]:
    """A data folder with one finished 12-instance job (server stopped): folder, id, results."""
    data = tmp_path_factory.mktemp("finished")
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        job_id = client.post("/api/v1/jobs", json=BODY).json()["job_id"]
        assert wait_for_job(client, job_id)["status"] == "done"
        served = client.get(f"/api/v1/jobs/{job_id}/results")
        assert served.status_code == 200
    worker.close()
    written = (data / "jobs" / "results" / f"{job_id}.jsonl").read_bytes()
    assert [json.loads(line)["index"] for line in written.splitlines()] == list(range(12))
    assert served.content == written  # as written, line for line
    return data, job_id, written


@pytest.fixture
def stopped(finished, tmp_path) -> tuple[Path, str, Path]:
    """A copy of the finished folder to damage: data folder, job id, its results file."""
    data = tmp_path / "data"
    shutil.copytree(finished[0], data)
    return data, finished[1], data / "jobs" / "results" / f"{finished[1]}.jsonl"


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _non_object_line(path: Path) -> None:
    lines = _lines(path)
    path.write_bytes(b"".join([*lines[:6], b"[1, 2, 3]\n", *lines[6:]]))


def _stray_index(path: Path) -> None:
    with path.open("ab") as file:
        file.write(b'{"index": 500, "explanations": {}}\n')


def _a_repeated_instance(path: Path) -> None:
    with path.open("ab") as file:
        file.write(_lines(path)[3])


def _an_edited_score(path: Path) -> None:
    lines = _lines(path)
    row = json.loads(lines[2])
    scores = row["explanations"]["gradient_x_input"]["scores"]
    text = json.dumps(scores[0]).encode()
    changed = json.dumps(-scores[0] if scores[0] else 1.0).encode()
    edited = lines[2].replace(text, changed, 1)
    assert edited != lines[2]
    path.write_bytes(b"".join([*lines[:2], edited, *lines[3:]]))


def _a_lost_line(path: Path) -> None:
    path.write_bytes(b"".join(_lines(path)[:-1]))


def _a_cut_line(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-20])


def _bad_json(path: Path) -> None:
    lines = _lines(path)
    lines[4] = b'{"index": 4, "explanations": {"gradient_x_input": {"scores": [NaN]}}}\n'
    path.write_bytes(b"".join(lines))


#: Each damage, planted with the server stopped, and the words its report must contain.
DAMAGE: list[tuple[Callable[[Path], None], str]] = [
    (_non_object_line, "results line 7 is not a JSON object"),
    (_stray_index, "results line 13 has index 500; this job's instances are 0 to 11"),
    (Path.unlink, "the results file is missing"),
    (_a_repeated_instance, "results line 13 was added after the job ended"),
    (_an_edited_score, "results lines 1 to 12 are not the lines that were written"),
    (_a_lost_line, "the results file has 11 of the 12 lines that were written"),
    (_a_cut_line, "results line 12 is cut short"),
    (_bad_json, "results line 5 is not valid JSON"),
]


def _assert_refused(response, reason: str) -> None:
    """A JSON error naming the damage, sent whole instead of any results."""
    assert response.status_code == 500, response.content[:200]
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": {"code": "results_damaged", "message": f"the job's results are damaged: {reason}"}
    }


@pytest.mark.parametrize(("plant", "reason"), DAMAGE, ids=[d[0].__name__ for d in DAMAGE])
def test_a_finished_jobs_damaged_results_are_reported_and_never_served(stopped, plant, reason):
    data, job_id, path = stopped
    plant(path)
    planted = path.read_bytes() if path.exists() else None
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        status = client.get(f"/api/v1/jobs/{job_id}").json()
        assert status["status"] == "damaged"
        assert status["message"] == f"the job's results are damaged: {reason}"
        assert (status["done"], status["total"]) == (12, 12)  # what was recorded, not the file
        results = f"/api/v1/jobs/{job_id}/results"
        _assert_refused(client.get(results), reason)
        _assert_refused(client.get(results, params={"format": "parquet"}), reason)
        _assert_refused(client.get(results, headers={"Accept": PARQUET}), reason)
    worker.close()
    assert (path.read_bytes() if path.exists() else None) == planted  # left as found


def _interrupted(data: Path, done: int, written: bytes) -> tuple[str, Path]:
    """A job the server was running when it stopped, ``done`` instances on file; id, file."""
    store = JobStore(data / "jobs")
    job_id = store.create(BODY, total=INSTANCES, limit=4)
    store.claim_next()
    for line in written.splitlines()[:done]:
        store.append(job_id, json.loads(line))
    return job_id, store.results_path(job_id)


def test_an_interrupted_job_with_damaged_results_fails_and_is_not_run_on(finished, tmp_path):
    """Resuming would add to the damaged file: the job ends, the file as it was found."""
    job_id, path = _interrupted(tmp_path, 5, finished[2])
    _non_object_line(path)  # line 7: after the five rows, a planted line
    planted = path.read_bytes()
    reason = "results line 6 is not a JSON object"
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        status = wait_for_job(client, job_id)
        assert status["status"] == "damaged" and status["done"] == 5
        assert status["message"] == f"the job's results are damaged: {reason}"
        _assert_refused(client.get(f"/api/v1/jobs/{job_id}/results"), reason)
        _assert_refused(client.get(f"/api/v1/jobs/{job_id}/results?format=parquet"), reason)
    worker.close()
    assert path.read_bytes() == planted
    with sqlite3.connect(tmp_path / "jobs" / "jobs.sqlite") as db:
        stored, message = db.execute("SELECT status, message FROM jobs").fetchone()
    db.close()
    assert (stored, message) == ("failed", f"the job's results are damaged: {reason}")


def test_a_line_written_just_before_a_crash_counts_and_the_job_resumes(finished, tmp_path):
    """No false alarm: a crash between writing a line and counting it, and a torn line."""
    job_id, path = _interrupted(tmp_path, 4, finished[2])
    lines = finished[2].splitlines(keepends=True)
    with path.open("ab") as file:  # written and flushed, the count not yet updated
        file.write(lines[4] + lines[5][:30])  # then a torn line
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        status = wait_for_job(client, job_id)
        assert (status["status"], status["done"]) == ("done", 12)
        served = client.get(f"/api/v1/jobs/{job_id}/results").content.splitlines(keepends=True)
        parquet = client.get(f"/api/v1/jobs/{job_id}/results?format=parquet")
    worker.close()
    assert served[:5] == lines[:5]  # the line before the crash kept, as it was
    assert [json.loads(line)["index"] for line in served] == list(range(12))
    table = pd.read_parquet(io.BytesIO(parquet.content))
    assert sorted(table["id"]) == list(range(12))


def _deleted(jobs: Path) -> None:
    for name in ("jobs.sqlite", "jobs.sqlite-wal", "jobs.sqlite-shm"):
        (jobs / name).unlink(missing_ok=True)


def _emptied(jobs: Path) -> None:
    _deleted(jobs)
    (jobs / "jobs.sqlite").write_bytes(b"")


def _replaced(jobs: Path) -> None:  # another, valid database that knows none of the jobs
    _deleted(jobs)
    with sqlite3.connect(jobs / "jobs.sqlite") as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    db.close()


def _garbage(jobs: Path) -> None:
    _deleted(jobs)
    (jobs / "jobs.sqlite").write_bytes(b"this is not a database at all" * 200)


#: Each way of losing the job table, and the words of the refusal.
LOST_TABLE = [
    (_deleted, "the job table jobs.sqlite is missing or empty in a folder that has held jobs"),
    (_emptied, "the job table jobs.sqlite is missing or empty in a folder that has held jobs"),
    (_replaced, "the job table jobs.sqlite does not know 1 job(s) whose results are on file"),
    (_garbage, "the job table jobs.sqlite cannot be read: file is not a database"),
]


@pytest.mark.parametrize(("lose", "words"), LOST_TABLE, ids=[t[0].__name__ for t in LOST_TABLE])
def test_a_lost_job_table_refuses_to_start(stopped, lose, words, monkeypatch, capsys):
    data, _, path = stopped
    lose(data / "jobs")
    kept = path.read_bytes()
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL))
    with pytest.raises(SettingsError) as refused:
        create_app(worker)
    worker.close()
    assert words in str(refused.value) and "--reset-jobs" in str(refused.value)
    import uvicorn  # the command line: exit 2 and one line, never a server

    monkeypatch.setattr(uvicorn, "run", lambda *_, **__: pytest.fail("the server started"))
    assert main(["serve", "--data", str(data), "--models", TEXT_MODEL, "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("attrlab: error: the job folder") and words in error
    assert path.read_bytes() == kept  # nothing was moved or removed


@pytest.mark.parametrize("asked", ["flag", "environment"])
def test_starting_afresh_moves_the_unreadable_folder_aside(stopped, asked):
    data, job_id, path = stopped
    kept = path.read_bytes()
    _deleted(data / "jobs")
    if asked == "flag":
        settings = job_settings(data, TEXT_MODEL, reset_jobs=True)
    else:
        settings = ServerSettings.for_server(
            {"ATTRLAB_DATA": str(data), "ATTRLAB_MODELS": TEXT_MODEL, "ATTRLAB_RESET_JOBS": "1"}
        )
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as client:
        assert client.get(f"/api/v1/jobs/{job_id}").status_code == 404  # a fresh table
        new = client.post("/api/v1/jobs", json={**BODY, "instances": BODY["instances"][:1]})
        assert wait_for_job(client, new.json()["job_id"])["status"] == "done"
    worker.close()
    (aside,) = data.glob("jobs.unreadable-*")
    assert (aside / "results" / path.name).read_bytes() == kept  # kept, not deleted


def test_starting_afresh_keeps_a_folder_that_reads(stopped):
    """The reset is for a folder that cannot be read: left set, it never drops good jobs."""
    data, job_id, _ = stopped
    worker = ExplainWorker(device="cpu", settings=job_settings(data, TEXT_MODEL, reset_jobs=True))
    with TestClient(create_app(worker)) as client:
        status = client.get(f"/api/v1/jobs/{job_id}").json()
        assert (status["status"], status["done"]) == ("done", 12)
    worker.close()
    assert not list(data.glob("jobs.unreadable-*"))


def _older_servers_folder(data: Path, rows: list[bytes]) -> Path:
    """A job folder of a server before result records: one finished job; its results file."""
    jobs = data / "jobs"
    jobs.mkdir(parents=True)
    with sqlite3.connect(jobs / "jobs.sqlite") as db:
        db.execute(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, status TEXT NOT NULL, request TEXT NOT NULL,"
            " total INTEGER NOT NULL, done INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL"
            " DEFAULT 0, created REAL NOT NULL, started REAL, finished REAL, message TEXT)"
        )
        db.execute(
            "INSERT INTO jobs VALUES ('old', 'done', ?, 12, 12, 0, 1.0, 2.0, 3.0, NULL)",
            (json.dumps(BODY),),
        )
    db.close()
    (jobs / "results").mkdir()
    path = jobs / "results" / "old.jsonl"
    path.write_bytes(b"".join(rows))
    return path


OLDER_DAMAGE = [
    (None, None),
    (_a_repeated_instance, "results line 13 repeats instance 3"),
    (_stray_index, "results line 13 has index 500; this job's instances are 0 to 11"),
    (_a_lost_line, "the results file holds 11 instances; 12 were done"),
    (Path.unlink, "the results file is missing"),
]


@pytest.mark.parametrize(
    ("plant", "reason"),
    OLDER_DAMAGE,
    ids=[plant.__name__ if plant else "intact" for plant, _ in OLDER_DAMAGE],
)
def test_an_older_servers_jobs_are_checked_for_form_and_count(finished, tmp_path, plant, reason):
    """Jobs written before the table recorded their lines: no digest, but the same rules."""
    written = finished[2].splitlines(keepends=True)
    path = _older_servers_folder(tmp_path, written)
    if plant is not None:
        plant(path)
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, TEXT_MODEL))
    with TestClient(create_app(worker)) as client:
        status = client.get("/api/v1/jobs/old").json()
        jsonl = client.get("/api/v1/jobs/old/results")
        parquet = client.get("/api/v1/jobs/old/results", params={"format": "parquet"})
    worker.close()
    if reason is None:
        assert (status["status"], status["done"]) == ("done", 12)
        assert jsonl.content == finished[2]
        assert sorted(pd.read_parquet(io.BytesIO(parquet.content))["id"]) == list(range(12))
    else:
        assert status["status"] == "damaged"
        assert status["message"] == f"the job's results are damaged: {reason}"
        _assert_refused(jsonl, reason)
        _assert_refused(parquet, reason)


def test_a_reset_setting_that_is_not_yes_or_no_is_refused():
    with pytest.raises(
        SettingsError, match="ATTRLAB_RESET_JOBS must be true or false; got 'perhaps'"
    ):
        ServerSettings.for_server({"ATTRLAB_RESET_JOBS": "perhaps"})


def test_a_lost_table_of_queued_jobs_only_refuses_to_start(tmp_path):
    """Jobs that never wrote a result leave no file to be missed: the folder itself tells."""
    JobStore(tmp_path / "jobs").create(BODY, total=INSTANCES, limit=4)
    _deleted(tmp_path / "jobs")
    worker = ExplainWorker(device="cpu", settings=job_settings(tmp_path, TEXT_MODEL))
    with pytest.raises(
        SettingsError, match=r"jobs\.sqlite is missing or empty in a folder that has"
    ):
        create_app(worker)
    worker.close()
