"""
Layer-wise Relevance Propagation for transformers: AttnLRP rules and PA-LRP positional rules.

``rules`` holds the rules as autograd functions, ``layouts`` the per-family module paths (data),
``patches`` the undoable hooks that apply the rules to a model, ``positional`` the
positional-encoding-aware parts, and ``relevance`` the forward/backward run. The registered
methods live in ``attribution/methods/attnlrp.py`` and ``pa_lrp.py``.
"""

from attribution.methods.lrp.layouts import LAYOUTS, LRPLayout, layout_for, unsupported_reason
from attribution.methods.lrp.patches import lrp_rules, transformer_lrp
from attribution.methods.lrp.relevance import LRPResult, lrp, to_attribution
from attribution.params import Param

__all__ = [
    "GAMMA_PARAMS",
    "LAYOUTS",
    "LRPLayout",
    "LRPResult",
    "layout_for",
    "lrp",
    "lrp_rules",
    "to_attribution",
    "transformer_lrp",
    "unsupported_reason",
]

#: γ-rule switches shared by AttnLRP and PA-LRP (0 = off: plain AttnLRP, exact conservation).
GAMMA_PARAMS = (
    Param(
        "gamma_linear",
        "float",
        0.0,
        "LRP-γ on every linear layer (0 = off, the AttnLRP rule for language models; "
        "the PA-LRP ViT experiments use 0.05).",
        minimum=0.0,
        maximum=100.0,
    ),
    Param(
        "gamma_conv",
        "float",
        0.0,
        "LRP-γ on convolutions, i.e. the ViT patch embedding (0 = off; AttnLRP and PA-LRP "
        "use about 100 for ViTs).",
        minimum=0.0,
        maximum=1000.0,
    ),
)
