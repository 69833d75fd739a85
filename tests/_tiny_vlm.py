"""Tiny random vision-language models built from their transformers configs (no hub)."""

from __future__ import annotations

from typing import Any

import torch
import transformers as tf

from attrlab.attribution.models.builtin import _minilm_tokenizer
from attrlab.attribution.models.vlm import VisionLanguageAdapter

_LANGUAGE_MODEL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": 0,
}
_QWEN2_VL_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]


def _tokenizer(extra: list[str]) -> Any:
    tokenizer = _minilm_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": extra})
    return tokenizer


def tiny_llava(image_size: int = 32, strategy: str = "default") -> VisionLanguageAdapter:
    """LLaVA 1.5 layout: a CLIP tower (8-px patches), a 2-layer MLP projector, a tiny LLaMA."""
    tokenizer = _tokenizer(["<image>"])
    config = tf.LlavaConfig(
        vision_config=tf.CLIPVisionConfig(
            image_size=image_size,
            patch_size=8,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
        ),
        text_config=tf.LlamaConfig(vocab_size=len(tokenizer), **_LANGUAGE_MODEL),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy=strategy,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.LlavaForConditionalGeneration(config).eval()
    image_processor = tf.CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
    )
    processor = tf.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=1,  # the CLS token, as the real processors count it
    )
    return VisionLanguageAdapter(model, processor, "tiny-random-llava")


def tiny_qwen2_vl(max_pixels: int = 48 * 48) -> VisionLanguageAdapter:
    """Qwen2-VL layout: 4-px patches merged 2 × 2 (8-px tokens), multimodal RoPE, tiny LM."""
    tokenizer = _tokenizer(_QWEN2_VL_TOKENS)
    start, image, end, video = tokenizer.convert_tokens_to_ids(_QWEN2_VL_TOKENS)
    config = tf.Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2]},
            **_LANGUAGE_MODEL,
        },
        vision_config={
            "depth": 2,
            "embed_dim": 16,
            "hidden_size": 32,
            "num_heads": 2,
            "patch_size": 4,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "mlp_ratio": 2,
        },
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.Qwen2VLForConditionalGeneration(config).eval()
    sizes = {"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2}
    processor = tf.Qwen2VLProcessor(
        image_processor=tf.Qwen2VLImageProcessor(min_pixels=64, max_pixels=max_pixels, **sizes),
        tokenizer=tokenizer,
        video_processor=tf.Qwen2VLVideoProcessor(**sizes),
    )
    return VisionLanguageAdapter(model, processor, "tiny-random-qwen2-vl")
