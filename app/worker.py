"""
The only place that touches the device: model cache, one job at a time, progress, cancel.

Every front end submits here, so the server's settings (which models, how large an input, how
many forward passes) are enforced once, for the REST API and the web page alike.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from transformers.utils import logging as hf_logging

from attrlab.app.settings import ServerSettings
from attrlab.attribution import engine, explain, layers, load, metrics, patching
from attrlab.attribution.alteration import unaltered
from attrlab.attribution.answers import AnswerSpec
from attrlab.attribution.calibration import calibrate, calibrated
from attrlab.attribution.defaults import (
    EVALUATE_ORDERS,
    NOISE_SEEDS,
    PATCHING_TOP_K,
    PRUNING_DRAWS,
    TOP_FRACTION,
)
from attrlab.attribution.errors import (
    AttrlabError,
    InvalidInputError,
    InvalidParameterError,
)
from attrlab.attribution.estimate import estimate
from attrlab.attribution.explain import preview
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.features import check_features
from attrlab.attribution.gate import checked_params, clear_shares
from attrlab.attribution.models import DEFAULT_MODELS, Adapter, Inputs, load_image
from attrlab.attribution.models.loading import resolve_device
from attrlab.attribution.models.placement import placement_of, private_offload
from attrlab.attribution.run import ProgressCallback, RunSettings, stop_if_cancelled
from attrlab.attribution.runs import Prepared, explain_rows, prepare_input
from attrlab.attribution.target import Target

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from attrlab.attribution.engine.study import PruningStudy
    from attrlab.attribution.estimate import Estimate
    from attrlab.attribution.explain import Preview
    from attrlab.attribution.layers import HeadAblation
    from attrlab.attribution.metrics import EvalItem
    from attrlab.attribution.metrics.check import MethodCheck
    from attrlab.attribution.patching import PatchingReport

__all__ = [
    "MAX_ABLATED_HEADS",
    "AblationRequest",
    "AttentionRequest",
    "BatchRequest",
    "CheckRequest",
    "EstimateRequest",
    "EvaluateRequest",
    "ExplainRequest",
    "ExplainWorker",
    "InputRequest",
    "Instance",
    "InstanceInterruptedError",
    "InstanceResults",
    "Job",
    "JobTableBusyError",
    "PatchRequest",
    "PreviewRequest",
    "PruneRequest",
    "QueueFullError",
    "WorkerClosedError",
    "WorkerRequest",
    "check_instance_features",
    "parse_param_pairs",
    "visible_devices",
]


#: What a job computes: an Explanation, a check of several methods, a preview, a table.
Result = TypeVar("Result")


log = logging.getLogger(__name__)


class InstanceFailedError(AttrlabError):
    """An unexpected failure (a bug) while explaining one instance of a batch."""


class InstanceInterruptedError(AttrlabError):
    """A job's instance not run again: the server stopped in its runs (killed, say) twice."""


class QueueFullError(AttrlabError):
    """As many requests as the server allows are already waiting; try again shortly."""


class WorkerClosedError(AttrlabError):
    """The worker is shutting down and takes no new work."""


class JobTableBusyError(AttrlabError):
    """The job table cannot be used now: locked by another process, read-only, or no room."""


