"""
The request records every front end builds, and the rules each request carries.

A request names a model (with zero-shot labels), a seed and what to compute: an explanation,
its estimate, a check of several methods, a head ablation, a patching or pruning study, an
evaluation, a batch. Its :meth:`~Request.check` holds the request's own rules (one output, how
many heads, the curves' sizes, parameters only for methods it runs) and the server's
:class:`~attribution.request.bounds.RequestBounds`, with no model loaded; its
:meth:`~Request.run_on` computes it on the loaded model through the :class:`JobContext`
:func:`~attribution.request.admission.resolve` gives (inputs read, checked and targeted).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from attrlab.attribution import (
    bits,
    engine,
    eviction,
    layers,
    methods,
    metrics,
    patching,
    visual_tokens,
)
from attrlab.attribution.errors import AttrlabError, InvalidInputError, InvalidParameterError
from attrlab.attribution.explain import explain, preview
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.inputs.features import check_features
from attrlab.attribution.inputs.runs import Prepared, explain_rows
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.catalog import default_model
from attrlab.attribution.models.images import load_image
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.attribution.request.bounds import RequestBounds
from attrlab.attribution.request.calibration import calibrate, calibrated
from attrlab.attribution.request.defaults import (
    BIT_WIDTHS,
    BITS_DRAWS,
    BUDGETS,
    EVALUATION_ORDERS,
    EVALUATION_STEPS,
    GROUP_SIZE,
    NOISE_SEEDS,
    PATCHING_TOP_K,
    PRUNING_DRAWS,
    TOP_FRACTION,
)
from attrlab.attribution.request.estimate import estimate
from attrlab.attribution.request.gate import an_input, check_modality, clear_shares
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import target_record

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from attrlab.attribution.bits import BitsStudy
    from attrlab.attribution.engine.study import PruningStudy
    from attrlab.attribution.eviction.request import EvictionRequest
    from attrlab.attribution.eviction.study import EvictionStudy
    from attrlab.attribution.explain import Preview
    from attrlab.attribution.layers import HeadAblation
    from attrlab.attribution.metrics import EvalItem
    from attrlab.attribution.metrics.check import MethodCheck
    from attrlab.attribution.patching import ImageCorruption, PatchingReport
    from attrlab.attribution.request.estimate import Estimate
    from attrlab.attribution.visual_tokens.request import VisualTokenReport, VisualTokenRequest

__all__ = [
    "MAX_ABLATED_HEADS",
    "MAX_CURVE_STEPS",
    "MAX_ORDERS",
    "AblationRequest",
    "AttentionRequest",
    "BatchRequest",
    "BitsRequest",
    "CheckRequest",
    "EstimateRequest",
    "EvaluateRequest",
    "EvictRequest",
    "ExplainRequest",
    "InputRequest",
    "Instance",
    "InstanceFailedError",
    "InstanceResults",
    "JobContext",
    "LayersDatasetRequest",
    "PatchRequest",
    "PreviewRequest",
    "PruneRequest",
    "Request",
    "VisualTokensRequest",
    "check_instance_features",
    "check_instance_modalities",
]

#: What a request computes: an Explanation, a check of several methods, a preview, a table.
Result = TypeVar("Result")

log = logging.getLogger(__name__)


class InstanceFailedError(AttrlabError):
    """An unexpected failure (a bug) while explaining one instance of a batch."""


@dataclass(frozen=True, kw_only=True)
class Instance:
    """
    One input: a text, an image, or both (an image and its prompt), and the output to explain.

    An image with a text is a vision-language model's input, the text its prompt
    (:class:`~attribution.models.vlm.ImagePrompt`). ``image`` holds encoded image bytes or a
    decoded array, never a path: front ends that read files (the CLI) read them before
    building the request. With ``answer`` the text is a
    decoder LM's prompt, and what is explained is the answer it asks about (given, generated,
    contrasted: :class:`~attribution.request.answers.AnswerSpec`), not ``target``. A text is
    explained at ``granularity`` (``spans``: the character spans of ``span``;
    :mod:`attribution.inputs.features`).
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
        """``"text"``, ``"image"`` or both, ``"image-text"``; refusing an input of neither."""
        if self.text is None and self.image is None:
            raise InvalidInputError("give exactly one input: a text or an image")
        if self.image is None:
            return "text"
        return "image" if self.text is None else "image-text"


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
        InvalidInputError, InvalidParameterError: as
        :func:`~attribution.inputs.features.check_features`,
            prefixed with the instance's name.
    """
    for number, instance in enumerate(instances):
        if getattr(instance, "problem", None) is None:
            try:
                check_features(instance.granularity, instance.spans, instance.text)
            except AttrlabError as err:
                named = name(number, instance) if name else f"instances[{number}]"
                raise type(err)(f"{named}: {err}") from None


def check_instance_modalities(
    adapter: Adapter, instances: Sequence[Instance], name: Callable[[int, Instance], str]
) -> None:
    """
    Refuse the first of a batch's instances whose input ``adapter`` does not take.

    A batch runs on one model, and a model takes one kind of input (a text, an image, or an
    image and its prompt): a dataset row of another kind is refused before any work, named
    by ``name(number, instance)``; instances that carry their ``problem`` are left to report it.

    Raises:
        InvalidInputError: as :func:`~attribution.request.gate.check_modality`, prefixed with
            the instance's name.
    """
    for number, instance in enumerate(instances):
        if instance.problem is None:
            try:
                check_modality(adapter, instance.modality)
            except InvalidInputError as err:
                raise InvalidInputError(f"{name(number, instance)}: {err}") from None


@dataclass(frozen=True, kw_only=True)
class Request(ABC, Generic[Result]):
    """
    What every request names: a model (with zero-shot labels), a seed, next-token or not.

    ``model``: ``None`` for the library's default for what the request asks
    (:attr:`chosen_model`), which every front end leaves to it.
    """

    model: str | None = None
    labels: Sequence[str] | None = None
    seed: int = 0
    next_token: bool = False  # the model must be a decoder LM; its next token is explained

    @property
    def chosen_model(self) -> str:
        """
        The model this request runs on: its own, else the default for what it asks.

        The default (:func:`~attribution.models.catalog.default_model`) is by the modality of
        its input and whether it asks a decoder LM (a next token, an answer): :meth:`_asks`.
        """
        return self.model if self.model is not None else default_model(*self._asks())

    def _asks(self) -> tuple[str, bool]:
        """The modality of the request's input and whether it asks a decoder LM."""
        return "text", self.next_token

    def check(self, bounds: RequestBounds) -> None:
        """Refuse, before the model loads, what breaks the request's rules or ``bounds``."""
        bounds.check_fields(None, self.labels, None, self.seed)

    def method_params(self) -> dict[str, dict[str, Any]]:
        """Method name -> the parameters the job runs it with (none: no registered method)."""
        return {}

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


