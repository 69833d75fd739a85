"""
Prices of runs from earlier estimates, for callers that may not estimate now.

A ZeroGPU Space must size a GPU slot before it may touch the GPU, so it cannot call
:func:`attribution.request.estimate.estimate` first: it prices a job from what earlier slots
estimated for runs of the same kind. :class:`EstimateBook` keeps, per kind (any hashable key: model,
method, parameters...), the estimated seconds at each input size seen, and the time runs took
beyond their estimates (model loads, decoding), and prices a job from them.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from typing import NamedTuple

__all__ = ["FIRST_SLOT_S", "SLOT_EXTRA_S", "SLOT_FACTOR", "EstimateBook", "Price", "slot_seconds"]

#: Slot of a job not priced yet (seconds).
FIRST_SLOT_S = 60
#: Margin over the estimate, whose seconds are within a factor 2 on the embedded models.
SLOT_FACTOR, SLOT_EXTRA_S = 2.0, 10


def slot_seconds(seconds: float) -> int:
    """The GPU slot a job priced at ``seconds`` asks for: the estimate with its margin."""
    return math.ceil(SLOT_FACTOR * seconds + SLOT_EXTRA_S)


class Price(NamedTuple):
    """A job's price from the book: seconds (None while a part is unknown), and how sure."""

    seconds: float | None
    #: Every part was seen at its size or larger: the price was not extrapolated upwards, so a
    #: refusal on it is safe (an upward extrapolation may be too high).
    seen_larger: bool


class EstimateBook:
    """
    Estimated seconds per kind of run and input size; thread-safe.

    A part of ``units`` (characters of text, 1 per image) of a kind is priced at the highest
    rate per unit seen for that kind; a job is its parts plus the largest time beyond the
    estimates among the last ``recent`` runs. A kind whose last run ended without an answer is
    unknown until a run of it answers.
    """

    def __init__(self, recent: int) -> None:
        #: kind -> units -> estimated seconds
        self.seen: dict[Hashable, dict[int, float]] = {}
        #: Time beyond the estimates of the last runs (seconds).
        self.beyond: deque[float] = deque(maxlen=recent)
        self._unanswered: set[Hashable] = set()
        self._lock = threading.Lock()

    def price(self, parts: Sequence[tuple[Hashable, int]]) -> Price:
        """The price of a job of ``(kind, units)`` parts (unknown for no parts)."""
        if not parts:
            return Price(None, False)
        total, seen_larger = 0.0, True
        with self._lock:
            for kind, units in parts:
                seen = self.seen.get(kind)
                if not seen or kind in self._unanswered:
                    return Price(None, False)
                total += units * max(seconds / size for size, seconds in seen.items())
                seen_larger = seen_larger and max(seen) >= units
            total += max(self.beyond, default=0.0)
        return Price(total, seen_larger)

    def unanswered(self, kinds: Iterable[Hashable]) -> bool:
        """Whether a run of any of ``kinds`` last ended without an answer."""
        with self._lock:
            return any(kind in self._unanswered for kind in kinds)

    def record(self, estimates: Iterable[tuple[Hashable, int, float]], beyond: float) -> None:
        """A run answered: its parts' ``(kind, units, seconds)`` and its time beyond them."""
        with self._lock:
            for kind, units, seconds in estimates:
                self.seen.setdefault(kind, {})[units] = seconds
                self._unanswered.discard(kind)
            self.beyond.append(beyond)

    def record_unanswered(self, kinds: Iterable[Hashable]) -> None:
        """A run of ``kinds`` ended without an answer (its slot was stopped)."""
        with self._lock:
            self._unanswered.update(kinds)
