"""Cancelling stops the method in progress at its next forward; a cancelled job gains no row."""

from __future__ import annotations

import functools
import json
import threading
import time

import numpy as np
import pytest
import torch
from _model_state import model_state
from _small_budgets import SMALL_BUDGETS
from _tiny_families import tiny_relu_cnn
from fastapi.testclient import TestClient
from torch import nn

from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import JobCancelledError
from attrlab.attribution.methods import available_methods, capabilities
from attrlab.attribution.metrics.check import check_methods
from attrlab.attribution.models import Adapter, load
from attrlab.attribution.request.calibration import calibrate
from attrlab.attribution.request.run import RunSettings, cancellable_forwards

TEXT = "the cat sat on the mat"
#: Small budgets, and batches small enough that each method runs several forwards.
PARAMS: dict[str, dict[str, object]] = {
    **SMALL_BUDGETS,
    "integrated_gradients": {"n_steps": 4, "internal_batch_size": 1},
    "rise": {"n_masks": 16, "batch_size": 4},
    "sobol": {"n_designs": 4, "bootstrap": 0, "batch_size": 4},
    "shap": {"max_evals": 20, "batch_size": 4},
    "occlusion": {"batch_size": 2},
}


@pytest.fixture(scope="module")
def tiny_models() -> list[tuple[Adapter, object]]:
    """A text transformer, a vision transformer and a CNN, each with an input it takes."""
    image = np.random.default_rng(0).integers(0, 255, (16, 16, 3)).astype(np.uint8)
    return [
        (load("tiny-random-bert", device="cpu"), TEXT),
        (load("tiny-random-vit", device="cpu"), image),
        (tiny_relu_cnn(), image),
    ]


class ForwardCounter:
    """Counts the model's finished forwards; sets ``cancel`` when the ``at``-th one finishes."""

    def __init__(self, model: nn.Module, at: int | None = None) -> None:
        self.calls = 0
        self.at = at
        self.cancel = threading.Event()
        self.handle = model.register_forward_hook(self.finished)

    def finished(self, *_: object) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.cancel.set()


@pytest.mark.parametrize("method", [m.name for m in available_methods()])
def test_a_cancelled_method_stops_at_its_next_forward_and_leaves_the_model_clean(
    tiny_models, method
):
    applied = 0
    for adapter, raw in tiny_models:
        if capabilities(adapter)[method] is not None:  # the method does not apply
            continue
        applied += 1
        inputs = adapter.preprocess(raw)
        params = PARAMS.get(method, {})
        clean = ForwardCounter(adapter.model)
        explain(adapter, method, inputs, params=params)
        clean.handle.remove()
        # Cancel as the method's first own forward ends when it runs several (more must not
        # start), else as the prediction ends (the method must not start).
        at = 2 if clean.calls >= 3 else 1

        def run(cancel, adapter=adapter, inputs=inputs, params=params):
            settings = RunSettings(cancel=cancel)
            return explain(adapter, method, inputs, params=params, settings=settings)

        _assert_cancel_stops_at(adapter, inputs, at, run)
    assert applied, f"{method} applies to none of the tiny models"


def _assert_cancel_stops_at(adapter: Adapter, inputs, at: int, run) -> None:
    """``run(cancel=...)`` cancelled as forward ``at`` ends: no forward after, the model intact."""
    counter = ForwardCounter(adapter.model, at)
    try:
        before = model_state(adapter.model)
        with torch.no_grad():
            logits = adapter.logits(**inputs.model_kwargs())
        counter.calls = 0
        with pytest.raises(JobCancelledError):
            run(cancel=counter.cancel)
        assert counter.calls == at, f"{counter.calls - at} forwards ran after the cancel"
        assert model_state(adapter.model) == before
        with torch.no_grad():  # weights a randomisation step drew are restored too
            assert torch.equal(adapter.logits(**inputs.model_kwargs()), logits)
    finally:
        counter.handle.remove()


def _explained_with_evaluation(adapter: Adapter, inputs, cancel=None) -> object:
    return explain(
        adapter, "gradient_x_input", inputs, settings=RunSettings(evaluate=True, cancel=cancel)
    )


def _checked_with_randomisation(adapter: Adapter, inputs, cancel=None) -> object:
    return check_methods(
        adapter, ["gradient_x_input"], inputs, randomise=True, settings=RunSettings(cancel=cancel)
    )


