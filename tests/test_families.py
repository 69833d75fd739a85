"""
Today's families on tiny random float64 models: Qwen3 (q/k norms), Gemma 1/2/3 (``1 + w`` norms,
scaled embeddings, soft-capping), Phi-3 (fused QKV and gate/up, partial rotary) and ModernBERT
(an encoder with RoPE, fused QKV, alternating local/global attention, mean pooling).
Every method runs or is refused with its reason; the LRP rules never change a prediction and
keep relevance where the rules say they do.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from _small_budgets import SMALL_BUDGETS
from _tiny_families import CONFIGS, SIZES, build_family

from attrlab import attribution
from attrlab.attribution.methods import available_methods
from attrlab.attribution.methods.lrp import lrp, transformer_lrp
from attrlab.attribution.methods.lrp.rules import rms_norm_rule
from attrlab.attribution.models import load
from attrlab.attribution.models.layouts import layout_for
from attrlab.attribution.models.text import DecoderLMAdapter, TextClassifierAdapter
from attrlab.attribution.request.target import output_target

TEXT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def family(load_model, request):
    return build_family(load_model("tiny-random-bert").tokenizer, request.param)


def _logits(adapter, inputs):
    with torch.no_grad():
        return adapter.logits(**inputs.model_kwargs())[0]


families = pytest.mark.parametrize("family", sorted(CONFIGS), indirect=True)


@families
@pytest.mark.parametrize(
    ("pe_aware", "rule"),
    [(False, "attnlrp"), (True, "attnlrp"), (False, "cp"), (False, "cp_half"), (True, "cp_gate")],
)
def test_rules_never_change_the_prediction(family, pe_aware, rule):
    inputs = family.preprocess(TEXT)
    plain = _logits(family, inputs)
    layout = layout_for(family)
    with transformer_lrp(family, layout, pe_aware, attention_rule=rule, record=True):
        patched = _logits(family, inputs)
    torch.testing.assert_close(patched, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(_logits(family, inputs), plain, rtol=0, atol=0)


@families
@pytest.mark.parametrize("pe_aware", [False, True])
def test_rotary_relevance_is_conserved_in_every_layer(family, pe_aware):
    """q·k relevance = cos/sin relevance + unrotated q/k relevance, with partial rotary too."""
    inputs = family.preprocess(TEXT)
    target = int(_logits(family, inputs).argmax())
    result = lrp(family, inputs, output_target(family, target), pe_aware=pe_aware, record=True)
    assert len(result.attention_balance) == SIZES["num_hidden_layers"]
    for layer in result.attention_balance:
        assert (layer["rotary"] != 0) == pe_aware
        assert layer["rotary"] + layer["unrotated"] == pytest.approx(
            layer["query_key"], rel=1e-7, abs=1e-12
        )
        assert layer["value"] == pytest.approx(0.5 * layer["output"], rel=1e-9, abs=1e-15)


@families
@pytest.mark.parametrize(("rule", "share"), [("cp", 1.0), ("cp_half", 0.5), ("cp_gate", 1.0)])
def test_cp_variants_give_v_their_share_and_q_k_none(family, rule, share):
    inputs = family.preprocess(TEXT)
    target = int(_logits(family, inputs).argmax())
    result = lrp(
        family,
        inputs,
        output_target(family, target),
        pe_aware=False,
        record=True,
        attention_rule=rule,
    )
    for layer in result.attention_balance:
        assert layer["query_key"] == 0.0
        assert layer["value"] == pytest.approx(share * layer["output"], rel=1e-9, abs=1e-15)


def test_cp_gate_holds_the_mlp_gate_constant(load_model):
    """
    With the gate constant, act(g)·u is linear in u: u takes all of the MLP output's relevance;
    under the uniform rule of plain 'cp' it takes half.
    """
    qwen3 = build_family(load_model("tiny-random-bert").tokenizer, "qwen3")
    inputs = qwen3.preprocess(TEXT)
    target = int(_logits(qwen3, inputs).argmax())
    seen = {}
    mlp = qwen3.model.model.layers[-1].mlp
    hooks = [
        mlp.up_proj.register_forward_hook(lambda _m, _a, out: seen.setdefault("u", out)),
        mlp.down_proj.register_forward_hook(lambda _m, _a, out: seen.setdefault("out", out)),
    ]
    try:
        for rule, share in (("cp_gate", 1.0), ("cp", 0.5)):
            seen.clear()
            with transformer_lrp(qwen3, layout_for(qwen3), False, attention_rule=rule):
                logit = qwen3.logits(**inputs.model_kwargs())[0, target]
                grad_u, grad_out = torch.autograd.grad(logit, [seen["u"], seen["out"]])
            relevance_u = float((seen["u"] * grad_u).sum())
            relevance_out = float((seen["out"] * grad_out).sum())  # down_proj has no bias
            assert relevance_u == pytest.approx(share * relevance_out, rel=1e-9), rule
    finally:
        for hook in hooks:
            hook.remove()


def test_final_soft_cap_passes_the_logit_unchanged(load_model):
    """Identity rule on c·tanh(z/c): the relevance leaving the last block is the capped logit."""
    gemma2 = build_family(load_model("tiny-random-bert").tokenizer, "gemma2")
    inputs = gemma2.preprocess(TEXT)
    target = int(_logits(gemma2, inputs).argmax())
    result = lrp(gemma2, inputs, output_target(gemma2, target), pe_aware=False)
    cap = gemma2.config.final_logit_softcapping
    assert abs(result.target_logit) > 0.3 * cap  # far enough along tanh for the rule to matter
    assert result.residual[-1] == pytest.approx(result.target_logit, rel=1e-9)


@pytest.mark.parametrize("norm", ["llama", "gemma"])
def test_rms_norm_rule_conserves_whatever_the_weight_convention(norm):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    layer = (LlamaRMSNorm if norm == "llama" else GemmaRMSNorm)(16).double()
    with torch.no_grad():
        layer.weight.normal_(0.0, 0.5)
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    y = rms_norm_rule(x, layer(x))
    upstream = torch.randn(3, 16, dtype=torch.float64)
    (grad,) = torch.autograd.grad(y, x, upstream)
    torch.testing.assert_close(x * grad, y.detach() * upstream)  # relevance in = relevance out


@families
def test_every_method_runs_or_is_refused_with_a_reason(family):
    inputs = family.preprocess(TEXT)
    ids_before = inputs.input_ids.clone()
    plain = _logits(family, inputs)
    for method in available_methods():
        reason = method.unsupported_reason(family)
        if reason is not None:
            assert "text" in reason or "image" in reason, (method.name, reason)
            continue
        e = attribution.explain(
            family, method.name, inputs, params=SMALL_BUDGETS.get(method.name, {})
        )
        assert len(e.scores) == len(e.tokens) and np.all(np.isfinite(e.scores)), method.name
        torch.testing.assert_close(_logits(family, inputs), plain, rtol=0, atol=0)
    assert torch.equal(inputs.input_ids, ids_before)


@families
def test_loads_from_a_folder_by_its_config(family, tmp_path):
    family.model.save_pretrained(tmp_path)
    family.tokenizer.save_pretrained(tmp_path)
    reloaded = load(str(tmp_path), device="cpu")
    assert reloaded.family == family.family and reloaded.positional_encoding == "rope"
    assert reloaded.readout == family.readout
    assert layout_for(reloaded) is layout_for(family)


@pytest.mark.parametrize(
    ("spec", "heads", "kv"), [("tiny-random-llama", 4, 2), ("tiny-random-gpt2", 4, 4)]
)
def test_grouped_query_attention_maps_heads_to_kv_heads(load_model, spec, heads, kv):
    adapter = load_model(spec)
    assert adapter.num_heads == heads and adapter.num_kv_heads == kv
    per_group = heads // kv
    assert [adapter.kv_head(h) for h in range(heads)] == [h // per_group for h in range(heads)]


def test_gpt2_that_upcasts_and_reorders_attention_keeps_its_prediction(load_model):
    tokenizer = load_model("tiny-random-bert").tokenizer
    config = tf.GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        reorder_and_upcast_attn=True,
        scale_attn_by_inverse_layer_idx=True,
        bos_token_id=None,
        eos_token_id=None,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    adapter = DecoderLMAdapter(
        tf.GPT2LMHeadModel(config).eval(), tokenizer, "gpt2-upcast", add_special_tokens=False
    )
    inputs = adapter.preprocess(TEXT)
    plain = _logits(adapter, inputs)
    for pe_aware in (False, True):
        with transformer_lrp(adapter, layout_for(adapter), pe_aware):
            torch.testing.assert_close(_logits(adapter, inputs), plain)


def test_half_precision_models_get_float_sums(load_model):
    """A bf16 model (as hub LLMs load) keeps its prediction; relevance matches float32's."""
    tokenizer = load_model("tiny-random-bert").tokenizer
    adapters = [
        DecoderLMAdapter(
            build_family(tokenizer, "qwen3").model.to(dtype),
            tokenizer,
            str(dtype),
            add_special_tokens=False,
        )
        for dtype in (torch.float32, torch.bfloat16)
    ]
    inputs = adapters[0].preprocess(TEXT)
    target = int(_logits(adapters[0], inputs).argmax())
    scores = []
    for adapter in adapters:
        plain = _logits(adapter, inputs)
        with transformer_lrp(adapter, layout_for(adapter), True):
            torch.testing.assert_close(_logits(adapter, inputs), plain, rtol=0, atol=0)
        scores.append(lrp(adapter, inputs, output_target(adapter, target), pe_aware=True).scores)
    assert scores[1].dtype == np.float64 and np.all(np.isfinite(scores[1]))
    assert np.corrcoef(scores[0], scores[1])[0, 1] > 0.95


def test_gemma_classifier_without_an_lm_head_runs(load_model):
    """The final-logit cap rule belongs to the LM head; a sequence classifier has none."""
    tokenizer = load_model("tiny-random-bert").tokenizer
    config = CONFIGS["gemma2"](tokenizer.vocab_size)
    config.num_labels, config._attn_implementation = 3, "eager"
    torch.manual_seed(0)
    model = tf.Gemma2ForSequenceClassification(config).double().eval()
    adapter = TextClassifierAdapter(model, tokenizer, "gemma2-classifier")
    inputs = adapter.preprocess(TEXT)
    result = lrp(adapter, inputs, output_target(adapter, 0), pe_aware=True)
    assert np.all(np.isfinite(result.scores))
