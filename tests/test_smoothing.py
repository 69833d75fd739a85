"""
SmoothGrad, VarGrad and NoiseGrad over gradient methods, against averages written out here.

The noisy inputs and weights are read back from the model while it runs (a hook on its first
layer), so each expected map is the plain average of what the model saw, computed in the test.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from _model_state import model_state
from _small_budgets import SMALL_BUDGETS
from _tiny_families import tiny_relu_cnn
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.errors import (
    BudgetExceededError,
    InvalidParameterError,
    JobCancelledError,
)
from attrlab.attribution.methods import available_methods, get_method
from attrlab.attribution.methods.smoothing import weight_noise
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.vision import CNNAdapter
from attrlab.attribution.request.estimate import estimate
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import ClassTarget, output_target

SIZE = 8
SAMPLES = 4


def linear_adapter() -> CNNAdapter:
    """A seeded linear model ``w·x + b`` on 3×8×8 normalised pixels, four classes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 4))
    transform = ImageTransform((SIZE, SIZE), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    return CNNAdapter(model, "linear", transform, ["a", "b", "c", "d"])


def image(seed: int = 0, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (size, size, 3)).astype(np.uint8)


def smoothing(mode: str, **more: object) -> dict[str, object]:
    return {"smoothing": mode, "smoothing_samples": SAMPLES, **more}


class Seen:
    """What the linear layer saw on each call: its input rows and its weight."""

    def __init__(self, layer: nn.Linear) -> None:
        self.inputs: list[torch.Tensor] = []
        self.weights: list[torch.Tensor] = []
        self.handle = layer.register_forward_pre_hook(self.keep)

    def keep(self, module: nn.Linear, args: tuple) -> None:
        self.inputs.append(args[0].detach().clone())
        self.weights.append(module.weight.detach().clone())


def seen_during(adapter: CNNAdapter, method: str, params: dict, target: int = 2):
    seen = Seen(adapter.model[1])
    try:
        inputs = adapter.preprocess(image())
        explanation = explain(adapter, method, inputs, output_target(adapter, target), params)
    finally:
        seen.handle.remove()
    return explanation, seen


def per_pixel(values: torch.Tensor) -> np.ndarray:
    """(3·H·W,) -> (H, W): the maps' sum over colour channels."""
    return values.view(3, SIZE, SIZE).sum(0).double().numpy()


def test_smoothgrad_of_gradient_x_input_is_the_average_over_the_inputs_the_model_saw():
    adapter = linear_adapter()
    explanation, seen = seen_during(adapter, "gradient_x_input", smoothing("smoothgrad"))
    clean, *noisy = seen.inputs  # explain's own prediction, then one call per sample
    assert len(noisy) == SAMPLES
    weight = adapter.model[1].weight[2].detach()
    expected = np.mean([per_pixel(weight * x[0]) for x in noisy], axis=0)
    np.testing.assert_allclose(explanation.scores, expected, rtol=1e-5, atol=1e-7)
    # the noise: σ·(max − min) of the input, here 0.15 of its range, and fresh per sample
    spread = float(clean.max() - clean.min())
    noise = torch.stack(noisy) - clean
    assert float(noise.std()) == pytest.approx(0.15 * spread, rel=0.1)
    assert not torch.equal(noisy[0], noisy[1])


def test_smoothgrad_of_the_gradient_of_a_linear_model_is_its_weight_and_vargrad_is_zero():
    adapter = linear_adapter()
    weight = per_pixel(adapter.model[1].weight[2].detach())
    inputs = adapter.preprocess(image())
    mean = explain(adapter, "gradient", inputs, output_target(adapter, 2), smoothing("smoothgrad"))
    variance = explain(adapter, "gradient", inputs, output_target(adapter, 2), smoothing("vargrad"))
    squares = explain(
        adapter, "gradient", inputs, output_target(adapter, 2), smoothing("smoothgrad_sq")
    )
    np.testing.assert_allclose(mean.scores, weight, rtol=1e-6)
    assert np.array_equal(variance.scores, np.zeros_like(weight))
    np.testing.assert_allclose(squares.scores, weight**2, rtol=1e-6)


def test_vargrad_of_gradient_x_input_is_the_variance_over_the_inputs_seen():
    adapter = linear_adapter()
    explanation, seen = seen_during(adapter, "gradient_x_input", smoothing("vargrad"))
    weight = adapter.model[1].weight[2].detach()
    maps = np.stack([per_pixel(weight * x[0]) for x in seen.inputs[1:]])
    np.testing.assert_allclose(explanation.scores, maps.var(axis=0), rtol=1e-4, atol=1e-12)


def test_noisegrad_of_the_gradient_is_the_average_of_the_weights_the_model_ran_with():
    adapter = linear_adapter()
    original = adapter.model[1].weight.detach().clone()
    explanation, seen = seen_during(adapter, "gradient", smoothing("noisegrad"))
    clean, *noisy = seen.weights
    assert torch.equal(clean, original) and len(noisy) == SAMPLES
    expected = np.mean([per_pixel(w[2]) for w in noisy], axis=0)
    np.testing.assert_allclose(explanation.scores, expected, rtol=1e-6)
    ratio = torch.stack(noisy) / original  # multiplicative noise N(1, 0.2²), fresh per sample
    assert float(ratio.mean()) == pytest.approx(1.0, abs=0.02)
    assert float(ratio.std()) == pytest.approx(0.2, rel=0.1)
    assert torch.equal(adapter.model[1].weight, original)  # restored bit for bit


def test_noisegrad_plus_plus_moves_both_the_input_and_the_weights():
    adapter = linear_adapter()
    original = adapter.model[1].weight.detach().clone()
    explanation, seen = seen_during(adapter, "gradient_x_input", smoothing("noisegrad++"))
    (clean, *noisy), weights = seen.inputs, seen.weights[1:]
    expected = np.mean(
        [per_pixel(w[2] * x[0]) for w, x in zip(weights, noisy, strict=True)], axis=0
    )
    np.testing.assert_allclose(explanation.scores, expected, rtol=1e-5, atol=1e-7)
    assert not any(torch.equal(x, clean) for x in noisy)
    assert not any(torch.equal(w, original) for w in weights)


@pytest.mark.parametrize("mode", ["smoothgrad", "noisegrad++"])
@pytest.mark.parametrize("method", ["gradient_x_input", "deeplift"])
def test_zero_noise_gives_the_plain_method(method, mode):
    adapter = tiny_relu_cnn()
    inputs = adapter.preprocess(image(size=16))
    plain = explain(adapter, method, inputs, output_target(adapter, 1))
    params = smoothing(mode, smoothing_sigma=0.0, smoothing_weight_sigma=0.0)
    smooth = explain(adapter, method, inputs, output_target(adapter, 1), params)
    np.testing.assert_array_equal(smooth.scores, plain.scores)
    assert smooth.metrics == pytest.approx(plain.metrics)


@pytest.mark.parametrize("mode", ["smoothgrad", "noisegrad"])
def test_the_noise_is_seeded(mode):
    adapter = tiny_relu_cnn()
    inputs = adapter.preprocess(image(size=16))

    def run(seed: int) -> np.ndarray:
        settings = RunSettings(seed=seed)
        return explain(
            adapter, "gradient", inputs, output_target(adapter, 1), smoothing(mode), settings
        ).scores

    np.testing.assert_array_equal(run(3), run(3))
    assert not np.allclose(run(3), run(4))


def test_text_noise_lands_on_the_inputs_token_embeddings_only(load_model):
    """Special tokens and DeepLIFT's reference (pad tokens) get none; the other tokens do."""
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("the cat sat on the mat")
    embeddings = adapter.model.bert.embeddings
    seen: list[torch.Tensor] = []
    handle = embeddings.LayerNorm.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].detach().clone())
    )
    try:
        explain(
            adapter,
            "deeplift",
            inputs,
            output_target(adapter, 0),
            smoothing("smoothgrad", smoothing_samples=1),
        )
        reference = torch.where(inputs.special_tokens, inputs.input_ids, adapter.pad_token_id)
        with torch.no_grad():
            adapter.logits(input_ids=reference, attention_mask=inputs.attention_mask)
    finally:
        handle.remove()
    clean, paired, *_, clean_reference = seen  # prediction, [x; x'], F(x̃), F(x') again
    noise = paired[0] - clean[0]
    special = inputs.special_tokens
    assert torch.equal(noise[special], torch.zeros_like(noise[special]))
    assert bool((noise[~special].abs() > 0).all())
    assert torch.equal(paired[1], clean_reference[0])  # the reference row is left clean


