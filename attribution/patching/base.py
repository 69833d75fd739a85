"""
The shared vocabulary of patching: components, directions, sites, the scale and the table.

Components (:data:`COMPONENTS`) are where an activation is read and written, per layer: the
residual stream entering each block, the attention and MLP outputs (each per position), and each
attention head's output at the output projection's input (over all positions, or per
position; under grouped-query attention the query heads, with the key/value head each shares).

Two directions (:data:`DIRECTIONS`): denoising runs the corrupted input with clean activations
patched in, noising the clean input with corrupted ones. Every result is read on one scale,
``(patched − corrupted) / (clean − corrupted)``: 0 is the corrupted score, 1 the clean one; the
raw scores are kept beside it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError

__all__ = [
    "COLUMNS",
    "COMPONENTS",
    "DIRECTIONS",
    "Component",
    "Scale",
    "Site",
    "check_components",
    "check_directions",
    "chosen_names",
    "row_chunks",
    "scale_of",
    "site_masks",
    "site_sums",
    "table",
]


@dataclass(frozen=True)
class Component:
    """
    A kind of activation that is patched, one site at a time.

    Attributes:
        name: Its ``component`` in the tables.
        description: What it is, for people.
        per_head: Sites are heads (the output projection's input, split by head).
        per_position: Sites are token positions (with ``per_head``: a head at a position).
    """

    name: str
    description: str
    per_head: bool
    per_position: bool


#: Every component, in table order.
COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component("residual", "the residual stream entering each block, per position", False, True),
        Component("attention", "the attention output of each block, per position", False, True),
        Component("mlp", "the MLP output of each block, per position", False, True),
        Component("head", "each attention head's output at every position", True, False),
        Component("head_position", "each attention head's output at one position", True, True),
    )
}

#: ``denoising``: clean activations into the corrupted run; ``noising``: the reverse.
DIRECTIONS = ("denoising", "noising")

#: Columns of a patching table: one row per estimator, direction, component and site. ``head``
#: and ``kv_head`` are null on whole-layer components, ``position`` and ``token`` on ``head``.
COLUMNS = (
    "estimator",
    "direction",
    "component",
    "layer",
    "head",
    "kv_head",
    "position",
    "token",
    "effect",
    "patched",
    "normalised",
)


def chosen_names(kind: str, given: Sequence[str] | None, known: Collection[str]) -> list[str]:
    """
    The ``kind`` names asked for (all of ``known`` when ``given`` is None), each once.

    Raises:
        InvalidParameterError: none, or a name not in ``known``.
    """
    chosen = list(known) if given is None else list(dict.fromkeys(given))
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise InvalidParameterError(
            f"unknown {kind}(s) {', '.join(map(repr, unknown)) or '(none given)'}; choose "
            f"from {', '.join(known)}"
        )
    return chosen


def check_components(components: Sequence[str] | None) -> list[str]:
    """The components asked for (all by default): :func:`chosen_names`."""
    return chosen_names("component", components, COMPONENTS)


def check_directions(directions: Sequence[str] | None) -> list[str]:
    """The directions asked for (both by default): :func:`chosen_names`."""
    return chosen_names("direction", directions, DIRECTIONS)


def row_chunks(rows: int, max_rows: int | None) -> list[range]:
    """Rows ``0 … rows − 1`` in passes of at most ``max_rows`` (a memory bound; ``None``: one)."""
    step = max(1, max_rows or rows)
    return [range(start, min(rows, start + step)) for start in range(0, rows, step)]


#: A site: a token position (``None``: every position) and a head (``None``: every feature).
Site = tuple[int | None, int | None]


@dataclass(frozen=True)
class Scale:
    """
    The target's score on both sides, and the normalised scale built on them.

    Attributes:
        clean: Score of the clean input.
        corrupted: Score of the corrupted side (the mean over noise draws).
        destination: Score of the side patched into (the direction's baseline).
    """

    clean: float
    corrupted: float
    destination: float

    @property
    def gap(self) -> float:
        """``clean − corrupted``."""
        return self.clean - self.corrupted

    def normalise(self, score: float) -> float:
        """``(score − corrupted) / (clean − corrupted)``: 0 corrupted, 1 clean."""
        return (score - self.corrupted) / (self.clean - self.corrupted)


def scale_of(clean: float, corrupted: float, direction: str) -> Scale:
    """
    The normalised scale of one direction.

    Raises:
        InvalidInputError: the corruption does not change the target's score.
    """
    gap = clean - corrupted
    if not abs(gap) > 1e-6 * max(1.0, abs(clean)):
        raise InvalidInputError(
            f"the corruption leaves the target's score as it was ({clean:.6g} clean, "
            f"{corrupted:.6g} corrupted): there is nothing for patching to restore; corrupt "
            "the token the answer depends on"
        )
    return Scale(clean, corrupted, clean if direction == "noising" else corrupted)


def site_masks(
    sites: Sequence[Site], length: int, features: int, heads: int, device: torch.device
) -> torch.Tensor:
    """Bool ``(len(sites), T, F)``: where each site's activation lies."""
    positions = torch.zeros(len(sites), length, dtype=torch.bool)
    columns = torch.zeros(len(sites), features, dtype=torch.bool)
    size = features // heads
    for row, (position, head) in enumerate(sites):
        positions[row, slice(None) if position is None else position] = True
        columns[row, slice(None) if head is None else slice(head * size, (head + 1) * size)] = True
    return (positions[:, :, None] & columns[:, None, :]).to(device)


def site_sums(values: torch.Tensor, sites: Sequence[Site], heads: int) -> torch.Tensor:
    """
    Per-element contributions ``(rows, T, F)`` summed over each site's part.

    Summed per position and head first, so no ``(sites, T, F)`` mask is built (for every head
    at every position of a long prompt that would be gigabytes).

    Returns:
        ``(rows, len(sites))`` float64.
    """
    rows, length, features = values.shape
    split = heads if any(head is not None for _, head in sites) else 1
    parts = values.double().reshape(rows, length, split, features // split).sum(-1)
    # one more position holding every position's sum, one more head holding every head's
    parts = torch.cat([parts, parts.sum(1, keepdim=True)], 1)
    parts = torch.cat([parts, parts.sum(2, keepdim=True)], 2)
    at = torch.tensor([length if p is None else p for p, _ in sites], device=values.device)
    of = torch.tensor([split if h is None else h for _, h in sites], device=values.device)
    return parts[:, at, of]


def table(rows: Sequence[tuple]) -> pd.DataFrame:
    """The long table of :data:`COLUMNS`, heads and positions as nullable integers."""
    frame = pd.DataFrame.from_records(list(rows), columns=list(COLUMNS))
    for column in ("layer", "head", "kv_head", "position"):
        frame[column] = frame[column].astype("Int64")
    return frame