def parse_param_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["n_steps=20", ...]`` -> ``{"n_steps": "20"}``; values are typed by the method schema."""
    params = {}
    for pair in (p.strip() for p in pairs):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidParameterError(f"parameters are written key=value; got {pair!r}")
        params[key.strip()] = value.strip()
    return params


@dataclass(frozen=True, kw_only=True)
class Instance:
    """
    One input: a text or an image, and the output to explain.

    ``image`` holds encoded image bytes or a decoded array, never a path: front ends that read
    files (the CLI) read them before building the request. With ``answer`` the text is a
    decoder LM's prompt, and what is explained is the answer it asks about (given, generated,
    contrasted: :class:`~attribution.answers.AnswerSpec`), not ``target``. A text is explained
    at ``granularity`` (``spans``: the character spans of ``span``; :mod:`attribution.features`).
    """

    text: str | None = None
    image: Any = None
    target: int | str | None = None
    answer: AnswerSpec | None = None
    granularity: str = "token"
    spans: Sequence[Sequence[int]] | None = None
    #: Why the input could not even be read (undecodable base64): its job reports this.
    problem: str | None = None

    @property
    def modality(self) -> str:
        """``"text"`` or ``"image"``, refusing inputs that give both or neither."""
        if (self.text is None) == (self.image is None):
            raise InvalidInputError("give exactly one input: a text or an image")
        return "text" if self.text is not None else "image"


def check_instance_features(
    instances: Sequence[Any], name: Callable[[int, Any], str] | None = None
) -> None:
    """
    Refuse the first of a batch's instances whose granularity or spans cannot be explained.

    ``instances``: anything with ``granularity``, ``spans`` and ``text`` (an :class:`Instance`,
    a REST body's, a dataset row); one that carries its ``problem`` already is left to report
    it. Needs no model: a batch, a job or a dataset is refused before any work, naming the
    instance: ``name(number, instance)``, by default ``instances[number]``.

    Raises:
        InvalidInputError, InvalidParameterError: as :func:`~attribution.features.check_features`,
            prefixed with the instance's name.
    """
    for number, instance in enumerate(instances):
        if getattr(instance, "problem", None) is None:
            try:
                check_features(instance.granularity, instance.spans, instance.text)
            except AttrlabError as err:
                named = name(number, instance) if name else f"instances[{number}]"
                raise type(err)(f"{named}: {err}") from None


@dataclass(frozen=True, kw_only=True)
class WorkerRequest(ABC, Generic[Result]):
    """What every job names: a model (with zero-shot labels), a seed, next-token or not."""

    model: str
    labels: Sequence[str] | None = None
    seed: int = 0
    next_token: bool = False  # the model must be a decoder LM; its next token is explained

    def check(self, settings: ServerSettings) -> None:
        """Refuse, before queueing, what is out of this server's bounds."""
        settings.check_request(None, self.labels, None, self.seed)

    @abstractmethod
    def method_params(self) -> dict[str, dict[str, Any]]:
        """Method name -> the parameters the job runs it with."""

    @abstractmethod
    def run_on(self, adapter: Adapter, run: JobContext) -> Result:
        """Compute the job's result on the loaded model."""

    def costs(self) -> list[EstimateRequest]:
        """The estimates whose sum prices this job (none where it has no estimate)."""
        return []

    def reads_only(self, adapter: Adapter) -> bool:
        """
        Whether this request only reads ``adapter``'s own outputs (a few plain passes).

        Such a request on a model already loaded runs beside a long job (the worker's light
        path) instead of queueing behind it; see :mod:`attribution.alteration`.
        """
        return False


@dataclass(frozen=True, kw_only=True)
class InputRequest(WorkerRequest[Result], Instance):
    """A job on one input."""

    def check(self, settings: ServerSettings) -> None:
        """Exactly one input, and every field within this server's bounds."""
        self.modality  # noqa: B018 - raises for both or neither
        settings.check_request(self.text, self.labels, self.target, self.seed, self.answer)
        check_features(self.granularity, self.spans, self.text)


@dataclass(frozen=True, kw_only=True)
class ExplainRequest(InputRequest[Explanation]):
    """One explanation to compute: a model, a method and a text or an image."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    evaluate: bool = False  # add the map's faithfulness scores (the trust card) to metrics

    def method_params(self) -> dict[str, dict[str, Any]]:
        """The one method and its parameters."""
        return {self.method: self.params}

    def costs(self) -> list[EstimateRequest]:
        """The estimate of this explanation."""
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self)}
        return [EstimateRequest(**fields)]

    def run_on(self, adapter: Adapter, run: JobContext) -> Explanation:
        """The explanation (refused first when its estimate is over the server's seconds)."""
        ready = run.targeted(self)
        return explain(
            adapter,
            self.method,
            ready.inputs,
            target=ready.target,
            params=self.params,
            settings=run.settings_for(self.seed, self.evaluate),
            per_step=ready.per_step,
        )


@dataclass(frozen=True, kw_only=True)
class EstimateRequest(InputRequest["Estimate"]):
    """What an explanation would cost, without running it."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    evaluate: bool = False

    def method_params(self) -> dict[str, dict[str, Any]]:
        """The one method and its parameters."""
        return {self.method: self.params}

    def reads_only(self, adapter: Adapter) -> bool:
        """
        Once the model is calibrated: pricing is arithmetic and at most a tokenisation.

        A calibration times passes on the device: beside a job it would measure a shared
        device and misprice every later request, so it queues like a job.
        """
        return calibrated(adapter)

    def run_on(self, adapter: Adapter, run: JobContext) -> Estimate:
        """The estimate; the first on a model calibrates every batch width of its device."""
        settings = run.settings_for(self.seed, self.evaluate)
        ready = run.targeted(self)
        calibrate(adapter).measure_all()  # later estimates run no pass: light
        record = ready.target if isinstance(ready.target, Target) else None  # an answer's
        return estimate(
            adapter, self.method, ready.inputs, self.params, settings, record, ready.per_step
        )


@dataclass(frozen=True, kw_only=True)
class CheckRequest(InputRequest["MethodCheck"]):
    """
    Several methods on one input, compared.

    Their maps' agreement and (``randomise``) each map's randomisation check
    (:func:`attribution.metrics.check.check_methods`).
    """

    methods: tuple[str, ...]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per method
    randomise: bool = False
    top_fraction: float = TOP_FRACTION
    evaluate: bool = False  # each map's faithfulness scores (the trust card) in its metrics

    def method_params(self) -> dict[str, dict[str, Any]]:
        """Each method and its parameters."""
        return {method: self.params.get(method, {}) for method in self.methods}

    def run_on(self, adapter: Adapter, run: JobContext) -> MethodCheck:
        """The explanations, their agreement and the randomisation checks."""
        ready = run.targeted(self)
        return metrics.check_methods(
            adapter,
            self.methods,
            ready.inputs,
            ready.target,
            self.params,
            self.randomise,
            self.top_fraction,
            run.settings_for(self.seed, self.evaluate),
            ready.per_step,
        )


@dataclass(frozen=True, kw_only=True)
class PreviewRequest(InputRequest["Preview"]):
    """What the model predicts for one input and which methods apply, before choosing one."""

    def method_params(self) -> dict[str, dict[str, Any]]:
        """No method runs."""
        return {}

    def reads_only(self, adapter: Adapter) -> bool:
        """One plain forward pass."""
        return True

    def run_on(self, adapter: Adapter, run: JobContext) -> Preview:
        """The top predictions (one forward pass) and each method's applicability."""
        return preview(adapter, run.prepare(self))


#: The most heads one :class:`AblationRequest` zeroes.
MAX_ABLATED_HEADS = 64
#: Bounds of an :class:`EvaluateRequest`'s curves: the trust card's own steps, which its
#: estimate prices, and the most random orders an item's reference may draw.
MAX_CURVE_STEPS = 50
MAX_ORDERS = EVALUATE_ORDERS


@dataclass(frozen=True, kw_only=True)
class AblationRequest(InputRequest["HeadAblation"]):
    """
    One method's map of one input, then again with chosen heads zeroed.

    :func:`attribution.layers.ablate_heads_and_explain`: the same class explained both times.
    """

    method: str
    heads: tuple[tuple[int, int], ...]
    params: dict[str, Any] = field(default_factory=dict)

    def check(self, settings: ServerSettings) -> None:
        """One to :data:`MAX_ABLATED_HEADS` heads (whether the model has them is its job's)."""
        super().check(settings)
        _one_output(self.answer, "a head ablation")
        if not self.heads or len(self.heads) > MAX_ABLATED_HEADS:
            raise InvalidParameterError(
                f"name 1 to {MAX_ABLATED_HEADS} (layer, head) pairs to ablate; got "
                f"{len(self.heads)}"
            )

    def method_params(self) -> dict[str, dict[str, Any]]:
        """The one method and its parameters."""
        return {self.method: self.params}

    def costs(self) -> list[EstimateRequest]:
        """The method's estimate, once for the plain map and once for the ablated one."""
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self)}
        fields.pop("heads")
        cost = EstimateRequest(**fields)
        return [cost, cost]

    def run_on(self, adapter: Adapter, run: JobContext) -> HeadAblation:
        """Both maps (refused first when their estimate is over the server's seconds)."""
        return layers.ablate_heads_and_explain(
            adapter,
            self.method,
            run.prepare(self),
            self.target,
            self.heads,
            self.params,
            run.settings_for(self.seed),
        )


