"""
Estimators of channel importance (MLP neurons, convolution channels) from weights and data.

Each reads :class:`~attribution.engine.channels.ChannelStatistics` of the dataset the curves are
measured on (:attr:`~attribution.engine.estimators.Evidence.statistics`) and gives one score per
channel, layer by layer in the kind's site order:

- ``magnitude``: the L2 norm of the channel's weights (a neuron: its column of the down
  projection; a channel: its filter). Han et al. 2015; Li et al. 2017 for filters.
- ``lamp``: LAMP's layer-adaptive rescaling of the squared norm, ``s_u / Σ_{v ≥ u} s_v`` over the
  layer's channels sorted by ``s`` (Lee et al. 2021), comparable across layers.
- ``wanda``: ``Σ_i |W_ij| · ‖X_j‖₂``, Wanda's ``|W|·‖x‖`` summed over the neuron's column; and
  ``wanda_row``: each weight's share of its output row's total, summed over the column (Wanda
  compares weights within an output row). Sun et al. 2024. Neurons only: a channel's input
  norms are the previous layer's.
- ``activation``: ``mean |a|`` over every position of every input.
- ``taylor``, ``taylor_loss``, ``taylor_entropy``: ``mean over inputs |Σ_positions a · ∂f/∂a|``,
  the first-order change when the channel is zeroed, of the target's log-probability, the
  next-token loss (decoder LMs) and the output's entropy (label-free). Molchanov et al. 2017 /
  2019; the entropy criterion of label-free Taylor pruning (arXiv:2603.08083).
- ``mini_llm``: ``Σ_i |W_ij| · |∂L/∂W_ij| · ‖X_j‖₂``, MINI-LLM's feature-map sensitivity
  (Cheng et al. 2024) with the loss's gradient by backpropagation (the paper estimates it
  from forward passes); the target's log-probability where there is no next-token loss.
- ``neuron_lrp``: ``mean over inputs |Σ_positions R|``, AttnLRP relevance of the target at the
  neuron (Achtibat et al. 2024).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attrlab.attribution.engine.channels import (
    CHANNEL_KINDS,
    ChannelStatistics,
)
from attrlab.attribution.engine.estimators import (
    Estimator,
    per_layer_reading,
    register_estimator,
)

__all__ = ["lamp_scores"]


def lamp_scores(squares: torch.Tensor) -> torch.Tensor:
    """
    LAMP of one layer's scores ``s`` (squared norms): ``s_u / Σ_{v: rank(v) ≥ rank(u)} s_v``.

    Sorted ascending; ties keep the channels' order. The largest channel of a layer scores 1.
    """
    order = torch.argsort(squares, stable=True)
    ranked = squares[order]
    tails = torch.flip(torch.cumsum(torch.flip(ranked, [0]), 0), [0])
    found = torch.empty_like(squares)
    found[order] = ranked / tails.clamp_min(torch.finfo(squares.dtype).tiny)
    return found


def _magnitude(s: ChannelStatistics) -> list[torch.Tensor]:
    return [w.norm(dim=1) for w in s.weights]


def _lamp(s: ChannelStatistics) -> list[torch.Tensor]:
    return [lamp_scores((w**2).sum(1)) for w in s.weights]


def _wanda(s: ChannelStatistics) -> list[torch.Tensor]:
    return [w.abs().sum(1) * n for w, n in zip(s.weights, s.norms, strict=True)]


def _wanda_row(s: ChannelStatistics) -> list[torch.Tensor]:
    """Each weight's share of its output row's Wanda total, summed over the neuron's column."""
    found = []
    for w, n in zip(s.weights, s.norms, strict=True):
        metric = w.abs() * n[:, None]  # (neurons, outputs)
        found.append((metric / metric.sum(0, keepdim=True).clamp_min(1e-300)).sum(1))
    return found


def _first_order(objective: str) -> Callable[[ChannelStatistics], list[torch.Tensor] | None]:
    def read(s: ChannelStatistics) -> list[torch.Tensor] | None:
        return s.first_order.get(objective)

    return read


def _mini_llm(s: ChannelStatistics) -> list[torch.Tensor] | None:
    gradients = s.weight_gradients.get("loss", s.weight_gradients.get("target"))
    if gradients is None:
        return None
    return [(w.abs() * g).sum(1) * n for w, g, n in zip(s.weights, gradients, s.norms, strict=True)]


_NEURONS = ("neuron",)
_PASSES = "one forward over the dataset (shared by the channel estimators)"
_FIRST_ORDER = "+ one backward per input"

