"""
The one gate before a run, which every front end and :func:`~attribution.explain` pass through.

The worker (and through it the CLI, REST, the page and the Space) and the library call it.
Before a model is loaded, :func:`checked_params`: the method exists and its parameters are
valid. With the model, :func:`clear`: the method applies to it and to the input, its
parameters are resolved for it (never changing the caller's dict), and, when the run's
:class:`~attribution.request.run.RunSettings` bound its seconds, the run is priced
(:func:`~attribution.request.estimate.estimate`) and refused when it would take longer. When they
bound its memory, the run's rows per pass are lowered until its estimated peak fits (results do not
change with the batch), and the run is refused when even that does not fit. Several methods
in one run (:func:`clear_shares`) share those seconds equally. The forward-pass budget is held
while the run goes (:meth:`~attribution.request.run.RunContext.plan`): a method stopping early may
spend less than its bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from attrlab.attribution.errors import (
    InvalidInputError,
    TooMuchMemoryError,
    TooSlowError,
)
from attrlab.attribution.methods import get_method
from attrlab.attribution.methods.base import AttributionMethod
from attrlab.attribution.metrics.faithfulness import check_trust_regions
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.calibration import calibrate
from attrlab.attribution.request.estimate import Estimate, priced, study_estimate
from attrlab.attribution.request.params import validate_params
from attrlab.attribution.request.pricing import slot_seconds
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target

__all__ = [
    "DEFAULT_PARAM_LIMITS",
    "WORKLOAD",
    "Cleared",
    "Workload",
    "an_input",
    "check_modality",
    "checked_params",
    "clear",
    "clear_generation",
    "clear_shares",
    "clear_slot",
    "clear_study",
    "lighter",
    "memory_rows",
    "memory_text",
]


class Workload(NamedTuple):
    """What the gate knows of a parameter that sets how large a run is."""

    #: A server's default ceiling per request (``None``: none): at least every method's
    #: default, so a request with default parameters is always accepted.
    ceiling: float | None
    #: Lowering it makes a run faster: a too-slow refusal advises it (in :data:`WORKLOAD`'s order).
    advised: bool
    #: ``(parameter, value)``: the parameter sets no work while that one has that value (the
    #: smoothing copies when smoothing is off), so it is not advised then.
    idle_when: tuple[str, Any] | None = None


#: The parameters that set a run's size, by name.
WORKLOAD: dict[str, Workload] = {
    "n_masks": Workload(8000, True),
    "n_designs": Workload(1024, True),
    "max_evals": Workload(10_000, True),
    "n_steps": Workload(500, True),
    "n_references": Workload(64, True),
    "smoothing_samples": Workload(100, True, idle_when=("smoothing", "none")),
    "window": Workload(None, True),
    "bootstrap": Workload(1000, False),
    "max_tokens": Workload(512, False),
    "batch_size": Workload(64, False),  # a batch of images is held in memory at once
    "internal_batch_size": Workload(64, False),
}
#: Per-request ceilings of a server on the parameters that multiply the work.
DEFAULT_PARAM_LIMITS: dict[str, float] = {
    name: work.ceiling for name, work in WORKLOAD.items() if work.ceiling is not None
}
#: The parameters that set how many rows one pass holds (not what the run computes): the gate
#: lowers them to fit a memory bound.
ROW_PARAMS = ("internal_batch_size", "batch_size")
#: The share of a memory bound a run's estimated peak is fit to. The estimate scales a short
#: calibration by size and reads the CPU's peak from the resident size, which a heap reused
#: from earlier work hides: measured peaks ran up to 28 % over it (2026-12-05).
MEMORY_HEADROOM = 0.7


@dataclass(frozen=True)
class Cleared:
    """
    A run the gate lets through: its method and the parameters it runs with (resolved).

    ``rows``: the most rows one pass may hold within the run's memory bound (``None``: no
    bound), for the passes a parameter does not batch (a per-step matrix's steps, the trust
    card's scoring).
    """

    method: type[AttributionMethod]
    params: dict[str, Any]
    rows: int | None = None


def checked_params(
    method: str, params: Mapping[str, Any] | None, strict: bool = False
) -> dict[str, Any]:
    """
    ``method``'s parameters checked with defaults filled in, before any model is loaded.

    ``strict`` (JSON from REST): values only of their own type.

    Raises:
        UnknownMethodError: no method of that name.
        InvalidParameterError: an unknown parameter or a bad value.
    """
    return validate_params(get_method(method).params, params, strict)


def check_modality(adapter: Adapter, modality: str) -> None:
    """
    Refuse an input of another modality than the model's (``"text"``, ``"image"``, both).

    Raises:
        InvalidInputError: naming both.
    """
    if adapter.modality != modality and modality == "image-text":
        raise InvalidInputError(
            f"give exactly one input: a text or an image; model '{adapter.model_id}' takes "
            f"{an_input(adapter.modality)} (an image with a prompt is a vision-language "
            "model's input)"
        )
    if adapter.modality != modality:
        raise InvalidInputError(
            f"model '{adapter.model_id}' takes {an_input(adapter.modality)} as input, "
            f"but the request gives {an_input(modality)}"
        )


_INPUTS_IN_WORDS = {"image": "an image", "image-text": "an image and a prompt"}


def an_input(modality: str) -> str:
    """An input of ``modality`` in words: "an image", "an image and a prompt" or "text"."""
    return _INPUTS_IN_WORDS.get(modality, "text")


def clear(
    adapter: Adapter,
    method: str,
    inputs: Inputs,
    params: Mapping[str, Any] | None,
    settings: RunSettings,
    runs: int = 1,
    target: Target | None = None,
    per_step: bool = False,
) -> Cleared:
    """
    Let a run of ``method`` on ``inputs`` through, or refuse it before it starts.

    ``runs``: the run is repeated that many times (a check's randomisation steps, an ablation's
    second map), all within ``settings.max_seconds``. ``target`` and ``per_step``: a target
    record and its per-step matrix, priced with the run
    (:func:`~attribution.request.estimate.estimate`).

    Raises:
        UnknownMethodError, UnsupportedMethodError, InvalidParameterError: as their names say.
        InvalidInputError: an input of another modality than the model's.
        TooSlowError: estimated over ``settings.max_seconds``, with the estimate and what to
            lower.
    """
    method_cls = get_method(method)
    check_modality(adapter, inputs.modality)
    check_trust_regions(inputs, settings)
    resolved = method_cls.resolve(adapter, params)
    rows = None
    if settings.max_memory_bytes is not None:
        resolved, rows = _within_memory(
            adapter, method_cls, inputs, resolved, settings, target, per_step
        )
    if settings.max_seconds is not None:
        cost = priced(
            adapter,
            method_cls,
            inputs,
            resolved,
            settings.evaluate,
            target,
            per_step,
            rows,
            settings.evaluate_superpixels,
        )
        if cost.seconds * runs > settings.max_seconds:
            times = f" ({runs} runs of it)" if runs > 1 else ""
            raise TooSlowError(
                f"this request would take {cost.summary()}{times}; this server allows "
                f"{settings.max_seconds:g} s per request: {lighter(method, resolved)}"
            )
    return Cleared(method_cls, resolved, rows)


def _within_memory(
    adapter: Adapter,
    method_cls: type[AttributionMethod],
    inputs: Inputs,
    params: dict[str, Any],
    settings: RunSettings,
    target: Target | None,
    per_step: bool,
) -> tuple[dict[str, Any], int | None]:
    """
    ``params`` with the rows of each pass lowered to fit ``settings.max_memory_bytes``.

    The rows that fit come from the calibration's peak per row on this input's size; the
    method's row parameters (:data:`ROW_PARAMS`) are lowered to them, and the run is priced
    again at those widths. Also the rows that fit (``None``: no bound, or the CPU's peak cannot
    be read here).

    Raises:
        TooMuchMemoryError: even so estimated over the bound (one row does not fit, or a pass
            the method cannot batch holds more).
    """
    rows = memory_rows(adapter, inputs, settings)
    if rows is None:  # no bound, or the CPU's peak cannot be read here
        return params, None
    cost = priced(
        adapter,
        method_cls,
        inputs,
        params,
        settings.evaluate,
        target,
        per_step,
        superpixels=settings.evaluate_superpixels,
    )
    if (cost.peak_memory_bytes or 0) <= _usable(settings):
        return params, rows
    fitted = dict(params)
    for name in {p.name for p in method_cls.params}.intersection(ROW_PARAMS):
        planned = method_cls.planned_passes(adapter, inputs, fitted).batch
        if planned is not None:
            fitted[name] = min(planned, rows)
    cost = priced(
        adapter,
        method_cls,
        inputs,
        fitted,
        settings.evaluate,
        target,
        per_step,
        rows,
        settings.evaluate_superpixels,
    )
    _refuse_over_memory("this request", cost, settings, lighter(method_cls.name, fitted))
    return fitted, rows


def memory_rows(adapter: Adapter, inputs: Inputs, settings: RunSettings) -> int | None:
    """
    The most rows of one pass on ``inputs`` within ``settings.max_memory_bytes`` (at least 1).

    Within :data:`MEMORY_HEADROOM` of the bound, from the model's whole calibration (every
    width measured, so that the peak per row is the same for every request). ``None``: no
    bound, or a CPU whose peak cannot be read.
    """
    if settings.max_memory_bytes is None:
        return None
    calibration = calibrate(adapter)
    calibration.measure_all()
    row, one = calibration.row_bytes(inputs), calibration.peak_bytes(inputs, 1)
    if row is None or one is None:
        return None
    held = one - row  # once per pass, whatever its rows
    return max(1, (_usable(settings) - held) // max(row, 1))


def _usable(settings: RunSettings) -> int:
    """What of the settings' memory bound an estimated peak may take (:data:`MEMORY_HEADROOM`)."""
    return int((settings.max_memory_bytes or 0) * MEMORY_HEADROOM)