@dataclass(frozen=True, kw_only=True)
class PatchRequest(WorkerRequest["PatchingReport"]):
    """
    Activation patching of a transformer and its estimators (:mod:`attribution.patching`).

    ``clean`` and ``corrupted`` texts of the same token length, or ``noise_positions`` (the
    clean text's token positions whose embeddings get causal tracing's Gaussian noise,
    ``noise_seeds`` draws). On a decoder LM the target is ``answer`` (default: the model's next
    token), or ``answer`` rather than ``contrast``; on a text classifier the class ``target``
    (default: the clean text's top class). ``components``, ``estimators``, ``directions``:
    ``None`` for all.
    """

    clean: str
    corrupted: str | None = None
    answer: str | None = None
    contrast: str | None = None
    target: int | str | None = None
    noise_positions: tuple[int, ...] | None = None
    noise_seeds: int = NOISE_SEEDS
    components: tuple[str, ...] | None = None
    estimators: tuple[str, ...] | None = None
    directions: tuple[str, ...] | None = None
    top_k: int = PATCHING_TOP_K

    def check(self, settings: ServerSettings) -> None:
        """The texts within this server's bounds, one corruption, and known study names."""
        for text in (self.corrupted, self.answer, self.contrast):
            settings.check_request(text, None, None, self.seed)
        settings.check_request(self.clean, self.labels, self.target, self.seed)
        if (self.corrupted is None) == (self.noise_positions is None):
            raise InvalidInputError(
                "give a corrupted prompt, or noise positions of the clean one (causal tracing)"
            )
        patching.check_study(
            self.estimators, self.components, self.directions
        )  # before any queueing

    def method_params(self) -> dict[str, dict[str, Any]]:
        """No registered method: patching is its own study."""
        return {}

    def run_on(self, adapter: Adapter, run: JobContext) -> PatchingReport:
        """The study under the job's budget, progress and cancel switch."""
        noise = None
        if self.noise_positions is not None:
            noise = patching.GaussianNoise(self.noise_positions, self.noise_seeds, seed=self.seed)
        problem = patching.patching_problem(
            adapter, self.clean, self.corrupted, self.answer, self.contrast, noise, self.target
        )
        return patching.patching_report(
            adapter,
            problem,
            self.estimators,
            self.components,
            self.directions,
            run.settings_for(self.seed),
            self.top_k,
        )