for _estimator in (
    Estimator(
        "magnitude",
        CHANNEL_KINDS,
        "L2 norm of the channel's weights (a neuron's down-projection column, a filter)",
        "Han et al. 2015, Learning both Weights and Connections (arXiv:1506.02626); Li et al. "
        "2017, Pruning Filters for Efficient ConvNets (arXiv:1608.08710)",
        per_layer_reading(_magnitude),
        reads="statistics",
        title="Weight magnitude",
        passes="none (weights only)",
    ),
    Estimator(
        "lamp",
        CHANNEL_KINDS,
        "squared weight norm over the sum of the layer's norms not smaller: comparable "
        "across layers",
        "Lee et al. 2021, Layer-adaptive Sparsity for the Magnitude-based Pruning "
        "(arXiv:2010.07611)",
        per_layer_reading(_lamp),
        reads="statistics",
        title="LAMP",
        passes="none (weights only)",
    ),
    Estimator(
        "wanda",
        _NEURONS,
        "Σ over the down projection's outputs of |W| · ‖x‖₂ of the neuron over the texts",
        "Sun et al. 2024, A Simple and Effective Pruning Approach for LLMs (arXiv:2306.11695)",
        per_layer_reading(_wanda),
        reads="statistics",
        title="Wanda",
        passes=_PASSES,
    ),
    Estimator(
        "wanda_row",
        _NEURONS,
        "each weight's |W| · ‖x‖₂ as a share of its output row's (Wanda's comparison group), "
        "summed over the neuron's column",
        "Sun et al. 2024, A Simple and Effective Pruning Approach for LLMs (arXiv:2306.11695)",
        per_layer_reading(_wanda_row),
        reads="statistics",
        title="Wanda (per output row)",
        passes=_PASSES,
    ),
    Estimator(
        "activation",
        CHANNEL_KINDS,
        "mean |activation| over every position of the texts",
        "Hu et al. 2016, Network Trimming (arXiv:1607.03250)",
        per_layer_reading(lambda s: s.mean_abs),
        reads="statistics",
        title="Mean |activation|",
        passes=_PASSES,
    ),
    Estimator(
        "taylor",
        CHANNEL_KINDS,
        "|Σ a · ∂ log p(target)/∂a| per text, averaged: the first-order effect of zeroing it",
        "Molchanov et al. 2017, Pruning CNNs for Resource Efficient Inference "
        "(arXiv:1611.06440); Nanda 2023, attribution patching",
        per_layer_reading(_first_order("target")),
        reads="statistics",
        title="Taylor (target)",
        passes=f"{_PASSES} {_FIRST_ORDER}",
        needs=("target",),
    ),
    Estimator(
        "taylor_loss",
        _NEURONS,
        "|Σ a · ∂ loss/∂a| per text, averaged, of the mean next-token loss (decoder LMs)",
        "Molchanov et al. 2019, Importance Estimation for Neural Network Pruning "
        "(arXiv:1906.10771); Ma et al. 2023, LLM-Pruner (arXiv:2305.11627)",
        per_layer_reading(_first_order("loss")),
        reads="statistics",
        title="Taylor (loss)",
        passes=f"{_PASSES} {_FIRST_ORDER}",
        decoders_only=True,
        needs=("loss",),
    ),
    Estimator(
        "taylor_entropy",
        CHANNEL_KINDS,
        "|Σ a · ∂H/∂a| per text, averaged, of the output distribution's entropy: no label",
        "label-free Taylor pruning on the output's entropy (High-Fidelity Pruning for LLMs, "
        "arXiv:2603.08083)",
        per_layer_reading(_first_order("entropy")),
        reads="statistics",
        title="Taylor (entropy)",
        passes=f"{_PASSES} {_FIRST_ORDER}",
        needs=("entropy",),
    ),
    Estimator(
        "mini_llm",
        _NEURONS,
        "Σ over the column of |W| · |∂L/∂W| · ‖x‖₂ (the loss's gradient by backpropagation; "
        "the target's off decoder LMs)",
        "Cheng et al. 2024, MINI-LLM: Memory-Efficient Structured Pruning (arXiv:2407.11681)",
        per_layer_reading(_mini_llm),
        reads="statistics",
        title="MINI-LLM",
        passes=f"{_PASSES} {_FIRST_ORDER}",
        needs=("loss", "target", "weight_gradients"),
    ),
    Estimator(
        "neuron_lrp",
        _NEURONS,
        "|Σ relevance| at the neuron per text, averaged (AttnLRP rules, the target's score)",
        "Achtibat et al. 2024, AttnLRP (https://arxiv.org/abs/2402.05602)",
        per_layer_reading(lambda s: s.relevance),
        reads="statistics",
        title="LRP relevance",
        passes="one forward + one backward per text under LRP rules",
        needs=("relevance",),
    ),
):
    register_estimator(_estimator)