def _refuse_over_memory(what: str, cost: Estimate, settings: RunSettings, advice: str) -> None:
    """
    Refuse ``what`` when its estimated peak is over :func:`_usable` of the settings' bound.

    Raises:
        TooMuchMemoryError: naming the estimate, the bound and ``advice``.
    """
    bound = settings.max_memory_bytes
    if bound is None or (cost.peak_memory_bytes or 0) <= _usable(settings):
        return
    raise TooMuchMemoryError(
        f"{what} would need {memory_text(cost)} at its peak; this server allows "
        f"{_bytes(bound)} per request, {MEMORY_HEADROOM:.0%} of it for an estimate: {advice}"
    )


def memory_text(cost: Estimate) -> str:
    """An estimate's peak memory for people: "≈ 1.2 GB of memory on cpu"."""
    return f"≈ {_bytes(cost.peak_memory_bytes or 0)} of memory on {cost.device}"


def _bytes(count: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "bytes" else f"{count:,.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def clear_shares(
    adapter: Adapter,
    methods: Sequence[str],
    inputs: Inputs,
    params: Mapping[str, Mapping[str, Any]] | None,
    settings: RunSettings,
    runs: int = 1,
    applicable_only: bool = False,
) -> dict[str, Cleared]:
    """
    :func:`clear` for each of several methods of one run, each within its share of the seconds.

    Each method gets ``settings.max_seconds / len(methods)``; ``applicable_only`` leaves out
    (uncleared, but counted in the shares) the methods that do not apply to ``adapter``.

    Raises:
        As :func:`clear`.
    """
    share = settings.max_seconds / len(methods) if settings.max_seconds else None
    each = replace(settings, max_seconds=share)
    return {
        method: clear(adapter, method, inputs, (params or {}).get(method), each, runs)
        for method in methods
        if not applicable_only or get_method(method).unsupported_reason(adapter) is None
    }


