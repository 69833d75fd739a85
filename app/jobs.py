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

try:
    import fcntl
except ImportError:  # not POSIX: one server per data folder, unchecked
    fcntl = None  # type: ignore[assignment]
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
    message TEXT,
    done_at_start INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS instance_errors (
    job_id TEXT NOT NULL,
    instance INTEGER NOT NULL,
    method TEXT NOT NULL,
    code TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS instance_errors_of_job ON instance_errors (job_id, instance);
"""
#: Columns added since the first job table, for folders made by an older server.
_ADDED_COLUMNS = {"done_at_start": "INTEGER NOT NULL DEFAULT 0"}
#: Instance errors listed in a job's status (all of them are in its results).
LISTED_ERRORS = 100


@dataclass(frozen=True)
class JobRecord:
    """One row of the job table (without its stored request)."""

    id: str
    status: str
    total: int
    done: int
    errors: int
    created: float
    started: float | None
    finished: float | None
    message: str | None
    done_at_start: int  # instances done when the current run started (a restart resumes)

    def to_dict(self) -> dict[str, Any]:
        """Status for clients: progress, instance errors and an ETA from this run's pace."""
        eta = None
        ran = self.done - self.done_at_start
        if self.status == "running" and self.started is not None and ran > 0:
            pace = (time.time() - self.started) / ran
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


_COLUMNS = "id, status, total, done, errors, created, started, finished, message, done_at_start"


class JobStore:
    """
    The job table (SQLite) and the result files, in one folder.

    Every change of state is one transaction, and the ones that race (claiming a queued job,
    cancelling, finishing, the queue limit) are conditional updates, so two threads or two
    servers on one folder never run a job twice or undo a cancel.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "results").mkdir(parents=True, exist_ok=True)
        with self._connection() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            db.execute("BEGIN IMMEDIATE")  # two servers opening an old folder add each once
            present = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        # closing() closes the connection; the connection's own context commits one transaction
        with closing(sqlite3.connect(self.folder / "jobs.sqlite", timeout=30)) as db, db:
            yield db

    def create(self, request: dict[str, Any], total: int, limit: int) -> str:
        """
        A new queued job; its id.

        Raises:
            QueueFullError: ``limit`` jobs are already queued or running.
        """
        job_id = uuid.uuid4().hex
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")  # the count and the insert as one step
            (active,) = db.execute(
                "SELECT COUNT(*) FROM jobs WHERE status IN ('queued', 'running')"
            ).fetchone()
            if active >= limit:
                raise QueueFullError(f"{limit} jobs are already queued or running; try again later")
            db.execute(
                "INSERT INTO jobs (id, status, request, total, created) VALUES (?, ?, ?, ?, ?)",
                (job_id, "queued", json.dumps(request), total, time.time()),
            )
        return job_id

    def get(self, job_id: str) -> JobRecord | None:
        """The job, or None when there is no such job."""
        with self._connection() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRecord(*row) if row else None

    def request(self, job_id: str) -> dict[str, Any]:
        """The job's stored request body."""
        with self._connection() as db:
            (text,) = db.execute("SELECT request FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return dict(json.loads(text))

    def claim_next(self) -> JobRecord | None:
        """Mark the oldest queued job running and return it; None when nothing is queued."""
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT id FROM jobs WHERE status = 'queued' ORDER BY created LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            db.execute(  # each run times its own pace: a restart's downtime is no work
                "UPDATE jobs SET status = 'running', started = ?, done_at_start = done "
                "WHERE id = ?",
                (time.time(), row[0]),
            )
        return self.get(row[0])

    def finish(self, job_id: str, status: str, message: str | None = None) -> None:
        """End a running job as ``done`` or ``failed`` (a cancel that came first stands)."""
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET status = ?, message = ?, finished = ? "
                "WHERE id = ? AND status = 'running'",
                (status, message, time.time(), job_id),
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

    def append(self, job_id: str, result: dict[str, Any]) -> bool:
        """
        Write one instance's results to disk (after cutting a torn last line), then count.

        Only for a job that has not ended: the check, the write and the count hold the table's
        write lock together, so a cancel that answered first keeps the file as it answered it.

        Returns:
            False, writing nothing, when the job was cancelled or had ended.
        """
        path = self.results_path(job_id)
        failed = _errors_of(job_id, result)
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")  # a cancel waits for this row, or this row for it
            running = db.execute(
                "SELECT 1 FROM jobs WHERE id = ? AND status IN ('queued', 'running')", (job_id,)
            ).fetchone()
            if running is None:
                return False
            cut_torn_tail(path)
            with path.open("a", encoding="utf-8") as file:
                file.write(json.dumps(result, allow_nan=False) + "\n")
                file.flush()
                os.fsync(file.fileno())
            db.execute(
                "UPDATE jobs SET done = done + 1, errors = errors + ? WHERE id = ?",
                (bool(failed), job_id),
            )
            db.executemany("INSERT INTO instance_errors VALUES (?, ?, ?, ?, ?)", failed)
        return True

    def recount(self, job_id: str) -> None:
        """
        Set the job's progress and errors from the results on file, as a run starts.

        A crash may have left the count behind the file; this run's pace counts from here.
        """
        done = errors = 0
        failed = []
        for row in self.results(job_id):
            done += 1
            errors += bool(found := _errors_of(job_id, row))
            failed += found
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET done = ?, errors = ?, done_at_start = ? WHERE id = ?",
                (done, errors, done, job_id),
            )
            db.execute("DELETE FROM instance_errors WHERE job_id = ?", (job_id,))
            db.executemany("INSERT INTO instance_errors VALUES (?, ?, ?, ?, ?)", failed)

    def instance_errors(self, job_id: str) -> list[dict[str, Any]]:
        """The first :data:`LISTED_ERRORS` instance errors: index, method, code, message."""
        with self._connection() as db:
            rows = db.execute(
                "SELECT instance, method, code, message FROM instance_errors WHERE job_id = ? "
                "ORDER BY instance, rowid LIMIT ?",
                (job_id, LISTED_ERRORS),
            ).fetchall()
        return [dict(zip(("index", "method", "code", "message"), row, strict=True)) for row in rows]

    def results(self, job_id: str) -> Iterator[dict[str, Any]]:
        """
        The results on file, one per instance, as they were written (in instance order).

        A line torn by a crash, and a second line for an instance, are left out; the file is
        read a line at a time.
        """
        path = self.results_path(job_id)
        if not path.exists():
            return
        seen: set[int] = set()
        with path.open(encoding="utf-8") as file:
            for line in file:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if row["index"] not in seen:
                    seen.add(row["index"])
                    yield row


def _errors_of(job_id: str, result: dict[str, Any]) -> list[tuple[Any, ...]]:
    """An instance's errors as ``instance_errors`` rows."""
    return [
        (job_id, result["index"], method, outcome["error"]["code"], outcome["error"]["message"])
        for method, outcome in result["explanations"].items()
        if "error" in outcome
    ]


def cut_torn_tail(path: Path) -> None:
    """Cut a file back to its last newline: what an interrupted write of a line left."""
    if not path.exists():
        return
    with path.open("rb+") as file:
        size = file.seek(0, os.SEEK_END)
        if size == 0:
            return
        file.seek(size - 1)
        if file.read(1) == b"\n":
            return
        position = size
        while position > 0:  # backwards in blocks to the last newline
            start = max(0, position - 65536)
            file.seek(start)
            block = file.read(position - start)
            found = block.rfind(b"\n")
            if found >= 0:
                file.truncate(start + found + 1)
                return
            position = start
        file.truncate(0)


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
    :class:`BatchRequest` for its instance ``index``. One runner per data folder runs jobs at a
    time (an exclusive lock on ``runner.lock``); another server on the same folder queues jobs
    and takes over when the first stops.
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
        self._lock_file: Any = None

    def start(self) -> None:
        """Start the runner thread (it resumes interrupted jobs once it holds the folder)."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="attrlab-jobs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the instance in progress is cancelled; the job stays queued for later."""
        self._stopping.set()
        self._wake.set()
        self._cancel_current(None)
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._lock_file is not None:
            self._lock_file.close()  # releases the folder's lock
            self._lock_file = None

    def submit(self, request: dict[str, Any], total: int) -> str:
        """
        Store a new job and wake the runner.

        Raises:
            QueueFullError: as many jobs as the server allows are queued or running.
        """
        job_id = self.store.create(request, total, self.worker.settings.max_jobs)
        self._wake.set()
        return job_id

    def cancel(self, job_id: str) -> bool:
        """Cancel a job (stopping its instance in progress); False when it had finished."""
        cancelled = self.store.cancel(job_id)
        if cancelled:
            self._cancel_current(job_id)
        return cancelled

    def _cancel_current(self, job_id: str | None) -> None:
        with self._lock:
            current = self._current
        if current is not None and job_id in (None, current[0]):
            current[1].cancel()

    def _hold_folder(self) -> bool:
        """Take the folder's runner lock if free; resume what a stopped runner left running."""
        if self._lock_file is not None:
            return True
        handle = (self.store.folder / "runner.lock").open("a")
        try:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._lock_file = handle
        self.store.resume_interrupted()
        return True

    def _loop(self) -> None:
        while not self._stopping.is_set():
            job = None
            try:
                job = self.store.claim_next() if self._hold_folder() else None
                if job is None:
                    self._wake.wait(self.poll_s)
                    self._wake.clear()
                    continue
                self._run(job)
            except Exception:  # the runner must outlive any one failure (a bug, a full disk)
                log.exception("the job runner hit an error; it goes on")
                if job is not None:
                    self._end_failed(job.id)
                self._stopping.wait(self.poll_s)

    def _end_failed(self, job_id: str) -> None:
        """End a job that hit an unexpected error, so that it holds no place in the queue."""
        try:
            message = "the job failed inside attrlab; the server log has the details"
            self.store.finish(job_id, "failed", message)
        except Exception:  # the store itself fails (a full disk): a restart resumes the job
            log.exception("job %s could not be marked failed", job_id)

    def _run(self, job: JobRecord) -> None:
        self.store.recount(job.id)  # a crash may have left the count behind the file
        try:
            build = self.parse(self.store.request(job.id))
        except ValueError:  # a stored request this version of the server cannot read
            self.store.finish(job.id, "failed", "the stored request cannot be read")
            return
        finished = {row["index"] for row in self.store.results(job.id)}
        for index in range(job.total):
            if index in finished:
                continue
            while True:  # one instance, retried while the worker's queue is full
                if self._stopping.is_set():
                    self.store.requeue(job.id)  # resumed by the next start
                    return
                record = self.store.get(job.id)
                if record is None or record.status != "running":  # cancelled meanwhile
                    return
                try:
                    results = self._explain(job.id, build(index))
                    break
                except QueueFullError:  # interactive requests fill the worker's queue
                    self._stopping.wait(self.poll_s)
                except (JobCancelledError, CancelledError):
                    continue  # cancelled or stopping: the checks above end the job
                except WorkerClosedError:
                    self._stopping.set()  # the worker is gone: so is this runner
                except AttrlabError as err:  # the model or a method cannot run at all
                    self.store.finish(job.id, "failed", error_record(err)["error"]["message"])
                    return
            row = {"index": index, "explanations": instance_json(results)}
            if not self.store.append(job.id, row):  # cancelled as the instance finished
                return
        self.store.finish(job.id, "done")

    def _explain(self, job_id: str, request: BatchRequest) -> InstanceResults:
        submitted = self.worker.submit(request)
        with self._lock:
            self._current = (job_id, submitted)
        try:
            record = self.store.get(job_id)
            if self._stopping.is_set() or record is None or record.status != "running":
                submitted.cancel()  # a stop or cancel that came before _current was set
            (results,) = submitted.result()
        finally:
            with self._lock:
                self._current = None
        return results
