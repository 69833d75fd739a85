"""The embedded real decoder LM: SmolLM2-135M from its GGUF file, converted once and cached."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from _small_budgets import SMALL_BUDGETS

from attrlab.attribution import explain
from attrlab.attribution.methods import available_methods
from attrlab.attribution.models.builtin import _smollm2_gguf, smollm2_from_gguf
from attrlab.attribution.models.cache import converted

# Small budgets: the point is that every method applies and runs on a real 30-layer LLM.


def _next_token(adapter, prompt: str) -> tuple[str, float]:
    inputs = adapter.preprocess(prompt)
    with torch.no_grad():
        probabilities = adapter.logits(**inputs.model_kwargs())[0].softmax(-1)
    p, index = probabilities.max(0)
    return adapter.label(int(index)), float(p)


def test_it_knows_things(smollm2):
    assert smollm2.family == "decoder-lm" and smollm2.num_layers == 30
    assert smollm2.num_heads == 9 and smollm2.config.num_key_value_heads == 3
    label, p = _next_token(smollm2, "The capital of France is")
    assert label == " Paris" and 0.7 < p < 0.85  # 0.77 in RECIPES.md
    label, p = _next_token(smollm2, "When Mary and John went to the store, John gave a drink to")
    assert label == " Mary" and p > 0.85


@pytest.mark.slow
def test_cached_weights_equal_a_fresh_dequantisation(smollm2):
    reference, tokenizer = smollm2_from_gguf(_smollm2_gguf())
    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        expected = reference(**ids).logits[0, -1]
        # the model's own full forward (the adapter's next-token logits run the head on one
        # position, a matrix product of another shape: equal to rounding, not to the bit)
        inputs = smollm2.preprocess("The capital of France is").model_kwargs()
        got = smollm2.model(**inputs).logits[0, -1]
        torch.testing.assert_close(smollm2.logits(**inputs)[0], got)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_conversion_is_all_or_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTRLAB_CACHE", str(tmp_path))
    calls = []

    def fails(folder):
        (folder / "half.bin").write_bytes(b"x")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        converted("m", fails)
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left behind

    def works(folder):
        calls.append(1)
        (folder / "weights.bin").write_bytes(b"ok")

    first = converted("m", works)
    again = converted("m", works)
    assert first == again == tmp_path / "m" and calls == [1]
    assert (first / "weights.bin").read_bytes() == b"ok"


@pytest.mark.parametrize("method", [m.name for m in available_methods() if "text" in m.modalities])
def test_every_text_method_runs_on_it(smollm2, method):
    inputs = smollm2.preprocess("The capital of France is")
    kwargs = inputs.model_kwargs()
    with torch.no_grad():
        before = smollm2.logits(**kwargs)
    e = explain(smollm2, method, inputs, params=SMALL_BUDGETS.get(method, {}))
    assert e.target.label == " Paris"
    assert len(e.scores) == len(e.tokens) == inputs.input_ids.shape[1]
    assert np.all(np.isfinite(e.scores))
    with torch.no_grad():
        torch.testing.assert_close(smollm2.logits(**kwargs), before, rtol=0, atol=0)
    judged = {v.check: v for v in e.verdicts}
    if method.startswith("deeplift"):  # RMSNorm, GQA attention and SwiGLU all have rules
        assert e.metrics["relative_convergence_delta"] < 1e-3  # measured 1e-5
        assert not e.warnings and judged["summation_to_delta"].status == "pass"
    if method in ("attnlrp", "pa_lrp"):  # the map holds ~37 % of the logit, by the rules
        assert e.metrics["input_relevance"] < 0.5 * e.target.logit
        assert judged["lrp_conservation"].status == "pass"
    if method == "integrated_gradients":  # its path has steep stretches on this model
        assert judged["integral_convergence"].status == "fail"
        assert "raise n_steps" in judged["integral_convergence"].advice


def test_rest_defaults_to_it_for_next_tokens(smollm2):
    from fastapi.testclient import TestClient

    from attrlab.app.server import create_app
    from attrlab.app.settings import ServerSettings
    from attrlab.app.worker import ExplainWorker

    worker = ExplainWorker(device="cpu", settings=ServerSettings.for_server({}))
    try:
        with TestClient(create_app(worker)) as client:
            body = {"method": "gradient_x_input", "text": "The capital of France is"}
            answer = client.post("/api/v1/explain", json={**body, "next_token": True}).json()
            assert answer["model"]["id"] == "smollm2-135m"
            assert answer["target"]["label"] == " Paris"
            assert client.post("/api/v1/explain", json=body).json()["model"]["id"] == (
                "minilm-zeroshot"
            )
    finally:
        worker.close()


def test_staging_folders_of_dead_conversions_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTRLAB_CACHE", str(tmp_path))
    orphan = tmp_path / ".m-2147483646-abc"  # a process id that is not running
    orphan.mkdir()
    (orphan / "half.bin").write_bytes(b"x" * 10)
    ours = tmp_path / f".m-{os.getpid()}-xyz"  # a conversion still under way here
    ours.mkdir()
    converted("m", lambda folder: (folder / "w.bin").write_bytes(b"ok"))
    assert not orphan.exists() and ours.exists()
