"""Base of every attribution method: capabilities as data, parameter schema, one hook."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.methods.checkpointing import CHECKPOINTING_PARAM, checkpointing_reason
from attrlab.attribution.methods.smoothing import (
    SMOOTHING_PARAMS,
    smoothed,
    smoothed_passes,
    smoothing_requested,
)
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.params import Param, validate_params
from attrlab.attribution.run import RunContext
from attrlab.attribution.target import Target
from attrlab.attribution.verdicts import Verdict

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Attribution", "AttributionMethod", "Passes"]


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


class AttributionMethod(ABC):
    """
    One attribution method. Subclasses fill in the class attributes and :meth:`attribute`.

    As Captum splits ``attribute`` from ``_attribute``, the public :meth:`resolve` refuses a
    method that does not apply and checks the parameters, once, for every caller; the hooks
    behind it (:meth:`_resolve`, :meth:`passes`, :meth:`attribute`) get parameters already
    checked and resolved, and never change the dict they are given. Callers run a method
    with :meth:`compute` and price it with :meth:`planned_passes`, which add what the base
    does for every method: a gradient-based attribution method (one that requires gradients)
    takes the smoothing parameters (SmoothGrad, VarGrad, NoiseGrad: :mod:`.smoothing`) on top
    of its own, and is then run once per noisy copy.

    Class attributes:
        name: Registry key (``attrlab explain --method NAME``).
        title: Display name.
        paper: Citation link shown in docs and UI.
        modalities: Input modalities it applies to.
        requires: Adapter features it needs (see :class:`Adapter`).
        params: Parameter schema.
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
            input repeated once per step (what :mod:`attribution.estimate` prices).
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
            takes the ``checkpointing`` parameter (:mod:`.checkpointing`) for long inputs.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    paper: ClassVar[str]
    modalities: ClassVar[frozenset[str]] = frozenset({"text", "image"})
    requires: ClassVar[frozenset[str]] = frozenset()
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
        """A gradient-based attribution method takes the smoothing parameters too."""
        super().__init_subclass__(**kwargs)
        names = {p.name for p in cls.params}
        if cls.smoothable() and not names & {p.name for p in SMOOTHING_PARAMS}:
            cls.params = (*cls.params, *SMOOTHING_PARAMS)
        if cls.checkpointable and CHECKPOINTING_PARAM.name not in names:
            cls.params = (*cls.params, CHECKPOINTING_PARAM)

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

        ``params`` is left as it is; ``strict``: values only of their own type (JSON).

        Raises:
            UnsupportedMethodError: the method does not apply to ``adapter``.
            InvalidParameterError: an unknown parameter or a bad value, or checkpointing
                asked of a model without transformer blocks.
        """
        reason = cls.unsupported_reason(adapter)
        if reason is not None:
            raise UnsupportedMethodError(reason)
        checked = validate_params(cls.params, params, strict)
        if checked.get(CHECKPOINTING_PARAM.name) and (why := checkpointing_reason(adapter)):
            raise InvalidParameterError(why)
        return cls._resolve(adapter, checked)

    @classmethod
    def _resolve(cls, adapter: Adapter, params: dict[str, Any]) -> dict[str, Any]:
        """Hook: ``params`` (checked) with what depends on the model filled in (a new dict)."""
        return params

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
    def planned_passes(cls, adapter: Adapter, inputs: Inputs, params: dict[str, Any]) -> Passes:
        """The passes :meth:`compute` spends: :meth:`passes`, once per smoothing sample."""
        reads = cls.reads_prediction or cls.reads_prediction_attentions
        return smoothed_passes(cls.passes(adapter, inputs, params), params, reads)

    @classmethod
    def compute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: dict[str, Any],
        run: RunContext,
    ) -> Attribution:
        """:meth:`attribute`, or its smoothed map over noisy copies when ``params`` ask."""
        if not smoothing_requested(params):
            return cls.attribute(adapter, inputs, target, params, run)
        return smoothed(
            lambda noisy, own: cls.attribute(adapter, noisy, target, params, own),
            adapter,
            inputs,
            params,
            run,
            cls.planned_passes(adapter, inputs, params),
        )

    @classmethod
    def attribute_steps(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        steps: Sequence[int],
        params: dict[str, Any],
        run: RunContext,
    ) -> np.ndarray | None:
        """
        Hook: the maps of ``steps`` of ``target`` at once, ``(len(steps), *map_shape)``.

        What :meth:`attribute`'s ``scores`` are for each :class:`~attribution.target.StepTarget`,
        from batched passes (the input repeated, row ``r`` scoring step ``steps[r]``:
        :class:`~attribution.target.StepRows`). ``None`` where the method has no such batch:
        :func:`attribution.explain.attribute` then runs one attribution per step.
        """
        return None

    @classmethod
    @abstractmethod
    def passes(cls, adapter: Adapter, inputs: Inputs, params: dict[str, Any]) -> Passes:
        """The passes :meth:`attribute` spends on ``inputs`` with ``params`` (resolved)."""

    @classmethod
    @abstractmethod
    def attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: dict[str, Any],
        run: RunContext,
    ) -> Attribution:
        """Attribute ``target``'s score (:meth:`Target.score`) on one input (params resolved)."""
