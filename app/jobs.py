"""
Durable jobs: a SQLite job table and a JSON Lines file of results per job.

A job is a batch of explain instances (a line per instance), or a patching, pruning, bits or
eviction study (one line, its result): :class:`JobWork` says what a stored job runs and writes.

Both live under the server's data folder (``ATTRLAB_DATA``), so a restarted server resumes its
queued and interrupted jobs and loses nothing that finished: an instance's results are appended
(and flushed to disk) before its progress is counted, and resuming skips the instances whose
results are on file. One runner thread feeds jobs to the worker one instance at a time (a
worker batch of one, explained by the library's loop, :func:`attribution.inputs.runs.explain_rows`),
so interactive requests wait at most one instance behind a job.

The table records, per job, the result lines written, their bytes and a digest chained over
them, so results are checked whenever they are read: a file that was edited, cut, extended or
deleted behind the server's back makes its job ``damaged`` (never served), and a table that
was lost or cannot be read stops the server from opening the folder at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from attrlab.app.errors import error_record

try:
    import fcntl
except ImportError:  # not POSIX: one server per data folder, unchecked
    fcntl = None  # type: ignore[assignment]
from attrlab.app.worker import (
    ExplainWorker,
    InstanceInterruptedError,
    Job,
    JobTableBusyError,
    QueueFullError,
    WorkerClosedError,
)
from attrlab.attribution.errors import AttrlabError, JobCancelledError
from attrlab.attribution.request import BatchRequest, InstanceResults, Request

__all__ = [
    "DAMAGED",
    "INTERRUPTED",
    "JOB_STATES",
    "MAX_OPEN_RUNS",
    "DamagedResultsError",
    "JobRecord",
    "JobRunner",
    "JobStore",
    "JobWork",
    "UnreadableJobsError",
    "batch_work",
    "instance_json",
    "set_aside",
]

log = logging.getLogger(__name__)

#: A job's states; the last three are final.
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
#: The state reported (never stored) for a job whose results on file are not what was written.
DAMAGED = "damaged"
_ACTIVE = ("queued", "running")

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
    done_at_start INTEGER NOT NULL DEFAULT 0,
    result_lines INTEGER,
    result_bytes INTEGER,
    result_digest TEXT,
    run_instance INTEGER,
    open_runs INTEGER NOT NULL DEFAULT 0
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
#: Columns added since the first job table, for folders made by an older server. The result
#: record stays NULL for an older server's jobs until a run recounts them: until then their
#: files are checked for form and count only. An older server's interrupted job has no open
#: run on record (``open_runs`` 0): its instance in progress gets its first run and one retry.
_ADDED_COLUMNS = {
    "done_at_start": "INTEGER NOT NULL DEFAULT 0",
    "result_lines": "INTEGER",
    "result_bytes": "INTEGER",
    "result_digest": "TEXT",
    "run_instance": "INTEGER",
    "open_runs": "INTEGER NOT NULL DEFAULT 0",
}
_DATABASE = "jobs.sqlite"
#: The digest of no result lines; each line written chains on with :func:`_chained`.
_NO_RESULTS_DIGEST = hashlib.sha256(b"").hexdigest()
#: How long a transaction waits for another process's lock on the table before giving up.
_LOCK_WAIT_S = 30.0
#: Open flags of a results file: never wait on a pipe, refuse a link (POSIX; elsewhere the
#: lstat check stands alone), bytes as they are (Windows).
_NO_WAIT = getattr(os, "O_NONBLOCK", 0)
_RESULTS_OPEN = _NO_WAIT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
#: Why a results entry that is a link, a folder, a pipe or a device is damage.
_NOT_A_FILE = "the results file is not a regular file"
#: Instance errors listed in a job's status (all of them are in its results).
LISTED_ERRORS = 100
#: Runs of one instance that may end with the server stopping (killed for memory, say) before
#: the instance is failed instead of run again: the first run and one retry.
MAX_OPEN_RUNS = 2
#: Why an instance in whose runs the server stopped :data:`MAX_OPEN_RUNS` times is not run.
INTERRUPTED = (
    "the server stopped while this instance ran, twice; it is not run again (it may need more "
    "memory or time than this server has)"
)


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
    # what the store wrote to the results file: lines, bytes, digest (None: an older server's)
    result_lines: int | None = None
    result_bytes: int | None = None
    result_digest: str | None = None

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


_COLUMNS = (
    "id, status, total, done, errors, created, started, finished, message, done_at_start, "
    "result_lines, result_bytes, result_digest"
)


class DamagedResultsError(Exception):
    """A job's results file is not what the store wrote (edited, cut, extended or deleted)."""


