"""
Conservation under the full AttnLRP rule, in float64, with every bias present.

The target logit must equal, to 1e-6, what reaches the input embedding ``x0`` (tokens and, as
AttnLRP drops it, positions) plus what the rules let go elsewhere, each measured where it goes:
``b·g`` at every linear, convolution and LayerNorm bias (the ε-rule and the frozen-σ rule pass
the rest on exactly), and in each attention the share that softmax's linearisation absorbs
(its output's relevance minus what reaches v, q and k). Everything else (RMSNorm in either
weight convention, activations, the final soft-cap, gated products, rotary, residuals, heads)
must pass relevance on unchanged, so a rule that loses or creates relevance there fails here.
Inside attention the softmax share absorbs by definition; the last test checks what reaches
q and k there against a reference computed from the recorded tensors.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from _tiny_families import BIASED, biased_family, classic_family, clip, dinov2
from torch import nn

from attrlab.attribution.methods.lrp import transformer_lrp
from attrlab.attribution.models.layouts import find_module, layout_for

TEXT = "the quick brown fox jumps over the lazy dog"
IMAGE = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def _balance(
    adapter, inputs=None, explained: Callable[[dict], torch.Tensor] | None = None
) -> tuple[float, float, float, float]:
    """
    (logit, relevance at x0, absorbed by biases, absorbed by softmax linearisation).

    ``explained(kwargs)`` is the scalar explained (the top output's logit by default).
    """
    if inputs is None:
        inputs = adapter.preprocess(IMAGE if adapter.modality == "image" else TEXT)
    kwargs = dict(inputs.model_kwargs())
    if "pixel_values" in kwargs:
        kwargs["pixel_values"] = kwargs["pixel_values"].double()
    if explained is None:
        with torch.no_grad():
            target = int(adapter.logits(**kwargs)[0].argmax())

        def explained(kwargs: dict) -> torch.Tensor:
            return adapter.logits(**kwargs)[0, target]

    biases: list[tuple[nn.Module, torch.Tensor]] = []
    layout = layout_for(adapter)
    path, where = layout.embedding_sum
    # what computes x0 (a ViT's patch embedding) lies before it: its biases are inside x0
    upstream = (
        {id(m) for m in find_module(adapter.model, path).modules()} if where == "output" else set()
    )
    with torch.enable_grad(), transformer_lrp(adapter, layout, False, record=True) as recorder:
        hooks = [
            module.register_forward_hook(lambda m, _a, out: biases.append((m, out)))
            for module in adapter.model.modules()
            if id(module) not in upstream
            and isinstance(getattr(module, "bias", None), torch.Tensor)
            and (
                isinstance(module, nn.Linear | nn.Conv2d | nn.LayerNorm)
                or type(module).__name__ == "Conv1D"
            )
        ]
        try:
            logit = explained(kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        attention = [t for i in sorted(recorder.attention) for t in recorder.attention[i]]
        outputs = [out for _, out in biases]
        wanted = [recorder.embedding_sum, *attention, *outputs]
        grads = torch.autograd.grad(logit, wanted, allow_unused=True)

    def relevance(tensor, grad) -> float:
        return 0.0 if grad is None else float((tensor.detach() * grad).sum())

    at_input = relevance(recorder.embedding_sum, grads[0])
    softmax = 0.0
    for layer in range(len(attention) // 4):
        q, k, v, o = (grads[1 + 4 * layer + j] for j in range(4))
        qt, kt, vt, ot = attention[4 * layer : 4 * layer + 4]
        softmax += relevance(ot, o) - relevance(vt, v) - relevance(qt, q) - relevance(kt, k)
    absorbed = 0.0
    for (module, _), grad in zip(biases, grads[1 + len(attention) :], strict=True):
        if grad is not None:  # b·g: a convolution's bias is per channel, the others per feature
            spatial = isinstance(module, nn.Conv2d)
            summed = grad.sum((0, 2, 3)) if spatial else grad.reshape(-1, grad.shape[-1]).sum(0)
            absorbed += float((summed * module.bias.detach()).sum())
    return float(logit.detach()), at_input, absorbed, softmax


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit", *sorted(BIASED)])
def test_relevance_is_accounted_for(load_model, name):
    tokenizer = load_model("tiny-random-bert").tokenizer
    adapter = (
        classic_family(tokenizer, name)
        if name in ("bert", "gpt2", "llama", "vit")
        else (biased_family(tokenizer, name))
    )
    logit, at_input, absorbed, softmax = _balance(adapter)
    assert (absorbed != 0.0) == (name != "phi3")  # biases, where present, took their share
    assert at_input + absorbed + softmax == pytest.approx(logit, rel=1e-6, abs=1e-9)


def test_zero_shot_cosine_head_conserves(minilm):
    adapter = copy.deepcopy(minilm)
    adapter.model.double()
    logit, at_input, absorbed, softmax = _balance(adapter)
    assert at_input + absorbed + softmax == pytest.approx(logit, rel=1e-6, abs=1e-9)


def test_dinov2_and_clip_conserve(load_model):
    tokenizer = load_model("tiny-random-bert").tokenizer
    for adapter in (dinov2(), dinov2(registers=2), clip(tokenizer)):
        logit, at_input, absorbed, softmax = _balance(adapter)
        assert absorbed != 0.0
        assert at_input + absorbed + softmax == pytest.approx(logit, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("registers", [0, 3])
def test_dinov2_positions_resized_to_the_input_get_their_relevance(registers):
    """DINOv2 interpolates its position embeddings to the input size (registers get none)."""
    from attrlab.attribution.methods.lrp import lrp
    from attrlab.attribution.request.target import output_target

    adapter = dinov2(size=48, registers=registers)  # 6×6 patches, embeddings made for 4×4
    with torch.no_grad():  # pixel relevance then equals the patches' share of x0 exactly
        find_module(adapter.model, "patch_embeddings.projection").bias.zero_()
    inputs = adapter.preprocess(IMAGE)
    result = lrp(adapter, inputs, output_target(adapter, 0), pe_aware=True)
    assert result.positional_total != 0.0
    assert result.token_total + result.positional_total == pytest.approx(
        result.embedding_relevance, rel=1e-6, abs=1e-12
    )


@pytest.mark.parametrize("name", ["qwen3", "gemma2", "phi3"])
def test_inside_attention_q_and_k_get_a_quarter_through_the_cap(load_model, name):
    """
    What reaches q and k, against a reference computed here from the recorded tensors:
    R(q) + R(k) = ½·Σ C ⊙ ∂L/∂C with C the (soft-capped) scores, since the uniform rule gives
    q and k a quarter of the gradient of the bilinear q·kᵀ, and the cap passes relevance
    unchanged (identity rule). A wrong factor or a cap with tanh's own gradient fails.
    """
    adapter = biased_family(load_model("tiny-random-bert").tokenizer, name)
    inputs = adapter.preprocess(TEXT)
    with torch.no_grad():
        target = int(adapter.logits(**inputs.model_kwargs())[0].argmax())
    layout = layout_for(adapter)
    with torch.enable_grad(), transformer_lrp(adapter, layout, False, record=True) as recorder:
        logit = adapter.logits(**inputs.model_kwargs())[0, target]
        tensors = [t for i in sorted(recorder.attention) for t in recorder.attention[i]]
        grads = torch.autograd.grad(logit, tensors)
    blocks = list(find_module(adapter.model, layout.blocks).children())
    cap = getattr(adapter.config, "attn_logit_softcapping", None)
    for layer, block in enumerate(blocks):
        q, k, v, _ = (t.detach() for t in tensors[4 * layer : 4 * layer + 4])
        g_q, g_k, _, g_o = grads[4 * layer : 4 * layer + 4]
        attention = block.get_submodule(layout.attention)
        groups = q.shape[1] // k.shape[1]
        k_all, v_all = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = q @ k_all.transpose(-1, -2) * attention.scaling
        capped = cap * torch.tanh(scores / cap) if cap else scores
        length = scores.shape[-1]
        causal = torch.full((length, length), float("-inf"), dtype=scores.dtype).triu(1)
        probabilities = torch.softmax(capped + causal, dim=-1)
        g_probabilities = g_o.transpose(1, 2) @ v_all.transpose(-1, -2)
        g_capped = probabilities * (
            g_probabilities - (probabilities * g_probabilities).sum(-1, keepdim=True)
        )
        expected = 0.5 * float((capped * g_capped).sum())
        measured = float((q * g_q).sum() + (k * g_k).sum())
        # the models' eager attention takes its softmax in float32: ~1e-5 relative here
        assert measured == pytest.approx(expected, rel=1e-4, abs=1e-12), layer


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_the_run_time_accounting_matches_the_independent_one(load_model, name):
    """
    What AttnLRP reports as absorbed (biases as their layers' R(out) − R(own input), attention
    as its output's relevance minus q, k and v's) against :func:`_balance` (biases as b·g):
    each part, and the remainder left unaccounted.
    """
    from attrlab.attribution.methods.lrp import lrp
    from attrlab.attribution.request.target import output_target

    adapter = classic_family(load_model("tiny-random-bert").tokenizer, name)
    logit, at_input, absorbed, softmax = _balance(adapter)
    inputs = adapter.preprocess(IMAGE if adapter.modality == "image" else TEXT)
    with torch.no_grad():
        target = int(adapter.logits(**inputs.model_kwargs())[0].argmax())
    result = lrp(adapter, inputs, output_target(adapter, target), pe_aware=False, account=True)
    _check_run_time_accounting(result, logit, at_input, absorbed, softmax)


def _check_run_time_accounting(result, logit, at_input, absorbed, softmax) -> None:
    """An LRP run's own parts (``account=True``) against :func:`_balance`'s."""
    from attrlab.attribution.methods.lrp import to_attribution

    assert result.target_logit == pytest.approx(logit, rel=1e-9)
    assert result.embedding_relevance == pytest.approx(at_input, rel=1e-6, abs=1e-9)
    assert result.softmax_absorbed == pytest.approx(softmax, rel=1e-6, abs=1e-9)
    metrics = to_attribution(result, pe_aware=False).metrics
    # a ViT's patch convolution lies before x0: its bias's share is counted too
    assert metrics["bias_absorbed"] == pytest.approx(
        absorbed + (result.embedding_relevance - result.token_total - result.positional_total),
        rel=1e-6,
        abs=1e-9,
    )
    assert abs(metrics["unaccounted_relevance"]) <= 1e-9 * max(1.0, abs(logit))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("contrast", [" sleeps", None])
def test_an_answer_and_a_contrast_conserve_their_logits_term_by_term(load_model, name, contrast):
    """
    A contrast of one token each: the logit difference; a whole answer: its steps' logits
    summed (read by hand at the positions before each token), against the parts AttnLRP reports.
    """
    from attrlab.attribution.methods.lrp import lrp
    from attrlab.attribution.request.answers import answer_request

    adapter = classic_family(load_model("tiny-random-bert").tokenizer, name)
    answer = " jumps" if contrast else " jumps over the dog"
    inputs, target = answer_request(adapter, TEXT, answer=answer, contrast=contrast)
    length = inputs.answer_length
    first = inputs.input_ids.shape[1] - 1 - length  # the position predicting the answer

    def explained(kwargs: dict) -> torch.Tensor:
        logits = adapter.model(**kwargs).logits[0]
        if contrast:
            ours, theirs = target.answer.tokens[0], target.alternative.tokens[0]
            return logits[first, ours] - logits[first, theirs]
        return sum(logits[first + k, token] for k, token in enumerate(target.tokens))

    logit, at_input, absorbed, softmax = _balance(adapter, inputs, explained)
    assert at_input + absorbed + softmax == pytest.approx(logit, rel=1e-6, abs=1e-9)
    result = lrp(adapter, inputs, target, pe_aware=False, account=True)
    _check_run_time_accounting(result, logit, at_input, absorbed, softmax)


def test_a_rule_that_loses_relevance_fails_the_conservation_verdict(load_model, monkeypatch):
    """RMSNorm's rule halving what it passes on: nothing accounts for the loss."""
    from attrlab.attribution import explain
    from attrlab.attribution.methods.lrp import patches
    from attrlab.attribution.methods.lrp.rules import identity_rule, scale_gradient

    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess(TEXT)
    intact = explain(adapter, "attnlrp", inputs).verdicts[0]
    assert (intact.check, intact.status) == ("lrp_conservation", "pass")
    monkeypatch.setattr(
        patches, "rms_norm_rule", lambda x, out: identity_rule(scale_gradient(x, 0.5), out)
    )
    leaky = explain(adapter, "attnlrp", inputs)
    (verdict,) = leaky.verdicts
    assert verdict.status == "fail" and verdict.value > 0.01
    assert verdict.value == pytest.approx(
        abs(leaky.metrics["unaccounted_relevance"]) / abs(leaky.target.logit), rel=1e-6
    )
