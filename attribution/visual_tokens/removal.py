"""
Visual tokens dropped from a vision-language model's language model, at the input or at layer K.

A *visual-token site* is one visual position of an
:class:`~attribution.models.vlm.ImageTextInputs` (:data:`VISUAL_TOKEN`). Dropping a set of them
from block ``K`` on (``K = 0``: at the input, from the first block on) masks their keys for every
other query in those blocks, as transformers masks a position (the attention logit set to the
dtype's lowest value): no later position reads them, and every position keeps its position id,
as FastV keeps them (Chen et al. 2024, arXiv:2403.06764). That equals removing the tokens from
the sequence with the same position ids, and dropping them all equals the family's text-only
run (tested on every tiny family, Qwen2-VL's multimodal rotary positions included); a dropped
token still reads itself, so its own row stays defined, and nothing reads it. Each batch row
drops its own set, so many removals run in one forward.

The route (:func:`visual_attention`) sends each language-model block's attention through the
family's own eager attention (:func:`~attribution.methods._routing.route_attention`), edits the
mask the model built (a sliding window, Gemma 3's bidirectional image block and PaliGemma's prefix
stay as they are: a window narrower than the sequence stays where the full sequence puts it,
where removing the tokens would slide it further back), and can add a bias to the attention
logits (its gradient is AtP's) and keep a layer's attention probabilities for the scorers that
read them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from attrlab.attribution.alteration import altered
from attrlab.attribution.compat import register_attention
from attrlab.attribution.engine.units import Removal, Site, UnitKind
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.methods._routing import eager_attention, route_attention, route_of
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.visual_tokens.answer import visual_adapter, visual_inputs

__all__ = [
    "VISUAL_TOKEN",
    "AttentionReading",
    "dropped_at",
    "dropped_rows",
    "reading_attention",
    "visual_attention",
]

_ROUTE = "attrlab_visual_tokens"


@dataclass
class AttentionReading:
    """
    What one pass through :func:`visual_attention` kept.

    Attributes:
        probabilities: Per block read, ``(B, H, T, T)`` attention probabilities (detached).
    """

    probabilities: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Route:
    eager: Any
    layer: int
    dropped: torch.Tensor | None  # (B, T) bool: the keys no other query of this block reads
    bias: torch.Tensor | None  # (1, H, T, T): added to the attention logits
    reading: AttentionReading | None


def _routed_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """The family's eager attention with the route's keys masked and its bias added."""
    route: _Route = route_of(module, _ROUTE)
    rows, length, keys = int(query.shape[0]), int(query.shape[2]), int(key.shape[2])
    lowest = torch.finfo(query.dtype).min
    mask = attention_mask
    if route.dropped is not None or route.bias is not None:
        edited = _base_mask(module, query, keys) if mask is None else mask
        if route.dropped is not None:
            others = ~torch.eye(length, keys, dtype=torch.bool, device=query.device)
            dropped = route.dropped[:, :keys].to(query.device)  # a removal's mask may run longer
            hidden = dropped[:, None, None, :] & others
            edited = edited.expand(rows, -1, -1, -1).masked_fill(hidden, lowest)
        if route.bias is not None:
            edited = edited + route.bias.to(query.dtype)
        mask = edited
    output, weights = route.eager(module, query, key, value, mask, *args, **kwargs)
    if route.reading is not None:
        route.reading.probabilities[route.layer] = weights.detach()
    return output, weights


def _base_mask(module: Any, query: torch.Tensor, keys: int) -> torch.Tensor:
    """The mask a module given none applies: every key read, or causal where it says so."""
    length = int(query.shape[2])
    mask = torch.zeros((length, keys), dtype=query.dtype, device=query.device)
    if getattr(module, "is_causal", False):  # the kernel was left to apply causality
        above = torch.ones((length, keys), dtype=torch.bool, device=query.device).triu(1)
        mask = mask.masked_fill(above, torch.finfo(query.dtype).min)
    return mask[None, None]


@contextmanager
def visual_attention(
    adapter: Adapter,
    dropped: torch.Tensor | None = None,
    layer: int = 0,
    biases: Sequence[torch.Tensor | None] | None = None,
    read: Collection[int] = (),
) -> Iterator[AttentionReading]:
    """
    Route every language-model block's attention: drop, bias and read.

    ``dropped``: ``(B, T)`` bool (or longer than the sequence), the positions row ``b`` drops
    from block ``layer`` on (their keys masked for every other query). ``biases``: per block,
    ``(1, H, T, T)`` added to its attention logits (``None``: none). ``read``: the blocks whose
    attention probabilities are kept in the reading yielded.

    Raises:
        InvalidParameterError: a ``layer`` or block read the language model does not have.
        UnsupportedMethodError: attention outside the transformers interface.
    """
    attentions = visual_adapter(adapter).attention_modules()
    count = len(attentions)
    if not 0 <= layer < count or any(not 0 <= b < count for b in read):
        raise InvalidParameterError(
            f"the language model has blocks 0 to {count - 1}; got layer {layer}, "
            f"read {sorted(read)}"
        )
    reading = AttentionReading()
    with altered(adapter.model), ExitStack() as stack:
        for block, attention in enumerate(attentions):
            route = _Route(
                eager_attention(attention),
                block,
                dropped if block >= layer else None,
                None if biases is None else biases[block],
                reading if block in read else None,
            )
            stack.enter_context(route_attention(attention, _ROUTE, route))
        yield reading


@contextmanager
def reading_attention(attentions: Sequence[Any]) -> Iterator[AttentionReading]:
    """Keep the attention probabilities of ``attentions`` (any modules the routing reaches)."""
    reading = AttentionReading()
    with ExitStack() as stack:
        for index, attention in enumerate(attentions):
            route = _Route(eager_attention(attention), index, None, None, reading)
            stack.enter_context(route_attention(attention, _ROUTE, route))
        yield reading


def dropped_rows(inputs: ImageTextInputs, rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """
    ``(B, T)`` bool: row ``b`` drops the visual tokens ``rows[b]`` (indices among the visual ones).

    Raises:
        InvalidParameterError: an index that is not a visual token's.
    """
    positions = inputs.visual_positions.cpu()
    found = torch.zeros(len(rows), int(inputs.input_ids.shape[1]), dtype=torch.bool)
    for r, chosen in enumerate(rows):
        if any(not 0 <= i < len(positions) for i in chosen):
            raise InvalidParameterError(
                f"visual tokens are 0 to {len(positions) - 1}; got {chosen}"
            )
        found[r, positions[list(chosen)]] = True
    return found.to(inputs.input_ids.device)


def _sites(adapter: Adapter, inputs: Inputs | None) -> list[Site]:
    visual_adapter(adapter)
    positions = visual_inputs(inputs).visual_positions.tolist()
    return [Site("visual_token", position=int(p)) for p in positions]


def dropped_at(layer: int) -> Removal:
    """The removal dropping each row's visual-token sites from block ``layer`` on."""

    def remove(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> AbstractContextManager[Any]:
        model = visual_adapter(adapter)
        length = model.max_length
        dropped = torch.zeros(len(rows), length, dtype=torch.bool)
        for r, row in enumerate(rows):
            for site in row:
                if site.position is None or not 0 <= site.position < length:
                    raise InvalidParameterError(f"{site} is not a visual token's position")
                dropped[r, site.position] = True
        return visual_attention(adapter, dropped, layer)

    return remove


#: The unit kind: one site per visual token of an input, dropped at the input (block 0 on).
#: Not registered in :data:`~attribution.engine.units.UNIT_KINDS`: its sites are one input's
#: own positions, ranked and removed per item (:mod:`~attribution.visual_tokens.study`), not a
#: pruning study's sites removed from every input of a dataset.
VISUAL_TOKEN = UnitKind(
    "visual_token",
    "a visual token of an image and prompt, dropped at the language model's input: no other "
    "position reads it, every position keeps its position id (FastV's removal)",
    _sites,
    {"input": dropped_at(0)},
    positional=True,
    by_default=False,
)

register_attention(_ROUTE, _routed_attention)