class UnreadableJobsError(Exception):
    """A job folder whose table cannot be read, or has lost jobs whose results are on file."""


@dataclass
class _Scan:
    """What a check of a results file read: complete lines, their bytes and chained digest."""

    lines: int = 0
    size: int = 0
    digest: str = _NO_RESULTS_DIGEST


class JobStore:
    """
    The job table (SQLite) and the result files, in one folder.

    Every change of state is one transaction, and the ones that race (claiming a queued job,
    cancelling, finishing, the queue limit) are conditional updates, so two threads or two
    servers on one folder never run a job twice or undo a cancel.
    """

    def __init__(self, folder: Path) -> None:
        """
        Open (or make) the job folder.

        Raises:
            UnreadableJobsError: the table cannot be read, or it does not know jobs whose
                results are on file (it was deleted, emptied or replaced).
            OSError, JobTableBusyError: the folder cannot be written, or the table is locked.
        """
        self.folder = folder
        self._checked: dict[str, tuple[tuple[Any, ...], str | None]] = {}  # final jobs' checks
        results = folder / "results"
        database = folder / _DATABASE
        # The table is made before the results folder, so results without a table were orphaned.
        if results.is_dir() and (not database.exists() or database.stat().st_size == 0):
            raise UnreadableJobsError(
                f"the job table {_DATABASE} is missing or empty in a folder that has held jobs"
            )
        folder.mkdir(parents=True, exist_ok=True)
        try:
            known = self._open_table()
        except sqlite3.DatabaseError as err:  # not a database, or a damaged one
            raise UnreadableJobsError(f"the job table {_DATABASE} cannot be read: {err}") from None
        results.mkdir(exist_ok=True)
        lost = sorted(path.stem for path in results.glob("*.jsonl") if path.stem not in known)
        if lost:
            raise UnreadableJobsError(
                f"the job table {_DATABASE} does not know {len(lost)} job(s) whose results are "
                f"on file (the first: {lost[0]}); it was replaced or emptied"
            )

    def _open_table(self) -> set[str]:
        """Check the table, make or migrate it; the ids of the jobs it knows."""
        with self._connection() as db:
            (verdict,) = db.execute("PRAGMA quick_check").fetchone()
            if verdict != "ok":
                raise sqlite3.DatabaseError(f"its integrity check says: {verdict}")
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            db.execute("BEGIN IMMEDIATE")  # two servers opening an old folder add each once
            present = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
            return {job_id for (job_id,) in db.execute("SELECT id FROM jobs")}

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """
        One transaction on the table (committed on exit, rolled back on an error).

        Raises:
            JobTableBusyError: the table stayed locked by another process for
                :data:`_LOCK_WAIT_S`, or cannot be written (read-only, no room): not its
                content, so a client may try again.
        """
        try:
            # closing() closes the connection; the connection's context commits the transaction
            with closing(sqlite3.connect(self.folder / _DATABASE, timeout=_LOCK_WAIT_S)) as db, db:
                yield db
        except sqlite3.OperationalError as err:
            raise JobTableBusyError(
                f"the job table cannot be used now ({err}); try again later"
            ) from None

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
                "INSERT INTO jobs (id, status, request, total, created, result_lines, "
                "result_bytes, result_digest) VALUES (?, ?, ?, ?, ?, 0, 0, ?)",
                (job_id, "queued", json.dumps(request), total, time.time(), _NO_RESULTS_DIGEST),
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

    def open_runs(self, job_id: str, index: int) -> int:
        """
        The runs of instance ``index`` that started and never ended: the server stopped in them.

        A run that ends in any way while the server lives (a result, an error, a cancel, a
        stop that requeues the job) is closed by :meth:`end_run`; only a server that dies
        mid-instance (killed for memory, say) leaves one open.
        """
        with self._connection() as db:
            row = db.execute(
                "SELECT open_runs FROM jobs WHERE id = ? AND run_instance = ?", (job_id, index)
            ).fetchone()
        return row[0] if row else 0

    def start_run(self, job_id: str, index: int) -> None:
        """Count a run of instance ``index`` as open, on disk, before any of its work starts."""
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET open_runs = CASE WHEN run_instance = ? THEN open_runs + 1 "
                "ELSE 1 END, run_instance = ? WHERE id = ?",
                (index, index, job_id),
            )

    def end_run(self, job_id: str, index: int) -> None:
        """Close the run of instance ``index`` that :meth:`start_run` opened (it ended)."""
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET open_runs = open_runs - 1 "
                "WHERE id = ? AND run_instance = ? AND open_runs > 0",
                (job_id, index),
            )

    def results_path(self, job_id: str) -> Path:
        """The job's JSON Lines result file (for an id the table holds: never a client's)."""
        return self.folder / "results" / f"{job_id}.jsonl"

    def append(self, job_id: str, result: dict[str, Any]) -> bool:
        """
        Write one instance's results to disk (after cutting a torn last line), then count.

        Only for a job that has not ended: the check, the write and the count hold the table's
        write lock together, so a cancel that answered first keeps the file as it answered it,
        and a reader that takes the lock (:meth:`_snapshot`) sees the file and its record agree,
        in this process or another.

        Returns:
            False, writing nothing, when the job was cancelled or had ended.

        Raises:
            DamagedResultsError: the results file is not a regular file (:func:`_open_results`).
        """
        path = self.results_path(job_id)
        line = (json.dumps(result, allow_nan=False) + "\n").encode()
        failed = _errors_of(job_id, result)
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")  # a cancel waits for this row, or this row for it
            found = db.execute(
                "SELECT result_digest FROM jobs WHERE id = ? AND status IN ('queued', 'running')",
                (job_id,),
            ).fetchone()
            if found is None:
                return False
            (digest,) = found
            with _open_results(path, os.O_RDWR | os.O_CREAT | os.O_APPEND) as file:
                _cut_to_last_newline(file)
                file.write(line)
                file.flush()
                os.fsync(file.fileno())
                size = os.fstat(file.fileno()).st_size
            recorded = digest is not None  # an older server's job is recorded once recounted
            db.execute(
                "UPDATE jobs SET done = done + 1, errors = errors + ?, "
                "result_lines = result_lines + 1, result_bytes = ?, result_digest = ? WHERE id = ?",
                (
                    bool(failed),
                    size if recorded else None,
                    _chained(digest, line) if recorded else None,
                    job_id,
                ),
            )
            db.executemany("INSERT INTO instance_errors VALUES (?, ?, ?, ?, ?)", failed)
        return True

    def recount(self, job_id: str) -> set[int]:
        """
        Set the job's progress, errors and result record from its file, as a run starts.

        A crash may have left the count behind the file (a line written, not yet counted: it
        counts now), or a torn last line (cut); this run's pace counts from here. Returns the
        instances on file.

        Raises:
            DamagedResultsError: the file is not what was written; it is left as it is.
        """
        record, found = self._snapshot(job_id)
        path = self.results_path(job_id)
        scan = _Scan()
        done: set[int] = set()
        failed: list[tuple[Any, ...]] = []
        errors = 0
        for row in _checked_rows(path, record, found, scan):
            done.add(row["index"])
            errors += bool(of_row := _errors_of(job_id, row))
            failed += of_row
        if path.exists():  # cut only after the check: what it cuts was never recorded
            with _open_results(path, os.O_RDWR) as file:
                _cut_to_last_newline(file)
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET done = ?, errors = ?, done_at_start = ?, result_lines = ?, "
                "result_bytes = ?, result_digest = ? WHERE id = ?",
                (len(done), errors, len(done), scan.lines, scan.size, scan.digest, job_id),
            )
            db.execute("DELETE FROM instance_errors WHERE job_id = ?", (job_id,))
            db.executemany("INSERT INTO instance_errors VALUES (?, ?, ?, ?, ?)", failed)
        return done

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
        The results on file, one per instance, as they were written, checked as they are read.

        The first line for an instance counts (the store may write a redo after it). Read a line
        at a time: consume it whole before acting on it, since damage further on is only found
        there (see :meth:`checked_copy`).

        Raises:
            DamagedResultsError: where the file first differs from what the store wrote.
        """
        record, found = self._snapshot(job_id)
        yield from _checked_rows(self.results_path(job_id), record, found, _Scan())

    def checked_copy(self, job_id: str) -> Path:
        """
        The job's results (one line per instance) checked whole, as a temporary JSON Lines file.

        The caller serves the copy and deletes it: nothing is served before the whole file is
        known good, and lines the runner appends meanwhile wait for the next download.

        Raises:
            DamagedResultsError: the file is not what was written (no copy is left behind).
        """
        handle, name = tempfile.mkstemp(prefix="attrlab-results-", suffix=".jsonl")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as copy:
                for row in self.results(job_id):
                    copy.write(json.dumps(row, allow_nan=False) + "\n")
        except BaseException:
            os.unlink(name)
            raise
        return Path(name)

    def status(self, job_id: str) -> dict[str, Any] | None:
        """
        The job's status for clients (:meth:`JobRecord.to_dict` and its first errors), or None.

        A job whose results are damaged (:meth:`_damage`) reports :data:`DAMAGED` and why.
        """
        try:
            record, found = self._snapshot(job_id)
        except KeyError:
            return None
        status = {**record.to_dict(), "errors": self.instance_errors(job_id)}
        reason = self._damage(record, found)
        if reason is not None:
            status.update(status=DAMAGED, message=f"the job's results are damaged: {reason}")
        return status

    def _damage(self, record: JobRecord, found: os.stat_result | None) -> str | None:
        """
        Why the job's results are damaged, or None when they are as written.

        A finished job's file is checked whole (again only once it or the record changes); a
        queued or running job's, which grows, by its size against the record (a run checks it
        whole as it starts, and a download always does).
        """
        if found is None:
            return _missing(record)
        if record.status in _ACTIVE:
            if not stat.S_ISREG(found.st_mode):
                return _NOT_A_FILE
            if record.result_bytes is not None and found.st_size < record.result_bytes:
                return "the results file is shorter than what was written"
            return None
        key = (found.st_size, found.st_mtime_ns, found.st_ino, record)
        checked = self._checked.get(record.id)
        if checked is None or checked[0] != key:
            try:
                for _ in _checked_rows(self.results_path(record.id), record, found, _Scan()):
                    pass
                checked = (key, None)
            except DamagedResultsError as err:
                checked = (key, str(err))
            self._checked[record.id] = checked  # one entry per job, replaced whole: thread-safe
        return checked[1]

    def _snapshot(self, job_id: str) -> tuple[JobRecord, os.stat_result | None]:
        """
        The job's record and its results file's state, taken together in the write lock.

        No append lies between them, so lines beyond the record were left by a crash (or
        planted), never a line being written now.

        Raises:
            KeyError: there is no such job.
        """
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")  # appends write their line inside this lock
            row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:  # before any path is made of the id
                raise KeyError(f"no job '{job_id}'")
            try:  # the entry itself: a link is not followed (and is damage)
                found = self.results_path(job_id).lstat()
            except FileNotFoundError:
                found = None
        return JobRecord(*row), found


def _missing(record: JobRecord) -> str | None:
    """Why a job whose results file is absent is damaged: it had results; None if none yet."""
    if record.result_lines or (record.result_lines is None and record.done):
        return "the results file is missing"
    return None


def _chained(digest: str, line: bytes) -> str:
    """The results digest with one more line: sha256 over the digest so far and the line."""
    return hashlib.sha256(bytes.fromhex(digest) + line).hexdigest()


def _checked_rows(
    path: Path, record: JobRecord, found: os.stat_result | None, scan: _Scan
) -> Iterator[dict[str, Any]]:
    """
    The first row per instance of a results file, checked against ``record`` as it is read.

    Every line must be a result row of this job (:func:`_checked_row`); the recorded lines
    must all be there with their digest. Beyond them, only a queued or running job may have
    more: what a crash left before its count (a torn line, or a complete one that the next run
    counts); those are checked for form and new instances. Only the ``found`` bytes are read
    (the file as it was with ``record``: see :meth:`JobStore._snapshot`); ``scan`` ends holding
    the complete lines read.
    """
    recorded = record.result_lines
    active = record.status in _ACTIVE
    file = None
    if found is not None:
        if not stat.S_ISREG(found.st_mode):  # a link, a folder, a pipe: never opened
            raise DamagedResultsError(_NOT_A_FILE)
        with suppress(FileNotFoundError):  # deleted since the snapshot
            file = _open_results(path, os.O_RDONLY)
    if file is None:
        if (missing := _missing(record)) is not None:
            raise DamagedResultsError(missing)
        return
    seen: set[int] = set()
    left = found.st_size if found is not None else 0
    with file:
        while left > 0 and (line := file.readline(left)):
            left -= len(line)
            number = scan.lines + 1
            beyond = recorded is not None and number > recorded
            if not line.endswith(b"\n"):  # torn by a crash
                if active and (recorded is None or beyond):
                    break
                raise DamagedResultsError(f"results line {number} is cut short")
            row = _checked_row(line, number, record.total)
            scan.lines, scan.size = number, scan.size + len(line)
            scan.digest = _chained(scan.digest, line)
            if number == recorded and scan.digest != record.result_digest:
                raise DamagedResultsError(
                    f"results lines 1 to {number} are not the lines that were written"
                )
            if beyond and not active:
                raise DamagedResultsError(f"results line {number} was added after the job ended")
            if row["index"] in seen:
                if beyond or (recorded is None and not active):
                    raise DamagedResultsError(
                        f"results line {number} repeats instance {row['index']}"
                    )
                continue  # a redo the store wrote: the first line counts
            seen.add(row["index"])
            yield row
    if recorded is not None and scan.lines < recorded:
        raise DamagedResultsError(
            f"the results file has {scan.lines} of the {recorded} lines that were written"
        )
    if recorded is None and not 0 <= len(seen) - record.done <= active:  # an older server's
        raise DamagedResultsError(
            f"the results file holds {len(seen)} instances; {record.done} were done"
        )


def _checked_row(line: bytes, number: int, total: int) -> dict[str, Any]:
    """
    Line ``number`` of a job of ``total`` instances, parsed, if it is a result row.

    A row is ``{"index": 0 <= i < total, "explanations": {method: outcome}}``, an outcome an
    Explanation (with ``scores``) or ``{"error": {"code", "message"}}``; a patching job's one
    row is ``{"index": 0, "report": {...}}``, a report with its ``table`` of records; a pruning
    job's ``{"index": 0, "study": {...}}``, a study with its ``target``; a bits job's
    ``{"index": 0, "bits": {...}}``, a study with its ``measure`` and its ``table`` of records;
    an eviction job's ``{"index": 0, "evict": {...}}``, a study with its ``curves`` (their
    ``curves`` records) and its ``views``; a visual-token job's ``{"index": 0,
    "visual_tokens": {...}}``, a study with its ``curves`` and its ``answer``.

    Raises:
        DamagedResultsError: naming the line and what is wrong with it.
    """
    try:
        row = json.loads(line, parse_constant=_no_constant)
    except ValueError:  # not JSON, not UTF-8, or NaN / Infinity (never written)
        raise DamagedResultsError(f"results line {number} is not valid JSON") from None
    if not isinstance(row, dict):
        raise DamagedResultsError(f"results line {number} is not a JSON object")
    index = row.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < total:
        raise DamagedResultsError(
            f"results line {number} has index {json.dumps(index)[:40]}; this job's instances "
            f"are 0 to {total - 1}"
        )
    if "report" in row:
        report = row["report"]
        if not isinstance(report, dict) or not isinstance(report.get("table"), list):
            raise DamagedResultsError(f"results line {number} does not hold a patching report")
        return row
    if "study" in row:
        study = row["study"]
        if not isinstance(study, dict) or not isinstance(study.get("target"), str):
            raise DamagedResultsError(f"results line {number} does not hold a pruning study")
        return row
    if "bits" in row:
        study = row["bits"]
        if (
            not isinstance(study, dict)
            or not isinstance(study.get("measure"), str)
            or not isinstance(study.get("table"), list)
        ):
            raise DamagedResultsError(f"results line {number} does not hold a bits study")
        return row
    if "evict" in row:
        study = row["evict"]
        if (
            not isinstance(study, dict)
            or not isinstance(study.get("curves"), dict)
            or not isinstance(study["curves"].get("curves"), list)
            or not isinstance(study.get("views"), list)
        ):
            raise DamagedResultsError(f"results line {number} does not hold an eviction study")
        return row
    if "visual_tokens" in row:
        study = row["visual_tokens"]
        if (
            not isinstance(study, dict)
            or not isinstance(study.get("curves"), dict)
            or not isinstance(study["curves"].get("curves"), list)
            or not isinstance(study.get("answer"), dict)
        ):
            raise DamagedResultsError(f"results line {number} does not hold a visual-token study")
        return row
    explanations = row.get("explanations")
    if not isinstance(explanations, dict) or not all(
        _is_outcome(outcome) for outcome in explanations.values()
    ):
        raise DamagedResultsError(
            f"results line {number} does not hold an explanation or error per method"
        )
    return row


def _is_outcome(outcome: Any) -> bool:
    """Whether ``outcome`` is one method's wire result: an Explanation or an error record."""
    if not isinstance(outcome, dict):
        return False
    if "error" not in outcome:
        return isinstance(outcome.get("scores"), list)
    error = outcome["error"]
    return isinstance(error, dict) and all(
        isinstance(error.get(key), str) for key in ("code", "message")
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def set_aside(folder: Path) -> Path:
    """Rename a job folder that cannot be opened out of the way (kept, never deleted); where."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = folder.with_name(f"{folder.name}.unreadable-{stamp}")
    number = 1
    while aside.exists():
        number += 1
        aside = folder.with_name(f"{folder.name}.unreadable-{stamp}-{number}")
    folder.rename(aside)
    return aside


def _errors_of(job_id: str, result: dict[str, Any]) -> list[tuple[Any, ...]]:
    """An instance's errors as ``instance_errors`` rows (a report's row has none)."""
    return [
        (job_id, result["index"], method, outcome["error"]["code"], outcome["error"]["message"])
        for method, outcome in result.get("explanations", {}).items()
        if "error" in outcome
    ]


def cut_torn_tail(path: Path) -> None:
    """Cut a file back to its last newline: what an interrupted write of a line left."""
    if not path.exists():
        return
    with path.open("rb+") as file:
        _cut_to_last_newline(file)


def _cut_to_last_newline(file: BinaryIO) -> None:
    """Cut an open file (read and write) back to its last newline."""
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


def _open_results(path: Path, flags: int) -> BinaryIO:
    """
    A job's results file opened (``os.open`` ``flags``) if it is a regular file of its own.

    A link is not followed and a pipe or device is not waited on: what was planted in the
    results folder is damage, never a file read elsewhere or a request that hangs.

    Raises:
        DamagedResultsError: the entry is a link, a folder, a pipe or a device, or cannot be
            opened.
        FileNotFoundError: there is no file (and ``flags`` do not create one).
    """
    try:
        handle = os.open(path, flags | _RESULTS_OPEN, 0o644)
    except FileNotFoundError:
        raise
    except OSError as err:  # ELOOP: a link; ENXIO: a pipe nobody reads; EISDIR: a folder
        raise DamagedResultsError(f"the results file cannot be opened ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise DamagedResultsError(_NOT_A_FILE)
    if _NO_WAIT:
        os.set_blocking(handle, True)  # a regular file: reads and writes as usual
    return os.fdopen(handle, "rb+" if flags & os.O_RDWR else "rb")


def instance_json(results: InstanceResults) -> dict[str, Any]:
    """One instance's results for the wire: Explanation JSON or ``{"error": ...}`` per method."""
    return {
        method: error_record(outcome) if isinstance(outcome, AttrlabError) else outcome.to_dict()
        for method, outcome in results.items()
    }


