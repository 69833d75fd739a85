"""
SmoothGrad, its squared and variance forms, NoiseGrad and NoiseGrad++ over any gradient method.

A gradient map is sharp where the model's function is rough; averaging it over noisy copies
shows the structure that survives the noise. The copies differ in the input (SmoothGrad,
Smilkov et al. 2017, https://arxiv.org/abs/1706.03825: Gaussian noise of standard deviation
``σ·(max − min)`` of the input; text: of the input's token embeddings), in the model
(NoiseGrad, Bykov et al. 2022, https://arxiv.org/abs/2106.10185: every weight multiplied by
its own draw of ``N(1, σ²)``) or in both (NoiseGrad++: one draw of each per copy, an unbiased
estimate of the same double expectation as the paper's grid of N weight by M input draws). Of
the N maps the mode keeps the mean (SmoothGrad, NoiseGrad, NoiseGrad++), the mean of squares
(SmoothGrad², Hooker et al. 2019) or the variance (VarGrad, Adebayo et al. 2018), always of the
method's own map (after its sum over channels or the embedding dimension).

:attr:`AttributionMethod.param_record <attribution.methods.base.AttributionMethod>` of every
gradient-based attribution method derives from :class:`SmoothingParams`; the method base runs
:func:`smoothed` when they ask for it, so no method has code of its own for it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeGuard, cast

import numpy as np
import torch
from torch import nn

from attrlab.attribution.alteration import altered
from attrlab.attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.params import MethodParams, param
from attrlab.attribution.request.run import RunContext

if TYPE_CHECKING:
    from attrlab.attribution.methods.base import Attribution, Passes

__all__ = [
    "SMOOTHING_MODES",
    "SmoothingParams",
    "input_noise",
    "smoothed",
    "smoothed_passes",
    "smoothing_requested",
    "weight_noise",
]


@dataclass(frozen=True)
class SmoothingMode:
    """Where a mode's noise goes and which statistic of the N maps it keeps."""

    inputs: bool
    weights: bool
    statistic: str  # "mean", "mean_square" or "variance"


#: Each value of the ``smoothing`` parameter (besides ``"none"``).
SMOOTHING_MODES: dict[str, SmoothingMode] = {
    "smoothgrad": SmoothingMode(inputs=True, weights=False, statistic="mean"),
    "smoothgrad_sq": SmoothingMode(inputs=True, weights=False, statistic="mean_square"),
    "vargrad": SmoothingMode(inputs=True, weights=False, statistic="variance"),
    "noisegrad": SmoothingMode(inputs=False, weights=True, statistic="mean"),
    "noisegrad++": SmoothingMode(inputs=True, weights=True, statistic="mean"),
}


@dataclass(frozen=True, kw_only=True)
class SmoothingParams(MethodParams):
    """The smoothing parameters, which every gradient-based attribution method's record has."""

    smoothing: str = param(
        "none",
        "Average the map over noisy copies: of the input (smoothgrad; smoothgrad_sq: mean of "
        "squares; vargrad: variance), of the weights (noisegrad) or of both (noisegrad++).",
        choices=("none", *SMOOTHING_MODES),
    )
    smoothing_samples: int = param(20, "Noisy copies averaged over (N).", 1, 1000)
    smoothing_sigma: float = param(
        0.15,
        "Input noise: standard deviation as a share of the input's range (max − min); text: "
        "of its token embeddings.",
        0.0,
        1.0,
    )
    smoothing_weight_sigma: float = param(
        0.2, "Weight noise: each weight multiplied by a draw of N(1, σ²).", 0.0, 1.0
    )


#: Seed streams of the noise, apart from the method's own draws with the run's seed.
_INPUT_STREAM, _WEIGHT_STREAM = 1, 2
# Models whose weights are noisy now: a second noise context on one of them is refused.
_NOISY: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_NOISY_LOCK = threading.Lock()


def smoothing_requested(params: MethodParams) -> TypeGuard[SmoothingParams]:
    """``params`` ask for a smoothed map."""
    return isinstance(params, SmoothingParams) and params.smoothing != "none"


def smoothed_passes(passes: Passes, params: MethodParams, reads_prediction: bool) -> Passes:
    """
    The passes of a smoothed run: the method's, once per sample.

    ``reads_prediction``: each sample also predicts its noisy input (one forward), since the
    method reads that prediction (a convergence delta's ``F(x)``).
    """
    if not smoothing_requested(params):
        return passes
    samples = params.smoothing_samples
    return replace(
        passes,
        forward=samples * (passes.forward + int(reads_prediction)),
        backward=samples * passes.backward,
    )


def _seed(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence((seed, stream)).generate_state(1, dtype=np.uint64)[0])