@pytest.mark.parametrize("scoring", [_explained_with_evaluation, _checked_with_randomisation])
def test_cancelled_scoring_stops_at_its_next_forward_and_restores_the_model(tiny_models, scoring):
    adapter, raw = tiny_models[0]
    inputs = adapter.preprocess(raw)
    clean = ForwardCounter(adapter.model)
    scoring(adapter, inputs)
    clean.handle.remove()
    at = clean.calls // 2  # in the faithfulness curves, or at a randomised layer
    _assert_cancel_stops_at(adapter, inputs, at, functools.partial(scoring, adapter, inputs))


def test_a_run_that_is_not_cancelled_leaves_no_hook(tiny_models):
    adapter, raw = tiny_models[0]
    before = model_state(adapter.model)
    params = PARAMS["integrated_gradients"]
    explain(
        adapter,
        "integrated_gradients",
        adapter.preprocess(raw),
        params=params,
        settings=RunSettings(cancel=threading.Event()),
    )
    assert model_state(adapter.model) == before


JOB_MODEL = "tiny-random-bert"
JOB_PARAMS = {"n_steps": 4}  # the whole path in one forward: Captum's single attribute call


def _wait(client: TestClient, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/api/v1/jobs/{job_id}").json()
        if status["status"] in ("done", "failed", "cancelled"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {status}")


def _rows(client: TestClient, job_id: str) -> list[dict]:
    lines = client.get(f"/api/v1/jobs/{job_id}/results").text.splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("held", ["prediction", "path", "last"])
def test_after_a_job_is_cancelled_no_row_is_written_and_the_next_job_runs(tmp_path, held):
    env = {"ATTRLAB_DATA": str(tmp_path), "ATTRLAB_MODELS": JOB_MODEL}
    worker = ExplainWorker(device="cpu", settings=ServerSettings.for_server(env))
    adapter = worker.adapter(JOB_MODEL)  # the worker's own copy, which the jobs run on
    # calibrated before any count: the held forward is the job's, whichever test ran first
    calibrate(adapter).measure_all()
    clean = ForwardCounter(adapter.model)
    explain(adapter, "integrated_gradients", adapter.preprocess(TEXT), params=JOB_PARAMS)
    clean.handle.remove()
    per_instance = clean.calls  # the prediction, the path, F(baseline)
    # Hold the second instance in one of its forwards until the cancel has answered.
    hold_at = per_instance + {"prediction": 1, "path": 2, "last": per_instance}[held]
    reached, release = threading.Event(), threading.Event()
    calls = [0]

    def hold(*_: object) -> None:
        calls[0] += 1
        if calls[0] == hold_at:
            reached.set()
            assert release.wait(30)

    handle = adapter.model.register_forward_hook(hold)
    body = {
        "model": JOB_MODEL,
        "method": "integrated_gradients",
        "params": JOB_PARAMS,
        "instances": [{"text": f"{TEXT} {number}"} for number in range(4)],
    }
    try:
        with TestClient(create_app(worker)) as client:
            job_id = client.post("/api/v1/jobs", json=body).json()["job_id"]
            assert reached.wait(60), "the second instance never ran"
            queued = client.post("/api/v1/jobs", json={**body, "instances": body["instances"][:1]})
            answer = client.delete(f"/api/v1/jobs/{job_id}").json()
            release.set()
            assert answer["status"] == "cancelled" and answer["done"] == 1
            assert _wait(client, queued.json()["job_id"])["status"] == "done"  # not stuck
            assert [row["index"] for row in _rows(client, job_id)] == [0]
            status = client.get(f"/api/v1/jobs/{job_id}").json()
            assert (status["status"], status["done"]) == ("cancelled", 1)
            assert worker.status()["queued"] == 0
    finally:
        release.set()
        handle.remove()
        worker.close()


def test_a_cancel_stops_only_the_forwards_of_its_own_run(tiny_models):
    """Another thread's run on the same model answers to its own cancel, not to this one's."""
    adapter, raw = tiny_models[0]
    kwargs = adapter.preprocess(raw).model_kwargs()
    cancelled = threading.Event()
    cancelled.set()
    outcome: list[object] = []

    def other_run() -> None:
        with torch.no_grad():
            outcome.append(adapter.logits(**kwargs))

    with cancellable_forwards(adapter.model, cancelled):
        other = threading.Thread(target=other_run)
        other.start()
        other.join()
        with pytest.raises(JobCancelledError), torch.no_grad():
            adapter.logits(**kwargs)
    assert len(outcome) == 1 and isinstance(outcome[0], torch.Tensor)
    with torch.no_grad():  # the switch is gone with its block
        assert torch.equal(adapter.logits(**kwargs), outcome[0])
