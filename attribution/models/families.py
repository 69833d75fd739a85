"""
Per-family facts kept as data, one row per Hugging Face ``model_type``.

Each row says which adapter serves the family, its kind of positional encoding, and where it
keeps its blocks, attention and embeddings (its :class:`Layout`: module paths as data). Adding a
family means adding a row here, never an ``if`` on a model name inside a method. Plain data: the
hub reads it before transformers or torch is imported.

LRP, DeepLIFT's transformer rules, layer analysis, the importance engine and the randomisation
check reach the modules through the layouts (the adapter resolves them: :meth:`Adapter.blocks`
and its neighbours; :mod:`attribution.models.layouts` finds the modules). Paths are dotted module
names matched as a suffix of ``model.named_modules()`` names, so the same row serves a bare
encoder, a classifier around it and the zero-shot wrapper (e.g. ``"encoder.layer"`` matches
``bert.encoder.layer`` and ``encoder.encoder.layer``). Paths inside a block (``attention``,
``gated_product``) are relative to it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "FAMILIES",
    "READOUTS",
    "Family",
    "Layout",
    "RotaryLayout",
    "VisionLanguage",
    "family_of",
    "loadable",
    "positional_encoding_of",
    "readout_of",
    "vision_language_of",
]


@dataclass(frozen=True)
class RotaryLayout:
    """
    Rotary position embedding (RoPE): where cos/sin enter and which function rotates q and k.

    Attributes:
        kwarg: Keyword under which each attention module receives ``(cos, sin)``.
        function: Module-level function of the family's modeling file that rotates q and k,
            called as ``function(q, k, cos, sin, ...)``. Wrapping it (rather than hooking the
            q/k projections) sees q and k as they are rotated: after fused-QKV splits and q/k
            norms, and with only the rotated features of partial rotary.
    """

    kwarg: str = "position_embeddings"
    function: str = "apply_rotary_pos_emb"


@dataclass(frozen=True)
class Layout:
    """
    Where one architecture keeps the parts LRP, DeepLIFT and layer analysis reach into.

    Attributes:
        blocks: The ``ModuleList`` of transformer blocks.
        attention: Module inside a block that calls the attention interface with (q, k, v).
        embedding_sum: ``(module, "input" | "output")`` where the input embedding ``x0``
            (token + positional for additive PE) is first visible as one tensor.
        token_parts: Modules whose outputs are summed into the token embedding ``E`` (word and
            token-type embeddings; ViT: the patch embedding).
        prefix_tokens: Learned tokens concatenated before the patches (ViT CLS, DeiT
            distillation token), as parameter paths.
        registers: Register tokens (a parameter) inserted after the first prefix token once
            the positions are added, so they carry none (DINOv2 with registers).
        position: ``(path, "module" | "parameter" | "method")`` of the additive positional
            embedding ``P``: a module's output, a parameter, or what a method of a module
            returns (``embeddings.interpolate_pos_encoding``: ``P`` resized to the input).
        input_embedding: Text: the word-embedding module whose output becomes the leaf tensor
            of the backward pass (images use the pixels instead).
        rotary: RoPE details, for LLaMA-style models.
        gated_product: Module inside a block whose input is the gated-MLP product ``act(g)·u``.
        gate_activation: The activation module ``act`` of that gate (for ``cp_gate``).
        attention_linears: Module inside a block that holds every linear layer of the attention
            (q, k, v and output projections), which the γ-rule leaves alone; ``None`` means
            ``attention`` holds them all.
        attention_output: The attention's output projection inside a block; its input is the
            heads' outputs side by side ``(B, T, heads·head_dim)`` (head gates, ablations and
            per-head relevance act there).
        mlp_output: The MLP's last linear layer inside a block (its output is the MLP branch;
            a mixture-of-experts block: the block itself).
        final_norm: Decoders: the norm between the last block and the unembedding (logit lens).
        router: Mixture-of-experts: the router inside a block (it returns ``(logits, top-k
            weights, top-k experts)`` per token, or is a linear layer giving the logits).
        experts: Mixture-of-experts: the experts inside a block (fused 3-D weights called as
            ``experts(hidden, top_k_index, top_k_weights)``, or a ``ModuleList``).
    """

    blocks: str
    attention: str
    embedding_sum: tuple[str, str]
    token_parts: tuple[str, ...]
    prefix_tokens: tuple[str, ...] = ()
    registers: str | None = None
    position: tuple[str, str] | None = None
    input_embedding: str | None = None
    rotary: RotaryLayout | None = None
    gated_product: str | None = None
    gate_activation: str | None = None
    attention_linears: str | None = None
    attention_output: str = "attention.o_proj"
    mlp_output: str = "mlp.fc2"
    final_norm: str | None = None
    router: str | None = None
    experts: str | None = None


_BERT = Layout(
    blocks="encoder.layer",
    attention="attention.self",
    attention_linears="attention",
    attention_output="attention.output.dense",
    mlp_output="output.dense",
    embedding_sum=("embeddings.LayerNorm", "input"),
    token_parts=("embeddings.word_embeddings", "embeddings.token_type_embeddings"),
    position=("embeddings.position_embeddings", "module"),
    input_embedding="embeddings.word_embeddings",
)
_DISTILBERT = Layout(
    blocks="transformer.layer",
    attention="attention",
    attention_output="attention.out_lin",
    mlp_output="ffn.lin2",
    embedding_sum=("embeddings.LayerNorm", "input"),
    token_parts=("embeddings.word_embeddings",),
    position=("embeddings.position_embeddings", "module"),
    input_embedding="embeddings.word_embeddings",
)
_GPT2 = Layout(
    blocks="h",
    attention="attn",
    attention_output="attn.c_proj",
    mlp_output="mlp.c_proj",
    final_norm="ln_f",
    embedding_sum=("drop", "input"),
    token_parts=("wte",),
    position=("wpe", "module"),
    input_embedding="wte",
)
_LLAMA = Layout(
    blocks="layers",
    attention="self_attn",
    attention_output="self_attn.o_proj",
    mlp_output="mlp.down_proj",
    final_norm="norm",
    embedding_sum=("embed_tokens", "output"),
    token_parts=("embed_tokens",),
    input_embedding="embed_tokens",
    rotary=RotaryLayout(),
    gated_product="mlp.down_proj",
    gate_activation="mlp.act_fn",
)
_PHI3 = replace(_LLAMA, gate_activation="mlp.activation_fn")
# Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE in transformers 5: a router and fused experts per block
_MOE = replace(
    _LLAMA,
    mlp_output="mlp",
    gated_product=None,
    gate_activation=None,
    router="mlp.gate",
    experts="mlp.experts",
)
_MODERNBERT = Layout(
    blocks="layers",
    attention="attn",
    attention_output="attn.Wo",
    mlp_output="mlp.Wo",
    embedding_sum=("embeddings.tok_embeddings", "output"),
    token_parts=("embeddings.tok_embeddings",),
    input_embedding="embeddings.tok_embeddings",
    rotary=RotaryLayout(),
    gated_product="mlp.Wo",
    gate_activation="mlp.act",
)
_VIT = Layout(
    blocks="layers",
    attention="attention",
    embedding_sum=("embeddings", "output"),
    token_parts=("embeddings.patch_embeddings",),
    prefix_tokens=("embeddings.cls_token",),
    position=("embeddings.position_embeddings", "parameter"),
)
_DEIT = Layout(
    blocks="layers",
    attention="attention",
    embedding_sum=("embeddings", "output"),
    token_parts=("embeddings.patch_embeddings",),
    prefix_tokens=("embeddings.cls_token", "embeddings.distillation_token"),
    position=("embeddings.position_embeddings", "parameter"),
)

_DINOV2 = Layout(
    blocks="encoder.layer",
    attention="attention",
    embedding_sum=("embeddings", "output"),
    token_parts=("embeddings.patch_embeddings",),
    prefix_tokens=("embeddings.cls_token",),
    position=("embeddings.interpolate_pos_encoding", "method"),  # resized to the input
)
_CLIP_VISION = Layout(
    blocks="encoder.layers",
    attention="self_attn",
    attention_output="self_attn.out_proj",
    embedding_sum=("embeddings", "output"),
    token_parts=("embeddings.patch_embedding",),
    prefix_tokens=("embeddings.class_embedding",),
    position=("embeddings.position_embedding", "module"),
)


# A vision-language model's language model sits beside its vision tower, whose blocks a bare
# "layers" would also match: its paths name the language model.
_VLM_LANGUAGE_MODEL = replace(
    _LLAMA,
    blocks="language_model.layers",
    final_norm="language_model.norm",
    embedding_sum=("language_model.embed_tokens", "output"),
    token_parts=("language_model.embed_tokens",),
    input_embedding="language_model.embed_tokens",
)

# Idefics3 and SmolVLM call theirs the text model
_IDEFICS3_TEXT_MODEL = replace(
    _LLAMA,
    blocks="text_model.layers",
    final_norm="text_model.norm",
    embedding_sum=("text_model.embed_tokens", "output"),
    token_parts=("text_model.embed_tokens",),
    input_embedding="text_model.embed_tokens",
)


@dataclass(frozen=True)
class VisionLanguage:
    """
    How a vision-language family reads an image: its prompt and its visual tokens' regions.

    Attributes:
        prompt: Where the image goes in a prompt without a chat template: ``{image}`` is the
            processor's image placeholder token (which it expands to the visual tokens),
            ``{prompt}`` the user's text. With several images, the text before ``{prompt}`` is
            one image's and is repeated once per image.
        regions: How visual tokens map back to the image (:mod:`attribution.models.regions`):
            ``"patch_grid"``, one token per vision-tower patch in row-major order (LLaVA 1.5);
            ``"merged_grid"``, one token per ``m × m`` block of patches (Qwen2-VL's merger);
            ``"pooled_grid"``, the patches average-pooled to ``n × n`` tokens (Gemma 3);
            ``"tiled_grid"``, tiles and the whole image, pixel-shuffled (Idefics3, SmolVLM);
            ``"anyres_grid"``, the whole image and its any-resolution tiles (LLaVA-NeXT).
        token_inputs: The processor's per-token outputs the model reads besides the ids and
            the attention mask, each with its value over a teacher-forced answer (PaliGemma's
            token types: 0 is the prefix it reads both ways, 1 the answer it reads causally;
            Gemma 3's: 1 marks image tokens, which read each other both ways).
            Other per-token outputs (a text tokenizer's own token types, labels) are dropped.
        one_image: Why a prompt holds one image only, in words (``None``: it may hold
            several, each image's visual tokens mapped to that image).
        packages: Python modules its processor imports beyond transformers (the ``vlm``
            extra installs them): a load without them is refused by name.
    """

    prompt: str
    regions: str
    token_inputs: tuple[tuple[str, int], ...] = ()
    one_image: str | None = None
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """
    One ``model_type``'s row.

    Attributes:
        adapter: The adapter family that serves it (``None``: a part of another family's
            model, such as CLIP's vision tower, never loaded on its own).
        positional: Its kind of positional encoding.
        layout: Where its modules are (``None``: attrlab reaches into none of them).
        vision_language: For image + prompt -> text models, how they read the image.
    """

    adapter: str | None
    positional: str | None = None
    layout: Layout | None = None
    vision_language: VisionLanguage | None = None


_QWEN2_VL = VisionLanguage(
    "<|vision_start|>{image}<|vision_end|>{prompt}", "merged_grid", (("mm_token_type_ids", 0),)
)

#: Hugging Face ``model_type`` -> its row. Qwen3 (q/k norms), Gemma (``1 + w`` norms, scaled
#: embeddings, soft-capping) and Phi-3 (fused QKV and gate/up, partial rotary) share LLaMA's
#: module names; what differs is handled by rules that do not depend on names.
FAMILIES: dict[str, Family] = {
    "bert": Family("text-classifier", "learned", _BERT),
    "roberta": Family("text-classifier", "learned", _BERT),
    "xlm-roberta": Family("text-classifier", "learned", _BERT),
    "electra": Family("text-classifier", "learned", _BERT),
    "distilbert": Family("text-classifier", "learned", _DISTILBERT),
    "deberta-v2": Family("text-classifier", "relative"),
    "modernbert": Family("text-classifier", "rope", _MODERNBERT),
    "gpt2": Family("decoder-lm", "learned", _GPT2),
    "llama": Family("decoder-lm", "rope", _LLAMA),
    "mistral": Family("decoder-lm", "rope", _LLAMA),
    "qwen2": Family("decoder-lm", "rope", _LLAMA),
    "qwen3": Family("decoder-lm", "rope", _LLAMA),
    "gemma": Family("decoder-lm", "rope", _LLAMA),
    "gemma2": Family("decoder-lm", "rope", _LLAMA),
    "gemma3_text": Family("decoder-lm", "rope", _LLAMA),
    "phi3": Family("decoder-lm", "rope", _PHI3),
    "mixtral": Family("decoder-lm", "rope", _MOE),
    "qwen2_moe": Family("decoder-lm", "rope", _MOE),
    "qwen3_moe": Family("decoder-lm", "rope", _MOE),
    "olmoe": Family("decoder-lm", "rope", _MOE),
    "vit": Family("vision-transformer", "learned", _VIT),
    "deit": Family("vision-transformer", "learned", _DEIT),
    "dinov2": Family("vision-transformer", "learned", _DINOV2),
    "dinov2_with_registers": Family(
        "vision-transformer",
        "learned",
        replace(_DINOV2, registers="embeddings.register_tokens"),
    ),
    "clip": Family("zero-shot-image", "learned"),
    "clip_vision_model": Family(None, "learned", _CLIP_VISION),
    # Image + prompt -> text; their language models are LLaMA-like (LLaVA's may be any, its
    # layout holds for LLaMA, Vicuna and Mistral ones). Tested on tiny random models only.
    "llava": Family(
        "vision-language",
        "rope",
        _VLM_LANGUAGE_MODEL,
        VisionLanguage("{image}\n{prompt}", "patch_grid"),
    ),
    # each image its whole view and its any-resolution tiles (the model packs them per image)
    "llava_next": Family(
        "vision-language",
        "rope",
        _VLM_LANGUAGE_MODEL,
        VisionLanguage("{image}\n{prompt}", "anyres_grid"),
    ),
    "qwen2_vl": Family("vision-language", "rope", _VLM_LANGUAGE_MODEL, _QWEN2_VL),
    # the same tokens; its tower's window attention is undone before the merger's output
    "qwen2_5_vl": Family("vision-language", "rope", _VLM_LANGUAGE_MODEL, _QWEN2_VL),
    # SigLIP patches (no CLS) resized to a fixed square; its processor adds BOS and a newline
    "paligemma": Family(
        "vision-language",
        "rope",
        _VLM_LANGUAGE_MODEL,
        VisionLanguage(
            "{image}{prompt}",
            "patch_grid",
            (("token_type_ids", 1),),
            "PaliGemma is trained on one image before its prompt",
        ),
    ),
    # each image placeholder (begin-of-image) expands to its pooled tokens between BOI and EOI;
    # pan-and-scan crops are refused by the map (regions.py)
    "gemma3": Family(
        "vision-language",
        "rope",
        _VLM_LANGUAGE_MODEL,
        VisionLanguage("{image}{prompt}", "pooled_grid", (("token_type_ids", 0),)),
    ),
    "idefics3": Family(
        "vision-language",
        "rope",
        _IDEFICS3_TEXT_MODEL,
        VisionLanguage("{image}{prompt}", "tiled_grid"),
    ),
    # Idefics3's tiles, pixel shuffle and text model; its checkpoints' chat template places
    # the image ("User:<image>..."), the pattern serves a folder without one
    "smolvlm": Family(
        "vision-language",
        "rope",
        _IDEFICS3_TEXT_MODEL,
        VisionLanguage("{image}{prompt}", "tiled_grid", packages=("num2words",)),
    ),
}

#: Classifier class -> which tokens its logits read, when not the CLS token alone: distilled
#: DeiT averages the CLS and distillation heads; DINOv2 reads CLS concatenated with the mean of
#: the patch tokens (registers excluded). Rollout and attention flow explain that readout.
READOUTS: dict[str, str] = {
    "DeiTForImageClassificationWithTeacher": "first_two",
    "Dinov2ForImageClassification": "first_and_patches",
    "Dinov2WithRegistersForImageClassification": "first_and_patches",
}


def loadable(model_type: str) -> bool:
    """Whether an adapter serves ``model_type`` on its own."""
    row = FAMILIES.get(model_type)
    return row is not None and row.adapter is not None


def vision_language_of(model_type: str | None) -> VisionLanguage | None:
    """How a vision-language family reads its image; ``None`` for other families."""
    row = FAMILIES.get(model_type or "")
    return row.vision_language if row else None


def family_of(config: Any) -> str | None:
    """Adapter family for a transformers config, or ``None`` if unsupported."""
    row = FAMILIES.get(getattr(config, "model_type", ""))
    return row.adapter if row else None


def readout_of(model: Any) -> str:
    """The readout of a vision-transformer classifier (``"first"`` unless listed)."""
    return READOUTS.get(type(model).__name__, "first")


def positional_encoding_of(config: Any) -> str | None:
    """Kind of positional encoding a config uses (DistilBERT may be sinusoidal)."""
    if getattr(config, "sinusoidal_pos_embds", False):
        return "sinusoidal"
    row = FAMILIES.get(getattr(config, "model_type", ""))
    return row.positional if row else None
