"""
DeepLIFT on CNNs is Captum's DeepLIFT: max-pool rule included, product rule only on products.

Captum's max-pool multiplier may differ between the input's and the reference's halves of the
batch (where ``Δx = 0`` it keeps each half's own gradient); nothing of attrlab's may change
that. The reference each time is Captum's ``DeepLift`` run on the bare model in the test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from captum.attr import DeepLift as CaptumDeepLift
from captum.attr import DeepLiftShap as CaptumDeepLiftShap
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.methods._deeplift import deeplift_scope
from attrlab.attribution.methods.deeplift_shap import reference_distribution
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.vision import CNNAdapter
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import output_target

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def _max_pool_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 4),
    )


def _tiny_resnet() -> nn.Module:
    """timm's ResNet-10-T (deep stem, max-pool, avg-down shortcuts) with 8-64 channels."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "resnet10t",
        pretrained=False,
        num_classes=4,
        channels=(8, 16, 32, 64),
        stem_width=8,
        zero_init_last=False,  # else every residual branch starts at zero
    )
    with torch.no_grad():  # batch norms off their identity init, as a trained network's are
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model


def _adapter(model: nn.Module, size: int) -> CNNAdapter:
    transform = ImageTransform((size, size), MEAN, STD)
    return CNNAdapter(model.eval(), "toy", transform, [f"c{i}" for i in range(4)])


def _image(size: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (size, size, 3)).astype(np.uint8)


def _captum(model: nn.Module, pixels: torch.Tensor, target: int) -> tuple[np.ndarray, float]:
    """Captum's DeepLIFT against the mean colour (normalised zero): map and delta."""
    attributions, delta = CaptumDeepLift(model).attribute(
        pixels.clone().requires_grad_(True),
        baselines=torch.zeros_like(pixels),
        target=target,
        return_convergence_delta=True,
    )
    return attributions[0].sum(0).detach().double().numpy(), float(delta)


@pytest.mark.parametrize(
    ("build", "size", "method", "params"),
    [
        (_max_pool_cnn, 16, "deeplift", {}),
        (_tiny_resnet, 32, "deeplift", {}),
    ],
)
def test_deeplift_on_a_max_pool_cnn_is_captums(build, size, method, params):
    model = build()
    adapter = _adapter(model, size)
    inputs = adapter.preprocess(_image(size))
    explanation = explain(adapter, method, inputs, target=output_target(adapter, 1), params=params)
    expected, captum_delta = _captum(model, inputs.pixel_values, 1)
    np.testing.assert_allclose(explanation.scores, expected, rtol=1e-5, atol=1e-7)
    scale = max(1.0, abs(explanation.metrics["logit_difference"]))
    assert explanation.metrics["convergence_delta"] == pytest.approx(captum_delta, abs=1e-5 * scale)


def test_deeplift_shap_on_a_max_pool_cnn_is_captums_deeplift_shap():
    """The same seeded references (the run's draw) handed to Captum's ``DeepLiftShap``."""
    model = _max_pool_cnn()
    adapter = _adapter(model, 16)
    pixels = adapter.preprocess(_image(16)).pixel_values
    params = {"n_references": 4, "noise": 0.25}
    explanation = explain(
        adapter, "deeplift_shap", adapter.preprocess(_image(16)), output_target(adapter, 1), params
    )
    references = reference_distribution(torch.zeros_like(pixels), 4, 0.25, 1.0, RunContext())
    expected = CaptumDeepLiftShap(model).attribute(
        pixels.clone().requires_grad_(True), baselines=references, target=1
    )
    np.testing.assert_allclose(
        explanation.scores, expected[0].sum(0).detach().double().numpy(), rtol=1e-5, atol=1e-7
    )


def test_the_max_pool_cnn_keeps_halves_apart():
    """The case the test above is about: Captum's max-pool moves its argmax here (delta ≠ 0)."""
    model = _max_pool_cnn()
    adapter = _adapter(model, 16)
    _, delta = _captum(model, adapter.preprocess(_image(16)).pixel_values, 1)
    assert abs(delta) > 1e-4


class _InPlaceGate(nn.Module):
    """``h = W1 x; h *= W2 x``: a product DeepLIFT's rule cannot be attached to."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        hidden *= self.second(x)
        return hidden.sum(-1, keepdim=True)


def test_an_in_place_product_is_reported():
    model = _InPlaceGate().double()
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    with deeplift_scope(model) as report:
        CaptumDeepLift(model).attribute(x, baselines=torch.zeros_like(x), target=0)
    assert report.untreated == {"in-place product"}


def test_the_product_rule_ends_with_the_scope_even_on_error():
    """After a failing run a product of two input-dependent tensors has its plain gradient."""
    model = _InPlaceGate().double()

    def fail(_module, _args, _output):
        raise RuntimeError("forced failure")

    handle = model.second.register_forward_hook(fail)
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    with pytest.raises(RuntimeError, match="forced failure"), deeplift_scope(model):
        CaptumDeepLift(model).attribute(x, baselines=torch.zeros_like(x), target=0)
    handle.remove()
    paired = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64, requires_grad=True)
    a, b = paired * 2.0, paired + 1.0
    (grad,) = torch.autograd.grad((a * b).sum(), paired)
    torch.testing.assert_close(grad, 2.0 * (paired + 1.0) + 2.0 * paired)  # d(2p·(p+1))/dp
