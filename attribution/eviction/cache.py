"""
A decoder's key/value cache after one prefill, and the answer read with entries evicted.

The prompt's tokens but its last are *prefilled* once (:func:`prefill`): every layer's keys and
values are kept, per key/value head, and while the attention probabilities of each layer exist
(inside that layer's eager attention) they are reduced to what the eviction scorers read
(:class:`AttentionReadings`): the attention each entry received summed over the prefilled
queries, and the last ``window`` queries' rows. No ``prompt × prompt`` matrix outlives its layer.

An *eviction* is a keep mask per layer, key/value head and cached position. The answer is then
read in one forward (:func:`evicted_logits`) of the prompt's last token followed by the answer's
tokens but its last (teacher forcing), at their own positions, against the kept entries: every
answer token, the first included, is predicted from the evicted cache. Entries are evicted by
masking them for every later query (their attention logit set to the dtype's lowest value, as
transformers masks), which gives the logits of a cache that never held them (tested against a
cache with the entries dropped). Many evictions go in one batch: a row per keep mask, the
prefill's keys shared by every row (never copied per row, never recomputed).

Both forwards route each block's attention through the family's own eager attention function
(:func:`~attribution.methods._routing.route_attention`): families whose attention uses the
transformers attention interface, with plain causal attention (no sliding windows).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from attrlab.attribution.alteration import altered
from attrlab.attribution.compat import register_attention
from attrlab.attribution.errors import (
    InvalidInputError,
    InvalidParameterError,
    UnsupportedMethodError,
)
from attrlab.attribution.methods._routing import eager_attention, route_attention, route_of
from attrlab.attribution.models.base import Adapter, TextInputs
from attrlab.attribution.request.target import decoder_adapter

__all__ = [
    "AttentionReadings",
    "Prefill",
    "check_evictable",
    "evicted_logits",
    "keep_all",
    "prefill",
]

#: Names under which the two attention routes are registered with transformers.
_PREFILL = "attrlab_kv_prefill"
_EVICT = "attrlab_kv_evict"


@dataclass(frozen=True)
class AttentionReadings:
    """
    What one layer's prefill attention leaves behind for the scorers, per query head.

    Attributes:
        accumulated: ``(H, P)``: the attention each cached position received, summed over
            every prefilled query (H2O's accumulated attention).
        window: ``(H, w, P)``: the attention rows of the last ``w`` prefilled queries.
        outputs: ``(H, w, d)``: those queries' attention outputs (before the output
            projection).
    """

    accumulated: torch.Tensor
    window: torch.Tensor
    outputs: torch.Tensor


@dataclass(frozen=True)
class Prefill:
    """
    One prompt prefilled: its cache, its readings, and what the answer forward reads.

    Attributes:
        keys: Per layer ``(K, P, d)``: the cached keys (position-encoded, as the cache holds
            them) per key/value head ``K``, for the ``P`` prefilled positions.
        values: Per layer ``(K, P, d)``.
        readings: Per layer, the reduced attention (:class:`AttentionReadings`).
        queries: ``(A,)``: the tokens the answer forward reads: the prompt's last token, then
            the answer's tokens but its last.
        answer: ``(A,)``: the tokens predicted at those positions (the answer's, or the full
            cache's top next token when the input holds no answer).
        context: The evictable positions ``0 … context − 1`` (the context before the question).
        heads: Query heads per layer.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    readings: list[AttentionReadings]
    queries: torch.Tensor
    answer: torch.Tensor
    context: int
    heads: int

    @property
    def positions(self) -> int:
        """``P``: the prefilled (cached) positions."""
        return int(self.keys[0].shape[1])

    @property
    def layers(self) -> int:
        return len(self.keys)

    @property
    def kv_heads(self) -> int:
        return int(self.keys[0].shape[0])

    @property
    def groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.heads // self.kv_heads


def check_evictable(adapter: Adapter) -> None:
    """
    Refuse a model whose cache this module cannot evict from.

    Raises:
        InvalidInputError: not a decoder LM.
        UnsupportedMethodError: attention outside the transformers interface, or sliding
            windows (a windowed layer's mask is not plain causal).
    """
    decoder = decoder_adapter(adapter)
    config = decoder.model.config
    if getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None):
        raise UnsupportedMethodError(
            f"{adapter.model_id} has sliding-window attention; key/value eviction reads plain "
            "causal attention only"
        )
    for attention in decoder.attention_modules():
        eager_attention(attention)


