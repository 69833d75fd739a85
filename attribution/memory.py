"""
Peak memory of a stretch of work, on a GPU or on the CPU, beyond what was resting before it.

CUDA: torch's allocator counts its own peak (``max_memory_allocated``). CPU: torch has no such
count (its CPU allocator hands requests to ``malloc``; ``tracemalloc`` sees only Python's
objects), so the process's resident memory is read from Linux instead: free heap memory is
first handed back to the system (glibc's ``malloc_trim``, so that memory freed earlier and kept
by ``malloc`` cannot hide new allocations), the resident high-water mark is reset
(``/proc/self/clear_refs``), and the peak is ``VmHWM`` minus the resting ``VmRSS``. That counts
everything the process touched meanwhile (other threads too: a served process measures beside
its other requests) and pages, not bytes; where Linux or glibc do not offer this, the peak is
unknown (``None``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch

__all__ = ["peak_memory", "resident_bytes"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_HIGH_WATER_MARK = "5"  # clear_refs: reset the peak resident set size to the current one


@contextmanager
def peak_memory(device: torch.device) -> Iterator[Callable[[], int | None]]:
    """
    Measure the peak memory the block uses on ``device`` beyond what was in use before it.

    Yields:
        A function giving the peak in bytes once the block has ended (``None`` where the
        CPU's peak cannot be read).
    """
    peak: list[int | None] = [None]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        resting = torch.cuda.memory_allocated(device)
        yield lambda: peak[0]
        torch.cuda.synchronize(device)
        peak[0] = max(0, torch.cuda.max_memory_allocated(device) - resting)
        return
    _trim()
    cpu_resting = _reset_high_water_mark()
    yield lambda: peak[0]
    high = _status_bytes("VmHWM")
    if cpu_resting is not None and high is not None:
        peak[0] = max(0, high - cpu_resting)


def resident_bytes() -> int | None:
    """The process's resident memory now (``VmRSS``), or ``None`` off Linux."""
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> int | None:
    """Reset ``VmHWM`` to the current resident memory; that memory, or ``None`` if it cannot."""
    try:
        _CLEAR_REFS.write_text(_RESET_HIGH_WATER_MARK)
    except OSError:
        return None
    return resident_bytes()


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim  # glibc only
    except (OSError, AttributeError, TypeError):
        return None
    return trim


def _trim() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
