"""
One request's memory is bounded: calibrated on the model's own input, batched to fit, refused
over the bound before any of its own work, generation priced and stopped.

The requests are those an attack on ``attrlab serve`` sent (integrated gradients of 500 steps
on 300 words, attribution patching of every head at every position of a 200-word prompt, a
256-token generation after 3,000 words), on servers whose bound is set low.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings, SettingsError
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import TooMuchMemoryError, TooSlowError
from attrlab.attribution.explain import explain
from attrlab.attribution.inputs.runs import prepare_input
from attrlab.attribution.methods import get_method
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.attribution.request.calibration import _CALIBRATIONS, REFERENCE_TEXT, calibrate
from attrlab.attribution.request.estimate import estimate
from attrlab.attribution.request.gate import MEMORY_HEADROOM, clear, memory_rows
from attrlab.attribution.request.memory import peak_memory
from attrlab.attribution.request.run import RunSettings, cancellable_forwards

WORDS_300 = "word " * 300


def _server(tmp_path, **overrides) -> ExplainWorker:
    env = {"ATTRLAB_DATA": str(tmp_path)}
    return ExplainWorker(device="cpu", settings=ServerSettings.for_server(env, **overrides))


class _Lengths:
    """The sequence length of every forward of ``model`` while the block runs."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.seen = model, []

    def __enter__(self) -> list[int]:
        def record(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            embeds = kwargs.get("inputs_embeds")
            tensor = ids if ids is not None else embeds
            self.seen.append(int(tensor.shape[1]))

        self.handle = self.model.register_forward_pre_hook(record, with_kwargs=True)
        return self.seen

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def test_the_calibration_times_the_models_own_short_input_whatever_is_asked(load_model):
    # the model's first estimate is for 300 words, and yet every pass the calibration runs is
    # on the reference's tokens (a calibration made by an earlier test is dropped first)
    adapter = load_model("tiny-random-gpt2")
    _CALIBRATIONS.pop((adapter.model_id, str(adapter.device), adapter.modality), None)
    reference = adapter.preprocess(REFERENCE_TEXT).input_ids.shape[1]
    long = adapter.preprocess(WORDS_300)
    assert long.input_ids.shape[1] > 5 * reference  # truncated at 128 tokens
    with _Lengths(adapter.model) as lengths:
        cost = estimate(adapter, "gradient_x_input", long)
        calibrate(adapter).measure_all()
    assert lengths and set(lengths) == {reference}, set(lengths)
    with _Lengths(adapter.model) as lengths:  # later estimates run no pass at all
        again = estimate(adapter, "integrated_gradients", long, {"n_steps": 64})
    assert lengths == []
    assert again.seconds > cost.seconds > 0


def test_a_run_is_batched_to_fit_the_bound_and_its_map_does_not_change(load_model):
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("word " * 60)
    params = {"n_steps": 64}
    rows = memory_rows(adapter, inputs, RunSettings(max_memory_bytes=10**12))
    row = calibrate(adapter).row_bytes(inputs)
    assert rows is not None and row is not None and rows > 64
    one = calibrate(adapter).peak_bytes(inputs, 1)
    assert one is not None
    # room for 5 rows beside what a pass holds once, in the share of the bound an estimate takes
    bound = RunSettings(max_memory_bytes=int((one + 4 * row + row // 2) / MEMORY_HEADROOM))
    cleared = clear(adapter, "integrated_gradients", inputs, params, bound)
    assert cleared.params["internal_batch_size"] == 5 and cleared.rows == 5
    cost = estimate(adapter, "integrated_gradients", inputs, cleared.params)
    assert cost.peak_memory_bytes is not None and cost.peak_memory_bytes <= one + 5 * row
    bounded = explain(adapter, "integrated_gradients", inputs, params=params, settings=bound)
    free = explain(adapter, "integrated_gradients", inputs, params=params)
    assert bounded.params["internal_batch_size"] == 5 and free.params["internal_batch_size"] is None
    np.testing.assert_allclose(bounded.scores, free.scores, rtol=1e-4, atol=1e-6)
    # a bound below one row refuses, naming the estimate and the bound
    with pytest.raises(TooMuchMemoryError, match=r"≈ .* of memory on cpu.*allows .* per request"):
        clear(adapter, "integrated_gradients", inputs, params, RunSettings(max_memory_bytes=1))


def test_a_per_step_matrix_is_batched_within_the_bound(load_model, monkeypatch):
    adapter = load_model("tiny-random-llama")
    prepared = prepare_input(
        adapter, "the cat sat on the", None, AnswerSpec(answer=" mat and slept")
    )
    target = prepared.target
    steps = target.steps  # type: ignore[union-attr]
    assert steps > 2
    calibrate(adapter).measure_all()
    row = calibrate(adapter).row_bytes(prepared.inputs)
    one = calibrate(adapter).peak_bytes(prepared.inputs, 1)
    assert row and one
    bound = RunSettings(max_memory_bytes=int((one + row + row // 2) / MEMORY_HEADROOM))  # 2 rows
    seen: list[int] = []
    method = get_method("gradient_x_input")
    original = method.attribute_steps

    def spy(_cls, adapter, inputs, target, steps, params, run):
        seen.append(len(steps))
        return original(adapter, inputs, target, steps, params, run)

    monkeypatch.setattr(method, "attribute_steps", classmethod(spy))
    bounded = explain(
        adapter, "gradient_x_input", prepared.inputs, target, settings=bound, per_step=True
    )
    monkeypatch.undo()
    assert seen and max(seen) == 2 and sum(seen) == steps
    free = explain(adapter, "gradient_x_input", prepared.inputs, target, per_step=True)
    np.testing.assert_allclose(bounded.maps["steps"], free.maps["steps"], rtol=1e-5, atol=1e-7)


@pytest.mark.server
def test_the_attacks_requests_are_refused_quickly_on_a_low_bound(tmp_path):
    worker = _server(tmp_path, max_memory_bytes=2 * 10**6)
    with TestClient(create_app(worker)) as client:
        ig = {
            "model": "tiny-random-bert",
            "method": "integrated_gradients",
            "params": {"n_steps": 500},
            "text": "word " * 120,
        }
        cost = client.post("/api/v1/estimate", json=ig).json()
        assert cost["peak_memory_bytes"] > 2 * 10**6  # 500 steps in one batch
        started = time.monotonic()
        refused = client.post("/api/v1/explain", json=ig)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "over_memory"
        assert "of memory on cpu" in error["message"]
        assert "allows 2.0 MB per request, 70% of it for an estimate" in error["message"]
        assert time.monotonic() - started < 30
        patch = {
            "model": "tiny-random-gpt2",
            "clean": "word " * 100,
            "noise_positions": [1, 2],
            "components": ["head_position"],
            "estimators": ["atp"],
            "answer": " word",
        }
        refused = client.post("/api/v1/patch", json=patch)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "over_memory"
        assert "patching study would need" in refused.json()["error"]["message"]
    worker.close()


@pytest.mark.server
def test_a_generation_over_a_token_servers_seconds_is_refused_before_it_starts(tmp_path):
    worker = _server(tmp_path, api_token="t0ken", max_seconds=0.01)
    body = {
        "model": "tiny-random-llama",
        "method": "gradient_x_input",
        "text": "word " * 3000,
        "generate": 256,
    }
    with TestClient(create_app(worker)) as client:
        started = time.monotonic()
        refused = client.post(
            "/api/v1/explain", json=body, headers={"Authorization": "Bearer t0ken"}
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_slow"
        assert "generating up to 256 tokens after this prompt would take" in error["message"]
        assert time.monotonic() - started < 30
    worker.close()


@pytest.mark.slow
def test_a_bound_that_admits_the_request_holds_its_peak(minilm):
    """MiniLM's integrated gradients on 300 words within 700 MB: batched, and under it."""
    bound = 700 * 10**6
    inputs = minilm.preprocess(WORDS_300)
    settings = RunSettings(max_memory_bytes=bound)
    cleared = clear(minilm, "integrated_gradients", inputs, {"n_steps": 40}, settings)
    assert 1 <= cleared.params["internal_batch_size"] < 40
    with peak_memory(torch.device("cpu")) as peak:
        found = explain(
            minilm, "integrated_gradients", inputs, params={"n_steps": 40}, settings=settings
        )
    assert found.params["internal_batch_size"] == cleared.params["internal_batch_size"]
    assert peak() is not None and peak() < bound, (peak(), bound)


def test_generation_is_priced_before_it_starts_and_stopped_when_its_seconds_are_spent(load_model):
    adapter = load_model("tiny-random-llama")
    spec = AnswerSpec(generate=256)
    slow = pytest.raises(TooSlowError, match="generating up to 256 tokens after this prompt")
    with _Lengths(adapter.model) as lengths, slow:
        prepare_input(adapter, "word " * 100, None, spec, budgets=RunSettings(max_seconds=1e-4))
    reference = adapter.preprocess(REFERENCE_TEXT).input_ids.shape[1]
    assert set(lengths) <= {reference}  # the calibration's passes only: nothing generated
    with pytest.raises(TooMuchMemoryError, match="generating up to 256 tokens"):
        prepare_input(adapter, "word " * 100, None, spec, budgets=RunSettings(max_memory_bytes=1))
    # within its budgets it runs
    roomy = RunSettings(max_seconds=600, max_memory_bytes=10**12)
    fine = prepare_input(adapter, "word", None, AnswerSpec(generate=2), budgets=roomy)
    assert fine.inputs.answer_length >= 1  # type: ignore[union-attr]


def test_forwards_stop_once_the_seconds_are_spent(load_model):
    adapter = load_model("tiny-random-bert")
    calls = []

    def slow(_module, _args):
        calls.append(1)
        time.sleep(0.05)

    hooks = len(adapter.model._forward_pre_hooks)
    handle = adapter.model.register_forward_pre_hook(slow)
    try:
        kwargs = adapter.preprocess("a fine day").model_kwargs()
        past = pytest.raises(TooSlowError, match=r"ran past the 0\.12 s")
        with past, cancellable_forwards(adapter.model, threading.Event(), max_seconds=0.12):
            for _ in range(10):
                adapter.logits(**kwargs)
    finally:
        handle.remove()
    assert 2 <= len(calls) <= 5  # stopped at the first forward after 0.12 s
    assert len(adapter.model._forward_pre_hooks) == hooks  # the deadline's hook is gone


def test_the_memory_setting_reads_units_and_refuses_nonsense(tmp_path):
    def read(value: str) -> int | None:
        env = {"ATTRLAB_DATA": str(tmp_path), "ATTRLAB_MAX_MEMORY": value}
        return ServerSettings.for_server(env).max_memory_bytes

    assert read("4GB") == 4 * 10**9
    assert read("512 MiB") == 512 * 2**20
    assert read("2.5g") == 2_500_000_000
    assert read("123456") == 123456
    for bad in ("-1GB", "four", "1XB", "0"):
        with pytest.raises(SettingsError, match="ATTRLAB_MAX_MEMORY is an amount of memory"):
            read(bad)
    default = ServerSettings.for_server({"ATTRLAB_DATA": str(tmp_path)}).max_memory_bytes
    meminfo = Path("/proc/meminfo").read_text()
    available = int(meminfo.split("MemAvailable:")[1].split()[0]) * 1024
    assert default is not None and 0.3 * available < default < 0.5 * available
    assert ServerSettings.unrestricted().max_memory_bytes is None
