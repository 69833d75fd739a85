"""
DeepLIFT on transformers: summation-to-delta against the model's own ``F(x) − F(x')``.

Without rules for norms, softmax attention and products, DeepLIFT on a transformer misses the
logit difference by tens of percent; with them every family sums to it up to rounding. The
reference each time is two plain forward passes of the model, computed by Captum apart from
the attribution.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from _tiny_families import BIASED, biased_family, classic_family, clip, dinov2
from skimage import data
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.methods import _deeplift_rules as rules
from attrlab.attribution.methods._deeplift import deeplift_scope

TEXT = "the quick brown fox jumps over the lazy dog"
IMAGE = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
#: Families whose eager code computes the softmax or RMSNorm in float32 even in a float64 model;
#: their own forward values carry float32 rounding, which no attribution can sum to exactly.
WEIGHT_SCALE = 4.0
FLOAT32_INSIDE = {"llama", "vit", "clip", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"} | {
    "modernbert"
}


def _family(tokenizer, name: str):
    """A tiny float64 model whose weights are scaled up from their 0.02 init, so that its
    output depends on the input (otherwise ``F(x) − F(x')`` is ~1e-6 and proves nothing)."""
    if name in ("bert", "gpt2", "llama", "vit"):
        adapter = classic_family(tokenizer, name)
    elif name == "dinov2":
        adapter = dinov2(registers=2)
    elif name == "clip":
        adapter = clip(tokenizer)
    else:
        adapter = biased_family(tokenizer, name)
        if name == "gemma2":  # the 0.1 cap of the shared config flattens every logit difference
            adapter.config.final_logit_softcapping = 30.0
    with torch.no_grad():
        for param in adapter.model.parameters():
            if param.dim() >= 2:
                param.mul_(WEIGHT_SCALE)
    return adapter


def _inputs(adapter):
    inputs = adapter.preprocess(IMAGE if adapter.modality == "image" else TEXT)
    if adapter.modality == "image":
        pixels = inputs.pixel_values.double()
        inputs = type(inputs)(pixels, inputs.image, inputs.original_size)
    return inputs


@pytest.mark.parametrize(
    "name", ["bert", "gpt2", "llama", "vit", "dinov2", "clip", *sorted(BIASED)]
)
@pytest.mark.parametrize("method", ["deeplift", "deeplift_shap"])
def test_every_family_sums_to_the_logit_difference(load_model, name, method):
    adapter = _family(load_model("tiny-random-bert").tokenizer, name)
    explanation = explain(adapter, method, _inputs(adapter))
    bound = 1e-4 if name in FLOAT32_INSIDE else 1e-8
    assert explanation.metrics["relative_convergence_delta"] < bound
    # a difference to sum to (tiny BERT's tanh pooler keeps its own near 1e-5; MiniLM below is
    # BERT with a difference of 7.5)
    assert abs(explanation.metrics["logit_difference"]) > 1e-6
    assert not explanation.warnings


def test_without_the_rules_the_sum_misses(load_model, monkeypatch):
    """The same model and input with norms and attention passed as gradients misses by > 1 %."""
    adapter = classic_family(load_model("tiny-random-bert").tokenizer, "bert")
    with_rules = explain(adapter, "deeplift", _inputs(adapter))
    monkeypatch.setattr(rules, "_attention_modules", lambda *_: [])
    monkeypatch.setattr(rules, "treated_norm", lambda _module: False)
    monkeypatch.setattr(rules.nn, "LayerNorm", type("NotALayerNorm", (), {}))
    without = explain(adapter, "deeplift", _inputs(adapter))
    assert with_rules.metrics["relative_convergence_delta"] < 1e-8
    assert without.metrics["relative_convergence_delta"] > 1e-2
    assert any("LayerNorm" in w for w in without.warnings)


def _attention_relevance(scale: float) -> tuple[float, float]:
    """Σ Δ·multiplier over q, k, v of softmax(q·kᵀ)·v, and the reference Σ Δ(output)·g."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=generator, dtype=torch.float64) for _ in "qkv")
    q, k = q * scale, k * scale
    for t in (q, k, v):
        t.requires_grad_(True)
    keys = k.transpose(-1, -2)
    scores = rules._product(q, keys, q.detach() @ keys.detach(), torch.matmul)
    probabilities = rules._softmax(scores)
    output = rules._product(probabilities, v, probabilities.detach() @ v.detach(), torch.matmul)
    g = torch.randn(1, 2, 5, 4, generator=generator, dtype=torch.float64).expand(2, -1, -1, -1)
    grads = torch.autograd.grad(output, (q, k, v), g)
    got = sum(
        float(((t[0] - t[1]).detach() * grad[0]).sum())
        for t, grad in zip((q, k, v), grads, strict=True)
    )
    with torch.no_grad():  # reference: the plain attention at the two points
        plain = torch.softmax(q @ keys, -1) @ v
    return got, float(((plain[0] - plain[1]) * g[0]).sum())


@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0])
def test_attention_rule_is_exact_even_when_the_halves_scores_differ_widely(scale):
    """At scale 100 the two halves' softmax sums differ by e^1000s: nothing may overflow."""
    got, expected = _attention_relevance(scale)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


def _requiring_grad(_module, _args, out):
    return out.requires_grad_(True)


def test_rules_never_change_a_forward_value(load_model):
    """Logits of a paired batch under the rules equal the plain logits, for each family kind."""
    tokenizer = load_model("tiny-random-bert").tokenizer
    for name in ("gemma2", "modernbert", "clip"):
        adapter = _family(tokenizer, name)
        inputs = _inputs(adapter)
        kwargs = {k: torch.cat([t, t.flip(-1)]) for k, t in inputs.model_kwargs().items()}
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = torch.ones_like(kwargs["attention_mask"])
        with torch.no_grad():
            plain = adapter.logits(**kwargs)
        hooks = []
        if adapter.modality == "image":
            kwargs["pixel_values"].requires_grad_(True)
        else:  # the embeddings carry the gradient, as in Captum's layer methods
            embedding = adapter.model.get_input_embeddings()
            hooks.append(embedding.register_forward_hook(_requiring_grad))
        try:
            scope = deeplift_scope(adapter.model, adapter)
            with torch.enable_grad(), scope as report:
                ruled = adapter.logits(**kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        assert report.routed_attention and not report.untreated  # the rules were in the pass
        torch.testing.assert_close(ruled.detach(), plain, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["deeplift", "deeplift_shap"])
def test_minilm_deeplift_is_complete_and_not_gradient_times_input(minilm, method):
    inputs = minilm.preprocess("The movie was wonderful, I loved it.")
    explanation = explain(minilm, method, inputs)
    plain = explain(minilm, "gradient_x_input", inputs)
    assert explanation.metrics["relative_convergence_delta"] < 1e-4  # measured: 7e-7, 2e-7
    assert not explanation.warnings
    gap = np.abs(explanation.scores - plain.scores).max() / np.abs(plain.scores).max()
    assert gap > 0.1


def test_minilm_in_float64_sums_to_rounding(minilm):
    adapter = copy.deepcopy(minilm)
    adapter.model.double()
    explanation = explain(adapter, "deeplift", adapter.preprocess("The movie was wonderful."))
    assert explanation.metrics["relative_convergence_delta"] < 1e-10


def test_efficientnet_deeplift_shap_is_complete(effnet):
    explanation = explain(effnet, "deeplift_shap", effnet.preprocess(data.chelsea()))
    assert explanation.metrics["relative_convergence_delta"] < 1e-4
    assert not explanation.warnings


class _Gated(nn.Module):
    """``y = Σ_j (W1 x)_j · (W2 x)_j``: a product the rules never see as such."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(4, 3, bias=False), nn.Linear(4, 3, bias=False)

    def forward(self, x):
        return (self.first(x) * self.second(x)).sum(-1, keepdim=True)


def test_an_unseen_product_gets_deeplifts_product_rule_written_out():
    """Attribution to x_i = Σ_j (b̄_j W1_ji + ā_j W2_ji) Δx_i with ā, b̄ the means of x and x'."""
    from captum.attr import DeepLift as CaptumDeepLift

    model = _Gated().double()
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    x0 = torch.tensor([[0.2, 0.1, -1.0, 0.0]], dtype=torch.float64)
    with deeplift_scope(model):
        got = CaptumDeepLift(model).attribute(x, baselines=x0, target=0)
    with torch.no_grad():
        a_bar = (model.first(x) + model.first(x0)) / 2
        b_bar = (model.second(x) + model.second(x0)) / 2
        multiplier = b_bar @ model.first.weight + a_bar @ model.second.weight
    torch.testing.assert_close(got.detach(), multiplier * (x - x0))


def test_the_product_rule_gives_each_factor_the_mean_of_the_other():
    """Both halves' gradients: ``a`` gets b̄, ``b`` gets ā (not b or b' alone)."""
    a = torch.tensor([[2.0, -1.0], [0.5, 3.0]], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([[1.0, 4.0], [-3.0, 2.0]], dtype=torch.float64, requires_grad=True)
    product = rules._product(a, b, a.detach() * b.detach())
    grad_a, grad_b = torch.autograd.grad(product.sum(), (a, b))
    torch.testing.assert_close(grad_a, b.detach().mean(0).expand(2, -1))
    torch.testing.assert_close(grad_b, a.detach().mean(0).expand(2, -1))


def test_a_failing_forward_leaves_no_rule_on_a_transformer(load_model):
    """Norm hooks, linear pre-hooks, routed attention and Captum's table: all undone."""
    from attrlab.attribution.compat import deeplift_rules
    from attrlab.attribution.methods._routing import _RoutedConfig

    adapter = load_model("tiny-random-llama")
    model = adapter.model
    hooks = _hook_count(model)
    table = dict(deeplift_rules)
    blocks = list(model.model.layers)

    def fail(_m, _a, _o):
        raise RuntimeError("boom in block 1")

    handle = blocks[1].register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            explain(adapter, "deeplift", adapter.preprocess("the cat sat"))
    finally:
        handle.remove()
    assert _hook_count(model) == hooks
    assert not any(isinstance(getattr(m, "config", None), _RoutedConfig) for m in model.modules())
    assert deeplift_rules == table
    assert not any(hasattr(m, "input") or hasattr(m, "output") for m in model.modules())


def _hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_the_rules_or_says_why_not(load_model, dtype):
    """
    bf16 norms are checked at bf16's own rounding (the rules stay on); float16 never returns
    NaN silently. The delta itself is not bounded: the model's own forward rounds at 1e-2.
    """
    adapter = copy.deepcopy(_family(load_model("tiny-random-bert").tokenizer, "llama"))
    adapter.model.to(dtype)
    explanation = explain(adapter, "deeplift", adapter.preprocess(TEXT))
    assert not any("RMSNorm" in w for w in explanation.warnings)
    finite = np.isfinite(explanation.scores).all()
    assert finite or any("non-finite" in w for w in explanation.warnings)


def test_builtin_decoders_say_so(load_model):
    from attrlab.attribution.models import BUILTIN_MODELS

    for name in ("tiny-random-bert", "tiny-random-gpt2", "tiny-random-llama", "minilm-zeroshot"):
        assert BUILTIN_MODELS[name].next_token == (load_model(name).family == "decoder-lm")
