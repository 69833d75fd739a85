"""
What a run will cost, before it starts: model passes, seconds and peak device memory.

Passes come from the method's definition (:meth:`AttributionMethod.planned_passes`: its own
passes, once per smoothing sample): exact, or an upper bound where early stopping may end the
run sooner. Seconds and memory come from a calibration per model, device and modality, kept
for the process: each cost (a forward or a gradient pass, one row at a time or in batches of
copies, since batched rows cost less each) is measured on a fixed short input of the model's
own (:func:`reference_input`: never a request's, so that a request's size cannot change what
calibrating costs) and scaled by input size (tokens or pixels). The peak memory of those
passes beyond the resting weights (:func:`attribution.memory.peak_memory`: torch's allocator
on CUDA, the process's resident high-water mark on the CPU) is measured too, scaled by size
(a transformer's attention maps by its square, :meth:`Calibration.row_bytes`) and by the
widest batch.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from attrlab.attribution.errors import DeviceMemoryError
from attrlab.attribution.memory import peak_memory
from attrlab.attribution.methods import get_method
from attrlab.attribution.methods.base import AttributionMethod
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.perturb import auto_batch_size, repeated
from attrlab.attribution.run import RunSettings

if TYPE_CHECKING:
    from attrlab.attribution.target import Target

__all__ = [
    "REFERENCE_TEXT",
    "Calibration",
    "Estimate",
    "calibrate",
    "calibrated",
    "estimate",
    "per_step_runs",
    "priced",
    "reference_input",
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


#: Batch widths the calibration times per device type and pass kind; a batch is priced between
#: the widths around it (linear in log width). A GPU row keeps getting cheaper up to large
#: batches, so wider batches are timed there; a CPU row can get dearer past a few dozen rows
#: (EfficientNet-Lite0's per-row cost doubles from 16 to 64 rows as its activations leave cache).
_WIDTHS = {
    ("cpu", "forward"): (1, 16, 64),
    ("cpu", "backward"): (1, 16, 64),
    ("cuda", "forward"): (1, 16, 64, 256, 1024),
    ("cuda", "backward"): (1, 16, 64, 256),
}


#: The text every text model is calibrated on: short, so that calibrating costs a few of the
#: model's forward and gradient passes on 64 rows of it at most, whatever is asked later.
REFERENCE_TEXT = "The film was long, but the acting was warm and the ending stayed with me."
#: Tensors of one layer's attention maps (heads × T × T) a gradient pass holds at its peak:
#: the scores, the probabilities kept for the backward, and their gradient.
ATTENTION_MAPS = 3


def reference_input(adapter: Adapter) -> Inputs:
    """The fixed input of the model's own that its calibration times (never a request's)."""
    if adapter.modality == "image":
        from PIL import Image

        # resized to the model's own input size by its transform, as every image is
        return adapter.preprocess(Image.new("RGB", (224, 224), (124, 116, 104)))
    return adapter.preprocess(REFERENCE_TEXT)


class Calibration:
    """
    Measured costs of one model on one device and modality, per row of a reference input.

    Each cost is measured the first time an estimate needs it and kept for the process: a
    forward and a gradient pass, one row at a time or in batches of 16 and 64 copies (on a GPU
    up to 1024 forward and 256 gradient rows; a width that runs out of memory is skipped). Costs
    scale with the input's size (tokens or pixels) relative to the reference input's
    (:func:`reference_input`, which :func:`calibrate` gives it).
    """

    def __init__(self, adapter: Adapter, inputs: Inputs) -> None:
        self.adapter, self.inputs = adapter, inputs
        self.size = max(1, math.prod(inputs.map_shape))
        #: (kind, width) -> the peak memory of a pass of that many rows on the reference
        self.peaks: dict[tuple[str, int], int] = {}
        self._seconds: dict[tuple[str, int], float] = {}
        self._too_wide: set[tuple[str, int]] = set()  # widths that ran out of device memory
        self._lock = threading.RLock()  # a gradient cost measures forward costs first

    def row_bytes(self, inputs: Inputs) -> int | None:
        """
        Peak memory of one more row of a pass on ``inputs``' size (see :meth:`peak_bytes`).

        A pass's peak grows by this much per row: the slope between the two widest batches
        measured of a kind (the largest of the kinds), so that what a pass holds once whatever
        its width (buffers, thread pools) does not count per row. The reference's slope scaled
        by size; for a transformer plus the growth of its attention maps beyond that (layers ×
        heads × T² values of :data:`ATTENTION_MAPS` tensors, quadratic in the tokens where the
        rest of a row is linear). ``None`` before a pass was measured, or where the CPU's peak
        cannot be read.
        """
        with self._lock:
            slopes = []
            for kind in ("forward", "backward"):
                widths = sorted(w for k, w in self.peaks if k == kind)
                if len(widths) == 1:  # one width: all of its peak counts per row
                    slopes.append(self.peaks[kind, widths[0]] / widths[0])
                elif widths:
                    narrow, wide = widths[-2], widths[-1]
                    grown = self.peaks[kind, wide] - self.peaks[kind, narrow]
                    slopes.append(max(grown, 0) / (wide - narrow))
        if not slopes:
            return None
        size = max(1, math.prod(inputs.map_shape))
        linear = max(slopes) * size / self.size
        adapter = self.adapter
        growth = 0
        if inputs.modality == "text" and adapter.num_heads:
            itemsize = next(adapter.model.parameters()).element_size()
            maps = ATTENTION_MAPS * adapter.num_layers * adapter.num_heads * itemsize
            growth = maps * max(0, size * size - size * self.size)
        return int(linear + growth)

    def peak_bytes(self, inputs: Inputs, width: int) -> int | None:
        """
        Peak memory of a pass of ``width`` rows on ``inputs``, beyond the resting model.

        What the widest pass measured held beyond its rows (:meth:`row_bytes` each), plus
        ``width`` rows. ``None`` as :meth:`row_bytes`.
        """
        row = self.row_bytes(inputs)
        if row is None:
            return None
        reference = self.row_bytes(self.inputs) or 0
        with self._lock:
            kind, wide = max(self.peaks, key=lambda key: (key[1], key[0] == "backward"))
            held = max(0, self.peaks[kind, wide] - wide * reference)
        return held + row * max(1, width)

    def _widths(self, kind: str) -> tuple[int, ...]:
        return _WIDTHS["cuda" if self.adapter.device.type == "cuda" else "cpu", kind]

    def measure_all(self) -> None:
        """Measure every width of this device now (one that does not fit is skipped)."""
        for kind in ("forward", "backward"):
            for width in self._widths(kind):
                with suppress(DeviceMemoryError):
                    self._seconds_at(kind, width)

    @property
    def complete(self) -> bool:
        """Every width is measured (or known not to fit): estimates then run no pass."""
        with self._lock:
            return all(
                (kind, width) in self._seconds or (kind, width) in self._too_wide
                for kind in ("forward", "backward")
                for width in self._widths(kind)
            )

    def seconds(self, kind: str, batch: int) -> float:
        """Seconds per row of a ``"forward"`` or ``"backward"`` pass in batches of ``batch``."""
        widths = self._widths(kind)
        batch = max(1, batch)
        below = max(w for w in widths if w <= batch)
        above = min((w for w in widths if w >= batch), default=below)
        while True:  # the widest width at or below the batch that fits beside the model
            try:
                low = self._seconds_at(kind, below)
                break
            except DeviceMemoryError:
                if below == 1:
                    raise
                above, below = below, max(w for w in widths if w < below)
        if above == below:
            return low
        try:  # the wider width may not fit beside the model even where the batch does
            high = self._seconds_at(kind, above)
        except DeviceMemoryError:
            return low
        share = math.log(batch / below) / math.log(above / below)
        return low + share * (high - low)

    def _seconds_at(self, kind: str, width: int) -> float:
        with self._lock:
            if (kind, width) in self._too_wide:
                raise DeviceMemoryError(f"a {kind} pass of {width} rows does not fit")
            if (kind, width) not in self._seconds:
                try:
                    self._seconds[kind, width] = self._measure(kind, width)
                except DeviceMemoryError:
                    self._too_wide.add((kind, width))
                    raise
            return self._seconds[kind, width]

    def _measure(self, kind: str, width: int) -> float:
        adapter = self.adapter
        repeats = 2 if width < 64 else 1  # wide passes vary less and cost the most to repeat
        if kind == "backward":  # the forwards it subtracts, measured first: not inside its peak
            self.seconds("forward", 1)
            self.seconds("forward", width)
        try:
            seconds, peak = self._timed(kind, width, repeats)
        except torch.cuda.OutOfMemoryError:
            raise DeviceMemoryError(
                f"model '{adapter.model_id}' ran out of GPU memory while calibrating the estimate"
            ) from None
        if peak is not None:
            self.peaks[kind, width] = peak
        return seconds

    def _timed(self, kind: str, width: int, repeats: int) -> tuple[float, int | None]:
        """Seconds per row of a ``kind`` pass of ``width`` rows, and its peak memory."""
        from attrlab.attribution.explain import (
            explain,  # explain imports the methods, which import this
        )

        adapter, inputs = self.adapter, self.inputs
        if kind == "forward":
            rows = {k: repeated(v, width) for k, v in inputs.model_kwargs().items()}

            def forward() -> None:
                with torch.no_grad():
                    adapter.logits(**rows)

            spent, peak = _best(forward, adapter.device, repeats)
            seconds = spent / width
        elif width == 1:  # gradient × input: 2 forwards and 1 backward in all
            spent, peak = _best(
                lambda: explain(adapter, "gradient_x_input", inputs), adapter.device
            )
            seconds = max(spent - 2 * self.seconds("forward", 1), 0.0)
        else:  # a path of `width` points in one batch, width backwards, and single rows
            params = {"n_steps": width, "internal_batch_size": width}
            spent, peak = _best(
                lambda: explain(adapter, "integrated_gradients", inputs, params=params),
                adapter.device,
                repeats,
            )
            method = get_method("integrated_gradients")
            singles = 1 + method.passes(adapter, inputs, params).forward - width  # + predict
            single = self.seconds("forward", 1)
            seconds = max((spent - singles * single) / width - self.seconds("forward", width), 0.0)
        return seconds, peak


_CALIBRATIONS: dict[tuple[Any, ...], Calibration] = {}
_CALIBRATING = threading.Lock()


def calibrate(adapter: Adapter) -> Calibration:
    """The calibration of ``adapter`` on its device (made on first use, on its reference)."""
    key = (adapter.model_id, str(adapter.device), adapter.modality)
    with _CALIBRATING:
        if key not in _CALIBRATIONS:
            _CALIBRATIONS[key] = Calibration(adapter, reference_input(adapter))
        return _CALIBRATIONS[key]


def calibrated(adapter: Adapter) -> bool:
    """Whether ``adapter``'s calibration is complete (see :meth:`Calibration.measure_all`)."""
    with _CALIBRATING:
        key = (adapter.model_id, str(adapter.device), adapter.modality)
        calibration = _CALIBRATIONS.get(key)
    return calibration is not None and calibration.complete


