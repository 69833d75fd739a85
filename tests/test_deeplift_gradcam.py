"""DeepLIFT, DeepLIFT-SHAP and Grad-CAM: completeness, linear-model identity, peaks, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage import data
from torch import nn

from attrlab.attribution import explain, get_method
from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.methods._deeplift import untreated_by_deeplift
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.vision import CNNAdapter
from attrlab.attribution.request.params import validate_params
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import output_target

SIZE = 16
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def adapter_for(model: nn.Module, size: int = SIZE, classes: int = 4) -> CNNAdapter:
    transform = ImageTransform((size, size), MEAN, STD)
    return CNNAdapter(model, "toy", transform, [f"c{i}" for i in range(classes)])


def seeded(build):
    torch.manual_seed(0)
    return build()


def relu_cnn() -> nn.Module:
    return seeded(
        lambda: nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.AvgPool2d(2),  # Captum's max-pool rule is exact only if the argmax is unchanged
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 4),
        )
    )


def random_image(seed: int = 0, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (size, size, 3)).astype(np.uint8)


def hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )


@pytest.mark.parametrize("method", ["deeplift", "deeplift_shap"])
def test_deeplift_on_a_relu_cnn_sums_to_the_logit_difference(method):
    adapter = adapter_for(relu_cnn())
    inputs = adapter.preprocess(random_image())
    explanation = explain(adapter, method, inputs, target=output_target(adapter, 1))
    metrics = explanation.metrics
    assert abs(metrics["relative_convergence_delta"]) < 1e-4
    assert explanation.scores.sum() - metrics["logit_difference"] == pytest.approx(
        metrics["convergence_delta"], abs=1e-6
    )
    assert not explanation.warnings  # ReLU and linear layers: all treated exactly by Captum


@pytest.mark.parametrize("baseline", ["mean", "black"])
@pytest.mark.parametrize("method", ["deeplift", "deeplift_shap"])
def test_deeplift_on_a_linear_model_is_weight_times_difference(method, baseline):
    model = seeded(lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 4)))
    adapter = adapter_for(model)
    inputs = adapter.preprocess(random_image(1))
    params = {"baseline": baseline} | ({"noise": 0.0} if method == "deeplift_shap" else {})
    explanation = explain(adapter, method, inputs, target=output_target(adapter, 2), params=params)
    x = inputs.pixel_values[0].double()
    if baseline == "mean":
        x0 = torch.zeros_like(x)
    else:  # black pixels, normalised
        x0 = (-torch.tensor(MEAN) / torch.tensor(STD)).double().view(3, 1, 1).expand_as(x)
    weight = model[1].weight[2].detach().double().view(3, SIZE, SIZE)
    expected = (weight * (x - x0)).sum(dim=0).numpy()
    np.testing.assert_allclose(explanation.scores, expected, rtol=1e-4, atol=1e-5)


def test_deeplift_shap_averages_over_seeded_references():
    adapter = adapter_for(relu_cnn())
    inputs = adapter.preprocess(random_image(2))
    first = explain(
        adapter, "deeplift_shap", inputs, params={"n_references": 4}, settings=RunSettings(seed=3)
    )
    again = explain(
        adapter, "deeplift_shap", inputs, params={"n_references": 4}, settings=RunSettings(seed=3)
    )
    other = explain(
        adapter, "deeplift_shap", inputs, params={"n_references": 4}, settings=RunSettings(seed=4)
    )
    np.testing.assert_array_equal(first.scores, again.scores)
    assert not np.allclose(first.scores, other.scores)
    assert first.metrics["max_abs_reference_delta"] < 1e-4 * max(
        1.0, abs(first.metrics["logit_difference"])
    )


@pytest.mark.parametrize("method", ["deeplift", "deeplift_shap"])
def test_deeplift_routes_the_attention_of_an_sdpa_model_through_eager_for_the_run(
    load_model, method
):
    """SDPA bypasses the attention rule: the run switches to eager (the rule applies), then back."""
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("the cat sat on the mat")
    hooks = hook_count(adapter.model)  # transformers keeps its own output-capturing hooks
    expected = explain(adapter, method, inputs)
    adapter.model.set_attn_implementation("sdpa")
    try:
        explanation = explain(adapter, method, inputs)
        assert adapter.attention_implementation == "sdpa"
    finally:
        adapter.model.set_attn_implementation("eager")
    assert not [w for w in explanation.warnings if "Attention" in w]
    np.testing.assert_allclose(explanation.scores, expected.scores, rtol=1e-6, atol=1e-9)
    assert hook_count(adapter.model) == hooks


def test_untreated_modules_are_found_by_type():
    bert_like = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.LayerNorm(4))
    attention = nn.MultiheadAttention(4, 2)
    assert untreated_by_deeplift(bert_like) == []
    assert untreated_by_deeplift(nn.Sequential(nn.GroupNorm(2, 4))) == ["GroupNorm"]
    assert untreated_by_deeplift(nn.Sequential(attention)) == ["MultiheadAttention"]
    assert untreated_by_deeplift(nn.Sequential(attention), routed={id(attention)}) == []
    assert untreated_by_deeplift(relu_cnn()) == []
    assert untreated_by_deeplift(nn.Sequential(nn.BatchNorm2d(3), nn.ReLU6())) == []
    assert untreated_by_deeplift(nn.Sequential(nn.Linear(4, 4), nn.GLU())) == ["GLU"]


@pytest.mark.parametrize(
    "activation", [nn.ReLU6(), nn.GELU(), nn.SiLU(), nn.Hardswish(), nn.Mish(), nn.ReLU6(True)]
)
def test_rescale_rule_on_every_elementwise_activation(activation):
    """DeepLIFT multipliers (f(z) - f(z0)) / (z - z0), written out, on a one-hidden-layer net."""
    from captum.attr import DeepLift as CaptumDeepLift

    from attrlab.attribution.compat import deeplift_rules
    from attrlab.attribution.methods._deeplift import deeplift_scope

    torch.manual_seed(0)
    first, second = nn.Linear(5, 7), nn.Linear(7, 1)
    model = nn.Sequential(first, activation, second).double()
    x, x0 = torch.randn(1, 5, dtype=torch.float64) * 3, torch.zeros(1, 5, dtype=torch.float64)
    with deeplift_scope(model):
        got = CaptumDeepLift(model).attribute(x, baselines=x0, target=0)
    with torch.no_grad():
        z, z0 = first(x), first(x0)
        act = type(activation)()  # a fresh, not-in-place copy for the reference
        multiplier = (act(z) - act(z0)) / (z - z0)
        expected = ((second.weight * multiplier) @ first.weight) * (x - x0)
    torch.testing.assert_close(got, expected)
    assert got.sum().item() == pytest.approx(float(model(x) - model(x0)), rel=1e-9)
    assert type(activation) not in deeplift_rules  # the rule table is restored


def test_deeplift_on_efficientnet_is_complete_and_not_gradient_times_input(effnet):
    """ReLU6 gets the Rescale rule: DeepLIFT sums to the logit difference, unlike before."""
    inputs = effnet.preprocess(data.chelsea())
    deeplift = explain(effnet, "deeplift", inputs)
    plain = explain(effnet, "gradient_x_input", inputs)
    assert deeplift.metrics["relative_convergence_delta"] < 1e-4
    assert not deeplift.warnings
    gap = np.abs(deeplift.scores - plain.scores).max() / np.abs(plain.scores).max()
    assert gap > 0.1


class ReusedReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3)
        self.relu = nn.ReLU()
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.relu(self.conv2(self.relu(self.conv1(x)))).mean(dim=(2, 3)))


class FailsMidForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.relu = nn.Conv2d(3, 4, 3), nn.ReLU()
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.relu(self.conv(x))
        if self.fail:
            raise RuntimeError("forced failure")
        return hidden.mean(dim=(2, 3))


def test_deeplift_refuses_a_module_used_twice_and_cleans_up():
    model = seeded(ReusedReLU)
    adapter = adapter_for(model)
    inputs = adapter.preprocess(random_image())
    with pytest.raises(UnsupportedMethodError, match="more than once"):
        explain(adapter, "deeplift", inputs)
    assert hook_count(model) == 0
    assert not any(hasattr(m, "input") or hasattr(m, "output") for m in model.modules())


@pytest.mark.parametrize("method", ["deeplift", "gradcam"])
def test_an_error_mid_forward_leaves_the_model_unchanged(method):
    model = seeded(FailsMidForward)
    adapter = adapter_for(model)
    inputs = adapter.preprocess(random_image())
    with torch.no_grad():
        before = model(inputs.pixel_values)
    attributes = {name: set(vars(m)) for name, m in model.named_modules()}
    model.fail = True
    with pytest.raises(RuntimeError, match="forced failure"):
        # explain() runs a plain forward first, so call the method itself
        get_method(method).attribute(
            adapter,
            inputs,
            output_target(adapter, 0),
            {"baseline": "auto", "layer": "auto"},
            RunContext(),
        )
    model.fail = False
    assert hook_count(model) == 0
    assert {name: set(vars(m)) for name, m in model.named_modules()} == attributes
    with torch.no_grad():
        assert torch.equal(model(inputs.pixel_values), before)


def bright_corner_model() -> nn.Module:
    model = nn.Sequential(
        nn.Conv2d(3, 2, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2, 2),
    )
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].weight[0, :, 1, 1] = 1.0  # channel 0: brightness; channel 1: dark
        model[0].weight[1, :, 1, 1] = -1.0
        model[0].bias.zero_()
        model[4].weight.copy_(torch.eye(2))
        model[4].bias.zero_()
    return model


def test_gradcam_peaks_where_the_class_evidence_is():
    adapter = CNNAdapter(
        bright_corner_model(),
        "corner",
        ImageTransform((SIZE, SIZE), (0, 0, 0), (1, 1, 1)),
        ["a", "b"],
    )
    image = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
    image[:4, :4] = 255
    explanation = explain(
        adapter, "gradcam", adapter.preprocess(image), target=output_target(adapter, 0)
    )
    scores = explanation.scores
    assert scores.shape == (SIZE, SIZE) and (scores >= 0).all()
    row, col = np.unravel_index(scores.argmax(), scores.shape)
    assert row < 5 and col < 5
    assert scores[8:, 8:].max() == pytest.approx(0.0, abs=1e-9)


def test_gradcam_layer_parameter():
    adapter = adapter_for(relu_cnn())
    inputs = adapter.preprocess(random_image())
    auto = explain(adapter, "gradcam", inputs, target=output_target(adapter, 0))
    named = explain(
        adapter, "gradcam", inputs, target=output_target(adapter, 0), params={"layer": "4"}
    )  # last ReLU
    np.testing.assert_allclose(auto.scores, named.scores)
    with pytest.raises(InvalidParameterError, match="must name a module"):
        explain(adapter, "gradcam", inputs, params={"layer": "no.such.layer"})


def test_gradcam_on_efficientnet(effnet):
    hooks = hook_count(effnet.model)
    explanation = explain(effnet, "gradcam", effnet.preprocess(random_image(size=64)))
    assert explanation.scores.shape == (224, 224)
    assert (explanation.scores >= 0).all() and explanation.scores.max() > 0
    assert hook_count(effnet.model) == hooks


def test_gradcam_refuses_text(minilm):
    with pytest.raises(UnsupportedMethodError, match="image"):
        explain(minilm, "gradcam", minilm.preprocess("a text"))


def test_only_activation_modules_get_the_rescale_rule():
    """timm's layers package also holds convolutions, linears and norms: those are not treated."""
    from timm.layers import LayerNorm2d, Linear, StdConv2d
    from timm.layers.activations import Swish

    from attrlab.attribution.methods._deeplift import _elementwise_activations

    model = nn.Sequential(StdConv2d(3, 4, 3), Swish(), LayerNorm2d(4), nn.Flatten(), Linear(4, 2))
    assert _elementwise_activations(model) == {Swish}
    assert untreated_by_deeplift(model) == ["LayerNorm2d"]


