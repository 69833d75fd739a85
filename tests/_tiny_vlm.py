"""Tiny random vision-language models built from their transformers configs (no hub)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from torch import nn
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

from attrlab.attribution.models.builtin import _minilm_dir, _minilm_tokenizer
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
#: Every tiny vision tower's sizes (its image and patch sizes are the family's own).
_TOWER = {
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}
_QWEN2_VL_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]


def _tokenizer(extra: list[str]) -> Any:
    tokenizer = _minilm_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": extra})
    return tokenizer


def saved(adapter: VisionLanguageAdapter, folder: Path) -> Path:
    """``adapter``'s weights and processor saved in ``folder``, as a served model folder is."""
    adapter.model.save_pretrained(folder)
    adapter.processor.save_pretrained(folder)
    return folder.resolve()


def tiny_llava(
    image_size: int = 32,
    strategy: str = "default",
    pad: bool = False,
    language_model: dict[str, Any] | None = None,
) -> VisionLanguageAdapter:
    """
    LLaVA 1.5 layout: a CLIP tower (8-px patches), a 2-layer MLP projector, a tiny LLaMA.

    ``pad``: LLaVA's own image processor, which pads the image to a square before resizing.
    ``language_model``: sizes of the LLaMA that replace the tiny ones (the benchmarks').
    """
    tokenizer = _tokenizer(["<image>"])
    config = tf.LlavaConfig(
        vision_config=tf.CLIPVisionConfig(
            image_size=image_size,
            patch_size=8,
            **_TOWER,
        ),
        text_config=tf.LlamaConfig(
            vocab_size=len(tokenizer), **{**_LANGUAGE_MODEL, **(language_model or {})}
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy=strategy,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.LlavaForConditionalGeneration(config).eval()
    image_processor = (tf.LlavaImageProcessor if pad else tf.CLIPImageProcessor)(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        do_pad=pad,
        resample=tf.image_utils.PILImageResampling.BILINEAR,
    )
    processor = tf.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=1,  # the CLS token, as the real processors count it
    )
    return VisionLanguageAdapter(model, processor, "tiny-random-llava")


# Qwen2-VL's tower sizes its blocks by embed_dim and its output by hidden_size; Qwen2.5-VL's
# by hidden_size and out_hidden_size, with window attention (2 × 2 merged tokens a window here)
# in every block but those listed
_QWEN_TOWERS = {
    "qwen2_vl": {"embed_dim": 16, "hidden_size": 32, "mlp_ratio": 2},
    "qwen2_5_vl": {
        "hidden_size": 16,
        "out_hidden_size": 32,
        "intermediate_size": 32,
        "window_size": 16,
        "fullatt_block_indexes": [1],
    },
}
_QWEN_MODELS = {
    "qwen2_vl": (tf.Qwen2VLConfig, tf.Qwen2VLForConditionalGeneration, tf.Qwen2VLProcessor),
    "qwen2_5_vl": (
        tf.Qwen2_5_VLConfig,
        tf.Qwen2_5_VLForConditionalGeneration,
        tf.Qwen2_5_VLProcessor,
    ),
}


def tiny_qwen2_vl(max_pixels: int = 48 * 48, model_type: str = "qwen2_vl") -> VisionLanguageAdapter:
    """Qwen2-VL layout: 4-px patches merged 2 × 2 (8-px tokens), multimodal RoPE, tiny LM."""
    tokenizer = _tokenizer(_QWEN2_VL_TOKENS)
    start, image, end, video = tokenizer.convert_tokens_to_ids(_QWEN2_VL_TOKENS)
    config_class, model_class, processor_class = _QWEN_MODELS[model_type]
    config = config_class(
        text_config={
            "vocab_size": len(tokenizer),
            "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2]},
            **_LANGUAGE_MODEL,
        },
        vision_config={
            "depth": 2,
            "num_heads": 2,
            "patch_size": 4,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            **_QWEN_TOWERS[model_type],
        },
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = model_class(config).eval()
    sizes = {"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2}
    processor = processor_class(
        image_processor=tf.Qwen2VLImageProcessor(min_pixels=64, max_pixels=max_pixels, **sizes),
        tokenizer=tokenizer,
        video_processor=tf.Qwen2VLVideoProcessor(**sizes),
    )
    return VisionLanguageAdapter(model, processor, f"tiny-random-{model_type}")


def tiny_qwen2_5_vl(max_pixels: int = 48 * 48) -> VisionLanguageAdapter:
    """Qwen2.5-VL layout: as Qwen2-VL, with window attention in the vision tower."""
    return tiny_qwen2_vl(max_pixels, "qwen2_5_vl")


def tiny_paligemma(image_size: int = 32) -> VisionLanguageAdapter:
    """PaliGemma layout: a SigLIP tower (8-px patches, no CLS), a linear projector, tiny Gemma."""
    tokenizer = _tokenizer(["<image>"])
    tokenizer.bos_token = "[CLS]"  # the processor puts BOS between image and prompt
    config = tf.PaliGemmaConfig(
        vision_config=tf.SiglipVisionConfig(
            image_size=image_size,
            patch_size=8,
            **_TOWER,
        ).to_dict(),
        text_config=tf.GemmaConfig(
            vocab_size=len(tokenizer), head_dim=8, **_LANGUAGE_MODEL
        ).to_dict(),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        projection_dim=32,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.PaliGemmaForConditionalGeneration(config).eval()
    image_processor = tf.SiglipImageProcessor(
        size={"height": image_size, "width": image_size},
        image_seq_length=(image_size // 8) ** 2,
    )
    processor = tf.PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return VisionLanguageAdapter(model, processor, "tiny-random-paligemma")


def tiny_gemma3(image_size: int = 32, sliding_window: int = 4) -> VisionLanguageAdapter:
    """
    Gemma 3 layout: SigLIP (4-px patches, 8 × 8) average-pooled to 4 × 4 tokens, tiny Gemma 3.

    Both language-model layers attend within ``sliding_window`` tokens: at 4, an answer after
    the prompt does not reach the image.
    """
    special = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }
    tokenizer = tf.AutoTokenizer.from_pretrained(_minilm_dir(), extra_special_tokens=special)
    config = tf.Gemma3Config(
        vision_config=tf.SiglipVisionConfig(
            image_size=image_size,
            patch_size=image_size // 8,
            **_TOWER,
        ).to_dict(),
        text_config=tf.Gemma3TextConfig(
            vocab_size=len(tokenizer),
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=sliding_window,
            **_LANGUAGE_MODEL,
        ).to_dict(),
        mm_tokens_per_image=16,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # transformers initialises the projection to zeros: no image at all
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.5)
    image_processor = tf.Gemma3ImageProcessor(size={"height": image_size, "width": image_size})
    processor = tf.Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=16
    )
    return VisionLanguageAdapter(model, processor, "tiny-random-gemma3")


def tiny_idefics3(splitting: bool = True) -> VisionLanguageAdapter:
    """
    Idefics3 layout: 32-px tiles of an image resized to 64 px at most, then the whole image.

    8-px patches pixel-shuffled 2 × 2: each tile gives 2 × 2 tokens of 16 px.
    """
    tokenizer = _tokenizer(
        ["<global-img>", *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
    )
    image_processor = tf.Idefics3ImageProcessor(
        size={"longest_edge": 64},
        max_image_size={"longest_edge": 32},
        do_image_splitting=splitting,
        resample=tf.image_utils.PILImageResampling.BILINEAR,  # Lanczos reaches 3 px a scale
    )
    processor = tf.Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4
    )  # it adds its own image tokens to the tokenizer
    config = tf.Idefics3Config(
        vision_config=tf.Idefics3VisionConfig(
            image_size=32,
            patch_size=8,
            **_TOWER,
        ).to_dict(),
        text_config=tf.LlamaConfig(vocab_size=len(tokenizer), **_LANGUAGE_MODEL).to_dict(),
        scale_factor=2,
        image_token_id=processor.image_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.Idefics3ForConditionalGeneration(config).eval()
    return VisionLanguageAdapter(model, processor, "tiny-random-idefics3")


def tiny_smolvlm(splitting: bool = True) -> VisionLanguageAdapter:
    """
    SmolVLM layout: Idefics3's tiles, pixel shuffle and text model, with SmolVLM's classes.

    Its processor reads its image tokens from the tokenizer (Idefics3's adds its own) and its
    prompt from the chat template transformers gives SmolVLM (``User:<image>...Assistant:``).
    """
    special = {
        "fake_image_token": "<fake_token_around_image>",
        "image_token": "<image>",
        "global_image_token": "<global-img>",
        "end_of_utterance_token": "<end_of_utterance>",
    }
    rows = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    tokenizer = _tokenizer([*special.values(), "<|im_start|>", *rows])
    for name, token in special.items():
        setattr(tokenizer, name, token)
    sizes = {"size": {"longest_edge": 64}, "max_image_size": {"longest_edge": 32}}
    image_processor = tf.SmolVLMImageProcessor(
        **sizes,
        do_image_splitting=splitting,
        resample=tf.image_utils.PILImageResampling.BILINEAR,  # Lanczos reaches 3 px a scale
    )
    processor = tf.SmolVLMProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=tf.SmolVLMVideoProcessor(**sizes),
        image_seq_len=4,
        chat_template=DEFAULT_CHAT_TEMPLATE,
    )
    config = tf.SmolVLMConfig(
        vision_config=tf.SmolVLMVisionConfig(
            image_size=32,
            patch_size=8,
            **_TOWER,
        ).to_dict(),
        text_config=tf.LlamaConfig(vocab_size=len(tokenizer), **_LANGUAGE_MODEL).to_dict(),
        scale_factor=2,
        image_token_id=processor.image_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.SmolVLMForConditionalGeneration(config).eval()
    return VisionLanguageAdapter(model, processor, "tiny-random-smolvlm")


def tiny_llava_next() -> VisionLanguageAdapter:
    """LLaVA-NeXT layout: 32-px tiles of 4 × 4 patches, canvases of 1 × 2, 2 × 1 or 2 × 2 tiles."""
    tokenizer = _tokenizer(["<image>"])
    pinpoints = [[32, 64], [64, 32], [64, 64]]
    config = tf.LlavaNextConfig(
        vision_config=tf.CLIPVisionConfig(
            image_size=32,
            patch_size=8,
            **_TOWER,
        ).to_dict(),
        text_config=tf.LlamaConfig(vocab_size=len(tokenizer), **_LANGUAGE_MODEL).to_dict(),
        image_grid_pinpoints=pinpoints,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.LlavaNextForConditionalGeneration(config).eval()
    image_processor = tf.LlavaNextImageProcessor(
        size={"shortest_edge": 32},
        crop_size={"height": 32, "width": 32},
        image_grid_pinpoints=pinpoints,
        resample=tf.image_utils.PILImageResampling.BILINEAR,
    )
    processor = tf.LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return VisionLanguageAdapter(model, processor, "tiny-random-llava-next")


def model_module(adapter: VisionLanguageAdapter, pattern: str) -> nn.Module:
    """A module found by its name in the model (not through attrlab's layouts)."""
    return next(m for n, m in adapter.model.named_modules() if re.search(pattern, n))


def first_block(adapter: VisionLanguageAdapter) -> nn.Module:
    """The language model's first block, found by its name."""
    return model_module(adapter, r"(language_model|text_model)\.layers\.0$")


@contextmanager
def reads_one_visual_token(
    adapter: VisionLanguageAdapter, positions: torch.Tensor, keep: int
) -> Iterator[None]:
    """
    A model whose answer reads the image through one visual token: the others are zeroed.

    The language model's input embeddings (visual features in place) get every visual row
    (at ``positions``) but the ``keep``-th set to zero, so nothing of the images but that
    token reaches the answer.
    """

    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        embeds = kwargs["inputs_embeds"].clone()
        dropped = torch.cat([positions[:keep], positions[keep + 1 :]])
        embeds[:, dropped] = 0
        return args, {**kwargs, "inputs_embeds": embeds}

    language_model = model_module(adapter, r"^model\.(language_model|text_model)$")
    handle = language_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
