"""
Per-layer sparsity allocations: how much of each layer to prune, from a per-layer score.

Pruning every layer to the same sparsity is the uniform budget. An allocation prunes less where
a layer scores higher (:meth:`~attribution.engine.verification.LayerBudget.allocated`), from:

- ``owl``: the layer's share of outlier weights, Wanda's ``|W|·‖x‖`` over five times the layer's
  mean (Yin et al. 2024, Outlier Weighed Layerwise Sparsity, arXiv:2310.05175), here over the
  down projection (the neurons' weights);
- ``dlp``: the median of that metric over the layer (Chen et al. 2025, DLP: Dynamic Layerwise
  Pruning, the median of weights × input activations as the layer's importance);
- any layer estimator (:data:`~attribution.engine.estimators.ESTIMATORS` of the ``layer``
  kind, e.g. Block Influence): its score of each block.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from attrlab.attribution.engine.channels import CHANNEL_KINDS, ChannelStatistics
from attrlab.attribution.engine.registry import ESTIMATORS
from attrlab.attribution.errors import InvalidParameterError

__all__ = [
    "OUTLIER_RATIO",
    "WEIGHT_ALLOCATIONS",
    "allocation_names",
    "check_allocation",
    "layer_scores",
    "weight_allocation",
]

#: OWL's outlier threshold: a weight's metric over this many times its layer's mean.
OUTLIER_RATIO = 5.0
#: Allocations read from the neurons' weights and activation norms.
WEIGHT_ALLOCATIONS = ("owl", "dlp")


def allocation_names() -> list[str]:
    """Every allocation a study takes: OWL's, DLP's, and each layer estimator's name."""
    return [*WEIGHT_ALLOCATIONS, *(n for n, e in ESTIMATORS.items() if "layer" in e.units)]


def check_allocation(name: str, unit: str | None = None) -> None:
    """
    Refuse an allocation that does not exist or cannot apply to ``unit`` (where named).

    Raises:
        InvalidParameterError: naming those that do.
    """
    if name not in allocation_names():
        raise InvalidParameterError(
            f"allocation is one of {', '.join(allocation_names())}; got {name!r}"
        )
    if unit is None:
        return
    if name in WEIGHT_ALLOCATIONS and unit != "neuron":
        raise InvalidParameterError(
            f"the {name} allocation reads the MLP's down projection: it allocates neurons"
        )
    if unit in CHANNEL_KINDS and unit != "neuron" and name not in WEIGHT_ALLOCATIONS:
        raise InvalidParameterError(
            f"a layer estimator scores transformer blocks; a {unit}'s layers are convolutions"
        )


def weight_allocation(name: str, statistics: ChannelStatistics) -> np.ndarray:
    """
    ``owl`` or ``dlp``: one score per layer from the down projections' ``|W|·‖x‖``.

    Raises:
        InvalidParameterError: another name.
    """
    if name not in WEIGHT_ALLOCATIONS:
        raise InvalidParameterError(f"{name!r} is not one of {', '.join(WEIGHT_ALLOCATIONS)}")
    scores = []
    for weights, norms in zip(statistics.weights, statistics.norms, strict=True):
        metric = (weights.abs() * norms[:, None]).numpy()
        if name == "owl":
            scores.append(float((metric > OUTLIER_RATIO * metric.mean()).mean()))
        else:
            scores.append(float(np.median(metric)))
    return np.array(scores)


def layer_scores(name: str, rankings: Mapping[str, np.ndarray]) -> np.ndarray:
    """
    A layer estimator's scores among the layer ``rankings`` of a study.

    Raises:
        InvalidParameterError: the estimator gave none (it does not apply to the model).
    """
    if name not in rankings:
        raise InvalidParameterError(
            f"the layer estimator {name!r} gave no scores for this model and input"
        )
    return np.asarray(rankings[name], dtype=float)
