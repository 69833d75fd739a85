"""Base of every attribution method: capabilities as data, parameter schema, one hook."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

import numpy as np

from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.methods.checkpointing import CheckpointingParams, checkpointing_reason
from attrlab.attribution.methods.smoothing import (
    SmoothingParams,
    smoothed,
    smoothed_passes,
    smoothing_requested,
)
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.params import MethodParams, Param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import Verdict

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Attribution", "AttributionMethod", "Passes"]

#: A method's parameter record.
P = TypeVar("P", bound=MethodParams)


@dataclass(frozen=True)
class Passes:
    """
    Model passes a method spends on one input, known before it runs.

    Attributes:
        forward: Forward passes (one per input row).
        backward: Backward passes.
        batch: Rows per forward when the forwards run in batches (the perturbation engine,
            an integration path); ``None``: one input at a time.
        exact: The counts are exact; ``False``: an upper bound (early stopping may end sooner).
    """

    forward: int
    backward: int = 0
    batch: int | None = None
    exact: bool = True


@dataclass
class Attribution:
    """What a method computes; :func:`attribution.explain` wraps it into an Explanation."""

    scores: np.ndarray
    positional_scores: np.ndarray | None = None
    layers: pd.DataFrame | None = None
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    #: How the method's own checks came out (completeness, conservation).
    verdicts: list[Verdict] = field(default_factory=list)


class AttributionMethod(ABC, Generic[P]):
    """
    One attribution method: subclasses fill in the class attributes, ``_passes``, ``_attribute``.

    As Captum splits ``attribute`` from ``_attribute``, the public :meth:`resolve` refuses a
    method that does not apply and checks the parameters, once, for every caller. The public
    calls speak plain names and values (a mapping, as :meth:`resolve` gives it); the hooks
    behind them (:meth:`_resolve`, :meth:`_passes`, :meth:`_attribute`,
    :meth:`_attribute_steps`) get the method's typed record (``P``, its
    :attr:`param_record`), checked and resolved. Callers run a method with :meth:`compute` and
    price it with :meth:`planned_passes`, which add what the base does for every method: a
    gradient-based attribution method (one that requires gradients) takes the smoothing
    parameters (SmoothGrad, VarGrad, NoiseGrad: its record derives from
    :class:`~.smoothing.SmoothingParams`) on top of its own, and is then run once per noisy
    copy.

    Class attributes:
        name: Registry key (``attrlab explain --method NAME``).
        title: Display name.
        paper: Citation link shown in docs and UI.
        modalities: Input modalities it applies to.
        requires: Adapter features it needs (see :class:`Adapter`).
        param_record: The record of its parameters (``P``), one typed field per parameter.
        params: Parameter schema, derived from ``param_record`` (:meth:`MethodParams.schema`).
        has_convergence_delta: It reports a completeness / convergence delta in ``metrics``.
        reads_prediction_attentions: It reads the attention probabilities of the input's own
            forward pass (:meth:`RunContext.clean_attentions`), so :func:`attribution.explain`
            makes its prediction with them: one pass for both.
        reads_prediction: It reads the input's own logits (:meth:`RunContext.clean_logits`,
            e.g. for a convergence delta): a smoothed run predicts each noisy copy, one pass.
        category: ``"attribution"`` (a map over the input) or ``"analysis"`` (per-layer and
            per-head measures, with a map as a by-product).
        steps_share_forward: Its batched per-step matrix (:meth:`attribute_steps`) runs one
            forward of the input per batch of steps and a backward per step, rather than the
            input repeated once per step (what :mod:`attribution.request.estimate` prices).
        alters_model: It changes what the model's forward computes or records while it runs
            (hooks, routed attention), so :func:`attribution.explain` holds the model
            :func:`~attribution.alteration.altered` for the whole run. False for methods of
            plain forward and gradient passes, and for those that hold each of their own
            alterations (a light read may then run between them).
        routes_attention: It reads attention probabilities or routes attention to a rule, so
            :func:`attribution.explain` runs it (and the prediction before it) with eager
            attention (:meth:`Adapter.eager_attention`); by default, when it requires
            ``"attentions"``.
        checkpointable: Its passes are gradient passes through the transformer blocks, so it
            takes the ``checkpointing`` parameter for long inputs (its record derives from
            :class:`~.checkpointing.CheckpointingParams`).
    """

    name: ClassVar[str]
    title: ClassVar[str]
    paper: ClassVar[str]
    modalities: ClassVar[frozenset[str]] = frozenset({"text", "image"})
    requires: ClassVar[frozenset[str]] = frozenset()
    param_record: ClassVar[type[MethodParams]] = MethodParams
    params: ClassVar[tuple[Param, ...]] = ()
    has_convergence_delta: ClassVar[bool] = False
    reads_prediction_attentions: ClassVar[bool] = False
    reads_prediction: ClassVar[bool] = False
    category: ClassVar[str] = "attribution"
    alters_model: ClassVar[bool] = True  # a new method is held until it says otherwise
    steps_share_forward: ClassVar[bool] = False
    checkpointable: ClassVar[bool] = False
    routes_attention: ClassVar[bool | None] = None

    @classmethod
    def needs_eager_attention(cls) -> bool:
        """It runs with eager attention (see ``routes_attention``)."""
        if cls.routes_attention is not None:
            return cls.routes_attention
        return "attentions" in cls.requires

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """
        The schema from the record, whose shared groups match the method's capabilities.

        Raises:
            TypeError: a smoothable (checkpointable) method whose record does not derive from
                the smoothing (checkpointing) record, or another whose record does.
        """
        super().__init_subclass__(**kwargs)
        cls.params = cls.param_record.schema()
        for group, takes in (
            (SmoothingParams, cls.smoothable()),
            (CheckpointingParams, cls.checkpointable),
        ):
            if takes != issubclass(cls.param_record, group):
                raise TypeError(
                    f"{cls.__name__}: its param_record must {'' if takes else 'not '}derive "
                    f"from {group.__name__}"
                )

    @classmethod
    def smoothable(cls) -> bool:
        """Its maps can be smoothed: an attribution method that requires gradients."""
        return "gradients" in cls.requires and cls.category == "attribution"

    @classmethod
    def unsupported_reason(cls, adapter: Adapter) -> str | None:
        """``None`` if the method applies to ``adapter``, else why it does not."""
        if adapter.modality not in cls.modalities:
            kinds = "/".join(sorted(cls.modalities))
            return f"{cls.name} works on {kinds} models, not {adapter.modality}"
        missing = cls.requires - adapter.features
        if missing:
            return (
                f"{cls.name} needs {', '.join(sorted(missing))}, which model "
                f"'{adapter.model_id}' ({adapter.family}) does not offer"
            )
        return None

    @classmethod
    def resolve(
        cls, adapter: Adapter, params: Mapping[str, Any] | None, strict: bool = False
    ) -> dict[str, Any]:
        """
        The parameters a run on ``adapter`` uses: checked, defaults filled in, resolved.

        The method's record is built from ``params`` (:meth:`MethodParams.validated`) and
        resolved (:meth:`_resolve`); it is given back as plain names and values, what front
        ends, prices and the Explanation read. ``params`` is left as it is; ``strict``: values
        only of their own type (JSON).

        Raises:
            UnsupportedMethodError: the method does not apply to ``adapter``.
            InvalidParameterError: an unknown parameter or a bad value, or checkpointing
                asked of a model without transformer blocks.
        """
        reason = cls.unsupported_reason(adapter)
        if reason is not None:
            raise UnsupportedMethodError(reason)
        checked = cast(P, cls.param_record.validated(params, strict))
        if (
            isinstance(checked, CheckpointingParams)
            and checked.checkpointing
            and (why := checkpointing_reason(adapter))
        ):
            raise InvalidParameterError(why)
        return cls._resolve(adapter, checked).to_dict()

    @classmethod
    def _resolve(cls, adapter: Adapter, params: P) -> P:
        """Hook: ``params`` (checked) with what depends on the model filled in."""
        return params

    @classmethod
    def record_of(cls, params: Mapping[str, Any]) -> P:
        """The typed record of ``params`` resolved (see :meth:`MethodParams.of`)."""
        return cast(P, cls.param_record.of(params))

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Name, paper, modalities, needs and parameter schema (CLI, REST docs, UI)."""
        return {
            "name": cls.name,
            "title": cls.title,
            "paper": cls.paper,
            "modalities": sorted(cls.modalities),
            "requires": sorted(cls.requires),
            "has_convergence_delta": cls.has_convergence_delta,
            "category": cls.category,
            "params": {p.name: p.to_schema() for p in cls.params},
        }

    @classmethod
    def planned_passes(cls, adapter: Adapter, inputs: Inputs, params: Mapping[str, Any]) -> Passes:
        """The passes :meth:`compute` spends: :meth:`passes`, once per smoothing sample."""
        record = cls.record_of(params)
        reads = cls.reads_prediction or cls.reads_prediction_attentions
        return smoothed_passes(cls._passes(adapter, inputs, record), record, reads)

    @classmethod
    def compute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: Mapping[str, Any],
        run: RunContext,
    ) -> Attribution:
        """:meth:`attribute`, or its smoothed map over noisy copies when ``params`` ask."""
        record = cls.record_of(params)
        smoothing: MethodParams = record  # narrowed to the smoothing record, ``record`` stays P
        if not smoothing_requested(smoothing):
            return cls._attribute(adapter, inputs, target, record, run)
        return smoothed(
            lambda noisy, own: cls._attribute(adapter, noisy, target, record, own),
            adapter,
            inputs,
            smoothing,
            run,
            cls.planned_passes(adapter, inputs, params),
        )

    @classmethod
    def passes(cls, adapter: Adapter, inputs: Inputs, params: Mapping[str, Any]) -> Passes:
        """The passes :meth:`attribute` spends on ``inputs`` with ``params`` (resolved)."""
        return cls._passes(adapter, inputs, cls.record_of(params))

    @classmethod
    def attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: Mapping[str, Any],
        run: RunContext,
    ) -> Attribution:
        """Attribute ``target``'s score (:meth:`Target.score`) on one input (params resolved)."""
        return cls._attribute(adapter, inputs, target, cls.record_of(params), run)

    @classmethod
    def attribute_steps(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        steps: Sequence[int],
        params: Mapping[str, Any],
        run: RunContext,
    ) -> np.ndarray | None:
        """
        The maps of ``steps`` of ``target`` at once, ``(len(steps), *map_shape)``.

        What :meth:`attribute`'s ``scores`` are for each
        :class:`~attribution.request.target.StepTarget`, from batched passes (the input repeated,
        row ``r`` scoring step ``steps[r]``: :class:`~attribution.request.target.StepRows`).
        ``None`` where the method has no such batch (:meth:`batches_steps`):
        :func:`attribution.explain.attribute` then runs one attribution per step.
        """
        return cls._attribute_steps(adapter, inputs, target, steps, cls.record_of(params), run)

    @classmethod
    def batches_steps(cls) -> bool:
        """It has a batched per-step matrix (:meth:`attribute_steps` of its own)."""
        own = cls._attribute_steps.__func__  # type: ignore[attr-defined]
        return own is not AttributionMethod._attribute_steps.__func__  # type: ignore[attr-defined]

    @classmethod
    def _attribute_steps(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        steps: Sequence[int],
        params: P,
        run: RunContext,
    ) -> np.ndarray | None:
        """Hook of :meth:`attribute_steps`; ``None``: no batched matrix."""
        return None

    @classmethod
    @abstractmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: P) -> Passes:
        """Hook of :meth:`passes`."""

    @classmethod
    @abstractmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: P,
        run: RunContext,
    ) -> Attribution:
        """Hook of :meth:`attribute`."""
