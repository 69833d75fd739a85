"""
attrlab's attribution library: models, methods, layer/head analysis and metrics.

Pure PyTorch: nothing here imports a UI or web framework. Exports are imported on first use,
so that commands which need no model (listing models and methods) never import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attribution.errors import AttrlabError
from attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attribution.explain import explain
    from attribution.explanation import Explanation
    from attribution.methods.registry import available_methods, get_method
    from attribution.models.loading import load

__all__ = ["AttrlabError", "Explanation", "available_methods", "explain", "get_method", "load"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "explain": "attribution.explain",
        "Explanation": "attribution.explanation",
        "available_methods": "attribution.methods.registry",
        "get_method": "attribution.methods.registry",
        "load": "attribution.models.loading",
    },
)
