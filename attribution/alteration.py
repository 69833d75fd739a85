"""
Reading a model while a job works on it: light reads wait only while the model is altered.

A worker answers light requests (a prediction, a cost estimate) beside a long job on the same
model, so a researcher is not kept waiting behind a sampling run. That is safe only while the
model computes its own outputs: every context that changes what a forward pass of the model
computes or records (a hook, an attention routed to a rule, re-initialised weights) holds
:func:`altered` while it is in force, and a light read holds :func:`unaltered`, which waits
while any alteration of that model is in force and keeps new ones from starting until it ends.

Plain forward and gradient passes of a job alter nothing and take no part: they run beside
light reads (autograd's state is per thread, and the job's thread-scoped cancellation hook,
:func:`attribution.request.run.cancellable_forwards`, ignores other threads). A light read never
writes: an alteration begun by a thread that is reading the model is a bug, refused at once
rather than left to deadlock.

Fairness: when an alteration ends, the reads waiting for it go before the next alteration of
that model, so a job that alters step after step (the randomisation check, a layer analysis)
still lets light reads in between its steps.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from attrlab.attribution.request.run import stop_if_cancelled

__all__ = ["altered", "altering_thread", "unaltered"]

#: How often a waiting read looks at its cancel switch (seconds).
_POLL_S = 0.1

_state = threading.Condition()
#: id(model) -> (the altering thread, how deeply its alterations nest).
_altering: dict[int, tuple[int, int]] = {}
#: id(model) -> light reads in progress / waiting for an alteration to end.
_reading: Counter[int] = Counter()
_waiting: Counter[int] = Counter()
_local = threading.local()  # .reads: Counter of the models this thread reads


def _own_reads() -> Counter[int]:
    if not hasattr(_local, "reads"):
        _local.reads = Counter()
    reads: Counter[int] = _local.reads
    return reads


@contextmanager
def altered(model: nn.Module) -> Iterator[None]:
    """
    Hold while ``model``'s forward is changed: light reads of it wait until the block ends.

    Waits for light reads in progress (or waiting) to finish first. Nested use by one thread is
    free; another thread's alteration of the same model is waited for.

    Raises:
        RuntimeError: the calling thread is reading ``model`` through :func:`unaltered`.
    """
    key, me = id(model), threading.get_ident()
    with _state:
        if _own_reads()[key]:
            raise RuntimeError("a light read must not alter the model it reads")
        while True:
            holder = _altering.get(key)
            if holder is not None and holder[0] == me:
                _altering[key] = (me, holder[1] + 1)
                break
            if holder is None and not _reading[key] and not _waiting[key]:
                _altering[key] = (me, 1)
                break
            _state.wait()
    try:
        yield
    finally:
        with _state:
            thread, depth = _altering[key]
            if depth > 1:
                _altering[key] = (thread, depth - 1)
            else:
                del _altering[key]
                _state.notify_all()


@contextmanager
def unaltered(model: nn.Module, cancel: threading.Event | None = None) -> Iterator[None]:
    """
    Hold while reading ``model``'s own outputs from a thread that does not run its job.

    Waits while an alteration of ``model`` is in force; ``cancel`` ends the wait.

    Raises:
        JobCancelledError: ``cancel`` was set while waiting.
        RuntimeError: the calling thread is altering ``model`` (it would read its own change).
    """
    key = id(model)
    with _state:
        if altering_thread(model) == threading.get_ident():
            raise RuntimeError("a job cannot read its own altered model as unaltered")
        _waiting[key] += 1
        try:
            while key in _altering:
                stop_if_cancelled(cancel)
                _state.wait(_POLL_S if cancel is not None else None)
        finally:
            _waiting[key] -= 1
            if not _waiting[key]:
                del _waiting[key]
                _state.notify_all()  # an alteration may wait for the last waiting read
        _reading[key] += 1
        _own_reads()[key] += 1
    try:
        yield
    finally:
        with _state:
            _own_reads()[key] -= 1
            _reading[key] -= 1
            if not _reading[key]:
                del _reading[key]
                _state.notify_all()


def altering_thread(model: nn.Module) -> int | None:
    """The ident of the thread whose alteration of ``model`` is in force, or None."""
    holder = _altering.get(id(model))
    return None if holder is None else holder[0]
