"""
attrlab's attribution library: models, methods, layer/head analysis and metrics.

Pure PyTorch: nothing here imports a UI or web framework. Exports are imported on first use,
so that commands which need no model (listing models and methods) never import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.errors import AttrlabError
from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.answers import AnswerSpec
    from attrlab.attribution.explain import explain
    from attrlab.attribution.explanation import Explanation
    from attrlab.attribution.methods.registry import available_methods, get_method
    from attrlab.attribution.models.loading import load
    from attrlab.attribution.run import RunSettings
    from attrlab.attribution.runs import prepare_input

__all__ = [
    "AnswerSpec",
    "AttrlabError",
    "Explanation",
    "RunSettings",
    "available_methods",
    "explain",
    "get_method",
    "load",
    "prepare_input",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "prepare_input": "attrlab.attribution.runs",
        "AnswerSpec": "attrlab.attribution.answers",
        "explain": "attrlab.attribution.explain",
        "Explanation": "attrlab.attribution.explanation",
        "available_methods": "attrlab.attribution.methods.registry",
        "get_method": "attrlab.attribution.methods.registry",
        "load": "attrlab.attribution.models.loading",
        "RunSettings": "attrlab.attribution.run",
    },
)
