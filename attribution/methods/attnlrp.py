"""AttnLRP (Achtibat et al. 2024, https://arxiv.org/abs/2402.05602) for transformer models."""

from __future__ import annotations

from typing import Any, ClassVar

from attribution.methods.base import Attribution, AttributionMethod
from attribution.methods.lrp import GAMMA_PARAMS, lrp, to_attribution, unsupported_reason
from attribution.methods.registry import register
from attribution.models.base import Adapter, Inputs
from attribution.run import RunContext

__all__ = ["AttnLRP"]


@register
class AttnLRP(AttributionMethod):
    """
    Attention-aware LRP in its Gradient × Input form: one forward, one modified backward.

    Rules: identity on elementwise activations, constant ``1/σ`` in LayerNorm / RMSNorm (and
    ``1/‖x‖`` in the zero-shot cosine head), uniform split on QKᵀ and A·V, ½ on gated-MLP
    products, gradient × input through softmax, ε → 0 on linear layers (optional γ). The
    backward starts at the target logit. Text scores are token relevance at the input
    embedding (word + token-type share of ``E + P``); images get pixel relevance (H×W) through
    the patch embedding. Positional encodings receive relevance but are not reported: see
    ``pa_lrp``. ``metrics.conservation_error`` = ``|Σ input relevance − logit| / |logit|``;
    ``layers`` holds the relevance entering each residual stream (``residual_relevance``).
    """

    name = "attnlrp"
    title = "AttnLRP"
    paper = "https://arxiv.org/abs/2402.05602"
    requires = frozenset({"gradients", "attentions"})
    has_convergence_delta = True
    params = GAMMA_PARAMS
    #: Whether relevance is also attributed to positional encodings (PA-LRP).
    pe_aware: ClassVar[bool] = False

    @classmethod
    def unsupported_reason(cls, adapter: Adapter) -> str | None:
        return super().unsupported_reason(adapter) or unsupported_reason(adapter)

    @classmethod
    def attribute(
        cls, adapter: Adapter, inputs: Inputs, target: int, params: dict[str, Any], run: RunContext
    ) -> Attribution:
        result = lrp(
            adapter, inputs, target, cls.pe_aware, params["gamma_linear"], params["gamma_conv"]
        )
        run.count(forward=1, backward=1)
        return to_attribution(result, pe_aware=cls.pe_aware)