@dataclass(frozen=True, kw_only=True)
class PruneRequest(WorkerRequest["PruningStudy"]):
    """
    Layer and head pruning curves (:func:`attribution.engine.study.pruning_study`).

    The layers and heads are ranked on ``text`` for ``target``, or for a decoder's ``answer``
    (rather than ``contrast``; with ``corrupted``, exact residual patching ranks the layers
    too), and pruned over ``texts`` (``None``: the bundled sentences). ``units``: ``None`` for
    every registered unit kind. ``agreement``: each site also removed alone, and each ranking
    scored against those exact effects.
    """

    text: str
    target: int | str | None = None
    answer: str | None = None
    contrast: str | None = None
    corrupted: str | None = None
    texts: tuple[str, ...] | None = None
    units: tuple[str, ...] | None = None
    draws: int = PRUNING_DRAWS
    head_step: int | None = None
    agreement: bool = False

    def check(self, settings: ServerSettings) -> None:
        """Every text within this server's bounds, and no more dataset texts than a study takes."""
        if self.units is not None:
            engine.check_unit_kinds(self.units)
        settings.check_request(self.text, self.labels, self.target, self.seed)
        for text in (self.answer, self.contrast, self.corrupted, *(self.texts or ())):
            settings.check_request(text, None, None, self.seed)
        if self.texts is not None and not 1 <= len(self.texts) <= engine.MAX_TEXTS:
            raise InvalidInputError(
                f"give 1 to {engine.MAX_TEXTS} texts to prune over; got {len(self.texts)}"
            )

    def method_params(self) -> dict[str, dict[str, Any]]:
        """No registered method: pruning is its own study."""
        return {}

    def run_on(self, adapter: Adapter, run: JobContext) -> PruningStudy:
        """The study, priced and refused over the job's budgets before any work."""
        inputs, target, problem = engine.ranked_input(
            adapter, self.text, self.target, self.answer, self.contrast, self.corrupted
        )
        return engine.pruning_study(
            adapter,
            inputs,
            target,
            texts=self.texts,
            problem=problem,
            units=self.units or None,
            draws=self.draws,
            head_step=self.head_step,
            settings=run.settings_for(self.seed),
            agreement=self.agreement,
        )


@dataclass(frozen=True, kw_only=True)
class AttentionRequest(InputRequest["np.ndarray"]):
    """
    One head's attention pattern on one input, as it is (nothing ablated): one forward pass.

    :func:`attribution.layers.head_attention`: queries × keys over the visible tokens.
    """

    layer: int
    head: int

    def method_params(self) -> dict[str, dict[str, Any]]:
        """No method runs."""
        return {}

    def run_on(self, adapter: Adapter, run: JobContext) -> np.ndarray:
        """The attention weights (a layer or head the model lacks is refused by name)."""
        return layers.head_attention(adapter, run.prepare(self), self.layer, self.head)


