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
from attrlab.app.worker import ExplainWorker, Job
from attrlab.attribution.errors import AttrlabError
from attrlab.attribution.request import ExplainRequest, Request
from attrlab.attribution.request.run import ProgressCallback

__all__ = ["PageRunner", "Runner", "queued_cost"]

log = logging.getLogger(__name__)

#: How a page's request is run: through the worker's queue, or (a Space) in a GPU slot.
Runner = Callable[[Request[Any], ProgressCallback], Any]


class PageRunner:
    """
    Runs the page's requests with a progress bar and an ETA; Cancel stops a tab's job.

    Jobs are keyed by session and tab, so Cancel stops only the job of the tab it sits on. The
    worker runs a job on its own threads, where Gradio's progress bar cannot be reached: the
    handler's thread polls the job's progress and moves the bar. With a ``run`` (a Space's GPU
    slots) a job cannot be stopped once started; Cancel then only frees the page. User errors
    become a message on the page, bugs a generic one.

    The bar moves only when the count changed, and at most every :attr:`bar_s`: each move is a
    message that Gradio's page handles for every component that ever showed a status (hundreds
    here, for the shared link's fields), about 0.1 s of its main thread on 2 cores. At four a
    second a long run kept the page that busy, and where it got less than that of a core its
    backlog grew without end: a click waited a minute after a few minutes of run.
    """

    #: How often the handler's thread reads the job's progress (seconds).
    poll_s = 0.25
    #: The least time between two moves of the progress bar (seconds); the last one always goes.
    bar_s = 1.0

    def __init__(self, worker: ExplainWorker, run: Runner | None = None) -> None:
        self.worker = worker
        self._run = run
        self._jobs: dict[tuple[str, str], set[Job[Any]]] = {}
        self._lock = threading.Lock()

    def __call__(
        self,
        request: Request[Any],
        progress: Callable[..., Any],
        session: str | None = None,
        tab: str = "",
    ) -> Any:
        report = _ProgressBar(progress, self.bar_s)
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


class _ProgressBar:
    """
    Gradio's progress bar with an ETA, as a :data:`ProgressCallback`: ``done`` of ``total``.

    A count already shown is not sent again, nor a new one within ``every_s`` of the last move
    once the bar has left 0; the first steps (they start the ETA) and the end (the bar ends full)
    always are.
    """

    def __init__(self, progress: Callable[..., Any], every_s: float) -> None:
        self._progress = progress
        self._every_s = every_s
        self._started: float | None = None  # when the passes began (not the wait or the load)
        self._shown: tuple[int, int] | None = None
        self._moved = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._started is None:
            self._started = now
        if (done, total) == self._shown:
            return
        moving = self._shown is not None and self._shown[0] > 0
        if moving and done < total and now - self._moved < self._every_s:
            return
        self._shown, self._moved = (done, total), now
        eta = ""
        if 0 < done < total:  # the rate so far, over what is left
            left = (now - self._started) / done * (total - done)
            eta = f", ≈ {left:,.0f} s left" if left >= 1 else ", < 1 s left"
        self._progress(done / max(total, 1), desc=f"{done:,}/{total:,} steps{eta}")


def queued_cost(worker: ExplainWorker, request: ExplainRequest) -> str:
    """One method's estimate, through the worker's queue (it calibrates once per model)."""
    try:
        return worker.explain(request.costs()[0]).summary()
    except AttrlabError as err:
        return f"cannot estimate ({public_message(str(err))})"
    except Exception:
        log.exception("estimate failed")
        return "cannot estimate (internal error; the server log has details)"
