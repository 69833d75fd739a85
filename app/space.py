"""
Hugging Face Space entry: the same page, plus a batch endpoint in Gradio's API.

On a ZeroGPU Space (the ``spaces`` package, with ``SPACES_ZERO_GPU`` set by the platform) every
explanation runs inside a ``spaces.GPU`` function, in ZeroGPU's GPU process, and asks for a slot
as long as its cost estimate says: twice the estimate plus 10 s, within
``ATTRLAB_SPACE_MAX_SLOT`` seconds (a job priced over that is refused before it starts, with
what to lower). Estimates need the model on the device, which the main process must not touch,
so each slot computes its jobs' estimates (``attribution.request.estimate``) and hands them back as
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
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

try:  # first, as ZeroGPU asks: it patches torch before anything imports it
    import spaces
except ImportError:  # not a Space, or a Space without ZeroGPU
    spaces = None

if __package__ in (None, ""):
    # Run as a file, as a Space runs its app_file from the tree without installing it: the tree's
    # root is the package `attrlab` (installed, its folders are attrlab's subpackages).
    _tree = ModuleType("attrlab")
    _tree.__path__ = [str(Path(__file__).resolve().parents[1])]
    sys.modules["attrlab"] = _tree

import gradio as gr
from pydantic import ValidationError

from attrlab.app.api import ApiGuard, ExplainBody
from attrlab.app.errors import public_message, validation_problems
from attrlab.app.jobs import instance_json
from attrlab.app.server import bound_image_decoding, page_login
from attrlab.app.settings import ServerSettings, SettingsError
from attrlab.app.ui import build_ui
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import AttrlabError
from attrlab.attribution.request import (
    EstimateRequest,
    ExplainRequest,
    InstanceFailedError,
    Request,
)
from attrlab.attribution.request.gate import checked_params, clear_slot
from attrlab.attribution.request.pricing import FIRST_SLOT_S, EstimateBook, Price, slot_seconds
from attrlab.attribution.request.run import ProgressCallback

__all__ = ["FIRST_SLOT_S", "SpaceRunner", "build_space"]

log = logging.getLogger(__name__)

#: Whether GPU work runs in ZeroGPU slots (the platform sets SPACES_ZERO_GPU).
ZERO_GPU = spaces is not None and bool(spaces.config.Config.zero_gpu)

#: Slots whose time beyond their estimates (model loads, calibration, decoding) is remembered.
_RECENT_SLOTS = 5

Result = TypeVar("Result")
#: What prices alike: model, labels, next token or not, method, parameters, trust card, modality.
PriceKey = tuple[Any, ...]


class SpaceRunner:
    """
    Runs page and API requests in GPU slots sized by their cost estimates.

    ``gpu`` makes a function run in a GPU slot, given a ``duration`` callable (``spaces.GPU``
    on ZeroGPU); without it requests go through the worker's queue. A slot estimates its job's
    parts and times itself; the main process records them, per :data:`PriceKey`, in the
    library's :class:`~attribution.request.pricing.EstimateBook`, which prices the next job (the
    slots' time beyond their estimates: the largest of the last five). A job whose slot ended
    without an answer (ZeroGPU stops a slot at its duration) asks for the longest slot next time.
    """

    def __init__(
        self, worker: ExplainWorker, max_slot_s: int, gpu: Callable[..., Any] | None = None
    ) -> None:
        if max_slot_s < 1:
            raise SettingsError(f"ATTRLAB_SPACE_MAX_SLOT must be at least 1 s; got {max_slot_s}")
        self.worker = worker
        self.max_slot_s = max_slot_s
        self.book = EstimateBook(recent=_RECENT_SLOTS)
        self._on_gpu = gpu(self._run_on_device, duration=self.slot_s) if gpu else None

    def _price(self, request: Request[Any]) -> Price:
        """The request's price from earlier slots' estimates (:class:`EstimateBook`)."""
        return self.book.price([_price_key(cost) for cost in request.costs()])

    def priced_s(self, request: Request[Any]) -> float | None:
        """Seconds from earlier slots' estimates; None while any part was never priced."""
        return self._price(request).seconds

    def slot_s(self, request: Request[Any]) -> int:
        """The slot a job asks for: from its estimate, the first-job slot, or the longest."""
        if self.book.unanswered(_price_key(c)[0] for c in request.costs()):
            return self.max_slot_s
        seconds = self.priced_s(request)
        if seconds is None:
            return min(self.max_slot_s, FIRST_SLOT_S)
        return min(self.max_slot_s, slot_seconds(seconds))

    def cost_line(self, request: ExplainRequest) -> str:
        """The page's estimate before Run, without touching the GPU."""
        seconds = self.priced_s(request)
        if seconds is None:
            return "known after the first run of this model, method and parameters"
        return f"≈ {seconds:,.1f} s on the GPU (from the estimates of earlier runs)"

    def run(self, request: Request[Result], progress: ProgressCallback | None = None) -> Result:
        """
        Run a request: in a GPU slot on ZeroGPU, else in the worker's queue.

        Raises:
            TooSlowError: priced over the longest slot, before any slot is asked for.
            AttrlabError: a request out of bounds (before a slot), or the job's own errors
                (carried back from the slot as values: ZeroGPU passes only Gradio's errors
                through unchanged).
        """
        if self._on_gpu is None:
            return self.worker.explain(request, progress=progress)
        self.worker.validate(request)  # nothing out of bounds takes a slot
        seconds, seen_larger = self._price(request)
        clear_slot(seconds, seen_larger, self.max_slot_s, request.method_params())
        keys = [_price_key(cost)[0] for cost in request.costs()]
        try:
            outcome, seen, beyond = self._on_gpu(request)
        except gr.Error:  # ZeroGPU's own: a slot stopped at its duration, a quota, a start
            self.book.record_unanswered(keys)
            raise
        self.book.record(seen, beyond)
        if isinstance(outcome, AttrlabError):
            raise outcome
        return outcome

    def _run_on_device(
        self, request: Request[Result]
    ) -> tuple[Result | AttrlabError, list[tuple[PriceKey, int, float]], float]:
        """In the slot: estimate the job's parts (pricing the next ones), run it, time it all."""
        start = time.monotonic()
        seen = []
        for cost in request.costs():
            try:
                found = self.worker.run_here(cost)
            except AttrlabError:  # the job itself reports what is wrong with this part
                continue
            except Exception:
                log.exception("estimating %s failed in a GPU slot", cost.method)
                continue
            key, units = _price_key(cost)
            seen.append((key, units, found.seconds))
        try:
            outcome: Result | AttrlabError = self.worker.run_here(request)
        except AttrlabError as err:
            outcome = err
        except Exception:
            log.exception("a job failed in a GPU slot")
            outcome = InstanceFailedError(
                "the job failed inside attrlab; the server log has the details"
            )
        beyond = time.monotonic() - start - sum(estimated for _, _, estimated in seen)
        return outcome, seen, max(0.0, beyond)


