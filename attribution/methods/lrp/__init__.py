"""
Layer-wise Relevance Propagation for transformers: AttnLRP rules and PA-LRP positional rules.

``rules`` holds the rules as autograd functions, ``settings`` the shared parameters and each
family's defaults (data), ``patches`` the undoable hooks that apply the rules to a model (at the
per-family module paths of ``attribution/models/families.py``), ``positional`` the
positional-encoding-aware parts, and ``relevance`` the forward/backward run. The registered
methods live in ``attribution/methods/attnlrp.py`` and ``pa_lrp.py``.
"""

from attrlab.attribution.methods.lrp.patches import lrp_rules, transformer_lrp
from attrlab.attribution.methods.lrp.relevance import LRPResult, lrp, lrp_steps, to_attribution
from attrlab.attribution.methods.lrp.rules import ATTENTION_RULES, AttentionRule
from attrlab.attribution.methods.lrp.settings import (
    FAMILY_DEFAULTS,
    LRPDefaults,
    resolve_settings,
)

__all__ = [
    "ATTENTION_RULES",
    "FAMILY_DEFAULTS",
    "AttentionRule",
    "LRPDefaults",
    "LRPResult",
    "lrp",
    "lrp_rules",
    "lrp_steps",
    "resolve_settings",
    "to_attribution",
    "transformer_lrp",
]