@dataclass(frozen=True, kw_only=True)
class EvaluateRequest(WorkerRequest["pd.DataFrame"]):
    """
    Which method to believe for a model: each method on the bundled items, scored.

    :func:`attribution.metrics.evaluate_methods` on the first ``items`` of
    :func:`attribution.metrics.bundled_items` (all of them by default); one row per item and
    method that applies.
    """

    modality: str
    methods: tuple[str, ...]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per method
    items: int | None = None
    steps: int = 20
    random_orders: int = EVALUATE_ORDERS
    #: An uploaded set to evaluate instead of the bundled items (its first ``items``).
    instances: tuple[Instance, ...] = ()

    def check(self, settings: ServerSettings) -> None:
        """A known modality, methods, items and curve sizes within bounds, readable inputs."""
        super().check(settings)
        if self.modality not in metrics.SCORES:
            raise InvalidParameterError(
                f"the modality is one of {', '.join(metrics.SCORES)}; got {self.modality!r}"
            )
        if not self.methods:
            raise InvalidParameterError("name at least one method to evaluate")
        if self.items is not None and self.items < 1:
            raise InvalidParameterError(f"evaluate at least 1 item; got {self.items}")
        if not 1 <= self.steps <= MAX_CURVE_STEPS or not 0 <= self.random_orders <= MAX_ORDERS:
            raise InvalidParameterError(
                f"steps must lie in 1..{MAX_CURVE_STEPS} and random_orders in 0..{MAX_ORDERS}; "
                f"got {self.steps} and {self.random_orders}"
            )
        if settings.max_batch is not None and len(self.instances) > settings.max_batch:
            raise InvalidParameterError(
                f"an evaluation holds at most {settings.max_batch} uploaded items on this "
                f"server; got {len(self.instances)}"
            )
        for number, instance in enumerate(self.instances, start=1):
            if instance.problem is not None:
                raise InvalidInputError(f"item {number}: {instance.problem}")
            if instance.answer is not None:
                raise InvalidInputError(
                    f"item {number} asks about an answer; an evaluation scores each item's "
                    "prediction"
                )
            settings.check_request(instance.text, None, instance.target, self.seed)
            if instance.modality != self.modality:
                raise InvalidInputError(
                    f"item {number} is {_article(instance.modality)}; this evaluation takes "
                    f"{self.modality}"
                )
        _params_only_for(self.params, self.methods, "evaluated")

    def method_params(self) -> dict[str, dict[str, Any]]:
        """Each method and its parameters."""
        return {method: self.params.get(method, {}) for method in self.methods}

    def chosen_items(self, read: Callable[[Instance], Any] | None = None) -> list[EvalItem]:
        """
        The items evaluated: the uploaded ones, else the bundled ones (the first ``items``).

        ``read`` decodes an uploaded one within the server's bounds (without it, as uploaded).
        """
        if self.instances:
            chosen = self.instances[: self.items]
            return [
                metrics.EvalItem(
                    read(i) if read else i.text if i.text is not None else i.image,
                    i.target,
                    f"item {n}",
                )
                for n, i in enumerate(chosen, start=1)
            ]
        return metrics.bundled_items(self.modality)[: self.items]

    def costs(self) -> list[EstimateRequest]:
        """
        An explanation with its trust card per item and method (an unreadable item is refused).

        The trust card's curves are the largest an evaluation may ask for, so this is an upper
        bound.
        """
        for number, instance in enumerate(self.instances, start=1):
            if instance.problem is not None:
                raise InvalidInputError(f"item {number}: {instance.problem}")
        return [
            EstimateRequest(
                model=self.model,
                labels=self.labels,
                seed=self.seed,
                text=item.raw if isinstance(item.raw, str) else None,
                image=None if isinstance(item.raw, str) else item.raw,
                target=item.target,
                method=method,
                params=self.params.get(method, {}),
                evaluate=True,
            )
            for item in self.chosen_items()
            for method in self.methods
        ]

    def run_on(self, adapter: Adapter, run: JobContext) -> pd.DataFrame:
        """The per-item table (refused first when its estimate is over the server's seconds)."""
        if adapter.modality != self.modality:
            raise InvalidInputError(
                f"model '{adapter.model_id}' takes {_article(adapter.modality)} as input; "
                f"these {self.modality} items do not fit it"
            )
        items = self.chosen_items(run.read)
        total = len(items)
        first = adapter.preprocess(items[0].raw)
        settings = run.settings_for(self.seed, evaluate=True)
        # each item's explanation and scores within the method's share of the server's seconds
        clear_shares(
            adapter, self.methods, first, self.params, settings, runs=total, applicable_only=True
        )
        run.progress(0, total)
        return metrics.evaluate_methods(
            adapter,
            items,
            self.methods,
            self.params,
            self.steps,
            self.random_orders,
            settings,
            progress=lambda done: run.progress(done, total),
        )


#: One instance's results: method name -> its Explanation, or the error that stopped it.
InstanceResults = dict[str, "Explanation | AttrlabError"]


@dataclass(frozen=True, kw_only=True)
class BatchRequest(WorkerRequest[list[InstanceResults]]):
    """
    Several methods on several inputs, in order, as one job.

    An input that cannot be explained (empty, unreadable, too large, a target the model does
    not have) gets its error and the others go on; each explanation has the server's
    forward-pass budget of one request.
    """

    instances: tuple[Instance, ...]
    methods: tuple[str, ...]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per method
    evaluate: bool = False

    def check(self, settings: ServerSettings) -> None:
        """At least one method and one instance, and no more instances than allowed."""
        super().check(settings)
        if not self.methods or not self.instances:
            raise InvalidParameterError("a batch needs at least one method and one instance")
        check_instance_features(self.instances)
        if settings.max_batch is not None and len(self.instances) > settings.max_batch:
            raise InvalidParameterError(
                f"a batch holds at most {settings.max_batch} instances on this server; got "
                f"{len(self.instances)} (send a job for more)"
            )
        _params_only_for(self.params, self.methods, "run")

    def method_params(self) -> dict[str, dict[str, Any]]:
        """Each method and its parameters."""
        return {method: self.params.get(method, {}) for method in self.methods}

    def costs(self) -> list[EstimateRequest]:
        """One estimate per instance and method."""
        return [
            EstimateRequest(
                model=self.model,
                labels=self.labels,
                seed=self.seed,
                next_token=self.next_token,
                text=instance.text,
                image=instance.image,
                target=instance.target,
                answer=instance.answer,
                granularity=instance.granularity,
                spans=instance.spans,
                problem=instance.problem,
                method=method,
                params=self.params.get(method, {}),
                evaluate=self.evaluate,
            )
            for instance in self.instances
            for method in self.methods
        ]

    def run_on(self, adapter: Adapter, run: JobContext) -> list[InstanceResults]:
        """Each instance's explanations or errors; a cancelled job stops as a whole."""
        total = len(self.instances) * len(self.methods)

        def failed(number: int, method: str | None) -> AttrlabError:
            # a bug on one input must not sink the others
            if method is None:
                log.exception("reading instance %d failed", number)
                return InstanceFailedError(
                    "this input could not be read inside attrlab; the server log has the details"
                )
            log.exception("explaining instance %d with %s failed", number, method)
            return InstanceFailedError(
                f"{method} failed on this input inside attrlab; the server log has the details"
            )

        run.progress(0, total)
        rows = explain_rows(
            adapter,
            self.instances,
            self.methods,
            run.targeted,
            params=self.params,
            settings=run.settings_for(self.seed, self.evaluate),
            progress=lambda done: run.progress(done * len(self.methods), total),
            record_errors=failed,
        )
        return [row.outcomes for row in rows]


