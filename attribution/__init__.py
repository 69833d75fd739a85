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
    from attrlab.attribution.answers import AnswerSpec, answer_asked
    from attrlab.attribution.explain import explain
    from attrlab.attribution.explanation import Explanation
    from attrlab.attribution.features import read_spans
    from attrlab.attribution.gate import checked_params
    from attrlab.attribution.methods.registry import available_methods, get_method
    from attrlab.attribution.models.loading import load
    from attrlab.attribution.rows import dataset_line, numbered_lines
    from attrlab.attribution.run import RunSettings
    from attrlab.attribution.runs import prepare_input

__all__ = [
    "AnswerSpec",
    "AttrlabError",
    "Explanation",
    "RunSettings",
    "answer_asked",
    "available_methods",
    "checked_params",
    "dataset_line",
    "explain",
    "get_method",
    "load",
    "numbered_lines",
    "prepare_input",
    "read_spans",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "dataset_line": "attrlab.attribution.rows",
        "numbered_lines": "attrlab.attribution.rows",
        "checked_params": "attrlab.attribution.gate",
        "read_spans": "attrlab.attribution.features",
        "answer_asked": "attrlab.attribution.answers",
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
