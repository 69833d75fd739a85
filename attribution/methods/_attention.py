"""
Shared pieces of attention rollout and attention flow (Abnar & Zuidema 2020).

Paper: https://arxiv.org/abs/2005.00928. Both methods model a transformer as a layered graph
whose layer-``l`` edges are the head-fused attention of block ``l`` plus the residual
connection, ``Ã_l = 0.5·A_l + 0.5·I`` with rows renormalised to sum to 1. Where the model reads
its output (CLS, the last position or a mean over tokens) comes from ``Adapter.readout``; a
decoder's answer is read at the positions predicting its tokens
(:meth:`~attribution.request.target.Target.read_offsets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.models.base import Adapter, Inputs, patch_grid
from attrlab.attribution.request.params import Spec
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = [
    "HEAD_FUSION",
    "AttentionGraph",
    "attention_graph",
    "fuse_heads",
    "to_scores",
    "with_residual",
]

#: The ``head_fusion`` parameter, a field of the attention methods' records.
HEAD_FUSION: Spec[str] = Spec(
    "mean",
    "How the heads of a layer are combined into one attention matrix: mean, max or min.",
    choices=("mean", "max", "min"),
)


@dataclass(frozen=True)
class AttentionGraph:
    """
    Head-fused attention of one input, restricted to the tokens the model attends to.

    Attributes:
        fused: ``(L, n, n)`` float64 head-fused attention probabilities per layer.
        keep: ``(T,)`` bool, which input positions the ``n`` graph tokens are (padding out).
        readout: ``(n,)`` float64 weights with which the output reads the last layer's
            tokens (one-hot for CLS / last position, uniform for mean pooling or over an
            answer's predicting positions); sums to 1.
    """

    fused: torch.Tensor
    keep: torch.Tensor
    readout: torch.Tensor

    @property
    def num_layers(self) -> int:
        """Number of attention layers ``L``."""
        return int(self.fused.shape[0])

    @property
    def num_tokens(self) -> int:
        """Number of graph tokens ``n`` (attended positions)."""
        return int(self.fused.shape[-1])


def attention_graph(
    adapter: Adapter, inputs: Inputs, run: RunContext, head_fusion: str, target: Target
) -> AttentionGraph:
    """
    Every layer's attention for example 0, heads fused, from the input's own forward pass.

    Heads are fused per layer in float64 (see :func:`fuse_heads`). Text keeps the positions
    with ``attention_mask == 1``; images keep every token. The readout follows
    ``adapter.readout`` (:func:`readout_weights`): mean-pooled sentence encoders, such as the
    zero-shot MiniLM, read the mean of the attended tokens' final states, so the explained row
    is the mean of their rows; a decoder reads ``target`` at the positions of
    :meth:`~attribution.request.target.Target.read_offsets` (an answer's: the mean of their rows).

    Raises:
        UnsupportedMethodError: the adapter declares no readout position.
    """
    if adapter.readout not in READOUTS:
        raise UnsupportedMethodError(
            f"model '{adapter.model_id}' ({adapter.family}) does not say which token its output "
            "reads, so its attention graph has no output node"
        )
    layers = run.clean_attentions(adapter, inputs)  # explain's prediction made them
    fused = torch.stack([fuse_heads(layer[0].double(), head_fusion) for layer in layers])
    keep = inputs.visible_tokens(fused.shape[-1]).to(fused.device)
    if not keep.all():
        fused = fused[:, keep][:, :, keep]
    readout = readout_weights(adapter, fused.shape[-1], target.read_offsets())
    return AttentionGraph(fused, keep, readout.to(fused.device))


#: How each readout weighs the last layer's tokens (see :func:`readout_weights`).
READOUTS = ("first", "last", "mean", "first_two", "first_and_patches")


def readout_weights(adapter: Adapter, n: int, offsets: Sequence[int] = (0,)) -> torch.Tensor:
    """
    ``(n,)`` float64 weights with which the output reads the last layer's ``n`` tokens.

    ``first``: CLS; ``last``: the positions a decoder predicts from, counted back from the
    last by ``offsets`` (its next token: the last; an answer's tokens: the positions before
    each, equally); ``mean``: every token equally; ``first_two``: CLS and distillation token,
    half each (distilled DeiT averages the two heads); ``first_and_patches``: half on CLS, half
    spread over the patch tokens (DINOv2's head reads CLS concatenated with the mean patch;
    register tokens get nothing).

    Raises:
        UnsupportedMethodError: ``offsets`` other than the last position on a model that does
            not read it.
    """
    weights = torch.zeros(n, dtype=torch.float64)
    kind = adapter.readout
    read = sorted(set(offsets))
    if kind != "last" and read != [0]:
        raise UnsupportedMethodError(
            f"model '{adapter.model_id}' reads its output at one place ({kind}), not at the "
            "positions of an answer"
        )
    if kind == "first":
        weights[0] = 1.0
    elif kind == "last":
        weights[[n - 1 - offset for offset in read]] = 1.0 / len(read)
    elif kind == "mean":
        weights.fill_(1.0 / n)
    elif kind == "first_two":
        weights[:2] = 0.5
    else:
        rows, cols = patch_grid(adapter)
        weights[0] = 0.5
        weights[n - rows * cols :] += 0.5 / (rows * cols)
    return weights


def fuse_heads(attentions: torch.Tensor, how: str) -> torch.Tensor:
    """Combine heads ``(..., H, n, n) -> (..., n, n)`` by their mean, maximum or minimum."""
    if how == "mean":
        return attentions.mean(dim=-3)
    if how == "max":
        return attentions.amax(dim=-3)
    if how == "min":
        return attentions.amin(dim=-3)
    raise ValueError(f"unknown head fusion '{how}'")


def with_residual(fused: torch.Tensor) -> torch.Tensor:
    """``Ã = 0.5·A + 0.5·I`` with each row renormalised to sum to 1 (works on ``(..., n, n)``)."""
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    mixed = 0.5 * fused + 0.5 * eye
    return mixed / mixed.sum(dim=-1, keepdim=True)


def to_scores(
    adapter: Adapter, inputs: Inputs, graph: AttentionGraph, values: torch.Tensor
) -> np.ndarray:
    """
    Per-token values of the graph tokens as the method's ``scores``.

    Text: one value per input position (0 at padding). Images: the patch tokens (the last
    ``gh·gw`` tokens; CLS and any distillation token are dropped) reshaped to the patch grid and
    upsampled bilinearly to the model input size.

    Returns:
        ``np.ndarray`` of shape ``(T,)`` or ``(H, W)``, float64.
    """
    full = torch.zeros(graph.keep.shape[0], dtype=torch.float64, device=values.device)
    full[graph.keep] = values.detach().double()
    return inputs.token_map(adapter, full)
