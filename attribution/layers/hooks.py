"""
Scoped hooks for layer and head analysis, each undone when its ``with`` block exits.

Transformers v5 has no ``head_mask``: heads are reached at the input of each attention's output
projection, where their outputs sit side by side as ``(B, T, heads·head_dim)``. A gate scales
each head there, an ablation zeroes or mean-replaces one head per batch row (or zeroes a set of
heads in one row, or in every row); a skipped block returns its input as its output for one
batch row. All of them act on batch rows so that many variants run in one forward batch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from numbers import Integral
from typing import Any

import torch
from torch import nn

from attrlab.attribution.errors import InvalidParameterError

__all__ = [
    "ABLATIONS",
    "ablate_head_sets",
    "ablate_heads",
    "block_io",
    "check_heads",
    "gate_heads",
    "skip_blocks",
    "skip_blocks_at",
    "widened",
    "zeroed_heads",
]


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    """A block's residual-stream input, passed positionally or as ``hidden_states``."""
    return args[0] if args else kwargs["hidden_states"]


def _replace_hidden(output: Any, hidden: torch.Tensor) -> Any:
    """A block's output with its residual stream replaced (blocks return a tensor or a tuple)."""
    if isinstance(output, torch.Tensor):
        return hidden
    return (hidden, *output[1:])


