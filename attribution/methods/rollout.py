"""Attention rollout (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.methods._attention import (
    HEAD_FUSION,
    attention_graph,
    to_scores,
    with_residual,
)
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter, Inputs, patch_grid
from attrlab.attribution.request.params import MethodParams, param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["AttentionRollout", "RolloutParams", "attention_rollout", "discard_lowest"]


def _below_one(value: float) -> str | None:
    return "must be below 1" if value >= 1 else None


def discard_lowest(fused: torch.Tensor, ratio: float) -> torch.Tensor:
    """
    Zero the lowest ``ratio`` share of the entries of one fused ``(n, n)`` attention matrix.

    As in the vit-explain reference: the ``int(ratio·n²)`` smallest entries are picked among
    all entries, and entry ``[0, 0]`` (the first token attending to itself: CLS in encoders
    and ViT, the first token in decoders) is kept even when it is among them.
    """
    flat = fused.flatten().clone()
    count = int(flat.numel() * ratio)
    if count == 0:
        return fused
    lowest = flat.topk(count, largest=False).indices
    flat[lowest[lowest != 0]] = 0.0
    return flat.view_as(fused)


def attention_rollout(
    fused: torch.Tensor, discard_ratio: float = 0.0, start_layer: int = 0
) -> torch.Tensor:
    """
    Rolled-out attention ``R = Ã_L ⋯ Ã_{s+1}`` from head-fused attentions ``(L, n, n)``.

    Each layer's matrix (after the optional discard) becomes ``Ã = 0.5·A + 0.5·I`` with rows
    renormalised, so every row of ``R`` sums to 1. ``R[i, j]`` is how much of token ``i``'s
    final representation is traced back to input token ``j``. Layers below ``start_layer``
    (0-based) are left out.
    """
    n = fused.shape[-1]
    result = torch.eye(n, dtype=fused.dtype, device=fused.device)
    for layer in range(start_layer, fused.shape[0]):
        attention = fused[layer]
        if discard_ratio > 0:
            attention = discard_lowest(attention, discard_ratio)
        result = with_residual(attention) @ result
    return result


@dataclass(frozen=True, kw_only=True)
class RolloutParams(MethodParams):
    """The parameters of :class:`AttentionRollout`."""

    head_fusion: str = HEAD_FUSION.as_field()
    discard_ratio: float = param(
        0.0,
        "Share of the lowest fused attention entries set to 0 in each layer (CLS kept).",
        0.0,
        1.0,
        check=_below_one,
    )
    start_layer: int = param(0, "First layer (0-based) included in the product.", 0, 1000)


@register
class AttentionRollout(AttributionMethod[RolloutParams]):
    """
    Attention rollout: multiply the residual-augmented attention matrices of all layers.

    The explained row is where the output reads the last layer: CLS for text classifiers and
    ViT, the last position for decoders (for an answer, the mean of the rows of the positions
    predicting its tokens; a per-step row, its step's position), and for the mean-pooled
    zero-shot MiniLM the mean of the rows of all attended tokens (special tokens included, as
    in its pooling). Scores of one input sum to 1 (text); ViT maps show the patch tokens on the
    patch grid, upsampled to the image, and ``metrics.non_patch_share`` is the share left on
    CLS (and distillation) tokens. Rollout ignores which class or token is the target: it
    explains the representation read where the target is read, not a logit.
    """

    alters_model = False  # plain forward and gradient passes

    name = "rollout"
    title = "Attention rollout"
    paper = "https://arxiv.org/abs/2005.00928"
    requires = frozenset({"attentions"})
    reads_prediction_attentions = True
    param_record = RolloutParams
    modalities = frozenset({"text", "image", "image-text"})

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: RolloutParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        return Passes(0)  # the attentions come from explain's own prediction

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: RolloutParams,
        run: RunContext,
    ) -> Attribution:
        graph = attention_graph(adapter, inputs, run, params.head_fusion, target)
        if params.start_layer >= graph.num_layers:
            raise InvalidParameterError(
                f"parameter 'start_layer' must be below the model's {graph.num_layers} layers; "
                f"got {params.start_layer}"
            )
        rolled = attention_rollout(graph.fused, params.discard_ratio, params.start_layer)
        row = graph.readout @ rolled
        metrics = {}
        if inputs.modality == "image":  # how much ends on CLS / registers rather than patches
            rows, cols = patch_grid(adapter)
            metrics["non_patch_share"] = float(row[: row.shape[0] - rows * cols].sum())
        return Attribution(scores=to_scores(adapter, inputs, graph, row), metrics=metrics)
