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

from attrlab.attribution.models.base import Adapter

__all__ = ["FAMILY_DEFAULTS", "LRPDefaults", "resolve_settings"]


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


def resolve_settings(
    adapter: Adapter,
    attention_rule: str = "auto",
    gamma_linear: float | None = None,
    gamma_conv: float | None = None,
) -> LRPDefaults:
    """The settings that run: ``"auto"`` / ``None`` replaced by ``adapter``'s family defaults."""
    defaults = FAMILY_DEFAULTS.get(adapter.family, _TEXT)
    return LRPDefaults(
        attention_rule=defaults.attention_rule if attention_rule == "auto" else attention_rule,
        gamma_linear=defaults.gamma_linear if gamma_linear is None else gamma_linear,
        gamma_conv=defaults.gamma_conv if gamma_conv is None else gamma_conv,
    )
