"""
Durable batch jobs: a SQLite job table and a JSON Lines file of results per job.

Both live under the server's data folder (``ATTRLAB_DATA``), so a restarted server resumes its
queued and interrupted jobs and loses nothing that finished: an instance's results are appended
(and flushed to disk) before its progress is counted, and resuming skips the instances whose
results are on file. One runner thread feeds jobs to the worker one instance at a time, so
interactive requests wait at most one instance behind a job.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import error_record
from app.worker import (
    BatchRequest,
    ExplainWorker,
    InstanceResults,
    Job,
    QueueFullError,
    WorkerClosedError,
)
from attribution.errors import AttrlabError, JobCancelledError

__all__ = ["JOB_STATES", "JobRecord", "JobRunner", "JobStore", "instance_json"]

log = logging.getLogger(__name__)

#: A job's states; the last three are final.
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ({", ".join(f"'{state}'" for state in JOB_STATES)})),
    request TEXT NOT NULL,
    total INTEGER NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    message TEXT
)
"""


@dataclass(frozen=True)
class JobRecord:
    """One row of the job table."""

    id: str
    status: str
    request: dict[str, Any]
    total: int
    done: int
    errors: int
    created: float
    started: float | None
    finished: float | None
    message: str | None

    def to_dict(self) -> dict[str, Any]:
        """Status for clients: progress, instance errors and an ETA from the pace so far."""
        eta = None
        if self.status == "running" and self.started is not None and self.done > 0:
            pace = (time.time() - self.started) / self.done
            eta = round(pace * (self.total - self.done), 1)
        return {
            "job_id": self.id,
            "status": self.status,
            "done": self.done,
            "total": self.total,
            "instance_errors": self.errors,
            "eta_s": eta,
            "created": self.created,
            "finished": self.finished,
            "message": self.message,
        }


class JobStore:
    """The job table (SQLite) and the result files, in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "results").mkdir(parents=True, exist_ok=True)
        with self._connection() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        # closing() closes the connection; the connection's own context commits one transaction
        with closing(sqlite3.connect(self.folder / "jobs.sqlite", timeout=30)) as db, db:
            yield db

    def create(self, request: dict[str, Any], total: int) -> str:
        """A new queued job; its id."""
        job_id = uuid.uuid4().hex
        with self._connection() as db:
            db.execute(
                "INSERT INTO jobs (id, status, request, total, created) VALUES (?, ?, ?, ?, ?)",
                (job_id, "queued", json.dumps(request), total, time.time()),
            )
        return job_id

    def get(self, job_id: str) -> JobRecord | None:
        """The job, or None when there is no such job."""
        with self._connection() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _record(row) if row else None

    def next_queued(self) -> JobRecord | None:
        """The oldest queued job."""
        with self._connection() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM jobs WHERE status = 'queued' ORDER BY created LIMIT 1"
            ).fetchone()
        return _record(row) if row else None

    def active(self) -> int:
        """Jobs queued or running."""
        with self._connection() as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM jobs WHERE status IN ('queued', 'running')"
            ).fetchone()
        return int(count)

    def set_status(self, job_id: str, status: str, message: str | None = None) -> None:
        """Move a job to ``status`` (stamping when it started or finished)."""
        now = time.time()
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET status = ?, message = COALESCE(?, message), "
                "started = CASE WHEN ? = 'running' THEN COALESCE(started, ?) ELSE started END, "
                "finished = CASE WHEN ? IN ('done', 'failed', 'cancelled') THEN ? ELSE NULL END "
                "WHERE id = ?",
                (status, message, status, now, status, now, job_id),
            )

    def cancel(self, job_id: str) -> bool:
        """Cancel a job that has not finished; False when it had."""
        with self._connection() as db:
            changed = db.execute(
                "UPDATE jobs SET status = 'cancelled', finished = ? "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (time.time(), job_id),
            ).rowcount
        return changed > 0

    def requeue(self, job_id: str) -> None:
        """Put a running job back in the queue (the server is stopping)."""
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET status = 'queued' WHERE id = ? AND status = 'running'", (job_id,)
            )

    def resume_interrupted(self) -> int:
        """Queue again the jobs a stopped server left running; how many."""
        with self._connection() as db:
            return db.execute("UPDATE jobs SET status = 'queued' WHERE status = 'running'").rowcount

    def results_path(self, job_id: str) -> Path:
        """The job's JSON Lines result file."""
        return self.folder / "results" / f"{job_id}.jsonl"

    def append(self, job_id: str, result: dict[str, Any], failed: bool) -> None:
        """Write one instance's results to disk, then count it."""
        with self.results_path(job_id).open("a", encoding="utf-8") as file:
            file.write(json.dumps(result, allow_nan=False) + "\n")
            file.flush()
            os.fsync(file.fileno())
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET done = done + 1, errors = errors + ? WHERE id = ?",
                (int(failed), job_id),
            )

    def results(self, job_id: str) -> list[dict[str, Any]]:
        """The results on file, in instance order (a line torn by a crash is left out)."""
        path = self.results_path(job_id)
        if not path.exists():
            return []
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return sorted(rows, key=lambda row: row["index"])


