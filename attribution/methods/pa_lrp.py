"""PA-LRP, positional-encoding-aware LRP (Bakish et al. 2025, arXiv 2506.02138)."""

from __future__ import annotations

from attrlab.attribution.methods.attnlrp import AttnLRP
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter

__all__ = ["PALRP"]

_SUPPORTED_PE = ("learned", "sinusoidal", "rope")


@register
class PALRP(AttnLRP):
    """
    AttnLRP whose relevance also reaches the positional encoding.

    Additive PE (BERT-style, GPT-2, ViT/DeiT): the embedding sum ``E + P`` is split
    proportionally; token-type embeddings count with the token share. RoPE (LLaMA, Mistral,
    Qwen2): every layer's cos/sin are leaf tensors and each rotary product gets the uniform
    rule. ``scores`` = token relevance, ``positional_scores`` = positional relevance (per
    token; images: spread over each patch's pixels, CLS in ``metrics``; RoPE:
    ``Σ_layers Σ_{cos,sin} |Σ_d R|``), ``maps["combined"]`` = their sum,
    ``layers`` = ``positional_relevance`` and ``residual_relevance`` per layer, and
    ``metrics.conservation_error`` counts token plus (signed) positional relevance.
    Parameters and per-family defaults are AttnLRP's (vision transformers: CP attention rule,
    γ_lin = 0.05, γ_conv = 100, as in the PA-LRP DeiT experiments). With
    ``attention_rule="cp"`` no relevance passes through q and k, so RoPE positions get none.
    """

    name = "pa_lrp"
    title = "PA-LRP (positional-aware AttnLRP)"
    paper = "https://arxiv.org/abs/2506.02138"
    pe_aware = True
    #: Positional relevance is a text's or an image's (an image and a prompt: see ``attnlrp``).
    modalities = frozenset({"text", "image"})

    @classmethod
    def unsupported_reason(cls, adapter: Adapter) -> str | None:
        reason = super().unsupported_reason(adapter)
        if reason is None and adapter.positional_encoding not in _SUPPORTED_PE:
            return (
                f"pa_lrp handles learned, sinusoidal and rotary positional encodings; model "
                f"'{adapter.model_id}' uses {adapter.positional_encoding or 'none'}"
            )
        return reason