@contextmanager
def weight_noise(model: nn.Module, sigma: float, seed: int) -> Iterator[Callable[[], None]]:
    """
    Yield ``draw()``: each floating-point parameter becomes its original times ``N(1, σ²)``.

    Every ``draw`` starts from the original weights, with fresh noise from ``seed`` (one
    generator per device). On leaving the block, normally or by an exception, every parameter
    gets its original values back bit for bit (copied into the same storage). The originals are
    one copy of the weights on their device. A second noise context on ``model`` is refused.
    """
    with _NOISY_LOCK:
        if model in _NOISY:
            raise RuntimeError("weight noise is already applied to this model (nested use)")
        _NOISY.add(model)
    try:
        # Light reads of the model wait while its weights are noisy.
        with altered(model):
            yield from _noisy_weights(model, sigma, seed)
    finally:
        with _NOISY_LOCK:
            _NOISY.discard(model)


def _noisy_weights(model: nn.Module, sigma: float, seed: int) -> Iterator[Callable[[], None]]:
    """:func:`weight_noise`'s body: the originals kept, ``draw``, every weight restored."""
    parameters = [p for p in model.parameters() if p.is_floating_point()]
    originals: list[torch.Tensor] = []
    generators: dict[torch.device, torch.Generator] = {}

    def draw() -> None:
        with torch.no_grad():
            for parameter, original in zip(parameters, originals, strict=True):
                device = parameter.device
                if device not in generators:
                    generators[device] = torch.Generator(device).manual_seed(seed)
                wide = torch.promote_types(parameter.dtype, torch.float32)
                factor = 1 + sigma * torch.randn(
                    parameter.shape, generator=generators[device], device=device, dtype=wide
                )
                parameter.copy_((original.to(wide) * factor).to(parameter.dtype))

    try:
        with torch.no_grad():
            originals.extend(p.detach().clone() for p in parameters)
        yield draw
    finally:
        with torch.no_grad():
            for parameter, original in zip(parameters, originals, strict=False):
                parameter.copy_(original)