_COLUMNS = "id, status, request, total, done, errors, created, started, finished, message"


def _record(row: tuple[Any, ...]) -> JobRecord:
    job_id, status, request, total, done, errors, created, started, finished, message = row
    return JobRecord(
        job_id,
        status,
        json.loads(request),
        total,
        done,
        errors,
        created,
        started,
        finished,
        message,
    )


def instance_json(results: InstanceResults) -> dict[str, Any]:
    """One instance's results for the wire: Explanation JSON or ``{"error": ...}`` per method."""
    return {
        method: error_record(outcome) if isinstance(outcome, AttrlabError) else outcome.to_dict()
        for method, outcome in results.items()
    }


class JobRunner:
    """
    Runs stored jobs through the worker, oldest first, one instance per worker request.

    ``parse(request)`` reads a stored request (with the API's body parser, so that a stored job
    is read exactly as a live request is) into a function giving the worker's
    :class:`BatchRequest` for its instance ``index``.
    """

    def __init__(
        self,
        store: JobStore,
        worker: ExplainWorker,
        parse: Callable[[dict[str, Any]], Callable[[int], BatchRequest]],
        poll_s: float = 0.2,
    ) -> None:
        self.store = store
        self.worker = worker
        self.parse = parse
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._current: tuple[str, Job[Any]] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Resume interrupted jobs and start the runner thread."""
        self.store.resume_interrupted()
        self._thread = threading.Thread(target=self._loop, name="attrlab-jobs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the instance in progress is cancelled; the job stays queued for later."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            current = self._current
        if current is not None:
            current[1].cancel()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, request: dict[str, Any], total: int) -> str:
        """
        Store a new job and wake the runner.

        Raises:
            QueueFullError: as many jobs as the server allows are queued or running.
        """
        limit = self.worker.settings.max_jobs
        if self.store.active() >= limit:
            raise QueueFullError(f"{limit} jobs are already queued or running; try again later")
        job_id = self.store.create(request, total)
        self._wake.set()
        return job_id

    def cancel(self, job_id: str) -> bool:
        """Cancel a job (stopping its instance in progress); False when it had finished."""
        cancelled = self.store.cancel(job_id)
        with self._lock:
            current = self._current
        if cancelled and current is not None and current[0] == job_id:
            current[1].cancel()
        return cancelled

    def _loop(self) -> None:
        while not self._stopping.is_set():
            job = self.store.next_queued()
            if job is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            try:
                self._run(job)
            except Exception:  # a bug must not stop every later job: fail this one, go on
                log.exception("job %s failed", job.id)
                self.store.set_status(job.id, "failed", "internal error; the server log has it")

    def _run(self, job: JobRecord) -> None:
        self.store.set_status(job.id, "running")
        try:
            build = self.parse(job.request)
        except ValueError:  # a stored request this version of the server cannot read
            self.store.set_status(job.id, "failed", "the stored request cannot be read")
            return
        finished = {row["index"] for row in self.store.results(job.id)}
        index = 0
        while index < job.total:
            if index in finished:
                index += 1
                continue
            if self._stopping.is_set():
                self.store.requeue(job.id)  # resumed by the next start
                return
            record = self.store.get(job.id)
            if record is None or record.status == "cancelled":
                return
            try:
                results = self._explain(job.id, build(index))
            except QueueFullError:  # interactive requests fill the worker's queue: wait
                self._stopping.wait(self.poll_s)
                continue
            except (JobCancelledError, CancelledError):
                continue  # cancelled or stopping: the checks above end the job
            except WorkerClosedError:
                self.store.requeue(job.id)
                return
            except AttrlabError as err:  # the model or a method cannot run at all
                self.store.set_status(job.id, "failed", error_record(err)["error"]["message"])
                return
            failed = any(isinstance(r, AttrlabError) for r in results.values())
            line = {"index": index, "explanations": instance_json(results)}
            self.store.append(job.id, line, failed)
            index += 1
        record = self.store.get(job.id)
        if record is not None and record.status == "running":
            self.store.set_status(job.id, "done")

    def _explain(self, job_id: str, request: BatchRequest) -> InstanceResults:
        submitted = self.worker.submit(request)
        with self._lock:
            self._current = (job_id, submitted)
        try:
            (results,) = submitted.result()
        finally:
            with self._lock:
                self._current = None
        return results