@dataclass
class _PrefillRoute:
    eager: Any
    layer: int
    window: int
    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    readings: dict[int, AttentionReadings]


def _prefill_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs
) -> Any:
    """The family's eager attention; its keys, values and reduced probabilities are kept."""
    route: _PrefillRoute = route_of(module, _PREFILL)
    output, weights = route.eager(module, query, key, value, *args, **kwargs)
    probabilities = weights[0].detach().float()  # (H, P, P)
    groups = probabilities.shape[0] // value.shape[1]
    last = probabilities[:, -route.window :]
    values = value[0].detach().float().repeat_interleave(groups, dim=0)  # (H, P, d)
    route.keys[route.layer] = key[0].detach()
    route.values[route.layer] = value[0].detach()
    route.readings[route.layer] = AttentionReadings(
        accumulated=probabilities.sum(1), window=last.clone(), outputs=last @ values
    )
    return output, None  # the probabilities go no further than this layer


def _answer(decoder: Any, inputs: TextInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(queries, answer)`` of the answer forward (see :class:`Prefill`)."""
    ids = inputs.input_ids[0]
    held = inputs.answer_length
    if held:
        return ids[-held - 1 : -1], ids[-held:]
    with torch.no_grad():
        top = decoder.model(input_ids=inputs.input_ids).logits[0, -1].argmax()
    return ids[-1:], top[None]


def prefill(
    adapter: Adapter, inputs: TextInputs, context: int | None = None, window: int = 64
) -> Prefill:
    """
    Prefill ``inputs``' prompt (its tokens before the answer, but the last) once.

    ``context``: the evictable positions (``None``: every prefilled one); ``window``: the
    last prefilled queries whose attention rows are kept (the widest window a scorer reads).
    The input's answer (its ``answer_length`` last tokens) is what the evicted caches are
    judged on; without one, the full cache's top next token.

    Raises:
        InvalidInputError: a prompt of fewer than two tokens, a ``context`` beyond the
            prefilled positions, a ``window`` below 1.
        UnsupportedMethodError: as :func:`check_evictable`.
    """
    check_evictable(adapter)
    decoder = decoder_adapter(adapter)
    prompt = inputs.input_ids[:, : inputs.input_ids.shape[1] - inputs.answer_length]
    cached = int(prompt.shape[1]) - 1
    if cached < 1:
        raise InvalidInputError("eviction needs a prompt of at least two tokens")
    context = cached if context is None else context
    if not 1 <= context <= cached:
        raise InvalidInputError(
            f"the evictable context is 1 to {cached} prompt tokens (the prompt's last is read "
            f"with the answer); got {context}"
        )
    if window < 1:
        raise InvalidInputError(f"the attention window is at least one query; got {window}")
    keys: dict[int, torch.Tensor] = {}
    values: dict[int, torch.Tensor] = {}
    readings: dict[int, AttentionReadings] = {}
    attentions = decoder.attention_modules()
    with altered(decoder.model), ExitStack() as stack, torch.no_grad():
        for layer, attention in enumerate(attentions):
            route = _PrefillRoute(
                eager_attention(attention), layer, min(window, cached), keys, values, readings
            )
            stack.enter_context(route_attention(attention, _PREFILL, route))
        decoder.model(input_ids=prompt[:, :cached], use_cache=False)
    queries, answer = _answer(decoder, inputs)
    layers = range(len(attentions))
    return Prefill(
        keys=[keys[i] for i in layers],
        values=[values[i] for i in layers],
        readings=[readings[i] for i in layers],
        queries=queries,
        answer=answer,
        context=context,
        heads=int(readings[0].accumulated.shape[0]),
    )


@dataclass
class _EvictRoute:
    eager: Any
    keys: torch.Tensor  # (K, P, d)
    values: torch.Tensor
    kept: torch.Tensor  # (B, K, P) bool
    bias: torch.Tensor | None  # (B, K, P): added to the kept entries' attention logits


def _evicted_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *args,
    **kwargs,
) -> Any:
    """
    The family's eager attention over the prefill's kept entries, then the new tokens.

    The mask transformers built (causal over the new tokens alone) is replaced by one over
    the cache and the new tokens: an evicted entry masked as transformers masks a position.
    """
    route: _EvictRoute = route_of(module, _EVICT)
    rows, new = int(query.shape[0]), int(query.shape[2])
    groups = query.shape[1] // route.kept.shape[1]
    dtype = query.dtype
    lowest = torch.finfo(dtype).min
    keys = torch.cat([route.keys[None].to(key.dtype).expand(rows, -1, -1, -1), key], dim=2)
    values = torch.cat([route.values[None].to(value.dtype).expand(rows, -1, -1, -1), value], dim=2)
    past = torch.zeros(route.kept.shape, dtype=dtype, device=query.device)
    past = past.masked_fill(~route.kept, lowest)
    if route.bias is not None:
        past = past + route.bias.to(dtype)
    past = past.repeat_interleave(groups, dim=1)[:, :, None, :].expand(-1, -1, new, -1)
    causal = torch.full((new, new), lowest, dtype=dtype, device=query.device).triu(1)
    mask = torch.cat([past, causal.expand(rows, past.shape[1], -1, -1)], dim=-1)
    del attention_mask  # causal over the new tokens alone: rebuilt above with the cache
    return route.eager(module, query, keys, values, mask, *args, **kwargs)


@contextmanager
def _evicting(decoder: Any, cache: Prefill, kept: torch.Tensor, bias: Any) -> Iterator[None]:
    with altered(decoder.model), ExitStack() as stack:
        for layer, attention in enumerate(decoder.attention_modules()):
            route = _EvictRoute(
                eager_attention(attention),
                cache.keys[layer],
                cache.values[layer],
                kept[:, layer],
                None if bias is None else bias[:, layer],
            )
            stack.enter_context(route_attention(attention, _EVICT, route))
        yield


def evicted_logits(
    adapter: Adapter,
    cache: Prefill,
    kept: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    The answer forward's logits ``(B, A, V)`` with row ``b`` reading only ``kept[b]``.

    ``kept``: bool ``(B, layers, K, P)``, True for the entries row ``b`` keeps. ``bias``:
    ``(B, layers, K, P)`` added to the cached entries' attention logits (zeros: the same
    logits; its gradient is each entry's first-order effect). Gradients flow when ``bias``
    requires them; otherwise none are kept.
    """
    decoder = decoder_adapter(adapter)
    expected = (cache.layers, cache.kv_heads, cache.positions)
    if kept.dim() != 4 or tuple(kept.shape[1:]) != expected:
        raise InvalidParameterError(
            f"a keep mask is (rows, {', '.join(map(str, expected))}); got {tuple(kept.shape)}"
        )
    rows = int(kept.shape[0])
    start = cache.positions
    ids = cache.queries[None].expand(rows, -1)
    positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None].expand(rows, -1)
    grad = bias is not None and bias.requires_grad
    with _evicting(decoder, cache, kept, bias), torch.set_grad_enabled(grad):
        return decoder.model(input_ids=ids, position_ids=positions, use_cache=False).logits


def keep_all(cache: Prefill, rows: int) -> torch.Tensor:
    """``(rows, layers, K, P)`` keep masks that keep everything."""
    shape = (rows, cache.layers, cache.kv_heads, cache.positions)
    return torch.ones(shape, dtype=torch.bool, device=cache.keys[0].device)


register_attention(_PREFILL, _prefill_attention)
register_attention(_EVICT, _evicted_attention)
