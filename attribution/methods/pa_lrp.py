"""PA-LRP, positional-encoding-aware LRP (Bakish et al. 2025, arXiv 2506.02138)."""

from __future__ import annotations

from typing import Any

from attribution.methods.base import Attribution, AttributionMethod
from attribution.methods.lrp import GAMMA_PARAMS, lrp, to_attribution, unsupported_reason
from attribution.methods.registry import register
from attribution.models.base import Adapter, Inputs
from attribution.run import RunContext

__all__ = ["PALRP"]

_SUPPORTED_PE = ("learned", "sinusoidal", "rope")


@register
class PALRP(AttributionMethod):
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
    """

    name = "pa_lrp"
    title = "PA-LRP (positional-aware AttnLRP)"
    paper = "https://arxiv.org/abs/2506.02138"
    requires = frozenset({"gradients", "attentions"})
    has_convergence_delta = True
    params = GAMMA_PARAMS

    @classmethod
    def unsupported_reason(cls, adapter: Adapter) -> str | None:
        reason = super().unsupported_reason(adapter) or unsupported_reason(adapter)
        if reason is None and adapter.positional_encoding not in _SUPPORTED_PE:
            return (
                f"pa_lrp handles learned, sinusoidal and rotary positional encodings; model "
                f"'{adapter.model_id}' uses {adapter.positional_encoding or 'none'}"
            )
        return reason

    @classmethod
    def attribute(
        cls, adapter: Adapter, inputs: Inputs, target: int, params: dict[str, Any], run: RunContext
    ) -> Attribution:
        result = lrp(adapter, inputs, target, True, params["gamma_linear"], params["gamma_conv"])
        run.count(forward=1, backward=1)
        return to_attribution(result, pe_aware=True)
