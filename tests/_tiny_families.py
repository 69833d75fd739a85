"""Tiny random float64 models of the newer families, built from configs (shared by tests)."""

from __future__ import annotations

import torch
import transformers as tf

from attribution.models.text import DecoderLMAdapter, TextClassifierAdapter

SIZES = {
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": 0,
}
CONFIGS = {
    "qwen3": lambda v: tf.Qwen3Config(vocab_size=v, head_dim=8, **SIZES),
    "gemma": lambda v: tf.GemmaConfig(vocab_size=v, head_dim=8, **SIZES),
    "gemma2": lambda v: tf.Gemma2Config(
        vocab_size=v,
        head_dim=8,
        query_pre_attn_scalar=8,
        attn_logit_softcapping=0.5,  # small caps, so that tanh is far from the identity
        final_logit_softcapping=0.1,
        **SIZES,
    ),
    "gemma3_text": lambda v: tf.Gemma3TextConfig(
        vocab_size=v, head_dim=8, query_pre_attn_scalar=8, sliding_window=4, **SIZES
    ),
    "phi3": lambda v: tf.Phi3Config(vocab_size=v, partial_rotary_factor=0.5, **SIZES),
    "modernbert": lambda v: tf.ModernBertConfig(
        vocab_size=v,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        global_attn_every_n_layers=2,  # layers 0 and 2 global, layer 1 local
        local_attention=4,
        classifier_pooling="mean",
        num_labels=3,
        pad_token_id=0,
    ),
}


def build_family(
    tokenizer, name: str, **overrides: object
) -> DecoderLMAdapter | TextClassifierAdapter:
    """A seeded tiny model of family ``name`` (config ``overrides`` applied), norms off init."""
    torch.manual_seed(0)
    config = CONFIGS[name](tokenizer.vocab_size)
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = "eager"
    if name == "modernbert":
        model = tf.ModernBertForSequenceClassification(config).double().eval()
        return TextClassifierAdapter(model, tokenizer, "tiny-modernbert")
    model = tf.AutoModelForCausalLM.from_config(config).double().eval()
    with torch.no_grad():  # norm weights away from their init, so a misread convention shows
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.normal_(0.0, 0.5)
    return DecoderLMAdapter(model, tokenizer, f"tiny-{name}", add_special_tokens=False)
