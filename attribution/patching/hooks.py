"""
Scoped hooks of patching: noise on the embeddings, an edit of one activation, recordings.

Every hook is registered on an :class:`~contextlib.ExitStack` (or removed in a ``finally``) and
gone when its ``with`` block ends, normally or by an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attrlab.attribution.compat import register_attention
from attrlab.attribution.layers.analysis import ModelParts
from attrlab.attribution.methods._routing import eager_attention, route_attention, route_of
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.patching.base import COMPONENTS, site_masks

__all__ = [
    "Activations",
    "Edit",
    "Pattern",
    "edited",
    "noised",
    "recorded",
    "recorded_patterns",
    "removed_sites",
]


@contextmanager
def noised(adapter: Adapter, noise: torch.Tensor | None) -> Iterator[None]:
    """
    ``noise`` ``(rows, T, D)`` added to the token embeddings of the passes inside.

    A batch of ``k·rows`` rows gets draw ``r % rows`` in row ``r``.
    """
    if noise is None:
        yield
        return

    def add(_m: nn.Module, _a: tuple, out: torch.Tensor) -> torch.Tensor:
        draws = noise.to(out.dtype)
        index = torch.arange(out.shape[0], device=out.device) % draws.shape[0]
        return out + draws[index]

    handle = adapter.token_embedding_module().register_forward_hook(add)
    try:
        yield
    finally:
        handle.remove()


#: ``(B, T, F)`` activation -> the activation the model goes on with.
Edit = Callable[[torch.Tensor], torch.Tensor]


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def edited(parts: ModelParts, component: str, layer: int, edit: Edit) -> Iterator[None]:
    """
    ``edit`` applied to ``component``'s activation ``(B, T, F)`` of ``layer`` in the passes inside.

    The residual stream at the block's input, the attention and MLP outputs at their last
    linear layer's output, heads at the output projection's input (``F`` = heads × head size).
    """
    with ExitStack() as stack:
        if component == "residual":

            def block_input(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
                hidden = edit(_hidden(args, kwargs))
                if args:
                    return (hidden, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": hidden}

            block = parts.blocks[layer]
            stack.callback(block.register_forward_pre_hook(block_input, with_kwargs=True).remove)
        elif COMPONENTS[component].per_head:

            def heads_input(_m: nn.Module, args: tuple) -> tuple:
                return (edit(args[0]), *args[1:])

            projection = parts.projections[layer]
            stack.callback(projection.register_forward_pre_hook(heads_input).remove)
        else:

            def output(_m: nn.Module, _a: tuple, out: Any) -> Any:
                if isinstance(out, torch.Tensor):
                    return edit(out)
                return (edit(out[0]), *out[1:])

            module = parts.projections[layer] if component == "attention" else parts.mlps[layer]
            stack.callback(module.register_forward_hook(output).remove)
        yield


#: ``(component, layer)`` -> an activation ``(rows, T, F)``.
Activations = dict[tuple[str, int], torch.Tensor]

#: A site of one component: ``(layer, position, head)``, ``None`` for every position or head.
Located = tuple[int, int | None, int | None]


@contextmanager
def removed_sites(
    parts: ModelParts,
    component: str,
    rows: Sequence[Sequence[Located]],
    how: str,
    source: Activations | None = None,
) -> Iterator[None]:
    """
    Batch row ``r`` of the passes inside runs with the sites ``rows[r]`` of ``component`` removed.

    ``how``: ``zero``; ``mean``, the activation's mean over the positions of that row; or
    ``patch``, ``source[component, layer]`` row ``r`` written in (the other run's activation).
    Each layer with a site is edited by :func:`edited`, the sites' masks those of
    :func:`~attribution.patching.base.site_masks`.
    """
    layers = sorted({layer for row in rows for layer, _, _ in row})
    with ExitStack() as stack:
        for layer in layers:
            chosen = [[(p, h) for b, p, h in row if b == layer] for row in rows]

            def remove(x: torch.Tensor, layer: int = layer, chosen: list = chosen) -> torch.Tensor:
                _, length, features = x.shape
                where = torch.stack(
                    [
                        site_masks(sites, length, features, parts.heads, x.device).any(0)
                        for sites in chosen
                    ]
                )
                if how == "zero":
                    return x.masked_fill(where, 0)
                if how == "mean":
                    return torch.where(where, x.mean(1, keepdim=True), x)
                assert source is not None  # a patch
                return torch.where(where, source[component, layer].to(x.dtype), x)

            stack.enter_context(edited(parts, component, layer, remove))
        yield


@contextmanager
def recorded(
    parts: ModelParts, components: Sequence[str], keep_graph: bool = False
) -> Iterator[Activations]:
    """
    Every activation of ``components`` in every layer, kept during the pass inside.

    ``keep_graph``: the activations stay in the autograd graph (a gradient pass reads their
    gradients); one that does not require a gradient is made a leaf that does.
    """
    seen: Activations = {}
    with ExitStack() as stack:
        for component in dict.fromkeys(components):
            for layer in range(len(parts.blocks)):

                def keep(
                    x: torch.Tensor, key: tuple[str, int] = (component, layer)
                ) -> torch.Tensor:
                    if not keep_graph:
                        seen[key] = x.detach()
                        return x
                    if not x.requires_grad:
                        x = x.detach().requires_grad_(True)
                    seen[key] = x
                    return x

                stack.enter_context(edited(parts, component, layer, keep))
        yield seen


#: Name under which the pattern-recording attention is registered with transformers.
_RECORDING = "attrlab_patching_record"

#: Per layer: the attention pattern ``(rows, H, T, T)`` and values per query head ``(rows, H,
#: T, d)`` of a pass.
Pattern = dict[int, tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class _Route:
    eager: Callable[..., Any]
    layer: int
    into: Pattern


def _recording_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs
) -> Any:
    """The family's eager attention, keeping its pattern and values (repeated per query head)."""
    route: _Route = route_of(module, _RECORDING)
    output, weights = route.eager(module, query, key, value, *args, **kwargs)
    groups = weights.shape[1] // value.shape[1]  # grouped-query attention: one v per group
    route.into[route.layer] = (weights.detach(), value.detach().repeat_interleave(groups, dim=1))
    return output, weights


register_attention(_RECORDING, _recording_attention)


@contextmanager
def recorded_patterns(adapter: Adapter) -> Iterator[Pattern]:
    """Each layer's attention pattern and values during the passes inside."""
    seen: Pattern = {}
    with ExitStack() as stack:
        for layer, attention in enumerate(adapter.attention_modules()):
            route = _Route(eager_attention(attention), layer, seen)
            stack.enter_context(route_attention(attention, _RECORDING, route))
        yield seen
