"""
Hugging Face Space entry: the same page, plus a batch endpoint in Gradio's API.

On a ZeroGPU Space (the ``spaces`` package, with ``SPACES_ZERO_GPU`` set by the platform) every
explanation runs inside a ``spaces.GPU`` function, in ZeroGPU's GPU process, and asks for a slot
as long as its cost estimate says: twice the estimate plus 10 s, within
``ATTRLAB_SPACE_MAX_SLOT`` seconds (a job priced over that is refused before it starts, with
what to lower). Estimates need the model on the device, which the main process must not touch,
so each slot computes its jobs' estimates (``attribution.estimate``) and hands them back as
seconds per character of text (per image: images are resized to the model's input); the next
job of the same model, method and parameters is priced from them, and a first job asks for
:data:`FIRST_SLOT_S`. Mounted FastAPI routes get no ZeroGPU slot, so the batch endpoint is a
Gradio API function (``/explain_batch``, the body of ``POST /api/v1/explain``).

Without ZeroGPU (no ``spaces``, or a CPU or GPU Space, where ``spaces.GPU`` is a no-op) the page
runs as ``attrlab serve`` runs it. Run: ``python app/space.py`` (what a Space's ``app_file``
does).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):  # run as a file, as a Space runs its app_file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gradio as gr
from pydantic import ValidationError

from app.api import ExplainBody
from app.errors import public_message, validation_problems
from app.jobs import instance_json
from app.settings import ServerSettings
from app.ui import build_ui
from app.worker import (
    EstimateRequest,
    ExplainRequest,
    ExplainWorker,
    TooSlowError,
    WorkerRequest,
    lighter,
)
from attribution.errors import AttrlabError
from attribution.run import ProgressCallback

__all__ = ["FIRST_SLOT_S", "SpaceRunner", "build_space"]

try:
    import spaces
except ImportError:  # not a Space, or a Space without ZeroGPU
    spaces = None

#: Whether GPU work runs in ZeroGPU slots (the platform sets SPACES_ZERO_GPU).
ZERO_GPU = spaces is not None and bool(spaces.config.Config.zero_gpu)

#: Slot of a job not priced yet (seconds).
FIRST_SLOT_S = 60
#: Margin over the estimate, whose seconds are within a factor 2 on the embedded models.
SLOT_FACTOR, SLOT_EXTRA_S = 2.0, 10

Result = TypeVar("Result")
#: What prices alike: model, labels, next token or not, method, parameters, trust card.
PriceKey = tuple[Any, ...]


class SpaceRunner:
    """
    Runs page and API requests in GPU slots sized by their cost estimates.

    ``gpu`` makes a function run in a GPU slot, given a ``duration`` callable (``spaces.GPU``
    on ZeroGPU); without it requests go through the worker's queue.
    """

    def __init__(
        self, worker: ExplainWorker, max_slot_s: int, gpu: Callable[..., Any] | None = None
    ) -> None:
        self.worker = worker
        self.max_slot_s = max_slot_s
        self._seconds_per_unit: dict[PriceKey, float] = {}
        self._lock = threading.Lock()
        self._on_gpu = gpu(self._run_on_device, duration=self.slot_s) if gpu else None

    def priced_s(self, request: WorkerRequest[Any]) -> float | None:
        """Seconds from earlier slots' estimates; None while any part was never priced."""
        total = 0.0
        costs = request.costs()
        with self._lock:
            for cost in costs:
                key, units = _price_key(cost)
                if key not in self._seconds_per_unit:
                    return None
                total += self._seconds_per_unit[key] * units
        return total if costs else None

    def slot_s(self, request: WorkerRequest[Any]) -> int:
        """The slot a job asks for: from its estimate, or the first-job slot."""
        seconds = self.priced_s(request)
        if seconds is None:
            return min(self.max_slot_s, FIRST_SLOT_S)
        return min(self.max_slot_s, math.ceil(SLOT_FACTOR * seconds + SLOT_EXTRA_S))

    def cost_line(self, request: ExplainRequest) -> str:
        """The page's estimate before Run, without touching the GPU."""
        seconds = self.priced_s(request)
        if seconds is None:
            return "Cost: known after the first run of this model, method and parameters."
        return f"Cost: ≈ {seconds:,.1f} s on the GPU (from the estimates of earlier runs)"

    def run(
        self, request: WorkerRequest[Result], progress: ProgressCallback | None = None
    ) -> Result:
        """
        Run a request: in a GPU slot on ZeroGPU, else in the worker's queue.

        Raises:
            TooSlowError: priced over the longest slot, before any slot is asked for.
            AttrlabError: the job's own errors (carried back from the slot as values, since
                ZeroGPU passes only Gradio's errors through unchanged).
        """
        if self._on_gpu is None:
            return self.worker.explain(request, progress=progress)
        seconds = self.priced_s(request)
        if seconds is not None and SLOT_FACTOR * seconds + SLOT_EXTRA_S > self.max_slot_s:
            methods = ", ".join(request.method_params())
            raise TooSlowError(
                f"this request would take about {seconds:,.0f} s on the GPU; this Space's slots "
                f"last at most {self.max_slot_s} s: {lighter(next(iter(request.method_params())))}"
                f" ({methods})"
            )
        outcome, seconds_per_unit = self._on_gpu(request)
        with self._lock:
            self._seconds_per_unit.update(seconds_per_unit)
        if isinstance(outcome, AttrlabError):
            raise outcome
        return outcome

    def _run_on_device(
        self, request: WorkerRequest[Result]
    ) -> tuple[Result | AttrlabError, dict[PriceKey, float]]:
        """In the slot: estimate the job's parts (pricing the next ones), then run it."""
        seconds_per_unit = {}
        for cost in request.costs():
            try:
                found = self.worker.run_here(cost)
            except AttrlabError:  # the job itself reports what is wrong with this part
                continue
            key, units = _price_key(cost)
            seconds_per_unit[key] = found.seconds / units
        try:
            outcome: Result | AttrlabError = self.worker.run_here(request)
        except AttrlabError as err:
            outcome = err
        return outcome, seconds_per_unit


