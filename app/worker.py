"""
The only place that touches the device: model cache, one job at a time, progress, cancel.

Every front end submits the library's requests (:mod:`attribution.request`) here, and the
worker passes each through the library's gate with this server's settings as its bounds
(:func:`~attribution.request.admit` before queueing, :func:`~attribution.request.resolve`
once the model is loaded), so a request is refused alike through REST, the page, the Space
and the command line.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from transformers.utils import logging as hf_logging

from attrlab.app.settings import ServerSettings
from attrlab.attribution import load
from attrlab.attribution.alteration import unaltered
from attrlab.attribution.errors import AttrlabError, InvalidParameterError
from attrlab.attribution.models import Adapter
from attrlab.attribution.models.loading import resolve_device
from attrlab.attribution.models.placement import placement_of, private_offload
from attrlab.attribution.request import (
    Request,
    admit,
    resolve,
)
from attrlab.attribution.request.run import ProgressCallback

__all__ = [
    "ExplainWorker",
    "InstanceInterruptedError",
    "Job",
    "JobTableBusyError",
    "QueueFullError",
    "WorkerClosedError",
    "parse_param_pairs",
    "visible_devices",
]


#: What a job computes: an Explanation, a check of several methods, a preview, a table.
Result = TypeVar("Result")


class InstanceInterruptedError(AttrlabError):
    """A job's instance not run again: the server stopped in its runs (killed, say) twice."""


class QueueFullError(AttrlabError):
    """As many requests as the server allows are already waiting; try again shortly."""


class WorkerClosedError(AttrlabError):
    """The worker is shutting down and takes no new work."""


class JobTableBusyError(AttrlabError):
    """The job table cannot be used now: locked by another process, read-only, or no room."""


def parse_param_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["n_steps=20", ...]`` -> ``{"n_steps": "20"}``; values are typed by the method schema."""
    params = {}
    for pair in (p.strip() for p in pairs):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidParameterError(f"parameters are written key=value; got {pair!r}")
        params[key.strip()] = value.strip()
    return params


@dataclass(eq=False)  # identity: jobs are kept in a set while they wait or run
class Job(Generic[Result]):
    """A submitted request: its future result, progress and a cancel switch."""

    future: Future[Result]
    cancel_event: threading.Event
    progress: tuple[int, int] = (0, 0)

    def cancel(self) -> None:
        """Ask the job to stop at its next forward pass or step (a queued one never starts)."""
        self.cancel_event.set()
        self.future.cancel()

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the result (re-raising the job's error)."""
        return self.future.result(timeout)


def visible_devices(device: str | None = None) -> list[str]:
    """
    The devices a worker runs on: each visible GPU for ``None`` or ``"cuda"``, else ``device``.

    A comma-separated list names several (``"cuda:0,cuda:2"``); each gets its own lane.

    Raises:
        InvalidInputError: an unknown device, or CUDA where no GPU is visible.
    """
    if device is None or device.strip() == "cuda":
        if device is not None:
            resolve_device("cuda")  # refuses CUDA where no GPU is visible
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{index}" for index in range(count)] or ["cpu"]
    parts = [part.strip() for part in device.split(",") if part.strip()]
    return [str(resolve_device(part)) for part in parts] or ["cpu"]


#: Light requests one lane answers at once beside its job.
_LIGHT_THREADS = 2


class _Lane:
    """One device: its loaded models (least recently used first), one job at a time, its jobs."""

    def __init__(self, device: str, index: int) -> None:
        self.device = device
        self.models: OrderedDict[str, Adapter] = OrderedDict()
        self.jobs: set[Job[Any]] = set()
        # Loading a model (seconds, or minutes from the hub) holds only this lock, so
        # submitting and status, which the server's event loop calls, never wait for it.
        self.loading = threading.Lock()
        # One job at a time on the device, whether from the queue or run in the caller's thread.
        self.running = threading.Lock()
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"attrlab-worker-{index}"
        )
        # Light requests (predictions, estimates) on a loaded model: beside the running job.
        self.light = ThreadPoolExecutor(
            max_workers=_LIGHT_THREADS, thread_name_prefix=f"attrlab-light-{index}"
        )


