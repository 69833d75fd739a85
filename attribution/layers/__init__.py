"""Which layers and heads carried a prediction: per-layer and per-head measures, agreement."""

from attribution.layers.agreement import agreement, agreement_metrics
from attribution.layers.analysis import (
    COLUMNS,
    HEAD_ESTIMATORS,
    MEASURES,
    LayerReport,
    Measure,
    analyze,
    analyze_layers,
    joint_ablation,
)
from attribution.layers.dataset import DATASET_COLUMNS, DatasetItem, analyze_dataset

__all__ = [
    "COLUMNS",
    "DATASET_COLUMNS",
    "HEAD_ESTIMATORS",
    "MEASURES",
    "DatasetItem",
    "LayerReport",
    "Measure",
    "agreement",
    "agreement_metrics",
    "analyze",
    "analyze_dataset",
    "analyze_layers",
    "joint_ablation",
]
