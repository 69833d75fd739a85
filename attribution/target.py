"""
What to explain, as a record: the scalar every method attributes, read from model outputs.

A :class:`Target` turns a batch of model outputs (:meth:`Adapter.logits`, ``(B, C)``) into one
score per row (:meth:`Target.score`). Every method attributes that score and nothing else:
Captum's forward returns it, perturbation methods weigh their masks by it, LRP's backward starts
from it, the convergence delta compares it at the input and the baseline. So a method never
knows which kind of target it explains.

Today's kinds name one output (:class:`OutputTarget`): a class of a classifier
(:class:`ClassTarget`) or the next token of a decoder LM (:class:`NextTokenTarget`). Kinds built
from others fit the same interface: a contrast "A rather than B" scores
``A.score(outputs) - B.score(outputs)``; a whole answer sums its steps' scores, each step a
target of its own. Each kind has a JSON form (:meth:`Target.to_json`, :meth:`Target.from_json`)
that the Explanation's export carries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from attrlab.attribution.errors import InvalidInputError, UnsupportedMethodError

if TYPE_CHECKING:
    import torch

    from attrlab.attribution.models.base import Adapter

__all__ = [
    "ClassTarget",
    "NextTokenTarget",
    "OutputTarget",
    "Target",
    "output_index",
    "output_target",
    "resolve_target",
]

#: Target kind (its JSON ``kind``) -> the class that reads it back.
_KINDS: dict[str, type[Target]] = {}


class Target(ABC):
    """
    What a method explains: one score per batch row of model outputs, a label, a JSON form.

    Subclasses set ``kind`` (their JSON name; a subclass that sets it is registered for
    :meth:`from_json`) and fill in :meth:`score`, :meth:`to_json` and :meth:`_from_fields`.

    Attributes:
        label: How the target is shown (a class name, a token as text).
    """

    kind: ClassVar[str]
    label: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            _KINDS[cls.kind] = cls

    @abstractmethod
    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """The explained scalar of each row: ``(B, C)`` outputs of the adapter -> ``(B,)``."""

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """
        The score read from the softmax probabilities of ``outputs`` instead, ``(B,)``.

        For methods weighing by probability (RISE's default output) and the Explanation's record.
        """
        return self.score(outputs.softmax(-1))

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields, ``kind`` first; :meth:`from_json` reads them back."""

    @classmethod
    @abstractmethod
    def _from_fields(cls, data: dict[str, Any]) -> Target:
        """The target of this kind from its :meth:`to_json` fields (checked here)."""

    @staticmethod
    def from_json(data: Any) -> Target:
        """
        The target :meth:`to_json` wrote (an export, a REST body).

        Raises:
            InvalidInputError: not an object, an unknown kind or fields of the wrong type.
        """
        if not isinstance(data, dict):
            raise InvalidInputError(
                f"a target record is an object with a 'kind'; got {type(data).__name__}"
            )
        kind = data.get("kind")
        if not isinstance(kind, str) or kind not in _KINDS:
            raise InvalidInputError(
                f"unknown target kind {kind!r}; the kinds are: {', '.join(sorted(_KINDS))}"
            )
        return _KINDS[kind]._from_fields(data)


@dataclass(frozen=True)
class OutputTarget(Target):
    """
    One output of the model: its logit is the score.

    Attributes:
        index: Position in the adapter's output vector (class index, token id).
        label: Display name; :func:`resolve_target` fills in the model's when empty.
    """

    index: int
    label: str = ""

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """The logit of output :attr:`index` in each row."""
        return outputs[:, self.index]

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "index", "label"}``."""
        return {"kind": self.kind, "index": self.index, "label": self.label}

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> Target:
        index, label = data.get("index"), data.get("label", "")
        if not isinstance(index, int) or isinstance(index, bool) or not isinstance(label, str):
            raise InvalidInputError(
                f"a {cls.kind} target has a whole-number 'index' and a text 'label'; got "
                f"index {index!r} and label {label!r}"
            )
        return cls(index, label)


@dataclass(frozen=True)
class ClassTarget(OutputTarget):
    """A class of a classifier (text, image, zero-shot)."""

    kind: ClassVar[str] = "class"


@dataclass(frozen=True)
class NextTokenTarget(OutputTarget):
    """
    The next token of a decoder LM: its logit at the last attended position.

    A text naming several tokens resolves to its first (:meth:`Adapter.target_index`); the label
    shows which.
    """

    kind: ClassVar[str] = "next_token"


def output_target(adapter: Adapter, index: int) -> OutputTarget:
    """Output ``index`` of ``adapter`` as the kind its outputs are, with the model's label."""
    kind = NextTokenTarget if adapter.family == "decoder-lm" else ClassTarget
    return kind(index, adapter.label(index))


def resolve_target(
    adapter: Adapter, target: int | str | Target | None, logits: torch.Tensor
) -> Target:
    """
    A user's target as a record.

    An index, a label or ``None`` (the top prediction in ``logits``) becomes the adapter's kind
    of :class:`OutputTarget`; an :class:`OutputTarget` is checked against the model's outputs
    and gets the model's label when it has none; any other :class:`Target` is taken as given.

    Raises:
        InvalidInputError: an index out of range or an unknown label.
    """
    if isinstance(target, OutputTarget):
        index = adapter.target_index(target.index, logits)  # the range check
        return target if target.label else replace(target, label=adapter.label(index))
    if isinstance(target, Target):
        return target
    return output_target(adapter, adapter.target_index(target, logits))


def output_index(target: Target, what: str) -> int:
    """
    The one output ``target`` names, for ``what`` (a measure that reads one output's logit).

    Raises:
        UnsupportedMethodError: ``target`` is not one output (a class or a next token).
    """
    if not isinstance(target, OutputTarget):
        raise UnsupportedMethodError(
            f"{what} reads one output (a class or the next token), not a {target.kind} target"
        )
    return target.index
