"""
Gradient checkpointing for long inputs: keep each block's inputs, recompute its inside.

A gradient pass normally keeps every activation of the forward for the backward; at thousands
of tokens the attention probabilities alone (heads × T² per layer) outgrow memory.
Checkpointed, each transformer block keeps only its inputs and is run again during the
backward, one block at a time: peak memory falls to about one block's activations for about
one more forward pass (measured in ``benchmarks/memory.py``).

The recomputation is torch's non-reentrant checkpoint, so the autograd graph keeps its shape:
gradients to tensors recorded inside a block (LRP's per-layer relevance) still arrive, and the
rules' hooks and patched attention are in force during the recomputation as in the forward
(the backward runs inside the method's patches). transformers' own switch
(``gradient_checkpointing_enable``) acts only in training mode, which would also turn dropout
on; this wraps the blocks of the evaluating model instead.

:attr:`AttributionMethod.checkpointable` methods (gradient, gradient × input, integrated
gradients, the LRP methods) have records deriving from :class:`CheckpointingParams`;
:func:`attribution.explain` runs them inside :func:`checkpointing_for`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from attrlab.attribution.alteration import altered
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.params import MethodParams, param

__all__ = ["CheckpointingParams", "checkpointed", "checkpointing_for", "checkpointing_reason"]


@dataclass(frozen=True, kw_only=True)
class CheckpointingParams(MethodParams):
    """The ``checkpointing`` parameter, which every checkpointable method's record has."""

    checkpointing: bool = param(
        False,
        "Gradient checkpointing: recompute each transformer block during the backward instead "
        "of keeping its activations (long texts: far less memory for about one more forward).",
    )


def checkpointing_reason(adapter: Adapter) -> str | None:
    """``None`` if ``adapter``'s blocks can be checkpointed, else why not."""
    if adapter.layout is None:
        return (
            f"checkpointing recomputes transformer blocks, and model '{adapter.model_id}' "
            "has none attrlab knows"
        )
    return None


def checkpointing_for(adapter: Adapter, params: MethodParams) -> AbstractContextManager[None]:
    """:func:`checkpointed` where ``params`` ask for it, else nothing."""
    asked = isinstance(params, CheckpointingParams) and params.checkpointing
    return checkpointed(adapter) if asked else nullcontext()


def _checkpointed_forward(forward: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # nothing is kept for a backward: nothing to save
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


@contextmanager
def checkpointed(adapter: Adapter) -> Iterator[None]:
    """
    Gradient passes inside the block recompute each transformer block during the backward.

    The model keeps no key/value cache meanwhile (a recomputed block would add to it again).
    Each block's ``forward`` (accelerate's dispatching wrapper included, which then loads an
    offloaded block's weights again for its recomputation) is wrapped on the instance and put
    back on leaving, also after an error; the model is held
    :func:`~attribution.alteration.altered` meanwhile.

    Raises:
        InvalidParameterError: the model has no transformer blocks attrlab knows.
    """
    reason = checkpointing_reason(adapter)
    if reason is not None:
        raise InvalidParameterError(reason)
    with ExitStack() as stack:
        stack.enter_context(altered(adapter.model))
        config = adapter.config
        if getattr(config, "use_cache", False):  # a recomputed block would append to a KV cache
            stack.callback(setattr, config, "use_cache", True)
            config.use_cache = False  # type: ignore[union-attr]
        for block in adapter.blocks():
            stack.callback(_restore_forward, block, block.__dict__.get("forward"))
            block.forward = _checkpointed_forward(block.forward)
        yield


def _restore_forward(block: nn.Module, own: Any) -> None:
    """Put back ``block``'s own instance ``forward`` (accelerate's), or its class's."""
    if own is None:
        del block.forward
    else:
        block.forward = own