@dataclass(frozen=True)
class JobWork:
    """
    What a stored job runs: each instance's worker request, and the result line it writes.

    Attributes:
        request: Instance ``index`` -> the worker request that computes it.
        line: That request's result -> its results line (beside ``index``), such as
            ``{"explanations": ...}`` or ``{"report": ...}`` (see :func:`_checked_row`).
        gate: The checks a new job of this body passes before it is stored (bounds, methods,
            parameters, model), against a worker's current settings; a run of a stored job
            passes them again first (the settings may have changed since).
        error_line: Instance ``index`` and why it is not computed -> its results line, such
            as an error per method; None when one instance's failure fails the job.
    """

    request: Callable[[int], Request[Any]]
    line: Callable[[Any], dict[str, Any]]
    gate: Callable[[ExplainWorker], None]
    error_line: Callable[[int, AttrlabError], dict[str, Any]] | None = None


def batch_work(
    build: Callable[[int], BatchRequest], gate: Callable[[ExplainWorker], None]
) -> JobWork:
    """A batch job's work: instance ``index`` as a worker batch of one, its explanations."""

    def line(results: list[InstanceResults]) -> dict[str, Any]:
        (only,) = results
        return {"explanations": instance_json(only)}

    def error_line(index: int, err: AttrlabError) -> dict[str, Any]:
        return {"explanations": {method: error_record(err) for method in build(index).methods}}

    return JobWork(build, line, gate, error_line)


