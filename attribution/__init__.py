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
    from attrlab.attribution.explain import explain
    from attrlab.attribution.explanation import Explanation
    from attrlab.attribution.inputs.features import read_spans
    from attrlab.attribution.inputs.rows import dataset_line, numbered_lines
    from attrlab.attribution.inputs.runs import prepare_input
    from attrlab.attribution.methods.registry import available_methods, get_method
    from attrlab.attribution.models.loading import load
    from attrlab.attribution.request.answers import AnswerSpec, answer_asked
    from attrlab.attribution.request.gate import checked_params
    from attrlab.attribution.request.run import RunSettings

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
        "dataset_line": "attrlab.attribution.inputs.rows",
        "numbered_lines": "attrlab.attribution.inputs.rows",
        "checked_params": "attrlab.attribution.request.gate",
        "read_spans": "attrlab.attribution.inputs.features",
        "answer_asked": "attrlab.attribution.request.answers",
        "prepare_input": "attrlab.attribution.inputs.runs",
        "AnswerSpec": "attrlab.attribution.request.answers",
        "explain": "attrlab.attribution.explain",
        "Explanation": "attrlab.attribution.explanation",
        "available_methods": "attrlab.attribution.methods.registry",
        "get_method": "attrlab.attribution.methods.registry",
        "load": "attrlab.attribution.models.loading",
        "RunSettings": "attrlab.attribution.request.run",
    },
)