def test_weight_noise_restores_every_weight_after_an_error_mid_run():
    adapter = tiny_relu_cnn()
    model = adapter.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    storage = [p.data_ptr() for p in model.parameters()]
    state = model_state(model)
    calls = []

    def fail_on_the_third(_module, _args, _output):
        calls.append(torch.equal(model[0].weight, before["0.weight"]))
        if len(calls) == 3:
            raise RuntimeError("forced failure")

    handle = model.register_forward_hook(fail_on_the_third)
    try:
        with pytest.raises(RuntimeError, match="forced failure"):
            explain(
                adapter,
                "gradient",
                adapter.preprocess(image(size=16)),
                output_target(adapter, 1),
                smoothing("noisegrad"),
            )
    finally:
        handle.remove()
    assert calls == [True, False, False]  # the prediction, then two samples with noisy weights
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert [p.data_ptr() for p in model.parameters()] == storage
    assert model_state(model) == state
    explain(
        adapter,
        "gradient",
        adapter.preprocess(image(size=16)),
        output_target(adapter, 1),
        smoothing("noisegrad"),
    )


def test_weight_noise_refuses_a_second_context_on_one_model():
    model = tiny_relu_cnn().model
    with weight_noise(model, 0.2, 0) as draw:
        draw()
        with pytest.raises(RuntimeError, match="already"), weight_noise(model, 0.2, 0):
            pass
    assert model_state(model) == model_state(tiny_relu_cnn().model)