class ExplainWorker:
    """
    Runs jobs one at a time per device, with an LRU cache of loaded models on each.

    With several devices (every visible GPU by default) each job goes to the device with the
    fewest jobs, preferring one that already holds the job's model. With a placement that
    spreads models (the settings' device map or quantisation) there is one lane, ``device`` is
    not used, and the models' disk layers go to a private folder removed by :meth:`close`.
    """

    def __init__(
        self,
        device: str | None = None,
        max_models: int = 3,
        settings: ServerSettings | None = None,
    ) -> None:
        self.settings = settings or ServerSettings.unrestricted()
        # a spread model spans devices itself: one copy, so one lane, named after what places it
        spread = self.settings.placement.spread
        self.devices = ["device_map"] if spread else visible_devices(device)
        self.device = ",".join(self.devices)
        self.max_models = max_models
        self._cleanup = ExitStack()
        self.placement = self._cleanup.enter_context(private_offload(self.settings.placement))
        self.model_loads: Counter[str] = Counter()
        self._lanes = [_Lane(name, index) for index, name in enumerate(self.devices)]
        self._lock = threading.Lock()
        self._closed = False
        hf_logging.disable_progress_bar()  # weight-loading bars would clutter CLI and server logs

    def adapter(
        self, spec: str, labels: Sequence[str] | None = None, lane: _Lane | None = None
    ) -> Adapter:
        """Load (or reuse) a permitted model; the least recently used go past ``max_models``."""
        spec = (spec or "").strip()
        lane = lane or self._lanes[0]
        source = self.settings.model_source(spec)
        # A served hub id is always fetched from the hub, never read from a same-named folder.
        hub_only = source == "hub" or (source == "listed" and not os.path.isabs(spec))
        # A folder under a model root: each file it holds must stay under the roots too.
        within = self.settings.model_roots if source == "local" else None
        with lane.loading:
            with self._lock:
                adapter = lane.models.pop(spec, None)
            fresh = adapter is None
            if adapter is None:
                adapter = load(
                    spec,
                    device=lane.device,
                    hub_only=hub_only,
                    within=within,
                    placement=self.placement,
                )
            with self._lock:
                self.model_loads[spec] += fresh
                lane.models[spec] = adapter
                while len(lane.models) > self.max_models:
                    lane.models.popitem(last=False)
        return adapter.with_labels(labels) if labels else adapter

    def submit(
        self,
        request: Request[Result],
        progress: ProgressCallback | None = None,
        strict: bool = False,
    ) -> Job[Result]:
        """
        Queue a request; the returned job reports progress and can be cancelled.

        ``strict``: see :meth:`validate`.

        Raises:
            AttrlabError: at once, for a request out of bounds, a full queue or a closed worker.
        """
        self.validate(request, strict)  # before queueing
        job: Job[Result] = Job(future=Future(), cancel_event=threading.Event())
        model = request.chosen_model.strip()
        with self._lock:
            if self._closed:
                raise WorkerClosedError("the server is shutting down; try again later")
            queued = sum(len(lane.jobs) for lane in self._lanes)
            if queued >= self.settings.max_queue:
                raise QueueFullError(
                    f"{queued} requests are already queued (the limit); try again shortly"
                )
            holding = [lane for lane in self._lanes if model in lane.models]
            loaded = min(holding, key=lambda lane: len(lane.jobs)) if holding else None
            if loaded is not None and request.reads_only(loaded.models[model]):
                lane, light = loaded, True
            else:
                lane = min(self._lanes, key=lambda lane: (len(lane.jobs), model not in lane.models))
                light = False
            lane.jobs.add(job)

        def report(done: int, total: int) -> None:
            job.progress = (done, total)
            if progress is not None:
                progress(done, total)

        if light:
            job.future = lane.light.submit(self._run_light, request, report, job.cancel_event, lane)
        else:
            job.future = lane.executor.submit(self._run, request, report, job.cancel_event, lane)
        job.future.add_done_callback(lambda _: self._finished(job, lane))
        return job

    def validate(self, request: Request[Any], strict: bool = False) -> None:
        """
        Refuse a request this server will not run, without loading anything.

        The library's :func:`~attribution.request.admit` (``strict``: its), then whether this
        server serves the model.

        Raises:
            AttrlabError: as :func:`~attribution.request.admit`; a model this server does not
                serve.
        """
        admit(request, self.settings, strict)
        self.settings.model_source(request.chosen_model.strip())

    def _finished(self, job: Job[Any], lane: _Lane) -> None:
        with self._lock:
            lane.jobs.discard(job)

    def explain(self, request: Request[Result], progress: ProgressCallback | None = None) -> Result:
        """Submit and wait."""
        return self.submit(request, progress).result()

    def run_here(
        self, request: Request[Result], progress: ProgressCallback | None = None
    ) -> Result:
        """
        Run a request in the calling thread, on the first device, bypassing the queue.

        For callers that bring their own process or queue (a ZeroGPU slot runs in a forked
        process, where the worker's threads do not exist); jobs still run one at a time.

        Raises:
            AttrlabError: as :meth:`submit`, and the job's own errors.
        """
        self.validate(request)
        if self._closed:
            raise WorkerClosedError("the server is shutting down; try again later")
        return self._run(request, progress or _silent, threading.Event(), self._lanes[0])

    def status(self) -> dict[str, Any]:
        """Devices, loaded models (and where each is), how often each was loaded, the queue."""
        with self._lock:
            loaded = {spec: a.model for lane in self._lanes for spec, a in lane.models.items()}
            return {
                "device": self.device,
                "devices": [
                    {
                        "device": lane.device,
                        "queued": len(lane.jobs),
                        "models_loaded": list(lane.models),
                    }
                    for lane in self._lanes
                ],
                "models_loaded": list(loaded),
                "placements": {spec: placement_of(model) for spec, model in loaded.items()},
                "model_loads": dict(self.model_loads),
                "queued": sum(len(lane.jobs) for lane in self._lanes),
                "max_queue": self.settings.max_queue,
            }

    def _run(
        self,
        request: Request[Result],
        progress: ProgressCallback,
        cancel: threading.Event,
        lane: _Lane,
    ) -> Result:
        with lane.running:  # one job at a time on a device, queued or run in place
            base = self.adapter(request.chosen_model, None, lane)
            return self._execute(request, base, progress, cancel)

    def _run_light(
        self,
        request: Request[Result],
        progress: ProgressCallback,
        cancel: threading.Event,
        lane: _Lane,
    ) -> Result:
        """
        A request that only reads a loaded model: beside the lane's job.

        It never reads the model inside an alteration (:mod:`attribution.alteration`): it waits
        for one to end.
        """
        with self._lock:
            model = request.chosen_model.strip()
            base = lane.models.get(model)
            if base is not None:
                lane.models.move_to_end(model)
        if base is None:  # evicted since it was submitted: loading is a job's work
            return self._run(request, progress, cancel, lane)
        with unaltered(base.model, cancel):
            return self._execute(request, base, progress, cancel)

    def _execute(
        self,
        request: Request[Result],
        base: Adapter,
        progress: ProgressCallback,
        cancel: threading.Event,
    ) -> Result:
        """Run ``request`` on the loaded model ``base`` (its labels applied here)."""
        adapter = base.with_labels(request.labels) if request.labels else base
        return request.run_on(adapter, resolve(request, adapter, self.settings, progress, cancel))

    def close(self) -> None:
        """Stop accepting work, cancel what is queued or running, and release the models."""
        with self._lock:
            self._closed = True
            jobs = [job for lane in self._lanes for job in lane.jobs]
        for job in jobs:  # a running job stops at its next batch boundary
            job.cancel()
        for lane in self._lanes:
            lane.executor.shutdown(wait=False, cancel_futures=True)
            lane.light.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for lane in self._lanes:
                lane.models.clear()
        self._cleanup.close()  # the private offload folder, once no model reads it


def _silent(done: int, total: int) -> None:
    """No progress to report."""
