"""Attention rollout and attention flow: reference formulas, networkx agreement, refusals."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attrlab.attribution import explain, get_method
from attrlab.attribution.errors import (
    InvalidInputError,
    InvalidParameterError,
    UnsupportedMethodError,
)
from attrlab.attribution.methods._attention import fuse_heads
from attrlab.attribution.methods.attention_flow import attention_flow
from attrlab.attribution.methods.rollout import attention_rollout, discard_lowest
from attrlab.attribution.request.params import validate_params
from attrlab.attribution.request.run import RunContext


def random_attentions(layers: int, heads: int, n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(layers, heads, n, n, generator=generator, dtype=torch.float64)
    return logits.softmax(dim=-1)


def reference_residual(attention: np.ndarray) -> np.ndarray:
    """Abnar & Zuidema: (A + I) / 2, rows renormalised (written independently of the library)."""
    mixed = (attention + np.eye(attention.shape[-1])) / 2.0
    return mixed / mixed.sum(axis=-1)[..., None]


def reference_rollout(attentions: list[np.ndarray]) -> np.ndarray:
    """Mean over heads, residual, product R = Ã_L ... Ã_1 (attentions: (H, n, n) per layer)."""
    result = np.eye(attentions[0].shape[-1])
    for attention in attentions:
        result = reference_residual(attention.mean(axis=0)) @ result
    return result


def model_attentions(model: torch.nn.Module, inputs) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(**inputs.model_kwargs(), output_attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard", [0.0, 0.6])
@pytest.mark.parametrize("start", [0, 2])
def test_rollout_rows_sum_to_one(fusion, discard, start):
    fused = fuse_heads(random_attentions(4, 3, 7, seed=1), fusion)
    rolled = attention_rollout(fused, discard, start)
    assert torch.allclose(rolled.sum(dim=-1), torch.ones(7, dtype=torch.float64), atol=1e-12)
    assert (rolled >= 0).all()


def test_rollout_mean_no_discard_equals_reference_product():
    attentions = random_attentions(3, 4, 6, seed=2)
    expected = reference_rollout([a.numpy() for a in attentions])
    got = attention_rollout(fuse_heads(attentions, "mean")).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-12)
    # start_layer drops the lowest layers from the product
    later = attention_rollout(fuse_heads(attentions, "mean"), start_layer=2).numpy()
    np.testing.assert_allclose(later, reference_residual(attentions[2].mean(0).numpy()), atol=1e-12)


def test_discard_zeroes_the_lowest_share_but_keeps_cls():
    fused = torch.rand(5, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    fused[0, 0] = 0.0  # the lowest entry of all: protected anyway
    kept = discard_lowest(fused, 0.4)
    assert kept[0, 0] == fused[0, 0]
    assert int((kept == 0).sum()) == int(25 * 0.4)  # 10 lowest picked, [0, 0] among them
    threshold = fused.flatten().sort().values[int(25 * 0.4) - 1]
    assert torch.equal(kept[fused > threshold], fused[fused > threshold])


@pytest.mark.parametrize("spec", ["tiny-random-bert", "tiny-random-gpt2", "tiny-random-llama"])
def test_rollout_on_text_models_equals_reference(load_model, spec):
    adapter = load_model(spec)
    inputs = adapter.preprocess("the film was a delight from start to end")
    explanation = explain(adapter, "rollout", inputs)
    rolled = reference_rollout(model_attentions(adapter.model, inputs))
    row = rolled[-1] if adapter.family == "decoder-lm" else rolled[0]  # last token vs CLS
    np.testing.assert_allclose(explanation.scores, row, atol=1e-9)
    assert explanation.scores.sum() == pytest.approx(1.0, abs=1e-9)


def test_rollout_on_minilm_128_tokens_reads_the_mean_of_rows(minilm):
    inputs = minilm.preprocess(" ".join(["good"] * 126))
    assert len(inputs.tokens) == 128
    explanation = explain(minilm, "rollout", inputs)
    expected = reference_rollout(model_attentions(minilm.model.encoder, inputs)).mean(axis=0)
    np.testing.assert_allclose(explanation.scores, expected, atol=1e-9)
    assert explanation.scores.sum() == pytest.approx(1.0, abs=1e-9)


def test_rollout_on_vit_maps_patches_to_the_image(load_model):
    adapter = load_model("tiny-random-vit")
    image = np.random.default_rng(0).integers(0, 255, (32, 32, 3)).astype(np.uint8)
    inputs = adapter.preprocess(image)
    explanation = explain(adapter, "rollout", inputs)
    cls_row = reference_rollout(model_attentions(adapter.model, inputs))[0]
    grid = torch.tensor(cls_row[1:]).view(1, 1, 4, 4)  # 16 patches after CLS, row-major
    expected = F.interpolate(grid, size=(32, 32), mode="bilinear")[0, 0].numpy()
    assert explanation.scores.shape == (32, 32)
    np.testing.assert_allclose(explanation.scores, expected, atol=1e-9)
    assert explanation.metrics["non_patch_share"] == pytest.approx(cls_row[0], abs=1e-9)


def test_rollout_start_layer_beyond_depth_is_refused(load_model):
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("short text")
    with pytest.raises(InvalidParameterError, match="start_layer"):
        explain(adapter, "rollout", inputs, params={"start_layer": 2})
    with pytest.raises(InvalidParameterError, match="discard_ratio"):
        explain(adapter, "rollout", inputs, params={"discard_ratio": 1.0})


def test_one_layer_flow_equals_the_residual_attention_matrix():
    attention = random_attentions(1, 2, 6, seed=4).mean(dim=1).numpy()
    residual = reference_residual(attention)
    for i in range(6):
        flows, _ = attention_flow(residual, np.eye(6)[i])
        np.testing.assert_allclose(flows, residual[0, i], atol=1e-5)


def networkx_flows(residual: np.ndarray, readout: np.ndarray) -> np.ndarray:
    """Max-flow with float capacities in networkx, from the readout (pooled if not one-hot)."""
    layers, n, _ = residual.shape
    graph = nx.DiGraph()
    for layer in range(1, layers + 1):
        for i in range(n):
            for j in range(n):
                graph.add_edge((layer, i), (layer - 1, j), capacity=residual[layer - 1, i, j])
    for i in range(n):
        graph.add_edge("out", (layers, i), capacity=readout[i])
    flows = np.array([nx.maximum_flow_value(graph, "out", (0, j)) for j in range(n)])
    return flows / flows.sum()


@pytest.mark.parametrize("pooled", [False, True])
def test_flow_agrees_with_networkx(pooled):
    residual = reference_residual(random_attentions(3, 2, 5, seed=5).mean(dim=1).numpy())
    readout = np.full(5, 0.2) if pooled else np.eye(5)[0]
    flows, total = attention_flow(residual, readout)
    np.testing.assert_allclose(flows, networkx_flows(residual, readout), atol=1e-5)
    assert flows.sum() == pytest.approx(1.0) and total > 0


@pytest.mark.parametrize("spec", ["tiny-random-gpt2", "tiny-random-vit"])
def test_attention_flow_runs_end_to_end(load_model, spec):
    adapter = load_model(spec)
    if adapter.modality == "text":
        inputs = adapter.preprocess("a few words to explain here")
    else:
        inputs = adapter.preprocess(np.full((32, 32, 3), 128, dtype=np.uint8))
    explanation = explain(adapter, "attention_flow", inputs)
    assert np.isfinite(explanation.scores).all() and (explanation.scores >= 0).all()
    if adapter.modality == "text":
        assert explanation.scores.sum() == pytest.approx(1.0, abs=1e-9)
        assert explanation.timings.forward_passes == 1  # the prediction's pass gave them
    else:
        assert explanation.scores.shape == (32, 32)


@pytest.mark.parametrize("method", ["rollout", "attention_flow"])
@pytest.mark.parametrize("spec", ["tiny-random-bert", "tiny-random-llama", "tiny-random-vit"])
def test_attention_methods_read_the_attentions_of_the_prediction_pass(load_model, spec, method):
    """The model runs once: the prediction's pass gives the logits and the attentions."""
    adapter = load_model(spec)
    if adapter.modality == "text":
        inputs = adapter.preprocess("a few words to explain here")
    else:
        inputs = adapter.preprocess(np.full((32, 32, 3), 128, dtype=np.uint8))
    calls = []
    handle = adapter.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        explanation = explain(adapter, method, inputs)
    finally:
        handle.remove()
    assert len(calls) == 1 and explanation.timings.forward_passes == 1
    # The prediction made with attentions is the model's ordinary one.
    with torch.no_grad():
        plain = adapter.logits(**inputs.model_kwargs())[0].double()
    assert explanation.target.index == int(plain.argmax())
    assert explanation.target.logit == pytest.approx(float(plain.max()), rel=1e-5, abs=1e-6)
    # And the map equals the method's own on a separate attention pass (no prediction given).
    cls = get_method(method)
    run = RunContext()
    params = validate_params(cls.params, {})
    separate = cls.attribute(adapter, inputs, explanation.target_record, params, run)
    assert run.forward_passes == 1
    np.testing.assert_allclose(separate.scores, explanation.scores, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("method", ["rollout", "attention_flow"])
def test_attention_methods_run_an_sdpa_model_eagerly_for_the_run(load_model, method):
    """SDPA outputs no attention probabilities: the run switches to eager and back."""
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("the cat sat on the mat")
    expected = explain(adapter, method, inputs).scores
    adapter.model.set_attn_implementation("sdpa")
    try:
        got = explain(adapter, method, inputs).scores
        assert adapter.attention_implementation == "sdpa"
    finally:
        adapter.model.set_attn_implementation("eager")
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)


def test_attention_flow_refuses_inputs_above_the_token_limit(load_model):
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("one two three four five six")
    with pytest.raises(InvalidInputError, match="at most 4 tokens"):
        explain(adapter, "attention_flow", inputs, params={"max_tokens": 4})


@pytest.mark.parametrize("method", ["rollout", "attention_flow"])
def test_attention_methods_refuse_a_cnn(effnet, method):
    inputs = effnet.preprocess(np.zeros((8, 8, 3), dtype=np.uint8))
    with pytest.raises(UnsupportedMethodError, match="attentions"):
        explain(effnet, method, inputs)
