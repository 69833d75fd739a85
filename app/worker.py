"""
The only place that touches the device: model cache, one job at a time, progress, cancel.

Every front end submits here, so the server's settings (which models, how large an input, how
many forward passes) are enforced once, for the REST API and the web page alike.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from app.settings import ServerSettings
from attribution import explain, load
from attribution.errors import AttrlabError, InvalidInputError, InvalidParameterError
from attribution.explanation import Explanation
from attribution.methods import get_method
from attribution.models import DEFAULT_MODELS, Adapter, load_image
from attribution.params import validate_params
from attribution.run import ProgressCallback

__all__ = [
    "ExplainRequest",
    "ExplainWorker",
    "Job",
    "QueueFullError",
    "WorkerClosedError",
    "parse_param_pairs",
]


class QueueFullError(AttrlabError):
    """As many requests as the server allows are already waiting; try again shortly."""


class WorkerClosedError(AttrlabError):
    """The worker is shutting down and takes no new work."""


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


@dataclass(frozen=True)
class ExplainRequest:
    """
    One explanation to compute: a model, a method and a text or an image.

    ``image`` holds encoded image bytes or a decoded array, never a path: front ends that read
    files (the CLI) read them before building the request.
    """

    model: str
    method: str
    text: str | None = None
    image: Any = None
    labels: Sequence[str] | None = None
    target: int | str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    next_token: bool = False  # the model must be a decoder LM; its next token is explained
    evaluate: bool = False  # add the map's faithfulness scores (the trust card) to metrics

    @property
    def modality(self) -> str:
        """``"text"`` or ``"image"``, refusing requests that give both or neither."""
        if (self.text is None) == (self.image is None):
            raise InvalidInputError("give exactly one input: a text or an image")
        return "text" if self.text is not None else "image"


@dataclass(eq=False)  # identity: jobs are kept in a set while they wait or run
class Job:
    """A submitted request: its future result, progress and a cancel switch."""

    future: Future
    cancel_event: threading.Event
    progress: tuple[int, int] = (0, 0)

    def cancel(self) -> None:
        """Ask the job to stop at its next batch boundary."""
        self.cancel_event.set()
        self.future.cancel()

    def result(self, timeout: float | None = None) -> Explanation:
        """Wait for the Explanation (re-raising the job's error)."""
        return self.future.result(timeout)


class ExplainWorker:
    """Runs explanations on one device, one at a time, with an LRU cache of loaded models."""

    def __init__(
        self,
        device: str | None = None,
        max_models: int = 3,
        settings: ServerSettings | None = None,
    ) -> None:
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.max_models = max_models
        self.settings = settings or ServerSettings.unrestricted()
        self.model_loads: Counter[str] = Counter()
        self._models: OrderedDict[str, Adapter] = OrderedDict()
        # Two locks: loading a model (seconds, or minutes from the hub) holds only the first,
        # so submitting and status, which the server's event loop calls, never wait for it.
        self._loading = threading.Lock()
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attrlab-worker")
        hf_logging.disable_progress_bar()  # weight-loading bars would clutter CLI and server logs

    def adapter(self, spec: str, labels: Sequence[str] | None = None) -> Adapter:
        """Load (or reuse) a permitted model; the least recently used go past ``max_models``."""
        spec = (spec or "").strip()
        source = self.settings.model_source(spec)
        # A served hub id is always fetched from the hub, never read from a same-named folder.
        hub_only = source == "hub" or (source == "listed" and not os.path.isabs(spec))
        with self._loading:
            with self._lock:
                adapter = self._models.pop(spec, None)
            fresh = adapter is None
            if adapter is None:
                adapter = load(spec, device=self.device, hub_only=hub_only)
            with self._lock:
                self.model_loads[spec] += fresh
                self._models[spec] = adapter
                while len(self._models) > self.max_models:
                    self._models.popitem(last=False)
        return adapter.with_labels(labels) if labels else adapter

    def submit(self, request: ExplainRequest, progress: ProgressCallback | None = None) -> Job:
        """
        Queue a request; the returned job reports progress and can be cancelled.

        Raises:
            AttrlabError: at once, for a request out of bounds, a full queue or a closed worker.
        """
        request.modality  # noqa: B018 - exactly one input, checked before queueing
        self.settings.check_request(request.text, request.labels, request.target, request.seed)
        job = Job(future=Future(), cancel_event=threading.Event())
        with self._lock:
            if self._closed:
                raise WorkerClosedError("the server is shutting down; try again later")
            if len(self._jobs) >= self.settings.max_queue:
                raise QueueFullError(
                    f"{len(self._jobs)} requests are already queued (the limit); try again shortly"
                )
            self._jobs.add(job)

        def report(done: int, total: int) -> None:
            job.progress = (done, total)
            if progress is not None:
                progress(done, total)

        job.future = self._executor.submit(self._run, request, report, job.cancel_event)
        job.future.add_done_callback(lambda _: self._finished(job))
        return job

    def _finished(self, job: Job) -> None:
        with self._lock:
            self._jobs.discard(job)

    def explain(
        self, request: ExplainRequest, progress: ProgressCallback | None = None
    ) -> Explanation:
        """Submit and wait."""
        return self.submit(request, progress).result()

    def status(self) -> dict[str, Any]:
        """Device, loaded models, how often each was loaded, and the queue length."""
        with self._lock:
            return {
                "device": self.device,
                "models_loaded": list(self._models),
                "model_loads": dict(self.model_loads),
                "queued": len(self._jobs),
                "max_queue": self.settings.max_queue,
            }

    def _run(
        self, request: ExplainRequest, progress: ProgressCallback, cancel: threading.Event
    ) -> Explanation:
        method = get_method(request.method)
        # Fail on bad parameters before loading a model; budgets apply to resolved values.
        self.settings.check_params(method.name, validate_params(method.params, request.params))
        adapter = self.adapter(request.model, request.labels)
        if adapter.modality != request.modality:
            raise InvalidInputError(
                f"model '{adapter.model_id}' takes {_article(adapter.modality)} as input, but "
                f"the request gives {_article(request.modality)}"
            )
        if request.next_token and adapter.family != "decoder-lm":
            raise InvalidInputError(
                f"a next-token explanation needs a decoder LM; model '{adapter.model_id}' is a "
                f"{adapter.family} (the default LM is '{DEFAULT_MODELS['next-token']}')"
            )
        raw = (
            request.text
            if request.text is not None
            else load_image(request.image, max_pixels=self.settings.max_image_pixels)
        )
        return explain(
            adapter,
            method.name,
            adapter.preprocess(raw),
            target=request.target,
            params=request.params,
            seed=request.seed,
            progress=progress,
            cancel=cancel,
            max_forward_passes=self.settings.max_forward_passes,
            evaluate=request.evaluate,
        )

    def close(self) -> None:
        """Stop accepting work, cancel what is queued or running, and release the models."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs)
        for job in jobs:  # the running job stops at its next batch boundary
            job.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._models.clear()


def _article(modality: str) -> str:
    return "an image" if modality == "image" else "text"