def _applicable(method: str, load_model):
    """A tiny model the method applies to: the ReLU CNN, else tiny BERT."""
    cnn = tiny_relu_cnn()
    if get_method(method).unsupported_reason(cnn) is None:
        return cnn, image(size=16)
    return load_model("tiny-random-bert"), "the cat sat on the mat"


SMOOTHABLE = [m.name for m in available_methods() if m.smoothable()]


@pytest.mark.parametrize("method", SMOOTHABLE)
def test_the_estimate_counts_the_passes_of_every_sample(load_model, method):
    adapter, raw = _applicable(method, load_model)
    inputs = adapter.preprocess(raw)
    params = SMALL_BUDGETS.get(method, {}) | smoothing("noisegrad++", smoothing_samples=3)
    plain = estimate(adapter, method, inputs, SMALL_BUDGETS.get(method, {}))
    cost = estimate(adapter, method, inputs, params)
    spent = explain(adapter, method, inputs, params=params).timings
    assert (spent.forward_passes, spent.backward_passes) == (
        cost.forward_passes,
        cost.backward_passes,
    )
    # 3 × the method's passes, and 3 predictions of a noisy input for a method reading F(x)
    reads = get_method(method).reads_prediction
    assert cost.forward_passes - 1 == 3 * (plain.forward_passes - 1 + reads)
    assert cost.backward_passes == 3 * plain.backward_passes


def test_every_gradient_attribution_method_takes_smoothing_and_no_other_does():
    for method in available_methods():
        names = {p.name for p in method.params}
        gradient_map = "gradients" in method.requires and method.category == "attribution"
        assert ("smoothing" in names) == gradient_map, method.name
    with pytest.raises(InvalidParameterError, match="smoothgrad, smoothgrad_sq"):
        explain(
            tiny_relu_cnn(),
            "gradient",
            tiny_relu_cnn().preprocess(image(size=16)),
            ClassTarget(0),
            {"smoothing": "blur"},
        )


def test_progress_and_cancel_work_per_sample():
    adapter = tiny_relu_cnn()
    inputs = adapter.preprocess(image(size=16))
    reports: list[tuple[int, int]] = []
    explain(
        adapter,
        "gradient",
        inputs,
        output_target(adapter, 1),
        smoothing("smoothgrad"),
        RunSettings(progress=lambda *r: reports.append(r)),
    )
    assert reports == [(i, SAMPLES) for i in range(SAMPLES + 1)]
    cancel = threading.Event()

    def cancel_after_two(done: int, _total: int) -> None:
        if done == 2:
            cancel.set()

    weights = {k: v.clone() for k, v in adapter.model.state_dict().items()}
    settings = RunSettings(progress=cancel_after_two, cancel=cancel)
    with pytest.raises(JobCancelledError):
        explain(
            adapter, "gradient", inputs, output_target(adapter, 1), smoothing("noisegrad"), settings
        )
    assert all(torch.equal(adapter.model.state_dict()[k], v) for k, v in weights.items())


def test_the_pass_budget_covers_every_sample():
    adapter = tiny_relu_cnn()
    inputs = adapter.preprocess(image(size=16))
    settings = RunSettings(max_forward_passes=10)
    explain(
        adapter,
        "deeplift",
        inputs,
        output_target(adapter, 1),
        smoothing("smoothgrad", smoothing_samples=2),
        settings,
    )
    with pytest.raises(BudgetExceededError, match="smoothing_samples"):
        explain(
            adapter,
            "deeplift",
            inputs,
            output_target(adapter, 1),
            smoothing("smoothgrad", smoothing_samples=3),
            settings,
        )