def clear_study(
    adapter: Adapter,
    study: str,
    parts: Sequence[tuple[Inputs, int, int, int]],
    settings: RunSettings,
    run: RunContext,
    lower: str,
) -> None:
    """
    Let a study (patching, pruning) through, or refuse it before it starts.

    ``parts``: its planned passes per input (:func:`~attribution.request.estimate.study_estimate`),
    their widest batches within :func:`memory_rows` where the study can batch them so.
    Its forward rows are announced to ``run`` (refused over ``settings.max_forward_passes``);
    when the settings bound its seconds or memory, it is priced from the calibration and
    refused when it would take longer or hold more. ``lower``: what to ask for less of.

    Raises:
        BudgetExceededError: more forward passes than the settings allow.
        TooMuchMemoryError: estimated over ``settings.max_memory_bytes``.
        TooSlowError: estimated over ``settings.max_seconds``.
    """
    run.plan(sum(rows for _, rows, _, _ in parts), lower)
    if settings.max_seconds is None and settings.max_memory_bytes is None:
        return
    cost = study_estimate(adapter, study, parts)
    _refuse_over_memory(f"this {study} study", cost, settings, f"lower {lower}")
    if settings.max_seconds is not None and cost.seconds > settings.max_seconds:
        raise TooSlowError(
            f"this {study} study would take {cost.summary()}; this server allows "
            f"{settings.max_seconds:g} s per request: lower {lower}"
        )


