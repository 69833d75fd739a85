"""Gradient × Input and Integrated Gradients through the full explain() path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage import data
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.vision import CNNAdapter
from attrlab.attribution.request.target import output_target, target_record


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.randn(3, 3 * 8 * 8, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.weight.T


def _linear_adapter() -> CNNAdapter:
    transform = ImageTransform((8, 8), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    return CNNAdapter(_Linear(), "toy-linear", transform, ["a", "b", "c"])


@pytest.mark.parametrize("method", ["gradient_x_input", "integrated_gradients"])
def test_linear_image_model_attributions_are_w_times_x_minus_baseline(method):
    adapter = _linear_adapter()
    image = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    inputs = adapter.preprocess(image)
    e = explain(adapter, method, inputs, target=output_target(adapter, 2))
    x = inputs.pixel_values[0]
    # Gradient×Input has baseline 0 (= mean colour after normalisation), as IG's default.
    expected = (adapter.model.weight[2].view(3, 8, 8) * x).sum(0).detach().numpy()
    np.testing.assert_allclose(e.scores, expected, rtol=1e-4, atol=1e-5)
    assert e.image_size == (8, 8) and e.target.label == "c"


def test_ig_black_baseline_on_linear_model():
    adapter = _linear_adapter()
    inputs = adapter.preprocess(np.full((8, 8, 3), 200, dtype=np.uint8))
    e = explain(
        adapter,
        "integrated_gradients",
        inputs,
        target=output_target(adapter, 0),
        params={"baseline": "black"},
    )
    black = (0 - 0.5) / 0.25
    w = adapter.model.weight[0].view(3, 8, 8)
    expected = (w * (inputs.pixel_values[0] - black)).sum(0).detach().numpy()
    np.testing.assert_allclose(e.scores, expected, rtol=1e-4, atol=1e-5)
    assert abs(e.metrics["convergence_delta"]) < 1e-3


def test_ig_completeness_on_minilm(minilm):
    inputs = minilm.preprocess("What a terrible, boring film.")
    e = explain(minilm, "integrated_gradients", inputs, params={"n_steps": 64})
    baseline_ids = torch.where(inputs.special_tokens, inputs.input_ids, minilm.pad_token_id)
    with torch.no_grad():
        f_x = minilm.logits(**inputs.model_kwargs())[0, e.target.index]
        f_0 = minilm.logits(input_ids=baseline_ids, attention_mask=inputs.attention_mask)[
            0, e.target.index
        ]
    difference = float(f_x - f_0)
    assert abs(e.scores.sum() - difference) < 0.01 * abs(difference)
    assert abs(e.metrics["convergence_delta"]) < 0.01 * abs(difference)
    assert e.target.label == "negative"
    assert e.scores[0] == 0 and e.scores[-1] == 0  # CLS and SEP equal their baseline
    assert e.timings.backward_passes == 64


def test_ig_completeness_on_efficientnet(effnet):
    inputs = effnet.preprocess(data.chelsea())
    e = explain(
        effnet, "integrated_gradients", inputs, params={"n_steps": 50, "internal_batch_size": 25}
    )
    assert 281 <= e.target.index <= 285
    assert e.metrics["relative_convergence_delta"] < 0.1
    assert e.scores.shape == (224, 224)


def test_gradient_x_input_on_text_equals_manual_product(load_model):
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("hello there general kenobi")
    e = explain(adapter, "gradient_x_input", inputs, target=output_target(adapter, 1))
    embeddings = adapter.token_embedding_module()(inputs.input_ids).detach().requires_grad_()
    captured = {}

    def swap(_module, _args, _output):
        captured["e"] = embeddings
        return embeddings

    handle = adapter.token_embedding_module().register_forward_hook(swap)
    try:
        logit = adapter.logits(**inputs.model_kwargs())[0, 1]
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logit, embeddings)
    expected = (grad * embeddings).sum(-1)[0].detach().numpy()
    np.testing.assert_allclose(e.scores, expected, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("alias", ["tiny-random-gpt2", "tiny-random-llama"])
def test_decoder_next_token_ig(load_model, alias):
    adapter = load_model(alias)
    inputs = adapter.preprocess("the capital of france is")
    e = explain(adapter, "integrated_gradients", inputs, target=target_record(adapter, "paris"))
    assert e.target.label == " paris"  # the word as it stands after other text
    assert e.scores.shape == (len(inputs.tokens),)
    assert e.metrics["relative_convergence_delta"] < 0.05
