"""
A job runner whose server stops while one instance runs, run as its own process.

``python _dying_runner.py DATA MODEL JOB INDEX MARKS HOW`` runs the jobs in ``DATA`` (serving
``MODEL``) as a server does, and notes each run of instance ``INDEX`` that starts as a line
(its text) in ``MARKS``. That run then ends the process as ``HOW`` says:

- ``kill``: at once, as the kernel kills a server out of memory (exit 137, nothing cleaned up);
- ``stop``: the runner is stopped as a server that is asked to stop stops it (exit 3).

The process exits 0 once job ``JOB`` has ended.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from _jobs import job_settings

from attrlab.app.api import job_parser
from attrlab.app.jobs import JobRunner, JobStore, JobWork
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import JobCancelledError
from attrlab.attribution.request import BatchRequest, InstanceResults, JobContext

#: Exit status of a process the kernel killed (128 + SIGKILL).
KILLED = 137
#: Exit status after a stop asked for while the instance ran.
STOPPED = 3

_stop_asked = threading.Event()


@dataclass(frozen=True, kw_only=True)
class _Dying(BatchRequest):
    """A batch of one whose run ends the server (``how``), noted in ``marks`` first."""

    marks: str = ""
    how: str = "kill"

    def run_on(self, adapter: Any, run: JobContext) -> list[InstanceResults]:
        with open(self.marks, "a") as marks:
            marks.write(f"{self.instances[0].text}\n")
        if self.how == "kill":
            os._exit(KILLED)
        _stop_asked.set()  # the main thread stops the runner, which cancels this run
        cancel = run.settings.cancel
        assert cancel is not None
        cancel.wait(60)
        raise JobCancelledError("stopped")


def main(data: Path, model: str, job_id: str, index: int, marks: str, how: str) -> int:
    """Run the folder's jobs until ``job_id`` ends, or until instance ``index`` ends the server."""
    store = JobStore(data / "jobs")
    worker = ExplainWorker(device="cpu", settings=job_settings(data, model))

    def parse(stored: dict[str, Any]) -> JobWork:
        work = job_parser(stored)

        def request(number: int) -> Any:
            built = work.request(number)
            if number != index:
                return built
            kept = {f.name: getattr(built, f.name) for f in fields(built)}
            return _Dying(**kept, marks=marks, how=how)

        return replace(work, request=request)

    runner = JobRunner(store, worker, parse, poll_s=0.05)
    runner.start()
    try:
        while not _stop_asked.is_set():
            record = store.get(job_id)
            if record is None or record.status not in ("queued", "running"):
                return 0
            time.sleep(0.05)
        return STOPPED
    finally:
        runner.stop()
        worker.close()


if __name__ == "__main__":
    folder, model_name, job, number, marks_path, ending = sys.argv[1:]
    sys.exit(main(Path(folder), model_name, job, int(number), marks_path, ending))
