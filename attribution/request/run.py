"""
How a run goes: what its caller sets, and the state handed to every method.

:class:`RunSettings` is the caller's record (seed, progress, cancel, budgets, trust card);
:class:`RunContext` the per-run state (seeded randomness, progress, cancellation, counters).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from attrlab.attribution.errors import (
    BudgetExceededError,
    JobCancelledError,
    TooSlowError,
    UnsupportedMethodError,
)

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter, Inputs
    from attrlab.attribution.request.target import Target

__all__ = [
    "ProgressCallback",
    "RunContext",
    "RunSettings",
    "SharedPasses",
    "cancellable_forwards",
    "stop_if_cancelled",
]

#: Called with (done, total) units of work, typically forward passes.
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class RunSettings:
    """
    What the caller of a run decides, handed whole from front end to method.

    :func:`~attribution.explain`, :func:`~attribution.request.estimate`, the checks of several
    methods and the head ablation take one; the gate (:mod:`attribution.request.gate`) reads its
    budgets.

    Attributes:
        seed: Seed of every random draw of the run (same seed, same result).
        progress: Optional callback receiving (done, total).
        cancel: Optional event; once set, the run stops with :class:`JobCancelledError`.
        max_forward_passes: Most forward passes the run may spend (``None``: no limit); a
            sampling method is refused when it plans more.
        max_seconds: Longest estimated time of the run (``None``: no limit); a run estimated
            over it is refused before it starts, with :class:`TooSlowError`.
        max_memory_bytes: Most memory the run may hold at its peak beyond the resting model
            (``None``: no limit). The gate batches the run's rows to fit it and refuses, before
            it starts, a run whose estimated peak is over it even so
            (:class:`TooMuchMemoryError`).
        evaluate: Add the map's faithfulness scores and their random-order counterparts to its
            metrics (the trust card).
        evaluate_superpixels: With ``evaluate``, on an image and a prompt: the trust card
            removes the visual tokens of about this many SLIC superpixels of the image together
            (as a map's ``segments=slic`` with ``n_segments``); ``None``: each visual token.
    """

    seed: int = 0
    progress: ProgressCallback | None = None
    cancel: threading.Event | None = None
    max_forward_passes: int | None = None
    max_seconds: float | None = None
    max_memory_bytes: int | None = None
    evaluate: bool = False
    evaluate_superpixels: int | None = None


@dataclass
class RunContext:
    """
    Per-run state a method may use; nothing in it outlives the run.

    Attributes:
        seed: Seed of every random draw of the run (same seed, same result).
        progress: Optional callback receiving (done, total).
        cancel: Optional event; once set, :meth:`step` raises :class:`JobCancelledError`.
        max_forward_passes: Optional budget; :meth:`plan` refuses jobs that need more.
        logits: The input's own logits, which :func:`attribution.explain` computes before the
            method runs (a method reads them with :meth:`clean_logits` instead of a pass).
        attentions: The attention probabilities of that same pass, when the method reads them
            (:meth:`clean_attentions`).
        max_rows: Most rows one pass may hold, where the run's memory bounds them
            (:attr:`attribution.request.gate.Cleared.rows`); ``None``: as the method batches.
    """

    seed: int = 0
    progress: ProgressCallback | None = None
    cancel: threading.Event | None = None
    max_forward_passes: int | None = None
    max_rows: int | None = None
    logits: torch.Tensor | None = field(default=None, repr=False, compare=False)
    attentions: tuple[torch.Tensor, ...] | None = field(default=None, repr=False, compare=False)
    #: Targets' outputs on the input itself (:meth:`clean_outputs`), where not the logits.
    outputs: dict[Target, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    forward_passes: int = 0
    backward_passes: int = 0
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    @classmethod
    def of(cls, settings: RunSettings | None, **state: Any) -> RunContext:
        """A fresh run of ``settings`` (its seed, progress, cancel switch and pass budget)."""
        settings = settings or RunSettings()
        return cls(
            seed=settings.seed,
            progress=settings.progress,
            cancel=settings.cancel,
            max_forward_passes=settings.max_forward_passes,
            **state,
        )

    def step(self, done: int, total: int) -> None:
        """Report progress and stop here if the job was cancelled."""
        self.stop_if_cancelled()
        if self.progress is not None:
            self.progress(done, total)

    def stop_if_cancelled(self) -> None:
        """Raise :class:`JobCancelledError` once the job was cancelled."""
        stop_if_cancelled(self.cancel)

    def plan(self, forward_passes: int, lower: str = "the sample count") -> None:
        """
        Announce the forward passes a stage will need, before building anything that big.

        The budget covers the whole run: passes already spent count against it.

        Raises:
            BudgetExceededError: more than ``max_forward_passes``; ``lower`` names what to reduce.
        """
        budget = self.max_forward_passes
        needed = self.forward_passes + forward_passes  # what the run spent so far counts too
        if budget is not None and needed > budget:
            raise BudgetExceededError(
                f"this request needs {needed:,} forward passes; this server allows at "
                f"most {budget:,} per request: lower {lower}"
            )

    def count(self, forward: int = 0, backward: int = 0) -> None:
        """Record model passes (reported in ``Explanation.timings``)."""
        self.forward_passes += forward
        self.backward_passes += backward

    def clean_logits(self, adapter: Adapter, inputs: Inputs) -> torch.Tensor:
        """
        The input's own logits (one row), computed once per run.

        :func:`attribution.explain` sets them before the method runs; a method called on its
        own spends one counted forward pass, kept for the rest of the run.
        """
        if self.logits is None:
            with torch.no_grad():
                self.logits = adapter.logits(**inputs.model_kwargs())[0]
            self.count(forward=1)
        return self.logits

    def clean_outputs(self, adapter: Adapter, inputs: Inputs, target: Target) -> torch.Tensor:
        """
        ``target``'s outputs on the input itself (one row).

        :meth:`clean_logits` where the target reads the logits (one output); otherwise one
        counted forward, kept for the rest of the run.
        """
        if target.reads_logits:
            return self.clean_logits(adapter, inputs)[None]
        if target not in self.outputs:
            with torch.no_grad():
                self.outputs[target] = target.outputs(adapter, **inputs.model_kwargs())
            self.count(forward=1)
        return self.outputs[target]

    def clean_score(self, adapter: Adapter, inputs: Inputs, target: Target) -> torch.Tensor:
        """``target``'s score on the input itself (0-d): F(x) of a convergence delta."""
        return target.score(self.clean_outputs(adapter, inputs, target))[0]

    def clean_attentions(self, adapter: Adapter, inputs: Inputs) -> tuple[torch.Tensor, ...]:
        """
        The attention probabilities of the input's own forward pass, per layer ``(1, H, T, T)``.

        :func:`attribution.explain` sets them with its prediction for a method that reads them
        (:attr:`AttributionMethod.reads_prediction_attentions`); otherwise this spends one
        counted forward pass, kept for the rest of the run.
        """
        if self.attentions is None:
            with torch.no_grad():
                logits, self.attentions = adapter.logits_and_attentions(**inputs.model_kwargs())
            self.count(forward=1)
            if self.logits is None:  # the same pass gave the prediction: clean_logits is free
                self.logits = logits[0]
        if not self.attentions or any(layer is None for layer in self.attentions):
            raise UnsupportedMethodError(
                f"model '{adapter.model_id}' returned no attention probabilities: its attention "
                "implementation (SDPA or flash attention) does not output them; load it with "
                "attn_implementation='eager'"
            )
        return self.attentions

    def warn(self, message: str) -> None:
        """Attach a warning to the Explanation."""
        self.warnings.append(message)


@dataclass
class SharedPasses:
    """
    One forward-pass budget spent in turn by the runs of a composite run.

    A check of several methods, or a plain map and its ablated twin, each run with what the
    runs before it left (:meth:`left`), and count what they spent (:meth:`spend`).

    Attributes:
        limit: The whole run's forward passes (``None``: no bound).
        spent: Forward passes spent so far.
    """

    limit: int | None
    spent: int = 0

    def left(self, refusal: str) -> int | None:
        """
        The passes the next run may spend (``None``: no bound).

        Raises:
            BudgetExceededError: ``refusal`` (``{limit}`` in it filled), when the runs before
                spent them all.
        """
        if self.limit is None:
            return None
        if self.spent >= self.limit:
            raise BudgetExceededError(refusal.format(limit=self.limit))
        return self.limit - self.spent

    def spend(self, passes: int) -> None:
        """Count ``passes`` forward passes a run spent."""
        self.spent += passes


def stop_if_cancelled(cancel: threading.Event | None) -> None:
    """Raise :class:`JobCancelledError` once ``cancel`` is set."""
    if cancel is not None and cancel.is_set():
        raise JobCancelledError("the job was cancelled")


@contextmanager
def cancellable_forwards(
    model: nn.Module, cancel: threading.Event | None, max_seconds: float | None = None
) -> Iterator[None]:
    """
    Make every forward pass of ``model`` a cancellation point while the block runs.

    A forward pre-hook on the model raises :class:`JobCancelledError` once ``cancel`` is set, so
    a method stops before its next batch or step whatever library runs its forwards (Captum's
    internal batches, shap's evaluations, a perturbation batch) without code of its own. Only
    forwards of the thread that entered are stopped: another thread's run on the same model
    answers to its own cancel. With ``max_seconds``, a forward that would start once the block
    has run that long raises :class:`TooSlowError` instead (a budget spent). The hook is
    removed on exit.
    """
    if cancel is None and max_seconds is None:
        yield
        return
    owner = threading.get_ident()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds

    def check(_module: nn.Module, _args: tuple[object, ...]) -> None:
        if threading.get_ident() != owner:
            return
        stop_if_cancelled(cancel)
        if deadline is not None and time.monotonic() > deadline:
            raise TooSlowError(
                f"this request ran past the {max_seconds:g} s this server allows per request"
            )

    handle = model.register_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()
