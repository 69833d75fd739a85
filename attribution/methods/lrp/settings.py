"""
The LRP switches shared by AttnLRP and PA-LRP, and each model family's defaults (data).

The defaults follow the authors' reference code. Vision transformers: LXT maps torchvision's
ViT to its CP-LRP variant (q and k detached, the attention probabilities act as constants) and
PE-AWARE-LRP runs DeiT with ``cp_rule=True``, γ = 0.05 on linear layers outside attention and
γ = 100 on the patch-embedding convolution. Language models: the full AttnLRP attention rule
and no γ (LXT's text models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attrlab.attribution.models.base import Adapter
from attrlab.attribution.params import Param

__all__ = ["FAMILY_DEFAULTS", "LRP_PARAMS", "LRPDefaults", "resolve_settings"]


@dataclass(frozen=True)
class LRPDefaults:
    """
    What ``"auto"`` / an empty value of the LRP parameters means for one model family.

    Attributes:
        attention_rule: ``"attnlrp"`` or ``"cp"``.
        gamma_linear: γ on linear layers outside attention (MLP, classifier head).
        gamma_conv: γ on convolutions (the ViT patch embedding).
    """

    attention_rule: str
    gamma_linear: float
    gamma_conv: float


_TEXT = LRPDefaults(attention_rule="attnlrp", gamma_linear=0.0, gamma_conv=0.0)

_VISION = LRPDefaults(attention_rule="cp", gamma_linear=0.05, gamma_conv=100.0)

#: Adapter family -> defaults; families not listed get the language-model defaults.
FAMILY_DEFAULTS: dict[str, LRPDefaults] = {
    "vision-transformer": _VISION,
    "zero-shot-image": _VISION,
    "text-classifier": _TEXT,
    "zero-shot-text": _TEXT,
    "decoder-lm": _TEXT,
}

#: Parameters of AttnLRP and PA-LRP.
LRP_PARAMS = (
    Param(
        "attention_rule",
        "str",
        "auto",
        "Rule inside attention: 'attnlrp' (relevance also flows through softmax to q and k: "
        "q, k get ¼ of their gradient, v ½); 'cp' (attention probabilities held constant: "
        "q, k get none, v all of it; LXT's ViT rule); 'cp_half' (as 'cp', but v gets half "
        "of the attention output's relevance, as in the PA-LRP reference code); 'cp_gate' "
        "('cp' with the gated-MLP gate held constant too, LXT's full CP for LLaMA-style "
        "blocks); or 'auto' ('cp' for vision transformers, following LXT, and 'attnlrp' for "
        "text).",
        choices=("auto", "attnlrp", "cp", "cp_half", "cp_gate"),
    ),
    Param(
        "gamma_linear",
        "float",
        None,
        "LRP-γ on the linear layers outside attention (MLP and classifier head); attention "
        "projections keep the ε-rule. Empty = family default: 0.05 for vision transformers, "
        "0 for text models; 0 turns it off.",
        minimum=0.0,
        maximum=100.0,
    ),
    Param(
        "gamma_conv",
        "float",
        None,
        "LRP-γ on convolutions, i.e. the ViT patch embedding. Empty = family default: 100 for "
        "vision transformers, 0 for text models; 0 turns it off.",
        minimum=0.0,
        maximum=1000.0,
    ),
)


def resolve_settings(adapter: Adapter, params: dict[str, Any]) -> dict[str, Any]:
    """
    ``params`` with ``"auto"`` / ``None`` replaced by ``adapter``'s family defaults.

    Returns:
        A new dict with concrete ``attention_rule``, ``gamma_linear`` and ``gamma_conv``.
    """
    defaults = FAMILY_DEFAULTS.get(adapter.family, _TEXT)
    resolved = dict(params)
    if resolved.get("attention_rule") in (None, "auto"):
        resolved["attention_rule"] = defaults.attention_rule
    for name in ("gamma_linear", "gamma_conv"):
        if resolved.get(name) is None:
            resolved[name] = getattr(defaults, name)
    return resolved
