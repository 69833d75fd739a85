"""
The worker survives whatever a request does: a job that fails mid-method or is cancelled
mid-run leaves no model patched and no queue stuck, and the next job gives exactly what a
fresh server gives.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from _model_state import model_state
from fastapi.testclient import TestClient

from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import JobCancelledError
from attrlab.attribution.request import ExplainRequest

LLAMA = ExplainRequest(model="tiny-random-llama", method="attnlrp", text="the cat sat on the mat")
RISE = ExplainRequest(
    model="tiny-random-bert",
    method="rise",
    text="a fine day",
    params={"n_masks": 64, "batch_size": 8},
)


def _drained(worker: ExplainWorker) -> bool:
    """The queue is empty (done-callbacks run just after waiters wake, so allow a moment)."""
    for _ in range(100):
        if worker.status()["queued"] == 0:
            return True
        threading.Event().wait(0.05)
    return False


def _fresh(request: ExplainRequest) -> np.ndarray:
    worker = ExplainWorker(device="cpu")
    try:
        return worker.explain(request).scores
    finally:
        worker.close()


@pytest.fixture
def worker():
    w = ExplainWorker(device="cpu")
    yield w
    w.close()


def test_job_failing_mid_method_leaves_the_model_clean(worker):
    adapter = worker.adapter(LLAMA.model)
    before = model_state(adapter.model)
    inputs = adapter.preprocess(LLAMA.text).model_kwargs()
    with torch.no_grad():
        logits_before = adapter.logits(**inputs)
    calls = []

    def fail_inside_the_method(*_):
        calls.append(1)
        if len(calls) == 2:  # call 1 is explain()'s clean forward, call 2 the LRP forward
            raise RuntimeError("failure inside the method")

    handle = adapter.model.model.layers[-1].register_forward_hook(fail_inside_the_method)
    try:
        with pytest.raises(RuntimeError, match="failure inside the method"):
            worker.explain(LLAMA)
    finally:
        handle.remove()
    assert len(calls) == 2
    assert model_state(adapter.model) == before
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits(**inputs), logits_before, rtol=0, atol=0)
    np.testing.assert_array_equal(worker.explain(LLAMA).scores, _fresh(LLAMA))
    assert _drained(worker)


def test_job_cancelled_mid_run_stops_and_the_next_job_is_exact(worker):
    jobs = []
    reports = []
    submitted = threading.Event()

    def cancel_after_first_batch(done, total):
        reports.append((done, total))
        if done < total and submitted.wait(10):
            jobs[0].cancel()  # what a client going away does, mid-run

    jobs.append(worker.submit(RISE, progress=cancel_after_first_batch))
    submitted.set()
    with pytest.raises(JobCancelledError):
        jobs[0].result(timeout=120)
    assert reports and reports[-1][0] < reports[-1][1]  # it stopped before the end
    adapter = worker.adapter(RISE.model)
    before = model_state(adapter.model)
    np.testing.assert_array_equal(worker.explain(RISE).scores, _fresh(RISE))
    assert model_state(adapter.model) == before
    assert _drained(worker)


def test_unexpected_failure_is_a_500_without_details_and_the_server_goes_on(worker):
    adapter = worker.adapter("tiny-random-bert")

    def crash(*_):
        raise RuntimeError("/secret/path/weights.bin exploded")

    body = {"model": "tiny-random-bert", "method": "gradient_x_input", "text": "fine"}
    with TestClient(create_app(worker), raise_server_exceptions=False) as client:
        handle = adapter.model.register_forward_hook(crash)
        try:
            failed = client.post("/api/v1/explain", json=body)
        finally:
            handle.remove()
        assert failed.status_code == 500
        assert failed.json() == {
            "error": {
                "code": "internal",
                "message": "internal error; the server log has the details",
            }
        }
        assert client.post("/api/v1/explain", json=body).status_code == 200


def test_many_jobs_at_once_all_finish(worker):
    """Threads submitting together: every job completes, the queue drains to zero."""
    results = []

    def submit():
        results.append(
            worker.explain(
                ExplainRequest(
                    model="tiny-random-bert", method="gradient_x_input", text="one two three"
                )
            ).scores
        )

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 8 and all(np.array_equal(r, results[0]) for r in results)
    assert _drained(worker)
    assert worker.status()["model_loads"] == {"tiny-random-bert": 1}


def test_each_device_has_its_lane_and_a_job_goes_to_the_least_loaded():
    worker = ExplainWorker(device="cpu,cpu")
    release, blocked = threading.Event(), threading.Event()

    def hold(done: int, total: int) -> None:
        blocked.set()
        release.wait(30)

    try:
        assert worker.devices == ["cpu", "cpu"]
        first = worker.submit(RISE, progress=hold)
        assert blocked.wait(30)
        # The first lane is busy: the second job runs on the other and finishes meanwhile.
        second = worker.explain(LLAMA)
        # A finished job leaves its lane's count just after its waiter wakes: allow a moment.
        for _ in range(100):
            lanes = worker.status()["devices"]
            if [lane["queued"] for lane in lanes] == [1, 0]:
                break
            threading.Event().wait(0.05)
        assert [lane["queued"] for lane in lanes] == [1, 0]
        assert lanes[1]["models_loaded"] == [LLAMA.model]
        release.set()
        first.result(60)
        assert _drained(worker)
        # Both lanes idle: the job goes where its model is already loaded, not loaded again.
        again = worker.explain(LLAMA)
        np.testing.assert_array_equal(again.scores, second.scores)
        assert worker.status()["model_loads"] == {RISE.model: 1, LLAMA.model: 1}
    finally:
        release.set()
        worker.close()


def test_device_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    from attrlab.app.worker import visible_devices
    from attrlab.attribution.errors import InvalidInputError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert visible_devices(None) == ["cpu"]
    assert visible_devices(" cpu, cpu ") == ["cpu", "cpu"]
    with pytest.raises(InvalidInputError, match="no CUDA GPU is available"):
        visible_devices("cuda")
    with pytest.raises(InvalidInputError, match="no CUDA GPU is available"):
        visible_devices("cpu,cuda:1")
    with pytest.raises(InvalidInputError, match="unknown device 'gpu'; use cpu or cuda"):
        visible_devices("gpu")
