"""Which layers and heads carried a prediction: per-layer and per-head measures, agreement."""

from attribution.layers.analysis import COLUMNS, HEAD_ESTIMATORS, MEASURES, Measure, analyze_layers

__all__ = ["COLUMNS", "HEAD_ESTIMATORS", "MEASURES", "Measure", "analyze_layers"]
