"""AttnLRP (Achtibat et al. 2024, https://arxiv.org/abs/2402.05602) for transformer models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.lrp import (
    LRP_PARAMS,
    lrp,
    lrp_steps,
    resolve_settings,
    to_attribution,
)
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.layouts import unsupported_reason
from attrlab.attribution.run import RunContext
from attrlab.attribution.target import Target

__all__ = ["AttnLRP"]


def _rules(params: dict[str, Any]) -> dict[str, Any]:
    """The rule parameters of a run (resolved) as :func:`lrp`'s keywords."""
    return {name: params[name] for name in ("gamma_linear", "gamma_conv", "attention_rule")}


@register
class AttnLRP(AttributionMethod):
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
    are not reported: see ``pa_lrp``. ``metrics.conservation_error`` =
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
    params = LRP_PARAMS
    #: Whether relevance is also attributed to positional encodings (PA-LRP).
    pe_aware: ClassVar[bool] = False

    @classmethod
    def unsupported_reason(cls, adapter: Adapter) -> str | None:
        return super().unsupported_reason(adapter) or unsupported_reason(adapter)

    @classmethod
    def _resolve(cls, adapter: Adapter, params: dict[str, Any]) -> dict[str, Any]:
        """The family's rule and γ values in place of ``"auto"`` / empty: what actually runs."""
        return resolve_settings(adapter, params)

    @classmethod
    def passes(cls, adapter: Adapter, inputs: Inputs, params: dict[str, Any]) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        return Passes(1, 1)

    @classmethod
    def attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: dict[str, Any],
        run: RunContext,
    ) -> Attribution:
        if (
            cls.pe_aware
            and params["attention_rule"].startswith("cp")
            and adapter.positional_encoding == "rope"
        ):
            run.warn(
                f"attention_rule '{params['attention_rule']}' sends no relevance through q and "
                "k, so rotary positions get none"
            )
        result = lrp(adapter, inputs, target, cls.pe_aware, account=True, **_rules(params))
        run.count(forward=1, backward=1)
        return to_attribution(result, pe_aware=cls.pe_aware)

    @classmethod
    def attribute_steps(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        steps: Sequence[int],
        params: dict[str, Any],
        run: RunContext,
    ) -> np.ndarray:
        """One patched forward of the text, one backward per step through its graph."""
        rows = lrp_steps(adapter, inputs, target, steps, cls.pe_aware, **_rules(params))
        run.count(forward=1, backward=len(steps))
        return rows
