"""
What a run will cost, before it starts: model passes, seconds and peak device memory.

Passes come from the method's definition (:meth:`AttributionMethod.planned_passes`: its own
passes, once per smoothing sample): exact, or an upper bound where early stopping may end the
run sooner. Seconds and memory come from the model's calibration
(:mod:`attribution.request.calibration`: forward and gradient passes timed on a fixed short input of
the model's own, one row at a time or in batches), scaled by the input's size (tokens or
pixels; a transformer's attention maps by its square,
:meth:`~attribution.request.calibration.Calibration.row_bytes`), memory also by the widest batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from attrlab.attribution.inputs.perturb import auto_batch_size
from attrlab.attribution.methods import get_method
from attrlab.attribution.methods.base import AttributionMethod
from attrlab.attribution.methods.smoothing import smoothing_requested
from attrlab.attribution.metrics.faithfulness import (
    RANDOM_ORDERS,
    check_trust_regions,
    faithfulness_passes,
)
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.calibration import calibrate
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.verdicts import draw_rounds

if TYPE_CHECKING:
    from attrlab.attribution.request.target import Target

__all__ = [
    "STEPS_PER_PASS",
    "Estimate",
    "estimate",
    "per_step_runs",
    "priced",
    "steps_batch",
    "study_estimate",
]


@dataclass(frozen=True)
class Estimate:
    """A run's cost before it starts (``exact``: False when the passes are an upper bound)."""

    method: str
    forward_passes: int
    backward_passes: int
    exact: bool
    seconds: float
    peak_memory_bytes: int | None
    device: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    def summary(self) -> str:
        """One line for people: "≈ 2,102 forward passes, ≈ 35 s on cpu"."""
        bound = "≈" if self.exact else "at most"
        backward = f" and {self.backward_passes:,} backward" if self.backward_passes else ""
        digits = 2 if self.seconds < 1 else 1 if self.seconds < 10 else 0
        return (
            f"{bound} {self.forward_passes:,} forward{backward} passes, "
            f"≈ {self.seconds:,.{digits}f} s on {self.device}"
        )


def per_step_runs(method_cls: type[AttributionMethod], steps: int) -> int:
    """
    The runs of ``method_cls`` that a per-step matrix of ``steps`` rows adds to the whole map.

    A method that scores perturbed inputs reads every step from the whole map's forwards: none.
    A gradient method (LRP among them) spends one run's passes per step: in batches of
    steps where it has them (:func:`steps_batch`), else a run per step. One row is the map.
    """
    return steps if steps > 1 and "gradients" in method_cls.requires else 0


#: The most steps one batched pass of :meth:`AttributionMethod.attribute_steps` takes on:
#: rows of the repeated input each hold their own activations for the backward.
STEPS_PER_PASS = 16


def steps_batch(
    method_cls: type[AttributionMethod],
    steps: int,
    params: Mapping[str, Any],
    max_rows: int | None = None,
) -> int:
    """
    How many steps of a per-step matrix one of the method's passes takes (1: a run per step).

    A method with batched steps (:meth:`AttributionMethod.attribute_steps`) takes up to
    :data:`STEPS_PER_PASS` at once, unless its map is smoothed, and at
    most ``max_rows`` (the rows the run's memory holds:
    :attr:`attribution.request.gate.Cleared.rows`).
    """
    if not method_cls.batches_steps() or smoothing_requested(method_cls.record_of(params)):
        return 1
    return max(1, min(steps, STEPS_PER_PASS, max_rows or STEPS_PER_PASS))


def estimate(
    adapter: Adapter,
    method: str,
    inputs: Inputs,
    params: Mapping[str, Any] | None = None,
    settings: RunSettings | None = None,
    target: Target | None = None,
    per_step: bool = False,
) -> Estimate:
    """
    The cost of ``explain(adapter, method, inputs, target, params, settings, per_step)``.

    Of the settings only ``evaluate`` and ``evaluate_superpixels`` change the cost (the trust
    card's curves). ``target``:
    a target record (an answer, a contrast), whose values on the input may take a forward of
    their own and whose per-step matrix (``per_step``) is priced by :func:`per_step_runs`; a
    class or a next token (or ``None``, the top prediction) costs the same whichever it is.

    Raises:
        UnknownMethodError, UnsupportedMethodError, InvalidParameterError: as ``explain``.
    """
    method_cls = get_method(method)
    resolved = method_cls.resolve(adapter, params)
    settings = settings or RunSettings()
    check_trust_regions(inputs, settings)
    return priced(
        adapter,
        method_cls,
        inputs,
        resolved,
        settings.evaluate,
        target,
        per_step,
        superpixels=settings.evaluate_superpixels,
    )