def _price_key(cost: EstimateRequest) -> tuple[PriceKey, int]:
    """What prices alike, and the input's size in units: characters, or 1 per image."""
    key = (
        cost.model,
        tuple(cost.labels or ()),
        cost.next_token,
        cost.method,
        json.dumps(cost.params, sort_keys=True, default=str),
        cost.evaluate,
        "text" if cost.text is not None else "image",
    )
    return key, max(1, len(cost.text)) if cost.text is not None else 1


def build_space(settings: ServerSettings | None = None) -> gr.Blocks:
    """The Space's Blocks: the page, its runs in GPU slots, and ``/explain_batch``."""
    settings = settings or ServerSettings.for_server()
    # On ZeroGPU the worker runs only inside slots (which see one GPU); naming the device keeps
    # the main process from asking CUDA how many there are.
    worker = ExplainWorker(device="cuda:0" if ZERO_GPU else None, settings=settings)
    max_slot_s = int(os.environ.get("ATTRLAB_SPACE_MAX_SLOT", "120"))
    runner = SpaceRunner(worker, max_slot_s, gpu=spaces.GPU if ZERO_GPU else None)
    page_run: Callable[..., Any] = runner.run
    demo = build_ui(worker, run=page_run, cost=runner.cost_line if ZERO_GPU else None)

    def explain_batch(body: dict[str, Any]) -> dict[str, Any]:
        """The body of ``POST /api/v1/explain`` (one input or ``instances``), its answer."""
        try:
            parsed = ExplainBody.model_validate(body)
            if parsed.instances is None:
                return runner.run(parsed.to_request()).to_dict()
            results = runner.run(parsed.to_batch())
        except ValidationError as err:
            raise gr.Error(f"invalid request: {validation_problems(list(err.errors()))}") from None
        except AttrlabError as err:
            raise gr.Error(public_message(str(err))) from None
        return {"explanations": [instance_json(r) for r in results]}

    with demo:
        gr.api(explain_batch, api_name="explain_batch")
    return demo.queue(max_size=settings.max_queue)


if __name__ == "__main__":
    build_space().launch(server_name="0.0.0.0", show_error=False)