class JobRunner:
    """
    Runs stored jobs through the worker, oldest first, one instance per worker request.

    ``parse(request)`` reads a stored request (with the API's body parser, so that a stored job
    is read exactly as a live request is) into its :class:`JobWork`: the worker request for
    its instance ``index`` and the line its result writes. One runner per data folder runs jobs
    at a time (an exclusive lock on ``runner.lock``); another server on the same folder queues
    jobs and takes over when the first stops.
    """

    def __init__(
        self,
        store: JobStore,
        worker: ExplainWorker,
        parse: Callable[[dict[str, Any]], JobWork],
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
        try:
            finished = self.store.recount(job.id)  # a crash may have left the count behind
        except DamagedResultsError as err:  # never run on: it would add to a file gone wrong
            self.store.finish(job.id, "failed", f"the job's results are damaged: {err}")
            return
        try:
            work = self.parse(self.store.request(job.id))
        except ValueError:  # a stored request this version of the server cannot read
            self.store.finish(job.id, "failed", "the stored request cannot be read")
            return
        try:  # resumed work passes the gate new work passes, under today's settings
            work.gate(self.worker)
        except AttrlabError as err:
            message = error_record(err)["error"]["message"]
            self.store.finish(job.id, "failed", f"this server refuses the job now: {message}")
            return
        for index in range(job.total):
            if index in finished:
                continue
            if self.store.open_runs(job.id, index) >= MAX_OPEN_RUNS:
                row = self._interrupted(job.id, work, index)
                if row is None or not self._keep(job.id, row):
                    return
                continue
            self.store.start_run(job.id, index)  # open until it ends, unless the server dies
            try:
                row = self._instance(job.id, work, index)
                if row is None or not self._keep(job.id, row):
                    return
            finally:  # closed once its result is on disk, or it ended without one
                self.store.end_run(job.id, index)
        self.store.finish(job.id, "done")

    def _keep(self, job_id: str, row: dict[str, Any]) -> bool:
        """Append an instance's results line; False when the job ended instead (go no further)."""
        try:
            return self.store.append(job_id, row)  # False: cancelled as the instance finished
        except DamagedResultsError as err:  # replaced by a link, a pipe, a folder
            self.store.finish(job_id, "failed", f"the job's results are damaged: {err}")
            return False

    def _instance(self, job_id: str, work: JobWork, index: int) -> dict[str, Any] | None:
        """
        Instance ``index`` computed: its results line; None when the job ended meanwhile.

        Retried while the worker's queue is full; a stop puts the job back in the queue.
        """
        while True:
            if self._stopping.is_set():
                self.store.requeue(job_id)  # resumed by the next start
                return None
            record = self.store.get(job_id)
            if record is None or record.status != "running":  # cancelled meanwhile
                return None
            try:
                result = self._explain(job_id, work.request(index))
            except QueueFullError:  # interactive requests fill the worker's queue
                self._stopping.wait(self.poll_s)
                continue
            except (JobCancelledError, CancelledError):
                continue  # cancelled or stopping: the checks above end the job
            except WorkerClosedError:
                self._stopping.set()  # the worker is gone: so is this runner
                continue
            except AttrlabError as err:  # the model or a method cannot run at all
                self.store.finish(job_id, "failed", error_record(err)["error"]["message"])
                return None
            return {"index": index, **work.line(result)}

    def _interrupted(self, job_id: str, work: JobWork, index: int) -> dict[str, Any] | None:
        """
        Instance ``index``, whose runs the server died in twice, failed: its error line.

        None, and the job failed with the reason, for a job whose instance is all its work.
        """
        err = InstanceInterruptedError(INTERRUPTED)
        log.warning("job %s: instance %d is not run again: %s", job_id, index, INTERRUPTED)
        if work.error_line is None:
            self.store.finish(job_id, "failed", INTERRUPTED)
            return None
        return {"index": index, **work.error_line(index, err)}

    def progress(self, job_id: str) -> tuple[int, int] | None:
        """The steps done of the running instance of ``job_id`` (None: not running one)."""
        with self._lock:
            current = self._current
        if current is None or current[0] != job_id:
            return None
        return current[1].progress

    def _explain(self, job_id: str, request: Request[Any]) -> Any:
        submitted = self.worker.submit(request)
        with self._lock:
            self._current = (job_id, submitted)
        try:
            record = self.store.get(job_id)
            if self._stopping.is_set() or record is None or record.status != "running":
                submitted.cancel()  # a stop or cancel that came before _current was set
            return submitted.result()
        finally:
            with self._lock:
                self._current = None
