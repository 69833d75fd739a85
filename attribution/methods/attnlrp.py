"""AttnLRP (Achtibat et al. 2024, https://arxiv.org/abs/2402.05602) for transformer models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.checkpointing import CheckpointingParams
from attrlab.attribution.methods.lrp import (
    lrp,
    lrp_steps,
    resolve_settings,
    to_attribution,
)
from attrlab.attribution.methods.registry import register
from attrlab.attribution.methods.smoothing import SmoothingParams
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.layouts import unsupported_reason
from attrlab.attribution.request.params import param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["AttnLRP", "LRPParams"]


@dataclass(frozen=True, kw_only=True)
class LRPParams(SmoothingParams, CheckpointingParams):
    """The parameters of AttnLRP and PA-LRP."""

    attention_rule: str = param(
        "auto",
        "Rule inside attention: 'attnlrp' (relevance also flows through softmax to q and k: "
        "q, k get ¼ of their gradient, v ½); 'cp' (attention probabilities held constant: "
        "q, k get none, v all of it; LXT's ViT rule); 'cp_half' (as 'cp', but v gets half "
        "of the attention output's relevance, as in the PA-LRP reference code); 'cp_gate' "
        "('cp' with the gated-MLP gate held constant too, LXT's full CP for LLaMA-style "
        "blocks); or 'auto' ('cp' for vision transformers, following LXT, and 'attnlrp' for "
        "text).",
        choices=("auto", "attnlrp", "cp", "cp_half", "cp_gate"),
    )
    gamma_linear: float | None = param(
        None,
        "LRP-γ on the linear layers outside attention (MLP and classifier head); attention "
        "projections keep the ε-rule. Empty = family default: 0.05 for vision transformers, "
        "0 for text models; 0 turns it off.",
        minimum=0.0,
        maximum=100.0,
    )
    gamma_conv: float | None = param(
        None,
        "LRP-γ on convolutions, i.e. the ViT patch embedding. Empty = family default: 100 for "
        "vision transformers, 0 for text models; 0 turns it off.",
        minimum=0.0,
        maximum=1000.0,
    )


def _rules(params: LRPParams) -> dict[str, Any]:
    """The rule parameters of a run (resolved) as :func:`lrp`'s keywords."""
    return {
        "gamma_linear": params.gamma_linear,
        "gamma_conv": params.gamma_conv,
        "attention_rule": params.attention_rule,
    }


@register
class AttnLRP(AttributionMethod[LRPParams]):
    """
    Attention-aware LRP in its Gradient × Input form: one forward, one modified backward.

    Rules: identity on elementwise activations, constant ``1/σ`` in LayerNorm / RMSNorm (and
    ``1/‖x‖`` in the zero-shot cosine head), ½ on gated-MLP products, ε → 0 on linear layers.
    Attention (``attention_rule``): ``"attnlrp"`` = uniform split on QKᵀ and A·V with gradient
    × input through softmax; ``"cp"`` = CP-LRP, the attention probabilities are constants and
    v takes all of A·V's relevance. Optional LRP-γ on linear layers outside attention
    (``gamma_linear``) and on the patch convolution (``gamma_conv``). Defaults follow the
    authors' code per family: vision transformers ``cp``, γ_lin = 0.05, γ_conv = 100; text
    models ``attnlrp`` without γ. The values that ran replace ``"auto"`` / empty in the
    explanation's ``params``. The backward starts at the target logit. Text scores are token
    relevance at the input embedding (word + token-type share of ``E + P``); images get pixel
    relevance (H×W) through the patch embedding. Positional encodings receive relevance but
    are not reported: see ``pa_lrp``. An image and a prompt: the relevance is stopped at the
    language model's first block input (visual features and word embeddings there), the
    vision tower's rules are not used. ``metrics.conservation_error`` =
    ``|Σ input relevance − logit| / |logit|``, lowered by design: ``metrics`` also say where
    the rest went (positions, attention's softmax, biases) and what no rule accounts for, and
    the verdict judges that remainder. ``layers`` holds the relevance entering each residual
    stream (``residual_relevance``).
    """

    steps_share_forward = True  # attribute_steps: one forward, a backward per step
    name = "attnlrp"
    title = "AttnLRP"
    paper = "https://arxiv.org/abs/2402.05602"
    checkpointable = True
    requires = frozenset({"gradients", "attentions"})
    has_convergence_delta = True
    param_record = LRPParams
    modalities = frozenset({"text", "image", "image-text"})
    #: Whether relevance is also attributed to positional encodings (PA-LRP).
    pe_aware: ClassVar[bool] = False

    @classmethod
    def unsupported_reason(cls, adapter: Adapter) -> str | None:
        return super().unsupported_reason(adapter) or unsupported_reason(adapter)

    @classmethod
    def _resolve(cls, adapter: Adapter, params: LRPParams) -> LRPParams:
        """The family's rule and γ values in place of ``"auto"`` / empty: what actually runs."""
        settings = resolve_settings(
            adapter, params.attention_rule, params.gamma_linear, params.gamma_conv
        )
        return replace(
            params,
            attention_rule=settings.attention_rule,
            gamma_linear=settings.gamma_linear,
            gamma_conv=settings.gamma_conv,
        )

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: LRPParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        return Passes(1, 1)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: LRPParams,
        run: RunContext,
    ) -> Attribution:
        if (
            cls.pe_aware
            and params.attention_rule.startswith("cp")
            and adapter.positional_encoding == "rope"
        ):
            run.warn(
                f"attention_rule '{params.attention_rule}' sends no relevance through q and "
                "k, so rotary positions get none"
            )
        result = lrp(adapter, inputs, target, cls.pe_aware, account=True, **_rules(params))
        run.count(forward=1, backward=1)
        return to_attribution(result, pe_aware=cls.pe_aware)

    @classmethod
    def _attribute_steps(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        steps: Sequence[int],
        params: LRPParams,
        run: RunContext,
    ) -> np.ndarray:
        """One patched forward of the text, one backward per step through its graph."""
        rows = lrp_steps(adapter, inputs, target, steps, cls.pe_aware, **_rules(params))
        run.count(forward=1, backward=len(steps))
        return rows