class _OneMethod:
    """A request that runs one method with its parameters."""

    method: str
    params: dict[str, Any]

    def method_params(self) -> dict[str, dict[str, Any]]:
        """The one method and its parameters."""
        return {self.method: self.params}


class _SeveralMethods:
    """A request that runs several methods, each with its parameters (none: the defaults)."""

    methods: tuple[str, ...]
    params: dict[str, dict[str, Any]]

    def method_params(self) -> dict[str, dict[str, Any]]:
        """Each method and its parameters."""
        return {method: self.params.get(method, {}) for method in self.methods}


@dataclass(frozen=True, kw_only=True)
class InputRequest(Request[Result], Instance):
    """A job on one input."""

    def _asks(self) -> tuple[str, bool]:
        """An image's model or a text's, a decoder LM's for a next token or an answer."""
        return self.modality, self.next_token or self.answer is not None

    def check(self, bounds: RequestBounds) -> None:
        """An input, and every field within this server's bounds."""
        self.modality  # noqa: B018 - raises for neither
        bounds.check_fields(self.text, self.labels, self.target, self.seed, self.answer)
        check_features(self.granularity, self.spans, self.text)


@dataclass(frozen=True, kw_only=True)
class ExplainRequest(_OneMethod, InputRequest[Explanation]):
    """One explanation to compute: a model, a method and a text or an image."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    evaluate: bool = False  # add the map's faithfulness scores (the trust card) to metrics
    #: The trust card's regions of an image and a prompt: about this many superpixels.
    evaluate_superpixels: int | None = None

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
            settings=run.settings_for(self.seed, self.evaluate, self.evaluate_superpixels),
            per_step=ready.per_step,
        )


@dataclass(frozen=True, kw_only=True)
class EstimateRequest(_OneMethod, InputRequest["Estimate"]):
    """What an explanation would cost, without running it."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    evaluate: bool = False
    evaluate_superpixels: int | None = None

    def reads_only(self, adapter: Adapter) -> bool:
        """
        Once the model is calibrated: pricing is arithmetic and at most a tokenisation.

        A calibration times passes on the device: beside a job it would measure a shared
        device and misprice every later request, so it queues like a job.
        """
        return calibrated(adapter)

    def run_on(self, adapter: Adapter, run: JobContext) -> Estimate:
        """The estimate; the first on a model calibrates every batch width of its device."""
        settings = run.settings_for(self.seed, self.evaluate, self.evaluate_superpixels)
        ready = run.targeted(self)
        calibrate(adapter).measure_all()  # later estimates run no pass: light
        return estimate(
            adapter, self.method, ready.inputs, self.params, settings, ready.target, ready.per_step
        )