def priced(
    adapter: Adapter,
    method_cls: type[AttributionMethod],
    inputs: Inputs,
    params: dict[str, Any],
    evaluate: bool = False,
    target: Target | None = None,
    per_step: bool = False,
    max_rows: int | None = None,
    superpixels: int | None = None,
) -> Estimate:
    """
    :func:`estimate` of a method with parameters already resolved (by its ``resolve``).

    ``max_rows``: the most rows of one pass the run holds beside its own batch (a per-step
    matrix's batch of steps, the trust card's scoring batch), as the gate bounds them.
    ``superpixels``: the trust card's regions of an image and a prompt
    (:attr:`RunSettings.evaluate_superpixels`).
    """
    passes = method_cls.planned_passes(adapter, inputs, params)
    steps = target.steps if per_step and target is not None else 1
    runs = 1 + per_step_runs(method_cls, steps)
    calibration = calibrate(adapter)
    scale = max(1, math.prod(inputs.map_shape)) / calibration.size
    width = passes.batch or 1

    def run_seconds(batch: int) -> float:  # one run's passes, in rows of ``batch``
        rows = passes.forward - passes.backward  # forwards without a backward
        seconds = rows * calibration.seconds("forward", batch)
        if passes.backward:
            per_row = calibration.seconds("forward", batch) + calibration.seconds("backward", batch)
            seconds += passes.backward * per_row
        return seconds

    seconds = run_seconds(width)
    forward = passes.forward * runs + 1  # the map's, each step's, and explain's own forward
    if runs > 1:  # the per-step matrix's runs, a batch of steps at once where the method can
        batch = steps_batch(method_cls, steps, params, max_rows)
        if method_cls.steps_share_forward and batch > 1:  # a forward per batch of steps
            batches = math.ceil((runs - 1) / batch)
            forward -= (runs - 1 - batches) * passes.forward
            seconds += batches * calibration.seconds("forward", 1)
            seconds += (runs - 1) * passes.backward * calibration.seconds("backward", 1)
        else:
            seconds += (runs - 1) * run_seconds(width if batch == 1 else batch)
            width = max(width, batch)
    seconds += calibration.seconds("forward", 1)
    if target is not None and not target.reads_logits:  # the target's values on the input
        forward += 1
        seconds += calibration.seconds("forward", 1)
    if evaluate:  # the trust card's curves, scored in batches
        scoring = faithfulness_passes(inputs, superpixels=superpixels)
        scoring_batch = auto_batch_size(adapter, inputs)
        if max_rows is not None:
            scoring_batch = min(scoring_batch, max_rows)
        forward += scoring
        seconds += scoring * calibration.seconds("forward", scoring_batch)
        width = max(width, scoring_batch)
    memory = calibration.peak_bytes(inputs, width)  # the widest pass sets the peak
    return Estimate(
        method=method_cls.name,
        forward_passes=forward,
        backward_passes=passes.backward * runs,
        # the trust card's random orders stop once settled: its passes are then an upper bound
        exact=passes.exact and not (evaluate and draw_rounds(RANDOM_ORDERS) > 1),
        seconds=seconds * scale,
        peak_memory_bytes=memory,
        device=str(adapter.device),
    )


def study_estimate(
    adapter: Adapter, study: str, parts: Sequence[tuple[Inputs, int, int, int]]
) -> Estimate:
    """
    The cost of a study that is not one method's run (a patching or a pruning study).

    ``parts``: per input, ``(inputs, forward rows, backward passes, widest batch)``, as the
    study's planner gives them (:func:`attribution.patching.planned_passes`,
    :func:`attribution.engine.study.study_parts`). Forward rows are priced per row in
    batches of the widest batch, each backward pass (with its forward) one row at a time, both
    from the calibration and scaled by the input's size.
    """
    forward = backward = 0
    seconds = 0.0
    memory: int | None = None
    for inputs, rows, backwards, widest in parts:
        calibration = calibrate(adapter)
        scale = max(1, math.prod(inputs.map_shape)) / calibration.size
        # a gradient pass is measured only where one is priced (not every model's input has
        # one to measure: an image and a prompt's forward-only study)
        single = (
            calibration.seconds("forward", 1) + calibration.seconds("backward", 1)
            if backwards
            else 0.0
        )
        plain = (rows - backwards) * calibration.seconds("forward", max(1, widest))
        seconds += (plain + backwards * single) * scale
        forward, backward = forward + rows, backward + backwards
        part_memory = calibration.peak_bytes(inputs, widest)
        if part_memory is not None:
            memory = max(memory or 0, part_memory)
    return Estimate(
        method=study,
        forward_passes=forward,
        backward_passes=backward,
        exact=True,
        seconds=seconds,
        peak_memory_bytes=memory,
        device=str(adapter.device),
    )
