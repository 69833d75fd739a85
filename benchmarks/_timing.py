"""The one stopwatch of the benchmark scripts: the best of a few runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_seconds(run: Callable[[], Any], repeats: int = 3) -> float:
    """The shortest of ``repeats`` runs of ``run()``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best