@dataclass(frozen=True, kw_only=True)
class CheckRequest(_SeveralMethods, InputRequest["MethodCheck"]):
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
    evaluate_superpixels: int | None = None  # the trust cards' regions (an image and a prompt)

    def check(self, bounds: RequestBounds) -> None:
        """The input within bounds, and methods a check can compare (no model needed)."""
        super().check(bounds)
        metrics.check_choice(self.methods, self.params, self.randomise, self.top_fraction)

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
            run.settings_for(self.seed, self.evaluate, self.evaluate_superpixels),
            ready.per_step,
        )


@dataclass(frozen=True, kw_only=True)
class PreviewRequest(InputRequest["Preview"]):
    """What the model predicts for one input and which methods apply, before choosing one."""

    def reads_only(self, adapter: Adapter) -> bool:
        """One plain forward pass."""
        return True

    def run_on(self, adapter: Adapter, run: JobContext) -> Preview:
        """The top predictions (one forward pass) and each method's applicability."""
        return preview(adapter, run.prepare(self))


#: The most heads one :class:`AblationRequest` zeroes.
MAX_ABLATED_HEADS = 64
#: Bounds of an :class:`EvaluateRequest`'s curves: the trust card's own steps, which its
#: estimate prices, and the most random orders per item (drawn only while a margin is
#: unsettled, within what the methods' trust cards are priced for:
#: :func:`~attribution.metrics.evaluate_methods`).
MAX_CURVE_STEPS = 50
MAX_ORDERS = EVALUATION_ORDERS
#: An evaluation's refusal when it has no row: no items, or no method applies to the model.
_NOTHING_EVALUATED = "nothing was evaluated: no items, or no method applies"


@dataclass(frozen=True, kw_only=True)
class AblationRequest(_OneMethod, InputRequest["HeadAblation"]):
    """
    One method's map of one input, then again with chosen heads zeroed.

    :func:`attribution.layers.ablate_heads_and_explain`: the same class explained both times.
    """

    method: str
    heads: tuple[tuple[int, int], ...]
    params: dict[str, Any] = field(default_factory=dict)

    def check(self, bounds: RequestBounds) -> None:
        """One to :data:`MAX_ABLATED_HEADS` heads (whether the model has them is its job's)."""
        super().check(bounds)
        _one_output(self.answer, "a head ablation")
        if not self.heads or len(self.heads) > MAX_ABLATED_HEADS:
            raise InvalidParameterError(
                f"name 1 to {MAX_ABLATED_HEADS} (layer, head) pairs to ablate; got "
                f"{len(self.heads)}"
            )

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
            target_record(adapter, self.target),
            self.heads,
            self.params,
            run.settings_for(self.seed),
        )