def _text_noise(
    adapter: Adapter, inputs: TextInputs, sigma: float, generator: torch.Generator
) -> Iterator[Inputs]:
    """
    The input itself, while its token embeddings carry the noise wherever they are computed.

    A forward hook on the token-embedding module adds the noise to every row of token ids equal
    to the input's (so a reference, pad or mask tokens, stays clean); special tokens get none,
    as they are kept by every reference and perturbation.
    """
    embedding = adapter.token_embedding_module()
    ids = inputs.input_ids
    with torch.no_grad():
        clean = embedding(ids)
    free = ~inputs.fixed_tokens.to(clean.device).view(1, -1, 1)
    values = clean.masked_select(free.expand_as(clean))
    spread = float(values.max() - values.min()) if values.numel() else 0.0
    epsilon = torch.randn(clean.shape, generator=generator, dtype=torch.float64)
    noise = (sigma * spread * epsilon).to(clean.device, clean.dtype) * free

    def hook(_module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        given = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
        if given is None or given.shape[-1] != ids.shape[-1]:
            return output
        rows = (given.view(-1, ids.shape[-1]) == ids).all(-1).view(-1, 1, 1)
        return output + noise * rows.to(output.dtype)

    with altered(adapter.model):  # light reads wait while the embeddings carry the noise
        handle = embedding.register_forward_hook(hook, with_kwargs=True)
        try:
            yield inputs
        finally:
            handle.remove()


def _image_noise(
    adapter: Adapter, inputs: ImageInputs, sigma: float, generator: torch.Generator
) -> Iterator[Inputs]:
    """A copy of the input whose normalised pixels carry the noise."""
    pixels = inputs.pixel_values
    spread = float(pixels.max() - pixels.min())
    epsilon = torch.randn(pixels.shape, generator=generator, dtype=torch.float64)
    yield replace(inputs, pixel_values=pixels + (sigma * spread * epsilon).to(pixels))


def _block_noise(
    adapter: Adapter, inputs: ImageTextInputs, sigma: float, generator: torch.Generator
) -> Iterator[Inputs]:
    """A copy of the input whose first-block input carries the noise (fixed tokens none)."""
    hidden = inputs.block_input
    free = ~inputs.fixed_tokens.to(hidden.device).view(1, -1, 1)
    values = hidden.masked_select(free.expand_as(hidden))
    spread = float(values.max() - values.min()) if values.numel() else 0.0
    epsilon = torch.randn(hidden.shape, generator=generator, dtype=torch.float64)
    yield replace(inputs, block_input=hidden + (sigma * spread * epsilon).to(hidden) * free)


_INPUT_NOISE: dict[str, Callable[..., Iterator[Inputs]]] = {
    "text": _text_noise,
    "image": _image_noise,
    "image-text": _block_noise,
}


@contextmanager
def input_noise(
    adapter: Adapter, inputs: Inputs, sigma: float, generator: torch.Generator
) -> Iterator[Inputs]:
    """
    Inputs with one draw of Gaussian noise ``σ·(max − min)·ε`` (ε from ``generator``, float64).

    Images: normalised pixels (a copy). Text: the token embeddings, through a hook removed on
    leaving the block.
    """
    yield from _INPUT_NOISE[inputs.modality](adapter, inputs, sigma, generator)


class _Moments:
    """Running mean and sum of squared deviations of equally shaped arrays (Welford's update)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None
        self.squares: np.ndarray | None = None

    def add(self, value: np.ndarray) -> None:
        value = np.asarray(value, dtype=np.float64)
        if self.mean is None or self.squares is None:
            self.count, self.mean, self.squares = 1, value.copy(), np.zeros_like(value)
            return
        self.count += 1
        delta = value - self.mean
        self.mean = self.mean + delta / self.count
        self.squares = self.squares + delta * (value - self.mean)

    def statistic(self, name: str) -> np.ndarray:
        mean, squares = cast(np.ndarray, self.mean), cast(np.ndarray, self.squares)
        variance = squares / self.count
        return {"mean": mean, "mean_square": variance + mean**2, "variance": variance}[name]


def _sample(
    attribute: Callable[[Inputs, RunContext], Attribution],
    noisy: Inputs,
    run: RunContext,
    sample: int,
    samples: int,
) -> Attribution:
    """One noisy copy in a run of its own, whose passes, warnings and progress go to ``run``."""

    def progress(done: int, total: int) -> None:
        if run.progress is not None:
            run.progress(sample * total + done, samples * total)

    own = RunContext(seed=run.seed, progress=progress, cancel=run.cancel)
    result = attribute(noisy, own)
    run.count(forward=own.forward_passes, backward=own.backward_passes)
    for warning in own.warnings:
        if warning not in run.warnings:
            run.warn(warning)
    return result


def smoothed(
    attribute: Callable[[Inputs, RunContext], Attribution],
    adapter: Adapter,
    inputs: Inputs,
    params: SmoothingParams,
    run: RunContext,
    planned: Passes,
) -> Attribution:
    """
    ``attribute`` (one method on one input) on noisy copies of ``inputs``, as ``params`` ask.

    Each copy runs in a run of its own with the run's seed (the method's own draws, such as
    DeepLIFT-SHAP's references, stay the same) and no prediction (a method that reads it
    predicts the noisy input); its passes and warnings count in ``run``. Progress is reported
    and cancellation checked per sample. ``scores``, ``positional_scores`` and ``maps`` get
    the mode's statistic; ``metrics`` and the ``layers`` values are means over the samples.
    ``planned`` (the whole smoothed run's passes, :func:`smoothed_passes`) is announced to the
    run's budget before the first sample.
    """
    mode = SMOOTHING_MODES[params.smoothing]
    samples = params.smoothing_samples
    run.plan(planned.forward, "smoothing_samples")
    generator = torch.Generator().manual_seed(_seed(run.seed, _INPUT_STREAM))
    arrays: dict[str, _Moments] = {}
    metrics: dict[str, _Moments] = {}
    first: Attribution | None = None
    weights = (
        weight_noise(adapter.model, params.smoothing_weight_sigma, _seed(run.seed, _WEIGHT_STREAM))
        if mode.weights
        else nullcontext(lambda: None)
    )
    with weights as draw:
        for sample in range(samples):
            run.step(sample, samples)
            draw()
            noisy = (
                input_noise(adapter, inputs, params.smoothing_sigma, generator)
                if mode.inputs
                else nullcontext(inputs)
            )
            with noisy as given:
                result = _sample(attribute, given, run, sample, samples)
            named = {"scores": result.scores, "positional_scores": result.positional_scores}
            named |= {f"maps/{key}": value for key, value in result.maps.items()}
            if result.layers is not None:
                named["layers"] = result.layers["value"].to_numpy()
            for key, value in named.items():
                if value is not None:
                    arrays.setdefault(key, _Moments()).add(value)
            for key, number in result.metrics.items():
                metrics.setdefault(key, _Moments()).add(np.array(number))
            first = first or result
    run.step(samples, samples)
    assert first is not None  # the schema asks for one sample at least
    statistic = {key: moments.statistic(mode.statistic) for key, moments in arrays.items()}
    layers = None
    if first.layers is not None:
        layers = first.layers.copy()
        layers["value"] = arrays["layers"].statistic("mean")
    return replace(
        first,
        scores=statistic["scores"],
        positional_scores=statistic.get("positional_scores"),
        maps={key: statistic[f"maps/{key}"] for key in first.maps},
        metrics={key: float(moments.statistic("mean")) for key, moments in metrics.items()},
        layers=layers,
    )