def _rows_seen(model: nn.Module, calls: list[int]) -> torch.utils.hooks.RemovableHandle:
    """Record the rows of every call of ``model``, however its input is passed."""

    def hook(_module, args, kwargs, _output):
        first = args[0] if args else kwargs.get("input_ids")
        calls.append((first if first is not None else kwargs["inputs_embeds"]).shape[0])

    return model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("modality", ["image", "text"])
@pytest.mark.parametrize(
    ("method", "params", "rows"),
    [
        ("deeplift", {}, [1, 2, 1]),  # prediction; input and baseline; the baseline again
        ("deeplift_shap", {"n_references": 4}, [1, 8, 4]),  # 4 inputs and 4 references; refs
        ("integrated_gradients", {"n_steps": 8}, [1, 8, 1]),  # the path; the baseline
    ],
)
def test_convergence_delta_takes_f_of_x_from_the_prediction_explain_made(
    load_model, modality, method, params, rows
):
    """The input's forward runs once: the delta's F(x) is the prediction, F(x0) one pass more."""
    if modality == "image":
        adapter = adapter_for(relu_cnn())
        inputs = adapter.preprocess(random_image())
        reference = torch.zeros_like(inputs.pixel_values)  # the mean colour, the default
        kwargs = {"pixel_values": reference}
    else:
        adapter = load_model("tiny-random-bert")
        inputs = adapter.preprocess("the cat sat on the mat")
        reference = torch.where(inputs.special_tokens, inputs.input_ids, adapter.pad_token_id)
        kwargs = {"input_ids": reference, "attention_mask": inputs.attention_mask}
    calls: list[int] = []
    handle = _rows_seen(adapter.model, calls)
    try:
        explanation = explain(
            adapter, method, inputs, target=output_target(adapter, 1), params=params
        )
    finally:
        handle.remove()
    assert calls == rows
    checked = validate_params(get_method(method).params, params)
    assert explanation.timings.forward_passes == sum(rows)
    assert (
        explanation.timings.forward_passes
        == 1 + get_method(method).passes(adapter, inputs, checked).forward
    )
    # The delta against the model's own outputs, computed here: Σ scores − (F(x) − F(x0)) with
    # the default reference (mean colour; pad tokens, special tokens kept). DeepLIFT-SHAP's
    # references are a cloud around it, so its difference is checked through the metric.
    with torch.no_grad():
        logit = adapter.logits(**inputs.model_kwargs())[0, 1]
        reference_logit = adapter.logits(**kwargs)[0, 1]
    difference = explanation.metrics["logit_difference"]
    if method != "deeplift_shap":  # one reference: the model's own difference, computed here
        difference = float(logit.double() - reference_logit.double())
        assert explanation.metrics["logit_difference"] == pytest.approx(difference, rel=1e-5)
    expected = explanation.scores.sum() - difference
    assert explanation.metrics["convergence_delta"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    # DeepLIFT is exact up to float32 rounding (a random BERT's logit difference is small);
    # 8 path points leave integrated gradients a coarser sum.
    bound = {"image": 1e-4, "text": 1e-3}[modality] if method != "integrated_gradients" else 0.05
    assert abs(explanation.metrics["relative_convergence_delta"]) < bound