def _output_hidden(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


@contextmanager
def block_io(blocks: Sequence[nn.Module]) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Record each block's residual input and output ``(B, T, D)`` during the passes inside."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    with ExitStack() as stack:
        for block in blocks:

            def keep(_m: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
                seen.append((_hidden(args, kwargs), _output_hidden(out)))

            stack.callback(block.register_forward_hook(keep, with_kwargs=True).remove)
        yield seen


@contextmanager
def skip_blocks(blocks: Sequence[nn.Module], rows: Sequence[int | list[int]]) -> Iterator[None]:
    """Block ``i`` returns its input as its output in batch row(s) ``rows[i]``, others untouched."""
    with ExitStack() as stack:
        for block, row in zip(blocks, rows, strict=True):

            def bypass(
                _m: nn.Module, args: tuple, kwargs: dict, out: Any, row: int | list[int] = row
            ) -> Any:
                hidden = _output_hidden(out).clone()
                hidden[row] = _hidden(args, kwargs)[row]
                return _replace_hidden(out, hidden)

            stack.callback(block.register_forward_hook(bypass, with_kwargs=True).remove)
        yield


@contextmanager
def skip_blocks_at(
    blocks: Sequence[nn.Module], rows: Sequence[int], positions: torch.Tensor
) -> Iterator[None]:
    """
    Block ``i`` returns its input at ``positions`` in batch row ``rows[i]``, its output elsewhere.

    ``positions``: bool ``(T,)``. The block still runs on every position (the others read the
    skipped positions' inputs as usual); only its update of those positions is left out.
    """
    with ExitStack() as stack:
        for block, row in zip(blocks, rows, strict=True):

            def bypass(_m: nn.Module, args: tuple, kwargs: dict, out: Any, row: int = row) -> Any:
                hidden = _output_hidden(out).clone()
                where = positions.to(hidden.device)
                hidden[row, where] = _hidden(args, kwargs)[row, where]
                return _replace_hidden(out, hidden)

            stack.callback(block.register_forward_hook(bypass, with_kwargs=True).remove)
        yield


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(*x.shape[:-1], heads, x.shape[-1] // heads)


@contextmanager
def gate_heads(projections: Sequence[nn.Module], gates: Sequence[torch.Tensor]) -> Iterator[None]:
    """Multiply head ``h`` of layer ``l`` by ``gates[l][h]`` at its output projection's input."""
    with ExitStack() as stack:
        for projection, gate in zip(projections, gates, strict=True):

            def scale(_m: nn.Module, args: tuple, gate: torch.Tensor = gate) -> tuple:
                x = args[0]
                gated = _split_heads(x, gate.numel()) * gate.to(x).view(-1, 1)
                return (gated.reshape(x.shape), *args[1:])

            stack.callback(projection.register_forward_pre_hook(scale).remove)
        yield


#: How :func:`ablate_heads` takes a head out: zeroed, or replaced by its mean over the sequence.
ABLATIONS = ("zero", "mean")


@contextmanager
def ablate_heads(
    projection: nn.Module,
    heads: int,
    rows: Sequence[tuple[int, str] | None],
    visible: torch.Tensor | None = None,
    widen_at: nn.Module | None = None,
) -> Iterator[None]:
    """
    Ablate one head of one layer per batch row.

    Row ``r`` ablates head ``rows[r][0]`` by ``rows[r][1]`` (one of :data:`ABLATIONS`), or
    stays as it is where ``rows[r]`` is None. A ``mean`` ablation writes the head's mean over
    the ``visible`` positions of the first unablated row at every position. The batch must hold
    ``len(rows)`` copies of one input, or one input and ``widen_at``: the block whose input is
    then repeated into those rows, so the blocks before it run once (their output is the same
    in every row).
    """
    count = len(rows)
    ablated = [(r, row) for r, row in enumerate(rows) if row is not None]
    if any(kind not in ABLATIONS for _, (_, kind) in ablated):
        raise ValueError(f"an ablation is one of {', '.join(ABLATIONS)}")
    plain = [r for r, row in enumerate(rows) if row is None]
    if any(kind == "mean" for _, (_, kind) in ablated) and not plain:
        raise ValueError("a mean ablation needs an unablated row to take the mean from")
    index = torch.tensor([r for r, _ in ablated], dtype=torch.long)
    head = torch.tensor([h for _, (h, _) in ablated], dtype=torch.long)
    by_mean = torch.tensor([kind == "mean" for _, (_, kind) in ablated])

    def ablate(_m: nn.Module, args: tuple) -> tuple:
        x = args[0]
        split = _split_heads(x.clone(), heads)  # (rows, T, H, d)
        at, where = head.to(x.device), index.to(x.device)
        replaced = torch.zeros_like(split[where, :, at])  # (ablated rows, T, d)
        if by_mean.any():
            keep = visible if visible is not None else torch.ones(x.shape[1], dtype=torch.bool)
            mean = split[plain[0], keep.to(x.device)].mean(dim=0)  # (H, d)
            filled = mean[at].unsqueeze(1).expand_as(replaced)
            replaced = torch.where(by_mean.to(x.device).view(-1, 1, 1), filled, replaced)
        split[where, :, at] = replaced
        return (split.reshape(x.shape), *args[1:])

    with ExitStack() as stack:
        if widen_at is not None:
            stack.enter_context(widened(widen_at, count))
        stack.callback(projection.register_forward_pre_hook(ablate).remove)
        yield


@contextmanager
def widened(block: nn.Module, count: int) -> Iterator[None]:
    """
    ``block``'s input, one batch row, repeated into ``count`` rows.

    The modules before ``block`` run once on one input (an image's vision tower too); the rows
    part from ``block`` on, where the hooks that differ per row act.
    """

    def widen(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (args[0].expand(count, *args[0].shape[1:]), *args[1:]), kwargs
        hidden = kwargs["hidden_states"]
        return args, {**kwargs, "hidden_states": hidden.expand(count, *hidden.shape[1:])}

    handle = block.register_forward_pre_hook(widen, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def check_heads(chosen: Collection[tuple[int, int]], layers: int, heads: int) -> None:
    """
    Refuse a ``(layer, head)`` pair the model does not have, naming it and the model's counts.

    Raises:
        InvalidParameterError: for a pair out of range (or not two whole numbers).
    """
    for pair in chosen:
        whole = isinstance(pair, (tuple, list)) and len(pair) == 2
        whole = whole and all(isinstance(v, Integral) and not isinstance(v, bool) for v in pair)
        if not (whole and 0 <= pair[0] < layers and 0 <= pair[1] < heads):
            raise InvalidParameterError(
                f"head {pair!r} (layer, head) is not in this model: it has {layers} layers "
                f"(0..{layers - 1}) of {heads} heads each (0..{heads - 1})"
            )


#: Where a head is zeroed: a batch row (or every row, ``slice(None)``) and a head.
_Cell = tuple[int | slice, int]


@contextmanager
def _zeroed_cells(
    projections: Sequence[nn.Module], heads: int, cells: Sequence[Sequence[_Cell]]
) -> Iterator[None]:
    """Zero, at layer ``l``'s output-projection input, each ``(row, head)`` of ``cells[l]``."""
    with ExitStack() as stack:
        for projection, chosen in zip(projections, cells, strict=True):
            if not chosen:
                continue

            def zero(_m: nn.Module, args: tuple, chosen: Sequence[_Cell] = chosen) -> tuple:
                x = args[0]
                split = _split_heads(x.clone(), heads)
                for row, head in chosen:
                    split[row, :, head] = 0.0
                return (split.reshape(x.shape), *args[1:])

            stack.callback(projection.register_forward_pre_hook(zero).remove)
        yield


@contextmanager
def ablate_head_sets(
    projections: Sequence[nn.Module], heads: int, sets: Sequence[Collection[tuple[int, int]]]
) -> Iterator[None]:
    """
    Batch row ``i`` has every ``(layer, head)`` of ``sets[i]`` zeroed (jointly).

    Raises:
        InvalidParameterError: for a pair the model does not have.
    """
    for chosen in sets:
        check_heads(chosen, len(projections), heads)
    cells = [
        [(row, h) for row, chosen in enumerate(sets) for (ll, h) in chosen if ll == layer]
        for layer in range(len(projections))
    ]
    with _zeroed_cells(projections, heads, cells):
        yield


@contextmanager
def zeroed_heads(
    projections: Sequence[nn.Module], heads: int, chosen: Collection[tuple[int, int]]
) -> Iterator[None]:
    """
    Every ``(layer, head)`` of ``chosen`` zeroed in every batch row.

    For methods that batch many variants of one input (integrated gradients' steps, masks):
    each row sees the same model with those heads taken out.

    Raises:
        InvalidParameterError: for a pair the model does not have.
    """
    check_heads(chosen, len(projections), heads)
    every = slice(None)
    cells = [[(every, h) for (ll, h) in chosen if ll == layer] for layer in range(len(projections))]
    with _zeroed_cells(projections, heads, cells):
        yield
