"""How the page runs a request: the worker's queue (or a Space's slots), a progress bar, Cancel."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout  # builtin only from 3.11
from typing import Any

import gradio as gr

from attrlab.app.errors import public_message
from attrlab.app.ui.shared import session
from attrlab.app.worker import ExplainRequest, ExplainWorker, Job, WorkerRequest
from attrlab.attribution.errors import AttrlabError
from attrlab.attribution.run import ProgressCallback

__all__ = ["PageRunner", "Runner", "queued_cost"]

log = logging.getLogger(__name__)

#: How a page's request is run: through the worker's queue, or (a Space) in a GPU slot.
Runner = Callable[[WorkerRequest[Any], ProgressCallback], Any]


class PageRunner:
    """
    Runs the page's requests with a progress bar and an ETA; Cancel stops a tab's job.

    Jobs are keyed by session and tab, so Cancel stops only the job of the tab it sits on. The
    worker runs a job on its own threads, where Gradio's progress bar cannot be reached: the
    handler's thread polls the job's progress and moves the bar. With a ``run`` (a Space's GPU
    slots) a job cannot be stopped once started; Cancel then only frees the page. User errors
    become a message on the page, bugs a generic one.
    """

    #: How often the handler's thread moves the progress bar (seconds).
    poll_s = 0.25

    def __init__(self, worker: ExplainWorker, run: Runner | None = None) -> None:
        self.worker = worker
        self._run = run
        self._jobs: dict[tuple[str, str], set[Job[Any]]] = {}
        self._lock = threading.Lock()

    def __call__(
        self,
        request: WorkerRequest[Any],
        progress: Callable[..., Any],
        session: str | None = None,
        tab: str = "",
    ) -> Any:
        report = _eta_reporter(progress)
        try:
            if self._run is not None:
                return self._run(request, report)
            return self._wait(self.worker.submit(request), (session or "", tab), report)
        except gr.Error:  # already a message for the page (ZeroGPU's own errors among them)
            raise
        except CancelledError:  # cancelled while it waited in the queue
            raise gr.Error("the job was cancelled") from None
        except AttrlabError as err:
            raise gr.Error(public_message(str(err))) from None
        except Exception:
            log.exception("a page request failed")
            raise gr.Error("internal error; the server log has details") from None

    def _wait(self, job: Job[Any], key: tuple[str, str], report: ProgressCallback) -> Any:
        with self._lock:
            self._jobs.setdefault(key, set()).add(job)  # a tab may run two (Predict and Run)
        try:
            while True:
                try:
                    result = job.result(timeout=self.poll_s)
                except FutureTimeout:
                    done, total = job.progress
                    if total:
                        report(done, total)
                    continue
                done, total = job.progress
                if total:  # the bar ends full, however short the job
                    report(done, total)
                return result
        finally:
            with self._lock:
                running = self._jobs.get(key, set())
                running.discard(job)
                if not running:
                    self._jobs.pop(key, None)

    def cancel_handler(self, tab: str) -> Callable[[gr.Request], None]:
        """The Cancel button of ``tab``: it stops the clicking session's job on that tab."""

        def cancel(request: gr.Request) -> None:
            self.cancel(session(request), tab)

        return cancel

    def cancel(self, session: str | None, tab: str = "") -> None:
        """Stop the job of ``session`` on ``tab`` in the worker (it leaves no model patched)."""
        with self._lock:
            jobs = list(self._jobs.get((session or "", tab), ()))
        for job in jobs:
            job.cancel()


def _eta_reporter(progress: Callable[..., Any]) -> ProgressCallback:
    started: list[float] = []  # when the passes began (not the wait, load and calibration)

    def report(done: int, total: int) -> None:
        if not started:
            started.append(time.monotonic())
        eta = ""
        if 0 < done < total:  # the rate so far, over what is left
            left = (time.monotonic() - started[0]) / done * (total - done)
            eta = f", ≈ {left:,.0f} s left" if left >= 1 else ", < 1 s left"
        progress(done / max(total, 1), desc=f"{done:,}/{total:,} steps{eta}")

    return report


def queued_cost(worker: ExplainWorker, request: ExplainRequest) -> str:
    """One method's estimate, through the worker's queue (it calibrates once per model)."""
    try:
        return worker.explain(request.costs()[0]).summary()
    except AttrlabError as err:
        return f"cannot estimate ({public_message(str(err))})"
    except Exception:
        log.exception("estimate failed")
        return "cannot estimate (internal error; the server log has details)"
