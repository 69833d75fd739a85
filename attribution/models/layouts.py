"""
Where each transformer family keeps its blocks, attention and embeddings: module paths as data.

LRP, DeepLIFT's transformer rules, layer analysis and the randomisation check reach the modules
through these rows (the adapter resolves them: :meth:`Adapter.blocks` and its neighbours).

Paths are dotted module names matched as a suffix of ``model.named_modules()`` names, so the
same row serves a bare encoder, a classifier around it and the zero-shot wrapper (e.g.
``"encoder.layer"`` matches ``bert.encoder.layer`` and ``encoder.encoder.layer``). Paths inside
a block (``attention``, ``gated_product``) are relative to it. Adding a family means adding a
row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from torch import nn

from attrlab.attribution.errors import UnsupportedMethodError

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter

__all__ = [
    "LAYOUTS",
    "Layout",
    "RotaryLayout",
    "find_module",
    "find_parameter",
    "layout_for",
    "unsupported_reason",
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
        mlp_output: The MLP's last linear layer inside a block (its output is the MLP branch).
        final_norm: Decoders: the norm between the last block and the unembedding (logit lens).
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

#: Hugging Face ``model_type`` -> layout. Qwen3 (q/k norms), Gemma (``1 + w`` norms, scaled
#: embeddings, soft-capping) and Phi-3 (fused QKV and gate/up, partial rotary) share LLaMA's
#: module names; what differs is handled by rules that do not depend on names.
LAYOUTS: dict[str, Layout] = {
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "electra": _BERT,
    "distilbert": _DISTILBERT,
    "gpt2": _GPT2,
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _LLAMA,
    "gemma3_text": _LLAMA,
    "phi3": _PHI3,
    "modernbert": _MODERNBERT,
    "vit": _VIT,
    "deit": _DEIT,
    "dinov2": _DINOV2,
    "dinov2_with_registers": replace(_DINOV2, registers="embeddings.register_tokens"),
    "clip_vision_model": _CLIP_VISION,
}


def unsupported_reason(adapter: Adapter) -> str | None:
    """``None`` if the LRP patches know this model, else why not (for ``unsupported_reason``)."""
    model_type = adapter.model_type
    if model_type not in LAYOUTS:
        known = ", ".join(sorted(LAYOUTS))
        kind = f"'{model_type}'" if model_type else adapter.family
        return (
            f"LRP rules exist for transformer families ({known}); model '{adapter.model_id}' "
            f"is {kind}. A family is added as a row of LAYOUTS in "
            "attribution/models/layouts.py naming its blocks, attention and embeddings"
        )
    return None  # SDPA / flash models run eagerly for the method (Adapter.eager_attention)


def layout_for(adapter: Adapter) -> Layout:
    """
    The layout of ``adapter``'s architecture.

    Raises:
        UnsupportedMethodError: For CNNs and transformer families without a row here.
    """
    reason = unsupported_reason(adapter)
    if reason is not None:
        raise UnsupportedMethodError(reason)
    return LAYOUTS[str(adapter.model_type)]


def find_module(model: nn.Module, path: str) -> nn.Module:
    """
    The one module whose dotted name is ``path`` or ends with ``"." + path``.

    Raises:
        UnsupportedMethodError: If none or several modules match.
    """
    found = [m for name, m in model.named_modules() if name == path or name.endswith("." + path)]
    if len(found) != 1:
        problem = "no module" if not found else f"{len(found)} modules"
        raise UnsupportedMethodError(
            f"LRP could not locate '{path}' in {type(model).__name__}: {problem} match"
        )
    return found[0]


def find_parameter(model: nn.Module, path: str) -> nn.Parameter:
    """The one parameter whose dotted name is ``path`` or ends with ``"." + path``."""
    found = [p for name, p in model.named_parameters() if name == path or name.endswith("." + path)]
    if len(found) != 1:
        raise UnsupportedMethodError(
            f"LRP could not locate parameter '{path}' in {type(model).__name__}"
        )
    return found[0]
