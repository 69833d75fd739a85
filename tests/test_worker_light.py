"""
The worker's light path: a prediction or an estimate of a loaded model answers beside a job.

Each long job here blocks in its own progress callback, so "long" is exact and costs nothing:
a plain sampling run (RISE) blocked between batches, or the randomisation check blocked inside
a step, while the model's weights are randomised.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest
import torch

from attrlab.app.worker import ExplainWorker
from attrlab.attribution.alteration import altering_thread
from attrlab.attribution.errors import JobCancelledError
from attrlab.attribution.request import CheckRequest, ExplainRequest, PreviewRequest

MODEL = "tiny-random-bert"
TEXT = "the film was good and the acting was fine"
#: How long a light request may take beside a job (it takes milliseconds on a tiny model).
BOUND_S = 5.0


class Gate:
    """A progress callback that blocks the job at its ``at``-th report until released."""

    def __init__(self, at: int = 1) -> None:
        self.at, self.calls = at, 0
        self.inside, self.release = threading.Event(), threading.Event()

    def __call__(self, done: int, total: int) -> None:
        self.calls += 1
        if self.calls >= self.at and not self.release.is_set():
            self.inside.set()
            assert self.release.wait(30), "the test never released the job"


@pytest.fixture
def worker():
    worker = ExplainWorker(device="cpu")
    yield worker
    worker.close()


def _own_top(worker: ExplainWorker) -> list[tuple[int, float]]:
    """The model's own top-5 (index, probability), computed here from its logits."""
    probabilities = _logits(worker)[0].double().softmax(-1)
    top = probabilities.topk(min(5, probabilities.numel()))
    return list(zip(top.indices.tolist(), top.values.tolist(), strict=True))


def _same_top(preview, own: list[tuple[int, float]]) -> bool:
    """The preview's top-5 are the model's own: the same classes, the same probabilities."""
    shown = [(p.index, p.probability) for p in preview.predictions]
    return [i for i, _ in shown] == [i for i, _ in own] and [p for _, p in shown] == pytest.approx(
        [p for _, p in own], rel=1e-9
    )


@pytest.mark.slow
def test_a_prediction_and_an_estimate_answer_beside_a_long_job(worker):
    rise = ExplainRequest(model=MODEL, text=TEXT, method="rise", params={"n_masks": 64})
    own = _own_top(worker)  # loads the model
    idle_cost = worker.explain(rise.costs()[0])  # the first estimate calibrates, queued
    gate = Gate()
    job = worker.submit(rise, progress=gate)
    assert gate.inside.wait(30)
    try:
        preview = worker.submit(PreviewRequest(model=MODEL, text=TEXT)).result(BOUND_S)
        cost = worker.submit(rise.costs()[0]).result(BOUND_S)
    finally:
        gate.release.set()
    assert _same_top(preview, own)
    assert cost.to_dict() == idle_cost.to_dict()
    beside = job.result(60)
    alone = worker.explain(rise)  # the same seeded run with nothing beside it
    assert torch.equal(torch.as_tensor(beside.scores), torch.as_tensor(alone.scores))


def _logits(worker: ExplainWorker) -> torch.Tensor:
    """The model's own logits on the text, read directly (as a job's thread would see them)."""
    adapter = worker.adapter(MODEL)
    with torch.no_grad():
        return adapter.logits(**adapter.preprocess(TEXT).model_kwargs()).clone()


def _randomisation_job(worker: ExplainWorker, gate: Gate):
    check = CheckRequest(model=MODEL, text=TEXT, methods=("gradient_x_input",), randomise=True)
    # report 1 is the intact map; report 2 comes from inside the first randomised step
    return worker.submit(check, progress=gate)


def test_a_prediction_waits_out_randomised_weights_and_sees_the_model_intact(worker):
    own, intact, model = _own_top(worker), _logits(worker), worker.adapter(MODEL).model
    gate = Gate(at=2)
    job = _randomisation_job(worker, gate)
    assert gate.inside.wait(30)
    try:
        assert altering_thread(model) is not None
        # the job's change is real: the model computes otherwise now
        assert not torch.allclose(_logits(worker), intact)
        preview = worker.submit(PreviewRequest(model=MODEL, text=TEXT))
        with pytest.raises(TimeoutError):
            preview.result(0.5)  # it waits while the weights are random
    finally:
        gate.release.set()
    assert _same_top(preview.result(BOUND_S), own)
    table = job.result(60).randomisation
    assert len(table) > 2
    assert altering_thread(model) is None
    assert torch.equal(_logits(worker), intact)


def test_a_cancelled_alteration_leaves_the_model_intact_and_the_queue_moving(worker):
    own, intact, model = _own_top(worker), _logits(worker), worker.adapter(MODEL).model
    gate = Gate(at=2)
    job = _randomisation_job(worker, gate)
    assert gate.inside.wait(30)
    preview = worker.submit(PreviewRequest(model=MODEL, text=TEXT))
    job.cancel()
    gate.release.set()
    with pytest.raises((JobCancelledError, CancelledError)):
        job.result(60)
    assert _same_top(preview.result(BOUND_S), own)
    assert altering_thread(model) is None
    assert torch.equal(_logits(worker), intact)
    after = worker.explain(ExplainRequest(model=MODEL, text=TEXT, method="gradient_x_input"))
    assert after.target.index == own[0][0]  # the next job runs, on the intact model
