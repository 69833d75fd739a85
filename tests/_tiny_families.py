"""Tiny random float64 models of the newer families, built from configs (shared by tests)."""

from __future__ import annotations

import torch
import transformers as tf
from torch import nn

from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.text import DecoderLMAdapter, TextClassifierAdapter
from attrlab.attribution.models.vision import CLIPZeroShotAdapter, CNNAdapter, ViTAdapter

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


CLASSIC_SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 3}
BIASED = {  # configs of the newer families with every optional bias switched on
    "qwen3": {"attention_bias": True},
    "gemma": {"attention_bias": True},
    "gemma2": {"attention_bias": True},
    "gemma3_text": {"attention_bias": True},
    "phi3": {},  # Phi-3 has no bias options
    "modernbert": {"attention_bias": True, "mlp_bias": True, "norm_bias": True},
}


def random_norms_and_biases(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                param.normal_(0.0, 0.3)
    return model


def classic_family(tokenizer, name: str):
    """Tiny float64 BERT, GPT-2, LLaMA (biases on) or ViT with random norms and biases."""
    torch.manual_seed(0)
    vocab = tokenizer.vocab_size
    if name == "bert":
        config = tf.BertConfig(vocab_size=vocab, intermediate_size=48, **CLASSIC_SIZES)
        model = tf.BertForSequenceClassification(config)
    elif name == "gpt2":
        config = tf.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=3, n_head=4, n_positions=64)
        model = tf.GPT2LMHeadModel(config)
    elif name == "llama":
        config = tf.LlamaConfig(
            vocab_size=vocab,
            intermediate_size=48,
            num_key_value_heads=2,
            attention_bias=True,
            mlp_bias=True,
            **CLASSIC_SIZES,
        )
        model = tf.LlamaForCausalLM(config)
    else:
        config = tf.ViTConfig(image_size=32, patch_size=8, intermediate_size=48, **CLASSIC_SIZES)
        model = tf.ViTForImageClassification(config)
    model.config._attn_implementation = "eager"
    model = random_norms_and_biases(model.double().eval())
    if name == "vit":
        return ViTAdapter(model, "vit", ImageTransform((32, 32), (0.5,) * 3, (0.5,) * 3))
    if name == "bert":
        return TextClassifierAdapter(model, tokenizer, "bert")
    return DecoderLMAdapter(model, tokenizer, name, add_special_tokens=False)


def biased_family(tokenizer, name: str):
    """A family of :data:`BIASED` with every optional bias on, norms and biases random."""
    adapter = build_family(tokenizer, name, **BIASED[name])
    random_norms_and_biases(adapter.model)
    return adapter


def dinov2(size: int = 32, registers: int = 0) -> ViTAdapter:
    """Tiny float64 DINOv2 classifier (with ``registers`` register tokens) at ``size`` pixels."""
    torch.manual_seed(0)
    sizes = {"image_size": 32, "patch_size": 8, "mlp_ratio": 2, "num_labels": 5, **CLASSIC_SIZES}
    if registers:
        config = tf.Dinov2WithRegistersConfig(num_register_tokens=registers, **sizes)
        model = tf.Dinov2WithRegistersForImageClassification(config)
    else:
        config = tf.Dinov2Config(**sizes)
        model = tf.Dinov2ForImageClassification(config)
    model.config._attn_implementation = "eager"
    model = random_norms_and_biases(model.double().eval())
    return ViTAdapter(model, "dinov2", ImageTransform((size, size), (0.5,) * 3, (0.5,) * 3))


def clip(tokenizer) -> CLIPZeroShotAdapter:
    """Tiny float64 CLIP as a zero-shot classifier over three labels."""
    torch.manual_seed(0)
    config = tf.CLIPConfig(
        text_config={
            "vocab_size": tokenizer.vocab_size,
            "intermediate_size": 48,
            "max_position_embeddings": 32,
            "eos_token_id": tokenizer.sep_token_id,
            **CLASSIC_SIZES,
        },
        vision_config={"image_size": 32, "patch_size": 8, "intermediate_size": 48, **CLASSIC_SIZES},
        projection_dim=16,
    )
    config._attn_implementation = "eager"
    model = random_norms_and_biases(tf.CLIPModel(config).double().eval())
    transform = ImageTransform((32, 32), (0.5,) * 3, (0.5,) * 3)
    return CLIPZeroShotAdapter(model, tokenizer, "clip", transform, ["cat", "dog", "car"])


def tiny_relu_cnn() -> CNNAdapter:
    """A seeded 16×16 ReLU CNN with three classes (convolutions: Grad-CAM applies)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )
    transform = ImageTransform((16, 16), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    return CNNAdapter(model, "tiny-cnn", transform, ["a", "b", "c"])
