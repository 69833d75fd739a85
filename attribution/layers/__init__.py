"""Which layers and heads carried a prediction: per-layer and per-head measures, agreement."""

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
from attrlab.attribution.layers.heads import HeadAblation, ablate_heads_and_explain, head_attention
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
    "joint_ablation",
    "zeroed_heads",
]
