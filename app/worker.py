"""The only place that touches the device: model cache, one job at a time, progress, cancel."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from attribution import explain, load
from attribution.errors import InvalidInputError, InvalidParameterError
from attribution.explanation import Explanation
from attribution.methods import get_method
from attribution.models import Adapter
from attribution.params import validate_params
from attribution.run import ProgressCallback

__all__ = ["ExplainRequest", "ExplainWorker", "Job", "parse_param_pairs"]


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
    """One explanation to compute: a model, a method and a text or an image."""

    model: str
    method: str
    text: str | None = None
    image: Any = None
    labels: Sequence[str] | None = None
    target: int | str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    def raw_input(self) -> Any:
        """The text or image, refusing requests that give both or neither."""
        if (self.text is None) == (self.image is None):
            raise InvalidInputError("give exactly one input: a text or an image")
        return self.text if self.text is not None else self.image


@dataclass
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
        allowed_roots: Sequence[str | Path] | None = None,
    ) -> None:
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.max_models = max_models
        self.allowed_roots = allowed_roots
        self._models: OrderedDict[str, Adapter] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attrlab-worker")
        hf_logging.disable_progress_bar()  # weight-loading bars would clutter CLI and server logs

    def adapter(self, spec: str, labels: Sequence[str] | None = None) -> Adapter:
        """Load (or reuse) a model; least recently used models are evicted past ``max_models``."""
        with self._lock:
            adapter = self._models.pop(spec, None)
            if adapter is None:
                adapter = load(spec, device=self.device, allowed_roots=self.allowed_roots)
            self._models[spec] = adapter
            while len(self._models) > self.max_models:
                self._models.popitem(last=False)
        return adapter.with_labels(labels) if labels else adapter

    def submit(self, request: ExplainRequest, progress: ProgressCallback | None = None) -> Job:
        """Queue a request; the returned job reports progress and can be cancelled."""
        job = Job(future=Future(), cancel_event=threading.Event())

        def report(done: int, total: int) -> None:
            job.progress = (done, total)
            if progress is not None:
                progress(done, total)

        job.future = self._executor.submit(self._run, request, report, job.cancel_event)
        return job

    def explain(
        self, request: ExplainRequest, progress: ProgressCallback | None = None
    ) -> Explanation:
        """Submit and wait."""
        return self.submit(request, progress).result()

    def _run(
        self, request: ExplainRequest, progress: ProgressCallback, cancel: threading.Event
    ) -> Explanation:
        raw = request.raw_input()
        validate_params(get_method(request.method).params, request.params)  # fail before loading
        adapter = self.adapter(request.model, request.labels)
        inputs = adapter.preprocess(raw)
        return explain(
            adapter,
            request.method,
            inputs,
            target=request.target,
            params=request.params,
            seed=request.seed,
            progress=progress,
            cancel=cancel,
        )

    def close(self) -> None:
        """Stop accepting work and release the models."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._models.clear()