@dataclass(frozen=True)
class JobContext:
    """What the worker hands a job: its progress, cancel switch and budgets, its input decoder."""

    #: The job's progress and cancel switch, and the server's budgets of one request.
    settings: RunSettings
    #: An instance checked against the server's bounds and the model, decoded, preprocessed.
    prepare: Callable[[Instance], Inputs]
    #: The same with what it explains: its target, or the answer it asks about.
    targeted: Callable[[Instance], Prepared]
    #: The same, decoded only: a text, or an image within the server's pixel limit.
    read: Callable[[Instance], Any]

    def settings_for(self, seed: int, evaluate: bool = False) -> RunSettings:
        """The settings of a run of this job: its seed and trust card, the job's budgets."""
        return replace(self.settings, seed=seed, evaluate=evaluate)

    def progress(self, done: int, total: int) -> None:
        """Report the job's progress."""
        if self.settings.progress is not None:
            self.settings.progress(done, total)


@dataclass(eq=False)  # identity: jobs are kept in a set while they wait or run
class Job(Generic[Result]):
    """A submitted request: its future result, progress and a cancel switch."""

    future: Future[Result]
    cancel_event: threading.Event
    progress: tuple[int, int] = (0, 0)

    def cancel(self) -> None:
        """Ask the job to stop at its next forward pass or step (a queued one never starts)."""
        self.cancel_event.set()
        self.future.cancel()

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the result (re-raising the job's error)."""
        return self.future.result(timeout)


def visible_devices(device: str | None = None) -> list[str]:
    """
    The devices a worker runs on: each visible GPU for ``None`` or ``"cuda"``, else ``device``.

    A comma-separated list names several (``"cuda:0,cuda:2"``); each gets its own lane.

    Raises:
        InvalidInputError: an unknown device, or CUDA where no GPU is visible.
    """
    if device is None or device.strip() == "cuda":
        if device is not None:
            resolve_device("cuda")  # refuses CUDA where no GPU is visible
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{index}" for index in range(count)] or ["cpu"]
    parts = [part.strip() for part in device.split(",") if part.strip()]
    return [str(resolve_device(part)) for part in parts] or ["cpu"]


#: Light requests one lane answers at once beside its job.
_LIGHT_THREADS = 2


class _Lane:
    """One device: its loaded models (least recently used first), one job at a time, its jobs."""

    def __init__(self, device: str, index: int) -> None:
        self.device = device
        self.models: OrderedDict[str, Adapter] = OrderedDict()
        self.jobs: set[Job[Any]] = set()
        # Loading a model (seconds, or minutes from the hub) holds only this lock, so
        # submitting and status, which the server's event loop calls, never wait for it.
        self.loading = threading.Lock()
        # One job at a time on the device, whether from the queue or run in the caller's thread.
        self.running = threading.Lock()
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"attrlab-worker-{index}"
        )
        # Light requests (predictions, estimates) on a loaded model: beside the running job.
        self.light = ThreadPoolExecutor(
            max_workers=_LIGHT_THREADS, thread_name_prefix=f"attrlab-light-{index}"
        )