def clear_generation(adapter: Adapter, prompt: Inputs, tokens: int, settings: RunSettings) -> None:
    """
    Let the generation of an answer of up to ``tokens`` tokens after ``prompt`` through.

    Priced before it starts, as ``tokens`` forwards on the prompt (an upper bound: the cache
    of keys and values makes each later token cheaper), and refused when that is over the
    settings' seconds or memory. Generating then stops at its next forward once the seconds
    are spent (:func:`~attribution.request.run.cancellable_forwards`).

    Raises:
        TooMuchMemoryError, TooSlowError: estimated over ``settings``' bounds.
    """
    if settings.max_seconds is None and settings.max_memory_bytes is None:
        return
    cost = study_estimate(adapter, "generation", [(prompt, tokens, 0, 1)])
    what = f"generating up to {tokens:,} tokens after this prompt"
    lower = "lower generate or give a shorter prompt"
    _refuse_over_memory(what, cost, settings, lower)
    if settings.max_seconds is not None and cost.seconds > settings.max_seconds:
        raise TooSlowError(
            f"{what} would take {cost.summary()}; this server allows "
            f"{settings.max_seconds:g} s per request: {lower}"
        )


def clear_slot(
    seconds: float | None,
    certain: bool,
    max_slot_s: int,
    method_params: Mapping[str, Mapping[str, Any]],
) -> None:
    """
    Refuse a job whose GPU slot (:func:`~attribution.request.pricing.slot_seconds`) is too long.

    ``seconds``: its price from earlier runs (``None``: not priced yet, never refused);
    ``certain``: the price comes from inputs at least as large (a smaller input's price is a
    guess, and runs to learn more); ``method_params``: each method of the job and its
    parameters, for the advice.

    Raises:
        TooSlowError: over ``max_slot_s``, naming the slot asked for and how to ask for less.
    """
    if seconds is None or not certain or slot_seconds(seconds) <= max_slot_s:
        return
    advice = "; ".join(f"{m}: {lighter(m, p)}" for m, p in method_params.items())
    raise TooSlowError(
        f"this request needs a GPU slot of about {slot_seconds(seconds)} s; this Space's slots "
        f"last at most {max_slot_s} s ({advice})"
    )


def lighter(method: str, params: Mapping[str, Any] | None = None) -> str:
    """
    How to ask for less of ``method`` (a too-slow refusal's advice).

    ``params`` (the run's; those not given take their defaults): a parameter that sets no work
    with them is not advised.
    """
    schema = get_method(method).params
    names = {p.name for p in schema}
    given = {**{p.name: p.default for p in schema}, **(params or {})}

    def at_work(work: Workload) -> bool:
        if work.idle_when is None or params is None:
            return True
        name, idle = work.idle_when
        return given.get(name) != idle

    advice = [
        f"lower {name}"
        for name, work in WORKLOAD.items()
        if work.advised and name in names and at_work(work)
    ]
    if "tolerance" in names:
        advice.append("set a tolerance")
    return ", ".join([*advice, "or give a smaller input"])
