"""
What a model's passes cost on its device: seconds per row and peak memory, measured once.

Each cost (a forward pass, or a gradient pass: a forward from the input's embeddings or pixels
and a backward to them, as the gradient methods spend it) is timed on ``width`` copies of a
fixed short input of the model's own (:func:`reference_input`: never a request's, so that a
request's size cannot change what calibrating costs), since batched rows cost less each. The
passes are the adapter's own, run directly: calibrating runs no attribution method. The peak
memory of those passes beyond the resting weights (:func:`attribution.request.memory.peak_memory`:
torch's allocator on CUDA, the process's resident high-water mark on the CPU) is measured in
the same passes. :mod:`attribution.request.estimate` scales both by the size of the input it prices.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import torch
from PIL import Image

from attrlab.attribution.errors import DeviceMemoryError
from attrlab.attribution.inputs.perturb import repeated
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.vlm import ImagePrompt
from attrlab.attribution.request.memory import peak_memory

__all__ = [
    "ATTENTION_MAPS",
    "REFERENCE_TEXT",
    "Calibration",
    "calibrate",
    "calibrated",
    "reference_input",
]

#: Batch widths the calibration times per device type and pass kind; a batch is priced between
#: the widths around it (linear in log width). A GPU row keeps getting cheaper up to large
#: batches, so wider batches are timed there; a CPU row can get dearer past a few dozen rows
#: (EfficientNet-Lite0's per-row cost nearly doubles from 16 to 64 rows as its activations
#: leave cache). A gradient batch wider than the widest gradient width is priced from the
#: forward's change per row (:meth:`Calibration.seconds`): on the CPU the 64-row gradient pass
#: would be most of a calibration's time (4 s of SmolLM2-135M's), and its cost per row follows
#: the forward's (EfficientNet-Lite0 from 16 to 64 rows: gradient pass ×1.67, forward ×1.76;
#: SmolLM2-135M ×0.75 and ×0.74).
_WIDTHS = {
    ("cpu", "forward"): (1, 16, 64),
    ("cpu", "backward"): (1, 16),
    ("cuda", "forward"): (1, 16, 64, 256, 1024),
    ("cuda", "backward"): (1, 16, 64, 256),
}

#: A pass timed at least this long (seconds) is timed once, in the call that measures its peak:
#: what that first call pays beyond a warm one (fresh memory, new shapes: up to 0.7 s on the
#: CPU) is then a small share of it. A shorter pass is timed again after it.
ONE_CALL_S = 1.0
#: A pass shorter than this (seconds) is timed twice more, the faster counting (timer noise).
SHORT_CALL_S = 0.1

#: The text every text model is calibrated on: short, so that calibrating costs a few of the
#: model's forward and gradient passes on 64 rows of it at most, whatever is asked later.
REFERENCE_TEXT = "The film was long, but the acting was warm and the ending stayed with me."
#: Tensors of one layer's attention maps (heads × T × T) a gradient pass holds at its peak:
#: the scores, the probabilities kept for the backward, and their gradient.
ATTENTION_MAPS = 3


def reference_input(adapter: Adapter) -> Inputs:
    """The fixed input of the model's own that its calibration times (never a request's)."""
    # resized to the model's own input size by its transform or processor, as every image is
    image = Image.new("RGB", (224, 224), (124, 116, 104))
    if adapter.modality == "image":
        return adapter.preprocess(image)
    if adapter.modality == "image-text":
        return adapter.preprocess(ImagePrompt(image, REFERENCE_TEXT))
    return adapter.preprocess(REFERENCE_TEXT)


class Calibration:
    """
    Measured costs of one model on one device and modality, per row of a reference input.

    Each cost is measured the first time an estimate needs it and kept for the process: a
    forward and a gradient pass, one row at a time or in batches of 16 copies, forwards also
    of 64 (on a GPU up to 1024 forward and 256 gradient rows; a width that runs out of memory
    is skipped). Costs scale with the input's size (tokens or pixels) relative to the
    reference input's (:func:`reference_input`, which :func:`calibrate` gives it).
    """

    def __init__(self, adapter: Adapter, inputs: Inputs) -> None:
        self.adapter, self.inputs = adapter, inputs
        self.size = max(1, math.prod(inputs.map_shape))
        #: (kind, width) -> the peak memory of a pass of that many rows on the reference
        self.peaks: dict[tuple[str, int], int] = {}
        self._seconds: dict[tuple[str, int], float] = {}
        self._too_wide: set[tuple[str, int]] = set()  # widths that ran out of device memory
        self._warmed = False  # the model's first pass is run untimed
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
        line = self._memory_line()
        if line is None:
            return None
        size = max(1, math.prod(inputs.map_shape))
        linear = line[0] * size / self.size
        adapter = self.adapter
        growth = 0
        if inputs.modality in ("text", "image-text") and adapter.num_heads:
            itemsize = next(adapter.model.parameters()).element_size()
            maps = ATTENTION_MAPS * adapter.num_layers * adapter.num_heads * itemsize
            growth = maps * max(0, size * size - size * self.size)
        return int(linear + growth)

    def peak_bytes(self, inputs: Inputs, width: int) -> int | None:
        """
        Peak memory of a pass of ``width`` rows on ``inputs``, beyond the resting model.

        What the widest pass measured of the kind that sets :meth:`row_bytes` held beyond its
        rows, plus ``width`` rows. ``None`` as :meth:`row_bytes`.
        """
        row = self.row_bytes(inputs)
        line = self._memory_line()
        if row is None or line is None:
            return None
        return line[1] + row * max(1, width)

    def _memory_line(self) -> tuple[float, int] | None:
        """
        The reference's peak memory per row and what a pass holds once, of the steepest kind.

        Per kind, the slope between its two widest measured widths (one width: all of its
        peak per row) and what its widest pass held beyond that many rows.
        """
        with self._lock:
            lines = []
            for kind in ("forward", "backward"):
                widths = sorted(w for k, w in self.peaks if k == kind)
                if not widths:
                    continue
                wide = widths[-1]
                if len(widths) == 1:
                    slope = self.peaks[kind, wide] / wide
                else:
                    grown = self.peaks[kind, wide] - self.peaks[kind, widths[-2]]
                    slope = max(grown, 0) / (wide - widths[-2])
                lines.append((slope, max(0, int(self.peaks[kind, wide] - wide * slope))))
        return max(lines) if lines else None

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
        """
        Seconds per row of a ``"forward"`` or ``"backward"`` pass in batches of ``batch``.

        A backward: what a gradient pass costs beyond its forward. Wider than every gradient
        width, its cost at the widest changes per row as the forward's does up to the batch.
        """
        widths = self._widths(kind)
        batch = max(1, batch)
        below = max(w for w in widths if w <= batch)
        above = min((w for w in widths if w >= batch), default=None)
        while True:  # the widest width at or below the batch that fits beside the model
            try:
                low = self._seconds_at(kind, below)
                break
            except DeviceMemoryError:
                if below == 1:
                    raise
                above, below = below, max(w for w in widths if w < below)
        if above is None:  # wider than every width of its kind
            if kind == "forward" or batch == below:
                return low
            return low * self.seconds("forward", batch) / self.seconds("forward", below)
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
        """Seconds per row of a ``kind`` pass of ``width`` rows; its peak into :attr:`peaks`."""
        adapter = self.adapter
        # a gradient pass's forward, measured first (its own peak, not inside the gradient's)
        forward = self.seconds("forward", width) if kind == "backward" else 0.0
        call = _gradient_pass if kind == "backward" else _forward_pass
        try:
            if not self._warmed:  # a model's first pass pays once (lazy buffers, paged weights)
                _forward_pass(adapter, self.inputs, 1)()
                self._warmed = True
            spent, peak = _timed(call(adapter, self.inputs, width), adapter.device)
        except torch.cuda.OutOfMemoryError:
            raise DeviceMemoryError(
                f"model '{adapter.model_id}' ran out of GPU memory while calibrating the estimate"
            ) from None
        if peak is not None:
            self.peaks[kind, width] = peak
        return max(spent / width - forward, 0.0)


def _forward_pass(adapter: Adapter, inputs: Inputs, width: int) -> Callable[[], Any]:
    """
    A forward pass of ``width`` copies of ``inputs``, without gradients, as methods batch them.

    Where the inputs hold keywords every row shares (an image and a prompt: the vision tower
    runs once per pass), the attributed input is repeated beside one row of them.
    """
    held = inputs.held_kwargs()
    if held:
        tensor, _ = inputs.attributed()
        rows = {**held, inputs.forward_keys[0]: repeated(tensor.detach(), width)}
    else:
        rows = {key: repeated(value, width) for key, value in inputs.model_kwargs().items()}

    def forward() -> None:
        with torch.no_grad():
            adapter.logits(**rows)

    return forward


def _gradient_pass(adapter: Adapter, inputs: Inputs, width: int) -> Callable[[], Any]:
    """
    A gradient pass of ``width`` copies of ``inputs``, as the gradient methods spend one.

    A forward from what they attribute to (:meth:`~attribution.models.base.TextInputs.attributed`:
    pixels, or token ids taken to their embeddings by the inputs' attribution layer and given
    as ``inputs_embeds``, as integrated gradients gives them), then the gradient of the sum of
    each row's top logit with respect to that input only (no weight gradients, as Captum's).
    """
    tensor, extra = inputs.attributed()
    keys = inputs.forward_keys
    layer = inputs.attribution_layer(adapter)
    if layer is not None:  # token ids are not differentiable: their embeddings are
        with torch.no_grad():
            tensor = layer(tensor)
        keys = ("inputs_embeds", *keys[1:])
    leaf = repeated(tensor.detach(), width).requires_grad_(True)
    rows = {
        **inputs.held_kwargs(),
        **dict(zip(keys, (leaf, *(repeated(e, width) for e in extra)), strict=True)),
    }

    def gradient() -> None:
        with torch.enable_grad():
            logits = adapter.logits(**rows)
            torch.autograd.grad(logits.max(dim=-1).values.sum(), leaf)

    return gradient


def _timed(call: Callable[[], Any], device: torch.device) -> tuple[float, int | None]:
    """
    Seconds of one warm ``call``, and the peak memory of one.

    The first call measures the peak: on the CPU its measure first hands freed memory back to
    the system, so that call also pays for fresh memory (and, on any device, for shapes not
    run before). Its time counts alone where it took :data:`ONE_CALL_S` or more; else the
    fastest of it and the calls after it (two of them where a call is under
    :data:`SHORT_CALL_S`) counts, so that one call slowed by other work does not.
    """

    def run() -> float:
        start = time.perf_counter()
        call()
        if device.type == "cuda":  # kernels run asynchronously: wait for them
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    with peak_memory(device) as peak:
        first = run()
    if first >= ONE_CALL_S:
        return first, peak()
    repeats = 2 if first < SHORT_CALL_S else 1
    return min(first, *(run() for _ in range(repeats))), peak()


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