def _price_key(cost: EstimateRequest) -> tuple[PriceKey, int]:
    """What prices alike, and the input's size in units: characters, or 1 per image."""
    try:  # page parameters arrive as text, API ones as numbers: compare the checked values
        params = checked_params(cost.method, cost.params)
    except AttrlabError:
        params = dict(cost.params)
    key = (
        cost.chosen_model.strip(),
        tuple(label.strip() for label in cost.labels or ()),
        cost.next_token,
        cost.method,
        json.dumps(params, sort_keys=True, default=str),
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
    try:
        max_slot_s = int(os.environ.get("ATTRLAB_SPACE_MAX_SLOT", "120"))
    except ValueError:
        raise SettingsError("ATTRLAB_SPACE_MAX_SLOT must be a whole number of seconds") from None
    runner = SpaceRunner(worker, max_slot_s, gpu=spaces.GPU if ZERO_GPU else None)
    # Off ZeroGPU the page runs through the worker's queue itself (progress bar and Cancel).
    page_run: Callable[..., Any] | None = runner.run if ZERO_GPU else None
    demo = build_ui(worker, run=page_run, cost=runner.cost_line if ZERO_GPU else None)

    def explain_batch(body: dict[str, Any]) -> dict[str, Any]:
        """The body of ``POST /api/v1/explain`` (one input or ``instances``), its answer."""
        try:
            parsed = ExplainBody.model_validate(body)
            if parsed.instances is None:
                single = parsed.to_request()
                worker.validate(single, strict=True)  # JSON, as over REST: typed parameters
                return runner.run(single).to_dict()
            batch = parsed.to_batch()
            worker.validate(batch, strict=True)
            results = runner.run(batch)
        except ValidationError as err:
            raise gr.Error(f"invalid request: {validation_problems(list(err.errors()))}") from None
        except AttrlabError as err:
            raise gr.Error(public_message(str(err))) from None
        return {"explanations": [instance_json(r) for r in results]}

    with demo:
        gr.api(explain_batch, api_name="explain_batch")
    return demo.queue(max_size=settings.max_queue)


def launch(settings: ServerSettings | None = None) -> None:
    """Serve the Space with the server's page limits: login with a token, body and image size."""
    settings = settings or ServerSettings.for_server()
    bound_image_decoding(settings)
    demo = build_space(settings)
    demo.launch(
        server_name="0.0.0.0",
        state_session_capacity=demo.state_session_capacity,  # the page's, not Gradio's default
        auth=page_login(settings.api_token),
        max_file_size=settings.max_body_bytes,
        app_kwargs=ApiGuard.options(settings.max_body_bytes),  # before Gradio parses a body
        show_error=False,  # only gr.Error messages (already free of paths) reach the page
    )


if __name__ == "__main__":
    launch()
