"""
Which layers and heads carried a prediction: per-layer and per-head measures, agreement.

Exports are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.layers.agreement import agreement, agreement_metrics
    from attrlab.attribution.layers.analysis import (
        COLUMNS,
        HEAD_ESTIMATORS,
        MEASURES,
        LayerReport,
        Measure,
        analyze,
        analyze_layers,
    )
    from attrlab.attribution.layers.dataset import DATASET_COLUMNS, DatasetItem, analyze_dataset
    from attrlab.attribution.layers.heads import (
        HeadAblation,
        ablate_heads_and_explain,
        head_attention,
    )
    from attrlab.attribution.layers.hooks import zeroed_heads

__all__ = [
    "COLUMNS",
    "DATASET_COLUMNS",
    "HEAD_ESTIMATORS",
    "MEASURES",
    "DatasetItem",
    "HeadAblation",
    "LayerReport",
    "Measure",
    "ablate_heads_and_explain",
    "agreement",
    "agreement_metrics",
    "analyze",
    "analyze_dataset",
    "analyze_layers",
    "head_attention",
    "zeroed_heads",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "agreement": "attrlab.attribution.layers.agreement",
        "agreement_metrics": "attrlab.attribution.layers.agreement",
        "COLUMNS": "attrlab.attribution.layers.analysis",
        "HEAD_ESTIMATORS": "attrlab.attribution.layers.analysis",
        "MEASURES": "attrlab.attribution.layers.analysis",
        "LayerReport": "attrlab.attribution.layers.analysis",
        "Measure": "attrlab.attribution.layers.analysis",
        "analyze": "attrlab.attribution.layers.analysis",
        "analyze_layers": "attrlab.attribution.layers.analysis",
        "DATASET_COLUMNS": "attrlab.attribution.layers.dataset",
        "DatasetItem": "attrlab.attribution.layers.dataset",
        "analyze_dataset": "attrlab.attribution.layers.dataset",
        "HeadAblation": "attrlab.attribution.layers.heads",
        "ablate_heads_and_explain": "attrlab.attribution.layers.heads",
        "head_attention": "attrlab.attribution.layers.heads",
        "zeroed_heads": "attrlab.attribution.layers.hooks",
    },
)
