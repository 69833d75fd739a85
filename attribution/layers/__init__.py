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
        joint_ablation,
    )
    from attrlab.attribution.layers.dataset import DATASET_COLUMNS, DatasetItem, analyze_dataset
    from attrlab.attribution.layers.heads import (
        HeadAblation,
        ablate_heads_and_explain,
        head_attention,
    )
    from attrlab.attribution.layers.hooks import zeroed_heads
    from attrlab.attribution.layers.pruning import UNITS
    from attrlab.attribution.layers.pruning_study import (
        MAX_TEXTS,
        PruningStudy,
        check_units,
        pruning_study,
        ranked_input,
    )

__all__ = [
    "COLUMNS",
    "DATASET_COLUMNS",
    "HEAD_ESTIMATORS",
    "MAX_TEXTS",
    "MEASURES",
    "UNITS",
    "DatasetItem",
    "HeadAblation",
    "LayerReport",
    "Measure",
    "PruningStudy",
    "ablate_heads_and_explain",
    "agreement",
    "agreement_metrics",
    "analyze",
    "analyze_dataset",
    "analyze_layers",
    "check_units",
    "head_attention",
    "joint_ablation",
    "pruning_study",
    "ranked_input",
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
        "joint_ablation": "attrlab.attribution.layers.analysis",
        "DATASET_COLUMNS": "attrlab.attribution.layers.dataset",
        "DatasetItem": "attrlab.attribution.layers.dataset",
        "analyze_dataset": "attrlab.attribution.layers.dataset",
        "HeadAblation": "attrlab.attribution.layers.heads",
        "ablate_heads_and_explain": "attrlab.attribution.layers.heads",
        "head_attention": "attrlab.attribution.layers.heads",
        "zeroed_heads": "attrlab.attribution.layers.hooks",
        "UNITS": "attrlab.attribution.layers.pruning",
        "MAX_TEXTS": "attrlab.attribution.layers.pruning_study",
        "PruningStudy": "attrlab.attribution.layers.pruning_study",
        "check_units": "attrlab.attribution.layers.pruning_study",
        "pruning_study": "attrlab.attribution.layers.pruning_study",
        "ranked_input": "attrlab.attribution.layers.pruning_study",
    },
)