@dataclass(frozen=True, kw_only=True)
class PatchRequest(Request["PatchingReport"]):
    """
    Activation patching of a transformer and its estimators (:mod:`attribution.patching`).

    ``clean`` and ``corrupted`` texts of the same token length, or ``noise_positions`` (the
    clean text's token positions whose embeddings get causal tracing's Gaussian noise,
    ``noise_seeds`` draws). On a decoder LM the target is ``answer``'s answer (default: the
    model's next token), or that rather than its contrast; on a text classifier the class ``target``
    (default: the clean text's top class). ``components``, ``estimators``, ``directions``:
    ``None`` for all.

    On a vision-language model, ``image`` (the clean image: encoded bytes or a decoded array,
    never a path) with ``clean`` its prompt, and ``image_corruption``, how the corrupted image
    is made (:data:`~attribution.patching.image.ImageCorruption`: another image, given as data
    too, a blurred, noised or masked copy); the target is ``answer``'s answer (default: the
    next token); :func:`~attribution.patching.image.image_patching_report` runs it.
    """

    clean: str
    corrupted: str | None = None
    answer: AnswerSpec | None = None
    target: int | str | None = None
    noise_positions: tuple[int, ...] | None = None
    noise_seeds: int = NOISE_SEEDS
    components: tuple[str, ...] | None = None
    estimators: tuple[str, ...] | None = None
    directions: tuple[str, ...] | None = None
    top_k: int = PATCHING_TOP_K
    image: Any = None
    image_corruption: ImageCorruption | None = None

    def _asks(self) -> tuple[str, bool]:
        """
        A decoder LM's answer, unless a text classifier's class is the target.

        With an image: a vision-language model, which has no default (one must be named).
        """
        if self.image is not None:
            return "image-text", True
        return "text", self.target is None

    def check(self, bounds: RequestBounds) -> None:
        """The texts within this server's bounds, one corruption, and known study names."""
        _given_answer(self.answer, "patching")
        bounds.check_fields(self.corrupted, None, None, self.seed)
        bounds.check_fields(self.clean, self.labels, self.target, self.seed, self.answer)
        if self.image is not None or self.image_corruption is not None:
            self._check_images(bounds)
        elif (self.corrupted is None) == (self.noise_positions is None):
            raise InvalidInputError(
                "give a corrupted prompt, or noise positions of the clean one (causal tracing)"
            )
        patching.check_study(
            self.estimators, self.components, self.directions
        )  # before any queueing

    def _check_images(self, bounds: RequestBounds) -> None:
        """
        An image, its corruption and nothing of a text's: the images read within the bounds.

        Raises:
            InvalidInputError: an image without a corruption or the reverse, a text's
                corruption or a class target or a contrast beside them, a blank prompt or
                answer, several images, an image that cannot be read.
            InputTooLargeError: an image over the bounds' pixels.
        """
        if self.image is None or self.image_corruption is None:
            raise InvalidInputError(
                "patching an image needs the clean image and how it is corrupted: give both "
                "(the corruption: another image, a blur, noise or a masked box)"
            )
        if self.corrupted is not None or self.noise_positions is not None:
            raise InvalidInputError(
                "an image's corruption is the corrupted side: give no corrupted prompt or noise "
                "positions with it"
            )
        if self.target is not None or (self.answer is not None and self.answer.contrast):
            raise InvalidInputError(
                "an image and a prompt are patched on an answer (default: the model's next "
                "token): a class target or a contrast is not offered on them yet"
            )
        visual_tokens.check_prompt_and_answer(
            self.clean, None if self.answer is None else self.answer.answer
        )
        if isinstance(self.image, list | tuple):  # what one_image refuses, before any load
            raise InvalidInputError(
                f"patching reads one image; {len(self.image)} were given: give one image"
            )
        load_image(self.image, max_pixels=bounds.max_image_pixels)
        if isinstance(self.image_corruption, patching.OtherImage):
            load_image(self.image_corruption.image, max_pixels=bounds.max_image_pixels)

    def run_on(self, adapter: Adapter, run: JobContext) -> PatchingReport:
        """The study under the job's budget, progress and cancel switch."""
        if self.image_corruption is not None:  # an image and its prompt, read as every one is
            prompt = run.read(Instance(text=self.clean, image=self.image))
            return patching.image_patching_report(
                adapter,
                prompt,
                self.image_corruption,
                self.components,
                self.estimators,
                self.directions,
                _answer_texts(self.answer)[0],
                run.settings_for(self.seed),
                self.top_k,
            )
        noise = None
        if self.noise_positions is not None:
            noise = patching.GaussianNoise(self.noise_positions, self.noise_seeds, seed=self.seed)
        problem = patching.patching_problem(
            adapter, self.clean, self.corrupted, *_answer_texts(self.answer), noise, self.target
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
class PruneRequest(Request["PruningStudy"]):
    """
    Layer and head pruning curves (:func:`attribution.engine.study.pruning_study`).

    The layers and heads are ranked on ``text`` for ``target``, or for a decoder's ``answer``
    (its answer, rather than its contrast; with ``corrupted``, exact residual patching ranks
    the layers too), and pruned over ``texts`` (``None``: the bundled sentences); or, for an
    image model (a CNN's channels), ranked on ``image`` and pruned over the bundled images.
    ``units``:
    ``None`` for the model's default kinds. ``agreement``: each site also removed alone, and
    each ranking scored against those exact effects. ``sparsity``, ``allocation`` and
    ``removal`` as :func:`attribution.engine.study.pruning_study` takes them.
    """

    text: str | None = None
    image: Any = None
    target: int | str | None = None
    answer: AnswerSpec | None = None
    corrupted: str | None = None
    texts: tuple[str, ...] | None = None
    units: tuple[str, ...] | None = None
    draws: int = PRUNING_DRAWS
    head_step: int | None = None
    agreement: bool = False
    sparsity: str = "global"
    allocation: str | None = None
    removal: str | None = None

    def _asks(self) -> tuple[str, bool]:
        """A decoder LM for a next token, an answer or a corrupted prompt; else a classifier."""
        if self.image is not None:
            return "image", False
        asks = self.next_token or self.answer is not None or self.corrupted is not None
        return "text", asks

    def _ranked(self) -> Instance:
        return Instance(text=self.text, image=self.image, target=self.target)

    def check(self, bounds: RequestBounds) -> None:
        """Every text within this server's bounds, and no more dataset texts than a study takes."""
        if self._ranked().modality == "image-text":
            raise InvalidInputError("give exactly one input: a text or an image")
        if self._ranked().modality == "image" and (
            self.answer is not None or self.corrupted is not None or self.texts is not None
        ):
            raise InvalidInputError(
                "an image is ranked for a class and pruned over the bundled images: give no "
                "answer, corrupted prompt or texts with it"
            )
        if self.units is not None:
            engine.check_unit_kinds(self.units)
        engine.check_sparsity(self.units or (), self.sparsity, self.allocation)
        _given_answer(self.answer, "a pruning study")
        bounds.check_fields(self.text, self.labels, self.target, self.seed, self.answer)
        for text in (self.corrupted, *(self.texts or ())):
            bounds.check_fields(text, None, None, self.seed)
        if self.texts is not None and not 1 <= len(self.texts) <= engine.MAX_TEXTS:
            raise InvalidInputError(
                f"give 1 to {engine.MAX_TEXTS} texts to prune over; got {len(self.texts)}"
            )

    def run_on(self, adapter: Adapter, run: JobContext) -> PruningStudy:
        """The study, priced and refused over the job's budgets before any work."""
        if self.text is None:  # an image, read and bounded as every image is
            ready = run.targeted(self._ranked())
            inputs, target, problem = ready.inputs, ready.target, None
        else:
            inputs, target, problem = engine.ranked_input(
                adapter, self.text, self.target, *_answer_texts(self.answer), self.corrupted
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
            sparsity=self.sparsity,
            allocation=self.allocation,
            removal=self.removal,
        )


@dataclass(frozen=True, kw_only=True)
class BitsRequest(Request["BitsStudy"]):
    """
    Weight-only quantisation, one part at a time, and bit allocations by proxies.

    :func:`attribution.bits.bits_study` over ``texts`` (``None``: the bundled LM paragraphs on
    a decoder, the bundled sentences on a classifier); ``kinds``: the table's part kinds
    (``None``: :data:`~attribution.bits.DEFAULT_KINDS`); ``group_sizes``: ``None`` entries
    mean per output channel.
    """

    texts: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    bits: tuple[int, ...] = BIT_WIDTHS
    group_sizes: tuple[int | None, ...] = (GROUP_SIZE, None)
    budgets: tuple[float, ...] = BUDGETS
    draws: int = BITS_DRAWS

    def _asks(self) -> tuple[str, bool]:
        """A language model's loss by default (a classifier's KL where one is named)."""
        return "text", True

    def check(self, bounds: RequestBounds) -> None:
        """Known kinds, widths, budgets and draws; every text within this server's bounds."""
        bits.check_bits_study(self.kinds, self.bits, self.group_sizes, self.budgets, self.draws)
        bounds.check_fields(None, self.labels, None, self.seed)
        for text in self.texts or ():
            bounds.check_fields(text, None, None, self.seed)
        if self.texts is not None and not 1 <= len(self.texts) <= bits.MAX_TEXTS:
            raise InvalidInputError(f"give 1 to {bits.MAX_TEXTS} texts; got {len(self.texts)}")

    def run_on(self, adapter: Adapter, run: JobContext) -> BitsStudy:
        """The study, priced and refused over the job's budgets before any work."""
        return bits.bits_study(
            adapter,
            self.texts,
            self.kinds or bits.DEFAULT_KINDS,
            self.bits,
            self.group_sizes,
            self.budgets,
            self.draws,
            settings=run.settings_for(self.seed),
        )


@dataclass(frozen=True, kw_only=True)
class EvictRequest(Request["EvictionStudy"]):
    """
    Key/value-cache eviction on a decoder LM: each scorer's curves beside random evictions.

    ``study``: what :func:`attribution.eviction.request.run_eviction` runs (its tasks, made
    from its own ``seed`` or given; scorers, unit, split, ratios, draws, span); the record's
    ``seed`` seeds the random evictions.
    """

    study: EvictionRequest = field(default_factory=lambda: eviction.EvictionRequest())

    def _asks(self) -> tuple[str, bool]:
        """A decoder LM: its cache is what is evicted from."""
        return "text", True

    def check(self, bounds: RequestBounds) -> None:
        """The study's own rules (:meth:`EvictionRequest.check`); each given text within bounds."""
        super().check(bounds)
        self.study.check()
        for task in self.study.tasks or ():
            for text in (task.context, task.question, task.answer):
                bounds.check_fields(text, None, None, self.seed)

    def run_on(self, adapter: Adapter, run: JobContext) -> EvictionStudy:
        """The study, priced and refused over the job's budgets before any work."""
        return eviction.run_eviction(adapter, self.study, run.settings_for(self.seed))


@dataclass(frozen=True, kw_only=True)
class _VisionLanguageStudy(Request[Result]):
    """A study of one image and prompt on a vision-language model, which the request names."""

    def _asks(self) -> tuple[str, bool]:
        """An image and a prompt, on a decoder: its answer is what is measured."""
        return "image-text", True

    @property
    def chosen_model(self) -> str:
        """
        The model named (no default: none of the built-in models takes an image and a prompt).

        Raises:
            InvalidParameterError: no model named.
        """
        if self.model is None or not self.model.strip():
            raise InvalidParameterError(
                "name a vision-language model: none of the built-in models takes an image and "
                "a prompt"
            )
        return self.model


@dataclass(frozen=True, kw_only=True)
class VisualTokensRequest(_VisionLanguageStudy["VisualTokenReport"]):
    """
    The visual-token study of a vision-language model on one image and prompt, with ShortV.

    ``study``: what :func:`attribution.visual_tokens.request.run_visual_tokens` runs (its image
    bytes, prompt, answer, scorers, blocks, ratios, draws); the record's ``seed`` seeds the
    random orders. ``model`` is required: no vision-language model is built in.
    """

    study: VisualTokenRequest

    def check(self, bounds: RequestBounds) -> None:
        """
        The study's rules (:meth:`VisualTokenRequest.check`); its texts and image in bounds.

        The image is read as the explain path reads one: its pixels from its header first.
        """
        super().check(bounds)
        self.chosen_model  # noqa: B018 - raises without a model
        self.study.check()
        for text in (self.study.prompt, self.study.answer, self.study.stop):
            bounds.check_fields(text, None, None, self.seed)
        load_image(self.study.image, max_pixels=bounds.max_image_pixels)

    def run_on(self, adapter: Adapter, run: JobContext) -> VisualTokenReport:
        """The study, priced and refused over the job's budgets before any work."""
        return visual_tokens.run_visual_tokens(adapter, self.study, run.settings_for(self.seed))


@dataclass(frozen=True, kw_only=True)
class AttentionRequest(InputRequest["np.ndarray"]):
    """
    One head's attention pattern on one input, as it is (nothing ablated): one forward pass.

    :func:`attribution.layers.head_attention`: queries × keys over the visible tokens.
    """

    layer: int
    head: int

    def run_on(self, adapter: Adapter, run: JobContext) -> np.ndarray:
        """The attention weights (a layer or head the model lacks is refused by name)."""
        return layers.head_attention(adapter, run.prepare(self), self.layer, self.head)


@dataclass(frozen=True, kw_only=True)
class EvaluateRequest(_SeveralMethods, Request["pd.DataFrame"]):
    """
    Which method to believe for a model: each method on the bundled items, scored.

    :func:`attribution.metrics.evaluate_methods` on the first ``items`` of
    :func:`attribution.metrics.bundled_items` of ``modality`` (all of them by default; ``None``:
    the model's modality), or of the uploaded ``instances`` (named ``names``, by default
    ``item 1``, ``item 2``...); one row per item and method that applies. ``image_fill``,
    ``text_removal`` and ``granularity`` are the evaluation's.
    """

    modality: str | None
    methods: tuple[str, ...]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per method
    items: int | None = None
    steps: int = EVALUATION_STEPS
    random_orders: int = EVALUATION_ORDERS
    #: An uploaded set to evaluate instead of the bundled items (its first ``items``).
    instances: tuple[Instance, ...] = ()
    names: tuple[str, ...] = ()
    image_fill: str = "rise"
    text_removal: str = "delete"
    granularity: str = "token"

    def _asks(self) -> tuple[str, bool]:
        """A classifier of the evaluation's modality (its first uploaded item's by default)."""
        return self.modality or _first_modality(self.instances), False

    def check(self, bounds: RequestBounds) -> None:
        """A known modality, methods, items and curve sizes within bounds, readable inputs."""
        super().check(bounds)
        if self.modality is not None and self.modality not in metrics.SCORES:
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
        metrics.check_options(self.image_fill, self.text_removal)
        metrics.check_granularity(self.granularity)
        if bounds.max_batch is not None and len(self.instances) > bounds.max_batch:
            raise InvalidParameterError(
                f"an evaluation holds at most {bounds.max_batch} uploaded items on this "
                f"server; got {len(self.instances)}"
            )
        if self.names and len(self.names) != len(self.instances):
            raise InvalidParameterError(
                f"name every uploaded item or none; got {len(self.names)} names for "
                f"{len(self.instances)} items"
            )
        for number, instance in enumerate(self.instances, start=1):
            if instance.problem is not None:
                raise InvalidInputError(f"item {number}: {instance.problem}")
            if instance.answer is not None:
                raise InvalidInputError(
                    f"item {number} asks about an answer; an evaluation scores each item's "
                    "prediction"
                )
            bounds.check_fields(instance.text, None, instance.target, self.seed)
            if self.modality is not None and instance.modality != self.modality:
                raise InvalidInputError(
                    f"item {number} is {an_input(instance.modality)}; this evaluation takes "
                    f"{self.modality}"
                )
        _params_only_for(self.params, self.methods, "evaluated")

    def chosen_items(
        self, modality: str, read: Callable[[Instance], Any] | None = None
    ) -> list[EvalItem]:
        """
        The items evaluated: the uploaded ones, else the bundled ones of ``modality``.

        The first ``items`` of them. ``read`` decodes an uploaded one within the server's
        bounds (without it, as uploaded).
        """
        if self.instances:
            chosen = self.instances[: self.items]
            return [
                metrics.EvalItem(
                    read(i) if read else i.text if i.text is not None else i.image,
                    i.target,
                    self.names[n - 1] if self.names else f"item {n}",
                )
                for n, i in enumerate(chosen, start=1)
            ]
        return metrics.bundled_items(modality)[: self.items]

    def costs(self) -> list[EstimateRequest]:
        """
        An explanation with its trust card per item and method (an unreadable item is refused).

        The trust card's curves are the largest an evaluation may ask for, so this is an upper
        bound. An evaluation of the model's own modality (``None``) is priced only once its
        model is loaded, as it runs: none here.
        """
        for number, instance in enumerate(self.instances, start=1):
            if instance.problem is not None:
                raise InvalidInputError(f"item {number}: {instance.problem}")
        if self.modality is None:
            return []
        return [
            EstimateRequest(
                model=self.chosen_model,  # every part on the whole's model
                labels=self.labels,
                seed=self.seed,
                text=item.raw if isinstance(item.raw, str) else None,
                image=None if isinstance(item.raw, str) else item.raw,
                target=item.target,
                method=method,
                params=self.params.get(method, {}),
                evaluate=True,
            )
            for item in self.chosen_items(self.modality)
            for method in self.methods
        ]

    def run_on(self, adapter: Adapter, run: JobContext) -> pd.DataFrame:
        """
        The per-item table (refused first when its estimate is over the server's seconds).

        Refused too when it has no row: no items, or no method applies to the model.
        """
        check_modality(adapter, self.modality or adapter.modality)
        items = self.chosen_items(adapter.modality, run.read)
        if not items:
            raise InvalidInputError(_NOTHING_EVALUATED)
        total = len(items)
        first = adapter.preprocess(items[0].raw)
        settings = run.settings_for(self.seed, evaluate=True)
        # each item's explanation and scores within the method's share of the server's seconds
        clear_shares(
            adapter, self.methods, first, self.params, settings, runs=total, applicable_only=True
        )
        run.progress(0, total)
        table = metrics.evaluate_methods(
            adapter,
            items,
            self.methods,
            self.params,
            self.steps,
            self.random_orders,
            settings,
            progress=lambda done: run.progress(done, total),
            image_fill=self.image_fill,
            text_removal=self.text_removal,
            granularity=self.granularity,
        )
        if table.empty:
            raise InvalidInputError(_NOTHING_EVALUATED)
        return table


@dataclass(frozen=True, kw_only=True)
class LayersDatasetRequest(Request["pd.DataFrame"]):
    """
    The layer measures' means over a dataset (:func:`attribution.layers.analyze_dataset`).

    Each of ``instances`` is analysed for its ``target`` (by default its top class);
    ``measures``: the layer analysis's (comma-separated names, or ``all``).
    """

    instances: tuple[Instance, ...]
    measures: str = "all"

    def _asks(self) -> tuple[str, bool]:
        """A model of the first input's modality (a decoder LM for a next token)."""
        return _first_modality(self.instances), self.next_token

    def check(self, bounds: RequestBounds) -> None:
        """At least one readable input, each of one output, within the bounds."""
        super().check(bounds)
        if not self.instances:
            raise InvalidInputError("the dataset has no inputs to analyse")
        if bounds.max_batch is not None and len(self.instances) > bounds.max_batch:
            raise InvalidParameterError(
                f"a dataset holds at most {bounds.max_batch} inputs on this server; got "
                f"{len(self.instances)}"
            )
        for number, instance in enumerate(self.instances, start=1):
            if instance.problem is not None:
                raise InvalidInputError(f"input {number}: {instance.problem}")
            _one_output(instance.answer, "a dataset's layer analysis")
            bounds.check_fields(instance.text, None, instance.target, self.seed)

    def method_params(self) -> dict[str, dict[str, Any]]:
        """The layer analysis's measures (its schema knows their names)."""
        return {"layers": {"measures": self.measures}}

    def run_on(self, adapter: Adapter, run: JobContext) -> pd.DataFrame:
        """The table of means; the job's progress counts the inputs done."""
        total = len(self.instances)
        items = (layers.DatasetItem(run.read(i), i.target) for i in self.instances)
        run.progress(0, total)
        return layers.analyze_dataset(
            adapter,
            items,
            methods.measure_names(self.measures),
            replace(run.settings_for(self.seed), progress=None),  # its passes are not inputs
            progress=lambda done: run.progress(done, total),
        )


#: One instance's results: method name -> its Explanation, or the error that stopped it.
InstanceResults = dict[str, "Explanation | AttrlabError"]


@dataclass(frozen=True, kw_only=True)
class BatchRequest(_SeveralMethods, Request[list[InstanceResults]]):
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
    evaluate_superpixels: int | None = None  # the trust cards' regions (an image and a prompt)

    def _asks(self) -> tuple[str, bool]:
        """The first instance's model: of its modality, a decoder LM's for an answer."""
        answer = bool(self.instances) and self.instances[0].answer is not None
        return _first_modality(self.instances), self.next_token or answer

    def check(self, bounds: RequestBounds) -> None:
        """At least one method and one instance, and no more instances than allowed."""
        super().check(bounds)
        if not self.methods or not self.instances:
            raise InvalidParameterError("a batch needs at least one method and one instance")
        check_instance_features(self.instances)
        if bounds.max_batch is not None and len(self.instances) > bounds.max_batch:
            raise InvalidParameterError(
                f"a batch holds at most {bounds.max_batch} instances on this server; got "
                f"{len(self.instances)} (send a job for more)"
            )
        _params_only_for(self.params, self.methods, "run")

    def costs(self) -> list[EstimateRequest]:
        """One estimate per instance and method."""
        return [
            EstimateRequest(
                model=self.chosen_model,  # every part on the whole's model
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
                evaluate_superpixels=self.evaluate_superpixels,
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
            settings=run.settings_for(self.seed, self.evaluate, self.evaluate_superpixels),
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

    def settings_for(
        self, seed: int, evaluate: bool = False, superpixels: int | None = None
    ) -> RunSettings:
        """
        The settings of a run of this job: its seed and trust card, the job's budgets.

        ``superpixels``: the trust card's regions (:attr:`RunSettings.evaluate_superpixels`).
        """
        return replace(
            self.settings, seed=seed, evaluate=evaluate, evaluate_superpixels=superpixels
        )

    def progress(self, done: int, total: int) -> None:
        """Report the job's progress."""
        if self.settings.progress is not None:
            self.settings.progress(done, total)


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


def _given_answer(answer: AnswerSpec | None, what: str) -> None:
    """Refuse an answer ``what`` cannot take: it ranks for a given answer or the next token."""
    if answer is not None and (answer.generate is not None or answer.chat or answer.per_step):
        raise InvalidInputError(
            f"{what} explains a given answer (or the next token), rather than a contrast: "
            "generate, chat and per_step are an explanation's"
        )


def _answer_texts(answer: AnswerSpec | None) -> tuple[str | None, str | None]:
    """``answer``'s answer and contrast texts (``None`` each where it gives none)."""
    return (None, None) if answer is None else (answer.answer, answer.contrast)


def _first_modality(instances: Sequence[Instance]) -> str:
    """The modality of the first of ``instances`` (text when there are none or it has none)."""
    if not instances or instances[0].image is None:
        return "text"
    return "image" if instances[0].text is None else "image-text"