def _best(call: Any, device: torch.device, repeats: int = 2) -> tuple[float, int | None]:
    """
    Fastest of ``repeats`` timed calls after one warm-up, and the warm-up's peak memory.

    The peak is measured on the warm-up only: on the CPU its measure first hands freed memory
    back to the system, which the timed calls should not pay for again.
    """
    with peak_memory(device) as peak:
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        if device.type == "cuda":  # kernels run asynchronously: wait for them
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times), peak()


def per_step_runs(method_cls: type[AttributionMethod], steps: int) -> int:
    """
    The runs of ``method_cls`` that a per-step matrix of ``steps`` rows adds to the whole map.

    A method that scores perturbed inputs reads every step from the whole map's forwards: none.
    A gradient method (LRP among them) spends one run's passes per step: in batches of
    steps where it has them (:func:`steps_batch`), else a run per step. One row is the map.
    """
    return steps if steps > 1 and "gradients" in method_cls.requires else 0


def steps_batch(
    method_cls: type[AttributionMethod],
    steps: int,
    params: Mapping[str, Any],
    max_rows: int | None = None,
) -> int:
    """
    How many steps of a per-step matrix one of the method's passes takes (1: a run per step).

    A method with batched steps (:meth:`AttributionMethod.attribute_steps`) takes up to
    :data:`~attribution.explain.STEPS_PER_PASS` at once, unless its map is smoothed, and at
    most ``max_rows`` (the rows the run's memory holds: :attr:`attribution.gate.Cleared.rows`).
    """
    from attrlab.attribution.explain import STEPS_PER_PASS  # explain prices through here
    from attrlab.attribution.methods.smoothing import smoothing_requested

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

    Of the settings only ``evaluate`` changes the cost (the trust card's curves). ``target``:
    a target record (an answer, a contrast), whose values on the input may take a forward of
    their own and whose per-step matrix (``per_step``) is priced by :func:`per_step_runs`;
    ``None`` for a class or a next token.

    Raises:
        UnknownMethodError, UnsupportedMethodError, InvalidParameterError: as ``explain``.
    """
    method_cls = get_method(method)
    resolved = method_cls.resolve(adapter, params)
    evaluate = (settings or RunSettings()).evaluate
    return priced(adapter, method_cls, inputs, resolved, evaluate, target, per_step)


def priced(
    adapter: Adapter,
    method_cls: type[AttributionMethod],
    inputs: Inputs,
    params: dict[str, Any],
    evaluate: bool = False,
    target: Target | None = None,
    per_step: bool = False,
    max_rows: int | None = None,
) -> Estimate:
    """
    :func:`estimate` of a method with parameters already resolved (by its ``resolve``).

    ``max_rows``: the most rows of one pass the run holds beside its own batch (a per-step
    matrix's batch of steps, the trust card's scoring batch), as the gate bounds them.
    """
    from attrlab.attribution.metrics.faithfulness import faithfulness_passes

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
        scoring = faithfulness_passes(inputs)
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
        exact=passes.exact,
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
        single = calibration.seconds("forward", 1) + calibration.seconds("backward", 1)
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
