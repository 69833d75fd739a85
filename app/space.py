"""
Hugging Face Space entry: the same page, plus a batch endpoint in Gradio's API.

On a ZeroGPU Space (the ``spaces`` package, with ``SPACES_ZERO_GPU`` set by the platform) every
explanation runs inside a ``spaces.GPU`` function, in ZeroGPU's GPU process, and asks for a slot
as long as its cost estimate says (twice the estimate plus a margin for loading, within
``ATTRLAB_SPACE_MAX_SLOT`` seconds). The main process never initialises CUDA: it prices a job
from costs measured in earlier slots (each slot hands its measured costs back), and a model's
first job gets :data:`FIRST_SLOT_S`. Mounted FastAPI routes get no ZeroGPU slot, so the batch
endpoint is a Gradio API function (``/explain_batch``, the REST body of ``POST /api/v1/explain``).

Without ZeroGPU (no ``spaces``, or a CPU or GPU Space, where ``spaces.GPU`` is a no-op) the page
runs as ``attrlab serve`` runs it. Run: ``python app/space.py`` (what a Space's ``app_file``
does).
"""

from __future__ import annotations

import math
import os
import sys
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
from app.worker import ExplainWorker, WorkerRequest
from attribution.errors import AttrlabError, NotCalibratedError
from attribution.estimate import adopt_calibrations, calibration_snapshots
from attribution.run import ProgressCallback

__all__ = ["FIRST_SLOT_S", "SpaceRunner", "build_space"]

try:
    import spaces
except ImportError:  # not a Space, or a Space without ZeroGPU
    spaces = None

#: Whether GPU work runs in ZeroGPU slots (the platform sets SPACES_ZERO_GPU).
ZERO_GPU = spaces is not None and bool(spaces.config.Config.zero_gpu)

#: Slot of a model's first job, before any of its costs were measured (seconds).
FIRST_SLOT_S = 60
#: Margin over the estimate, whose seconds are within a factor 2 on the embedded models.
SLOT_FACTOR, SLOT_EXTRA_S = 2.0, 10

Result = TypeVar("Result")


class SpaceRunner:
    """Runs page and API requests in GPU slots sized by their cost estimates."""

    def __init__(
        self, worker: ExplainWorker, max_slot_s: int, gpu: Callable[..., Any] | None = None
    ) -> None:
        """``gpu`` makes a function run in a GPU slot (``spaces.GPU`` on ZeroGPU, else none)."""
        self.worker = worker
        self.max_slot_s = max_slot_s
        self._on_gpu = gpu(self._run_on_device, duration=self.slot_s) if gpu else None

    def slot_s(self, request: WorkerRequest[Any]) -> int:
        """The slot a job asks for: from its estimate, or the first-job slot."""
        try:
            seconds = sum(cost.seconds for cost in self.worker.price(request))
        except NotCalibratedError:
            return min(self.max_slot_s, FIRST_SLOT_S)
        except AttrlabError:  # refused in the slot at once, with its message
            return SLOT_EXTRA_S
        return min(self.max_slot_s, math.ceil(SLOT_FACTOR * seconds + SLOT_EXTRA_S))

    def run(
        self, request: WorkerRequest[Result], progress: ProgressCallback | None = None
    ) -> Result:
        """Run a request: in a GPU slot on ZeroGPU, else in the worker's queue."""
        if self._on_gpu is None:
            return self.worker.explain(request, progress=progress)
        result, costs = self._on_gpu(request)
        adopt_calibrations(costs)  # the next job of this model is priced from them
        return result

    def _run_on_device(self, request: WorkerRequest[Result]) -> tuple[Result, list[dict[str, Any]]]:
        """In the slot: measure the costs the estimate needs, run, hand the costs back."""
        for cost in request.costs():
            try:
                self.worker.run_here(cost)
            except AttrlabError:  # the job itself reports what is wrong
                break
        return self.worker.run_here(request), calibration_snapshots()


def build_space(settings: ServerSettings | None = None) -> gr.Blocks:
    """The Space's Blocks: the page, its runs in GPU slots, and ``/explain_batch``."""
    settings = settings or ServerSettings.for_server()
    # On ZeroGPU models go to "cuda" in the main process without initialising CUDA there.
    worker = ExplainWorker(device="cuda:0" if ZERO_GPU else None, settings=settings)
    max_slot_s = int(os.environ.get("ATTRLAB_SPACE_MAX_SLOT", "120"))
    runner = SpaceRunner(worker, max_slot_s, gpu=spaces.GPU if ZERO_GPU else None)
    page_run: Callable[..., Any] = runner.run
    demo = build_ui(worker, run=page_run, measure=not ZERO_GPU)

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
