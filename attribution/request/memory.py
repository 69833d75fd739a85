"""
Peak memory of a stretch of work, on a GPU or on the CPU, beyond what was resting before it.

CUDA: torch's allocator counts its own peak (``max_memory_allocated``). CPU: torch has no such
count (its CPU allocator hands requests to ``malloc``; ``tracemalloc`` sees only Python's
objects), so the process's resident memory is read from Linux instead: free heap memory is
first handed back to the system (glibc's ``malloc_trim``, so that memory freed earlier and kept
by ``malloc`` cannot hide new allocations), then a thread samples the resident size
(``/proc/self/statm``) every :data:`SAMPLE_S` seconds while the work runs; the peak is the
largest sample minus the resting size. It counts everything the process touched meanwhile
(other threads too) in pages, and can miss a spike shorter than the sampling interval.
(Resetting the kernel's own high-water mark through ``/proc/self/clear_refs`` was tried: it
made the passes measured several times slower here.) Off Linux the peak is unknown (``None``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch

__all__ = ["available_bytes", "default_memory_limit", "peak_memory", "resident_bytes"]

#: A server's default bound on one request's peak memory: this share of the memory available
#: when it starts (the rest for the models it loads and the requests beside it).
DEFAULT_MEMORY_SHARE = 0.4

#: How often the resident size is sampled while CPU work runs (seconds).
SAMPLE_S = 0.001
_STATM = Path("/proc/self/statm")  # sizes in pages: total, resident, ...
_MEMINFO = Path("/proc/meminfo")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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
    before = resident_bytes()
    if before is None:
        yield lambda: peak[0]
        return
    highest = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            highest[0] = max(highest[0], resident_bytes() or 0)

    sampler = threading.Thread(target=sample, name="attrlab-peak-memory", daemon=True)
    sampler.start()
    try:
        yield lambda: peak[0]
    finally:
        done.set()
        sampler.join()
    highest[0] = max(highest[0], resident_bytes() or 0)
    peak[0] = highest[0] - before


def resident_bytes() -> int | None:
    """The process's resident memory now, or ``None`` off Linux."""
    try:
        pages = int(_STATM.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * _PAGE


def available_bytes() -> int | None:
    """The machine's memory available to new work now (Linux's ``MemAvailable``), or ``None``."""
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # in kB
    except (OSError, IndexError, ValueError):
        return None
    return None


def default_memory_limit() -> int | None:
    """
    A server's bound on one request's peak memory when none is set: a share of what is free.

    :data:`DEFAULT_MEMORY_SHARE` of :func:`available_bytes`; ``None`` where that is unknown.
    """
    available = available_bytes()
    return None if available is None else int(available * DEFAULT_MEMORY_SHARE)


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
