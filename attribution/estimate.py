"""
What a run will cost, before it starts: model passes, seconds and peak device memory.

Passes come from the method's definition (:meth:`AttributionMethod.passes`): exact, or an upper
bound where early stopping may end the run sooner. Seconds and memory come from a calibration
measured once per model, device and input size and kept for the process: one forward of the
input, a forward of a batch of copies (perturbation methods score their inputs in batches, which
costs less per input than one at a time), and a gradient pass, single and batched. On CUDA the
peak memory of those passes is measured too and scaled by the batch size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from attribution.errors import UnsupportedMethodError
from attribution.methods import get_method
from attribution.models.base import Adapter, Inputs
from attribution.params import validate_params
from attribution.perturb import auto_batch_size, repeated

__all__ = ["Calibration", "Estimate", "calibrate", "estimate"]

#: Largest batch the calibration times; larger batches are taken to cost as much per row.
_CALIBRATION_BATCH = 64


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


@dataclass(frozen=True)
class Calibration:
    """Measured costs of one model on one device and input size."""

    forward_s: float
    batched_forward_s: float  # per input, in batches of ``batch``
    backward_s: float  # one gradient pass beyond its forward
    batched_backward_s: float  # per input, in batches of ``batch``
    batch: int
    peak_memory_bytes: int | None  # CUDA: a gradient pass's peak, per input row


_CALIBRATIONS: dict[tuple[Any, ...], Calibration] = {}
_CALIBRATING = threading.Lock()


def calibrate(adapter: Adapter, inputs: Inputs, batch: int | None = None) -> Calibration:
    """
    The calibration of ``adapter`` for inputs of this size (measured on first use).

    ``batch``: rows per batched pass (default: the engine's batch for this input), at most 64.
    """
    batch = max(1, min(batch or auto_batch_size(adapter, inputs), _CALIBRATION_BATCH))
    key = (adapter.model_id, str(adapter.device), inputs.modality, inputs.map_shape, batch)
    with _CALIBRATING:
        if key not in _CALIBRATIONS:
            _CALIBRATIONS[key] = _measure(adapter, inputs, batch)
        return _CALIBRATIONS[key]


def _measure(adapter: Adapter, inputs: Inputs, batch: int) -> Calibration:
    from attribution.explain import explain  # explain imports the methods, which import this

    kwargs = inputs.model_kwargs()
    rows = {k: repeated(v, batch) for k, v in kwargs.items()}

    def forward(arguments: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            adapter.logits(**arguments)

    cuda = adapter.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(adapter.device)
        resting = torch.cuda.memory_allocated(adapter.device)
    single = _best(lambda: forward(kwargs))
    batched = _best(lambda: forward(rows)) / batch
    # a gradient pass: gradient × input spends 2 forwards and 1 backward in all
    gradient = _best(lambda: explain(adapter, "gradient_x_input", inputs))
    backward = max(gradient - 2 * single, 0.0)
    # an integration path of `steps` points in one batch: steps + 3 forwards, steps backwards
    steps = max(batch, 2)
    path = _best(
        lambda: explain(
            adapter,
            "integrated_gradients",
            inputs,
            params={"n_steps": steps, "internal_batch_size": steps},
        ),
    )
    batched_backward = max((path - 3 * single) / steps - batched, 0.0)
    peak = None
    if cuda:
        peak = max(0, torch.cuda.max_memory_allocated(adapter.device) - resting) // batch
    return Calibration(single, batched, backward, batched_backward, batch, peak)


def _best(call: Any, repeats: int = 3) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def estimate(
    adapter: Adapter,
    method: str,
    inputs: Inputs,
    params: dict[str, Any] | None = None,
    evaluate: bool = False,
) -> Estimate:
    """
    The cost of ``explain(adapter, method, inputs, params=params, evaluate=evaluate)``.

    Raises:
        UnknownMethodError, UnsupportedMethodError, InvalidParameterError: as ``explain``.
    """
    from attribution.metrics.faithfulness import faithfulness_passes

    method_cls = get_method(method)
    reason = method_cls.unsupported_reason(adapter)
    if reason is not None:
        raise UnsupportedMethodError(reason)
    passes = method_cls.passes(adapter, inputs, validate_params(method_cls.params, params))
    calibration = calibrate(adapter, inputs, passes.batch)
    own = passes.forward - passes.backward  # forwards without a backward
    if passes.batch is not None:
        seconds = own * calibration.batched_forward_s + passes.backward * (
            calibration.batched_forward_s + calibration.batched_backward_s
        )
    else:
        seconds = own * calibration.forward_s + passes.backward * (
            calibration.forward_s + calibration.backward_s
        )
    forward = passes.forward + 1  # explain's own forward of the input
    seconds += calibration.forward_s
    if evaluate:  # the trust card's curves, scored in batches
        scoring = faithfulness_passes(inputs)
        forward += scoring
        seconds += scoring * calibration.batched_forward_s
    batch = passes.batch or 1  # the widest pass sets the peak
    if evaluate:
        batch = max(batch, auto_batch_size(adapter, inputs))
    memory = None
    if calibration.peak_memory_bytes is not None:
        memory = calibration.peak_memory_bytes * batch
    return Estimate(
        method=method_cls.name,
        forward_passes=forward,
        backward_passes=passes.backward,
        exact=passes.exact,
        seconds=seconds,
        peak_memory_bytes=memory,
        device=str(adapter.device),
    )