class ExplainWorker:
    """
    Runs jobs one at a time per device, with an LRU cache of loaded models on each.

    With several devices (every visible GPU by default) each job goes to the device with the
    fewest jobs, preferring one that already holds the job's model. With a placement that
    spreads models (the settings' device map or quantisation) there is one lane, ``device`` is
    not used, and the models' disk layers go to a private folder removed by :meth:`close`.
    """

    def __init__(
        self,
        device: str | None = None,
        max_models: int = 3,
        settings: ServerSettings | None = None,
    ) -> None:
        self.settings = settings or ServerSettings.unrestricted()
        # a spread model spans devices itself: one copy, so one lane, named after what places it
        spread = self.settings.placement.spread
        self.devices = ["device_map"] if spread else visible_devices(device)
        self.device = ",".join(self.devices)
        self.max_models = max_models
        self._cleanup = ExitStack()
        self.placement = self._cleanup.enter_context(private_offload(self.settings.placement))
        self.model_loads: Counter[str] = Counter()
        self._lanes = [_Lane(name, index) for index, name in enumerate(self.devices)]
        self._lock = threading.Lock()
        self._closed = False
        hf_logging.disable_progress_bar()  # weight-loading bars would clutter CLI and server logs

    def adapter(
        self, spec: str, labels: Sequence[str] | None = None, lane: _Lane | None = None
    ) -> Adapter:
        """Load (or reuse) a permitted model; the least recently used go past ``max_models``."""
        spec = (spec or "").strip()
        lane = lane or self._lanes[0]
        source = self.settings.model_source(spec)
        # A served hub id is always fetched from the hub, never read from a same-named folder.
        hub_only = source == "hub" or (source == "listed" and not os.path.isabs(spec))
        # A folder under a model root: each file it holds must stay under the roots too.
        within = self.settings.model_roots if source == "local" else None
        with lane.loading:
            with self._lock:
                adapter = lane.models.pop(spec, None)
            fresh = adapter is None
            if adapter is None:
                adapter = load(
                    spec,
                    device=lane.device,
                    hub_only=hub_only,
                    within=within,
                    placement=self.placement,
                )
            with self._lock:
                self.model_loads[spec] += fresh
                lane.models[spec] = adapter
                while len(lane.models) > self.max_models:
                    lane.models.popitem(last=False)
        return adapter.with_labels(labels) if labels else adapter

    def submit(
        self,
        request: WorkerRequest[Result],
        progress: ProgressCallback | None = None,
        strict: bool = False,
    ) -> Job[Result]:
        """
        Queue a request; the returned job reports progress and can be cancelled.

        ``strict``: see :meth:`validate`.

        Raises:
            AttrlabError: at once, for a request out of bounds, a full queue or a closed worker.
        """
        self.validate(request, strict)  # before queueing
        job: Job[Result] = Job(future=Future(), cancel_event=threading.Event())
        model = (request.model or "").strip()
        with self._lock:
            if self._closed:
                raise WorkerClosedError("the server is shutting down; try again later")
            queued = sum(len(lane.jobs) for lane in self._lanes)
            if queued >= self.settings.max_queue:
                raise QueueFullError(
                    f"{queued} requests are already queued (the limit); try again shortly"
                )
            holding = [lane for lane in self._lanes if model in lane.models]
            loaded = min(holding, key=lambda lane: len(lane.jobs)) if holding else None
            if loaded is not None and request.reads_only(loaded.models[model]):
                lane, light = loaded, True
            else:
                lane = min(self._lanes, key=lambda lane: (len(lane.jobs), model not in lane.models))
                light = False
            lane.jobs.add(job)

        def report(done: int, total: int) -> None:
            job.progress = (done, total)
            if progress is not None:
                progress(done, total)

        if light:
            job.future = lane.light.submit(self._run_light, request, report, job.cancel_event, lane)
        else:
            job.future = lane.executor.submit(self._run, request, report, job.cancel_event, lane)
        job.future.add_done_callback(lambda _: self._finished(job, lane))
        return job

    def validate(self, request: WorkerRequest[Any], strict: bool = False) -> None:
        """
        Refuse a request this server will not run, without loading anything.

        ``strict`` (requests from JSON) takes method parameters only of their own type; the
        CLI and the page give text, parsed here.

        Raises:
            AttrlabError: a field out of bounds, an unknown method or parameter, a parameter
                over budget, a model this server does not serve.
        """
        request.check(self.settings)
        for name, params in request.method_params().items():
            self.settings.check_params(name, checked_params(name, params, strict))
        self.settings.model_source((request.model or "").strip())

    def _finished(self, job: Job[Any], lane: _Lane) -> None:
        with self._lock:
            lane.jobs.discard(job)

    def explain(
        self, request: WorkerRequest[Result], progress: ProgressCallback | None = None
    ) -> Result:
        """Submit and wait."""
        return self.submit(request, progress).result()

    def run_here(
        self, request: WorkerRequest[Result], progress: ProgressCallback | None = None
    ) -> Result:
        """
        Run a request in the calling thread, on the first device, bypassing the queue.

        For callers that bring their own process or queue (a ZeroGPU slot runs in a forked
        process, where the worker's threads do not exist); jobs still run one at a time.

        Raises:
            AttrlabError: as :meth:`submit`, and the job's own errors.
        """
        self.validate(request)
        if self._closed:
            raise WorkerClosedError("the server is shutting down; try again later")
        return self._run(request, progress or _silent, threading.Event(), self._lanes[0])

    def status(self) -> dict[str, Any]:
        """Devices, loaded models (and where each is), how often each was loaded, the queue."""
        with self._lock:
            loaded = {spec: a.model for lane in self._lanes for spec, a in lane.models.items()}
            return {
                "device": self.device,
                "devices": [
                    {
                        "device": lane.device,
                        "queued": len(lane.jobs),
                        "models_loaded": list(lane.models),
                    }
                    for lane in self._lanes
                ],
                "models_loaded": list(loaded),
                "placements": {spec: placement_of(model) for spec, model in loaded.items()},
                "model_loads": dict(self.model_loads),
                "queued": sum(len(lane.jobs) for lane in self._lanes),
                "max_queue": self.settings.max_queue,
            }

    def _run(
        self,
        request: WorkerRequest[Result],
        progress: ProgressCallback,
        cancel: threading.Event,
        lane: _Lane,
    ) -> Result:
        with lane.running:  # one job at a time on a device, queued or run in place
            base = self.adapter(request.model, None, lane)
            return self._execute(request, base, progress, cancel)

    def _run_light(
        self,
        request: WorkerRequest[Result],
        progress: ProgressCallback,
        cancel: threading.Event,
        lane: _Lane,
    ) -> Result:
        """
        A request that only reads a loaded model: beside the lane's job.

        It never reads the model inside an alteration (:mod:`attribution.alteration`): it waits
        for one to end.
        """
        with self._lock:
            base = lane.models.get((request.model or "").strip())
            if base is not None:
                lane.models.move_to_end(request.model.strip())
        if base is None:  # evicted since it was submitted: loading is a job's work
            return self._run(request, progress, cancel, lane)
        with unaltered(base.model, cancel):
            return self._execute(request, base, progress, cancel)

    def _execute(
        self,
        request: WorkerRequest[Result],
        base: Adapter,
        progress: ProgressCallback,
        cancel: threading.Event,
    ) -> Result:
        """Run ``request`` on the loaded model ``base`` (its labels applied here)."""
        adapter = base.with_labels(request.labels) if request.labels else base
        if request.next_token and adapter.family != "decoder-lm":
            raise InvalidInputError(
                f"a next-token explanation needs a decoder LM; model '{adapter.model_id}' is a "
                f"{adapter.family} (the default LM is '{DEFAULT_MODELS['next-token']}')"
            )

        def read(instance: Instance) -> Any:
            stop_if_cancelled(cancel)
            if instance.problem is not None:
                raise InvalidInputError(instance.problem)
            self.settings.check_request(
                instance.text, None, instance.target, request.seed, instance.answer
            )
            if adapter.modality != instance.modality:
                raise InvalidInputError(
                    f"model '{adapter.model_id}' takes {_article(adapter.modality)} as input, "
                    f"but the request gives {_article(instance.modality)}"
                )
            if instance.text is not None:
                return instance.text
            return load_image(instance.image, max_pixels=self.settings.max_image_pixels)

        def targeted(instance: Instance) -> Prepared:
            raw = read(instance)
            return prepare_input(
                adapter,
                raw,
                instance.target,
                instance.answer,
                cancel,
                instance.granularity,
                instance.spans,
                budgets=budgets,
            )

        def prepare(instance: Instance) -> Inputs:
            return targeted(instance).inputs

        budgets = RunSettings(
            progress=progress,
            cancel=cancel,
            max_forward_passes=self.settings.max_forward_passes,
            max_seconds=self.settings.max_seconds,
            max_memory_bytes=self.settings.max_memory_bytes,
        )
        context = JobContext(budgets, prepare, targeted, read)
        return request.run_on(adapter, context)

    def close(self) -> None:
        """Stop accepting work, cancel what is queued or running, and release the models."""
        with self._lock:
            self._closed = True
            jobs = [job for lane in self._lanes for job in lane.jobs]
        for job in jobs:  # a running job stops at its next batch boundary
            job.cancel()
        for lane in self._lanes:
            lane.executor.shutdown(wait=False, cancel_futures=True)
            lane.light.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for lane in self._lanes:
                lane.models.clear()
        self._cleanup.close()  # the private offload folder, once no model reads it


def _silent(done: int, total: int) -> None:
    """No progress to report."""


def _params_only_for(params: dict[str, Any], methods: Sequence[str], verb: str) -> None:
    """Refuse parameters given for a method the job does not ``verb`` (run, evaluate)."""
    unknown = set(params) - set(methods)
    if unknown:
        raise InvalidParameterError(
            f"parameters are given for {', '.join(sorted(unknown))}, which is not {verb}"
        )


def _one_output(answer: AnswerSpec | None, what: str) -> None:
    """Refuse an answer where the library's ``what`` explains one output (a class, a token)."""
    if answer is not None:
        raise InvalidInputError(
            f"{what} explains one output (a class or the next token), not an answer or a "
            "contrast: explain those one method at a time"
        )


def _article(modality: str) -> str:
    return "an image" if modality == "image" else "text"
