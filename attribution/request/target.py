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
that the Explanation's export carries. How an answer is scored lives here too
(:func:`answer_log_probs`, the outputs reused while :func:`reused_outputs` holds), so the record
reads its own outputs; building an answer's inputs is :mod:`~attribution.request.answers`' work.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch

from attrlab.attribution.errors import InvalidInputError, UnsupportedMethodError
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.models.vlm import alternative_kwargs

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter

__all__ = [
    "MEASURES",
    "AnswerTarget",
    "ClassTarget",
    "ContrastTarget",
    "NextTokenTarget",
    "OutputTarget",
    "StepRows",
    "StepTarget",
    "Target",
    "answer_log_probs",
    "decoder_adapter",
    "explained_target",
    "output_target",
    "resolve_target",
    "reused_outputs",
    "target_record",
]

#: Target kind (its JSON ``kind``) -> the class that reads it back.
_KINDS: dict[str, type[Target]] = {}


def decoder_adapter(adapter: Adapter) -> DecoderLMAdapter:
    """``adapter`` as a decoder LM, or a clear refusal (answers are a decoder's)."""
    if not isinstance(adapter, DecoderLMAdapter):
        raise InvalidInputError(
            f"answers and contrasts explain a decoder LM's continuation; model "
            f"'{adapter.model_id}' is a {adapter.family}"
        )
    return adapter


#: What an answer's step reads: its token's log-probability, or its raw logit (LRP).
MEASURES = ("log_prob", "logit")


def answer_log_probs(
    logits: torch.Tensor,
    attention_mask: torch.Tensor,
    tokens: Sequence[int],
    answer_length: int,
    measure: str = "log_prob",
) -> torch.Tensor:
    """
    Per-step log-probabilities ``(B, len(tokens))`` of ``tokens`` as an answer.

    ``measure="logit"``: the tokens' raw logits instead.

    ``logits`` ``(B, T, V)`` are a forward's over sequences whose last ``answer_length``
    attended tokens are the answer; step ``k`` is read at the position before the answer's
    token ``k``: ``last - answer_length + k``. ``tokens`` may differ from the answer in the
    sequence where the positions read do not depend on the difference (an alternative whose
    earlier tokens are the sequence's: causal attention).
    """
    last = attention_mask.sum(dim=1).long() - 1
    steps = torch.arange(len(tokens), device=logits.device)
    positions = (last - answer_length)[:, None] + steps[None, :]
    rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
    read = logits[rows, positions]
    read = read.to(torch.promote_types(read.dtype, torch.float32))  # half precision: float32
    if measure == "log_prob":
        read = read.log_softmax(-1)
    wanted = torch.as_tensor(list(tokens), device=logits.device).expand(logits.shape[0], -1)
    return read.gather(-1, wanted[..., None])[..., 0]


#: While :func:`reused_outputs` holds: (target, inputs' digest) -> the target's outputs.
_REUSED: ContextVar[dict[tuple[Any, str], torch.Tensor] | None] = ContextVar(
    "attrlab_reused_outputs", default=None
)


@contextmanager
def reused_outputs() -> Iterator[None]:
    """
    Within the block, a target's outputs on inputs it has already read come from memory.

    For runs that score the same perturbed inputs again (each row of a per-step matrix after
    the whole answer's map): the forwards are spent once. Only forwards without gradients are
    kept; a key is the target and a digest of the inputs' values.
    """
    token = _REUSED.set({})
    try:
        yield
    finally:
        _REUSED.reset(token)


def remembered(target: Any, model_kwargs: dict[str, torch.Tensor]) -> tuple[Any, Any]:
    """
    ``(store, key)`` of ``target``'s outputs on ``model_kwargs`` while outputs are reused.

    ``store`` is ``None`` when they are not: outside :func:`reused_outputs`, or inputs that
    carry gradients.
    """
    store = _REUSED.get()
    if store is None or torch.is_grad_enabled():
        return None, None
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(model_kwargs):
        tensor = model_kwargs[name]
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return store, (target, digest.hexdigest())


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

    def outputs(self, adapter: Adapter, **model_kwargs: torch.Tensor) -> torch.Tensor:
        """
        What :meth:`score` reads, from one forward of ``model_kwargs`` (a batch of inputs).

        The adapter's ``(B, C)`` logits unless a kind reads more (an answer's steps). While
        :func:`reused_outputs` holds, outputs already computed for the
        same inputs come back without a forward.
        """
        store, key = remembered(self, model_kwargs)
        if store is not None and key in store:
            return store[key]
        found = self._outputs(adapter, **model_kwargs)
        if store is not None:
            store[key] = found
        return found

    def _outputs(self, adapter: Adapter, **model_kwargs: torch.Tensor) -> torch.Tensor:
        return adapter.logits(**model_kwargs)

    def from_logits(
        self, adapter: Adapter, logits: torch.Tensor, model_kwargs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """
        :meth:`outputs` read from a decoder LM's logits at every position, ``(B, T, V)``.

        For logits the caller computed (a logit lens, a forward under hooks that also reads
        the whole distribution); ``model_kwargs`` are the inputs they belong to.

        Raises:
            InvalidInputError: ``adapter`` is not a decoder LM.
            UnsupportedMethodError: the target reads a forward of another sequence too.
        """
        return decoder_adapter(adapter).output_logits(logits, model_kwargs)

    def read_offsets(self) -> tuple[int, ...]:
        """
        The positions whose outputs the score reads, counted back from the last attended one.

        ``0`` is the last position (where a decoder predicts its next token). One per step, in
        step order, for the steps read from the input's own sequence (a contrast's alternative
        read from a sequence of its own has none): the rows attention readouts explain.
        """
        return (0,)

    def log_probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """
        ``log p`` of the target in each row of its outputs, ``(B,)``.

        One output: its log-softmax. Answers, contrasts and their steps score
        log-probabilities already: their :meth:`score`.
        """
        return self.score(outputs)

    @property
    def reads_logits(self) -> bool:
        """Its outputs are the adapter's logits (so the prediction's logits serve)."""
        return True

    @abstractmethod
    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """The explained scalar of each row: :meth:`outputs` of a batch -> ``(B,)``."""

    @property
    def steps(self) -> int:
        """How many steps the score sums (an answer's tokens); 1 for one output."""
        return 1

    def step_scores(self, outputs: torch.Tensor) -> torch.Tensor:
        """``(B, steps)``: each step's part of :meth:`score` (they sum to it)."""
        return self.score(outputs)[:, None]

    def step_labels(self) -> list[str]:
        """Each step's label, as the rows of a per-step matrix show it."""
        return [self.label]

    @property
    def answer_length(self) -> int:
        """Tokens at the input's end the target reads as its answer (0: none)."""
        return 0

    @property
    def named_output(self) -> int | None:
        """The one output the target names (a class, a next token); ``None`` for any other."""
        return None

    @property
    def recorded_index(self) -> int:
        """
        The output the target is recorded under: its index, or an answer's first token.

        (:class:`~attribution.explanation.TargetValues` keeps one index; the record keeps all.)

        Raises:
            UnsupportedMethodError: a kind that names no output (steps in rows).
        """
        raise UnsupportedMethodError(
            f"the Explanation's target reads one output (a class or the next token), not a "
            f"{self.kind} target"
        )

    @property
    def held_answer(self) -> AnswerTarget | None:
        """The answer the input holds (a contrast's first); ``None`` for one output or a step."""
        return None

    @property
    def alternative_answer(self) -> AnswerTarget | None:
        """The answer a contrast's is set against; ``None`` for any other kind."""
        return None

    @property
    def shares_input(self) -> bool:
        """False only for a contrast whose alternative needs a sequence of its own."""
        return True

    def apart(self) -> tuple[AnswerTarget, AnswerTarget] | None:
        """
        The two answers to attribute each in its own sequence and subtract, or ``None``.

        A contrast whose alternative is not read from the answer's sequence
        (:attr:`shares_input`); ``None`` for any other target.
        """
        return None

    @property
    def whole_and_step(self) -> tuple[Target, int | None]:
        """The target whose steps this one is part of and which step it is; whole: ``None``."""
        return self, None

    def in_logits(self) -> Target:
        """
        The target read in logits rather than log-probabilities (LRP explains those).

        The same target where it reads logits already (one output); an answer's steps then
        read their tokens' logits, so a contrast of one token each is the logit difference.
        """
        return self

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """
        The score read from the softmax probabilities of ``outputs`` instead, ``(B,)``.

        For methods weighing by probability (RISE's default output) and the Explanation's record.
        """
        return self.score(outputs.softmax(-1))

    @property
    def value_names(self) -> tuple[str, str | None]:
        """
        What :meth:`score` and :meth:`probability` hold, named as the Explanation records them.

        One output: its ``logit`` and its softmax ``probability``. The second is None where
        the probability means nothing (an answer scored in logits).
        """
        return ("logit", "probability")

    def values(self, outputs: torch.Tensor) -> dict[str, float]:
        """
        The first row's score and probability, each under its :attr:`value_names` name.

        Read in float64, so that a probability ratio overflows only past ``e**709``; one that
        still overflows is left out (JSON has no infinity).
        """
        outputs = outputs.double()
        score_name, probability_name = self.value_names
        values = {score_name: float(self.score(outputs)[0])}
        if probability_name is not None:
            probability = float(self.probability(outputs)[0])
            if math.isfinite(probability):
                values[probability_name] = probability
        return values

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
        label: Display name; :func:`explained_target` fills in the model's when empty.
    """

    index: int
    label: str = ""

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """The logit of output :attr:`index` in each row."""
        return outputs[:, self.index]

    def log_probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """``log softmax`` of the logits at :attr:`index`."""
        return outputs.log_softmax(-1)[:, self.index]

    @property
    def named_output(self) -> int:
        return self.index

    @property
    def recorded_index(self) -> int:
        return self.index

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

    A text naming several tokens resolves to its first (:meth:`Adapter.named_index`); the label
    shows which.
    """

    kind: ClassVar[str] = "next_token"


def _token_list(value: Any, what: str) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise InvalidInputError(f"{what} is a non-empty list of token ids; got {value!r}")
    return tuple(value)


def _text_list(value: Any, count: int, what: str) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or len(value) != count
        or not all(isinstance(v, str) for v in value)
    ):
        raise InvalidInputError(f"{what} is a list of {count} texts; got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class AnswerTarget(Target):
    """
    A decoder LM's whole answer: the sum of its tokens' log-probabilities, teacher-forced.

    The input is the prompt followed by the answer (``inputs.answer_length == len(tokens)``,
    :func:`attribution.request.answers.answer_inputs`); step ``k`` is ``log p(token_k | prompt,
    tokens_<k)``.

    Attributes:
        tokens: The answer's token ids.
        token_labels: The text each stands for.
        label: The answer's text.
        generated: True for the model's own greedy continuation.
        measure: ``log_prob`` (the default), or ``logit``: each step reads its token's raw
            logit (:meth:`in_logits`, for LRP).
    """

    kind: ClassVar[str] = "answer"
    tokens: tuple[int, ...]
    token_labels: tuple[str, ...]
    label: str = ""
    generated: bool = False
    measure: str = "log_prob"

    def _outputs(self, adapter: Adapter, **model_kwargs: torch.Tensor) -> torch.Tensor:
        """``(B, len(tokens))``: each step's log-probability (or logit)."""
        logits = decoder_adapter(adapter).run_model(**model_kwargs).logits
        return self.from_logits(adapter, logits, model_kwargs)

    def from_logits(
        self, adapter: Adapter, logits: torch.Tensor, model_kwargs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Each step's log-probability (or logit), read at the position before its token."""
        mask = model_kwargs["attention_mask"]
        return answer_log_probs(logits, mask, self.tokens, len(self.tokens), self.measure)

    def read_offsets(self) -> tuple[int, ...]:
        """Step ``k`` is read at ``last − len(tokens) + k``."""
        return tuple(range(len(self.tokens), 0, -1))

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """``log p(answer | prompt)``: the steps' log-probabilities (or logits) summed."""
        return outputs.sum(dim=1)

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """``p(answer | prompt)`` (a score in log-probabilities)."""
        return self.score(outputs).exp()

    @property
    def value_names(self) -> tuple[str, str | None]:
        """``log_probability`` and ``probability`` of the answer; in logits, ``logit_sum``."""
        if self.measure == "logit":
            return ("logit_sum", None)
        return ("log_probability", "probability")

    def in_logits(self) -> AnswerTarget:
        return replace(self, measure="logit")

    @property
    def reads_logits(self) -> bool:
        return False

    @property
    def steps(self) -> int:
        return len(self.tokens)

    def step_scores(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def step_labels(self) -> list[str]:
        return list(self.token_labels)

    @property
    def answer_length(self) -> int:
        return len(self.tokens)

    @property
    def recorded_index(self) -> int:
        return self.tokens[0]

    @property
    def held_answer(self) -> AnswerTarget:
        return self

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "tokens", "token_labels", "label", "generated", "measure"}``."""
        return {
            "kind": self.kind,
            "tokens": list(self.tokens),
            "token_labels": list(self.token_labels),
            "label": self.label,
            "generated": self.generated,
            "measure": self.measure,
        }

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> Target:
        tokens = _token_list(data.get("tokens"), "an answer's 'tokens'")
        labels = _text_list(data.get("token_labels"), len(tokens), "an answer's 'token_labels'")
        label, generated = data.get("label", ""), data.get("generated", False)
        measure = data.get("measure", "log_prob")
        if not isinstance(label, str) or not isinstance(generated, bool):
            raise InvalidInputError("an answer's 'label' is a text and 'generated' true or false")
        if measure not in MEASURES:
            raise InvalidInputError(f"an answer's 'measure' is one of {', '.join(MEASURES)}")
        return cls(tokens, labels, label, generated, measure)


@dataclass(frozen=True)
class ContrastTarget(Target):
    """
    One answer rather than another: ``log p(answer | x) − log p(alternative | x)``.

    The input holds ``answer`` (teacher-forced). Where the alternative's steps read positions
    that do not depend on how it differs (one token; or its earlier tokens are the answer's),
    both come from the same forward. Otherwise the alternative needs its own sequence: scored
    here by a second forward of the same perturbed prompt with the alternative in place (token
    ids; an image and a prompt's perturbed first-block rows of the prompt, followed by the
    alternative's own: :func:`~attribution.models.vlm.alternative_kwargs`); gradient methods,
    whose maps are linear in the score, attribute each answer in its own sequence and
    subtract (:func:`attribution.explain`).

    For one token each, this is also the logit difference (the softmax's normaliser cancels).

    Attributes:
        answer: The answer the input holds.
        alternative: The answer it is contrasted with.
        label: ``"' Paris' rather than ' Lyon'"``.
    """

    kind: ClassVar[str] = "contrast"
    answer: AnswerTarget
    alternative: AnswerTarget
    label: str = ""

    def __post_init__(self) -> None:
        if self.answer.measure != self.alternative.measure:
            raise InvalidInputError(
                "a contrast reads both answers in one measure; got "
                f"{self.answer.measure} and {self.alternative.measure}"
            )
        if not self.label:
            label = f"{self.answer.label!r} rather than {self.alternative.label!r}"
            object.__setattr__(self, "label", label)

    @property
    def shares_input(self) -> bool:
        """Both answers are read from the answer's own sequence (causal attention)."""
        ours, theirs = self.answer.tokens, self.alternative.tokens
        return len(theirs) <= len(ours) + 1 and theirs[:-1] == ours[: len(theirs) - 1]

    def _outputs(self, adapter: Adapter, **model_kwargs: torch.Tensor) -> torch.Tensor:
        """``(B, len(answer) + len(alternative))``: both answers' step log-probabilities."""
        model = decoder_adapter(adapter).run_model
        logits = model(**model_kwargs).logits
        if self.shares_input:
            return self.from_logits(adapter, logits, model_kwargs)
        ours = self.answer.from_logits(adapter, logits, model_kwargs)
        length, tokens = len(self.answer.tokens), self.alternative.tokens
        swapped = (
            alternative_kwargs(adapter, model_kwargs, length, tokens)
            if "block_input" in model_kwargs  # an image and a prompt at the first block
            else _with_answer(model_kwargs, length, tokens)
        )
        theirs = self.alternative.from_logits(adapter, model(**swapped).logits, swapped)
        return torch.cat([ours, theirs], dim=1)

    def from_logits(
        self, adapter: Adapter, logits: torch.Tensor, model_kwargs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """
        Both answers' steps from the answer's sequence.

        Raises:
            UnsupportedMethodError: the alternative needs a sequence of its own.
        """
        if not self.shares_input:
            raise UnsupportedMethodError(
                f"{self.label} reads the alternative from a sequence of its own (the two differ "
                "before their last token), not from the answer's logits: explain each answer "
                "on its own and subtract"
            )
        ours = self.answer.from_logits(adapter, logits, model_kwargs)
        theirs = answer_log_probs(
            logits,
            model_kwargs["attention_mask"],
            self.alternative.tokens,
            len(self.answer.tokens),
            self.alternative.measure,
        )
        return torch.cat([ours, theirs], dim=1)

    def read_offsets(self) -> tuple[int, ...]:
        """The answer's steps, then the alternative's where they are read from the same sequence."""
        ours = self.answer.read_offsets()
        if not self.shares_input:
            return ours
        length = len(self.answer.tokens)
        return (*ours, *(length - k for k in range(len(self.alternative.tokens))))

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """``log p(answer) − log p(alternative)`` per row."""
        return self.step_scores(outputs).sum(dim=1)

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """``p(answer) / p(alternative)``: how many times likelier the answer is."""
        return self.score(outputs).exp()

    @property
    def value_names(self) -> tuple[str, str | None]:
        """``log_probability_difference``, ``probability_ratio``; in logits ``logit_difference``."""
        if self.answer.measure == "logit":
            return ("logit_difference", None)
        return ("log_probability_difference", "probability_ratio")

    @property
    def steps(self) -> int:
        return len(self.answer.tokens) + len(self.alternative.tokens)

    def step_scores(self, outputs: torch.Tensor) -> torch.Tensor:
        """The answer's steps, then the alternative's with their sign turned."""
        length = len(self.answer.tokens)
        return torch.cat([outputs[:, :length], -outputs[:, length:]], dim=1)

    def step_labels(self) -> list[str]:
        return [
            *(f"+{t}" for t in self.answer.token_labels),
            *(f"−{t}" for t in self.alternative.token_labels),
        ]

    @property
    def answer_length(self) -> int:
        return len(self.answer.tokens)

    @property
    def recorded_index(self) -> int:
        return self.answer.tokens[0]

    @property
    def held_answer(self) -> AnswerTarget:
        return self.answer

    @property
    def alternative_answer(self) -> AnswerTarget:
        return self.alternative

    def apart(self) -> tuple[AnswerTarget, AnswerTarget] | None:
        return None if self.shares_input else (self.answer, self.alternative)

    @property
    def reads_logits(self) -> bool:
        return False

    def in_logits(self) -> ContrastTarget:
        return replace(
            self, answer=self.answer.in_logits(), alternative=self.alternative.in_logits()
        )

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "answer", "alternative", "label"}``."""
        return {
            "kind": self.kind,
            "answer": self.answer.to_json(),
            "alternative": self.alternative.to_json(),
            "label": self.label,
        }

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> Target:
        answer = Target.from_json(data.get("answer"))
        alternative = Target.from_json(data.get("alternative"))
        label = data.get("label", "")
        if not isinstance(answer, AnswerTarget) or not isinstance(alternative, AnswerTarget):
            raise InvalidInputError("a contrast's 'answer' and 'alternative' are answer targets")
        if not isinstance(label, str):
            raise InvalidInputError("a contrast's 'label' is a text")
        return cls(answer, alternative, label)


@dataclass(frozen=True)
class _StepsOf(Target):
    """
    Steps of a target of several, scored from the whole target's own outputs.

    Attributes:
        whole: The target of several steps.
    """

    whole: Target

    def outputs(self, adapter: Adapter, **model_kwargs: torch.Tensor) -> torch.Tensor:
        """The whole target's outputs (so every step's run reuses the same forwards)."""
        return self.whole.outputs(adapter, **model_kwargs)

    def from_logits(
        self, adapter: Adapter, logits: torch.Tensor, model_kwargs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        return self.whole.from_logits(adapter, logits, model_kwargs)

    @property
    def answer_length(self) -> int:
        return self.whole.answer_length

    @property
    def reads_logits(self) -> bool:
        return self.whole.reads_logits

    @property
    def value_names(self) -> tuple[str, str | None]:
        """The whole target's names: a step holds its part of the whole's quantity."""
        return self.whole.value_names

    def in_logits(self) -> Self:
        return replace(self, whole=self.whole.in_logits())


@dataclass(frozen=True)
class StepTarget(_StepsOf):
    """
    One step of a target of several (a row of the per-step matrix): its part of the score.

    Attributes:
        whole: The target of several steps.
        step: Which, from 0.
    """

    kind: ClassVar[str] = "step"
    step: int
    label: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.step < self.whole.steps:
            raise InvalidInputError(
                f"step {self.step} is out of range: the target has {self.whole.steps} steps"
            )
        if not self.label:
            object.__setattr__(self, "label", self.whole.step_labels()[self.step])

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.whole.step_scores(outputs)[:, self.step]

    @property
    def recorded_index(self) -> int:
        return self.whole.recorded_index

    @property
    def whole_and_step(self) -> tuple[Target, int | None]:
        return self.whole, self.step

    def read_offsets(self) -> tuple[int, ...]:
        """
        The one position the step is read at.

        Raises:
            UnsupportedMethodError: a contrast's alternative step read from its own sequence.
        """
        offsets = self.whole.read_offsets()
        if self.step >= len(offsets):
            raise UnsupportedMethodError(
                f"step {self.label!r} is read from the alternative's own sequence, not from "
                "this input's positions"
            )
        return (offsets[self.step],)

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """The step's probability: ``exp`` of its log-probability (a softmax over steps is none)."""
        if self.whole.reads_logits:
            return super().probability(outputs)
        return self.score(outputs).exp()

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "whole", "step", "label"}``."""
        return {
            "kind": self.kind,
            "whole": self.whole.to_json(),
            "step": self.step,
            "label": self.label,
        }

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> Target:
        step, label = data.get("step"), data.get("label", "")
        if not isinstance(step, int) or isinstance(step, bool) or not isinstance(label, str):
            raise InvalidInputError("a step target has a whole-number 'step' and a text 'label'")
        return cls(Target.from_json(data.get("whole")), step, label)


@dataclass(frozen=True)
class StepRows(_StepsOf):
    """
    Several steps of a target in the rows of one batch: row ``r`` scores step ``chosen[r % n]``.

    For a per-step matrix in one pass (:meth:`AttributionMethod.attribute_steps`): the input
    repeated once per step, row ``r`` explaining step ``chosen[r]``; summed over the rows, one
    backward gives each row its own step's gradient (rows do not interact). The modulus keeps
    the order of batches that repeat the whole batch (an integration path's points).

    Attributes:
        whole: The target of several steps.
        chosen: Which steps, in row order.
    """

    kind: ClassVar[str] = "step_rows"
    chosen: tuple[int, ...]
    label: str = ""

    def __post_init__(self) -> None:
        if not self.chosen or not all(0 <= s < self.whole.steps for s in self.chosen):
            raise InvalidInputError(
                f"steps {self.chosen} are not steps of a target of {self.whole.steps}"
            )
        if not self.label:
            object.__setattr__(self, "label", f"{self.whole.label} (steps in rows)")

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """Row ``r``'s step ``chosen[r % len(chosen)]``."""
        rows = torch.arange(outputs.shape[0], device=outputs.device)
        chosen = torch.as_tensor(self.chosen, device=outputs.device)
        return self.whole.step_scores(outputs)[rows, chosen[rows % len(self.chosen)]]

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "whole", "chosen", "label"}``."""
        return {
            "kind": self.kind,
            "whole": self.whole.to_json(),
            "chosen": list(self.chosen),
            "label": self.label,
        }

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> Target:
        chosen, label = data.get("chosen"), data.get("label", "")
        if (
            not isinstance(chosen, list)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in chosen)
            or not isinstance(label, str)
        ):
            raise InvalidInputError("step rows have a list of whole-number 'chosen' and a 'label'")
        return cls(Target.from_json(data.get("whole")), tuple(chosen), label)


def _with_answer(
    model_kwargs: dict[str, torch.Tensor], length: int, tokens: Sequence[int]
) -> dict[str, torch.Tensor]:
    """
    ``model_kwargs``' rows (token ids) with ``tokens`` for their last ``length`` attended ones.

    The rows come back right-padded again.

    Raises:
        UnsupportedMethodError: inputs given as embeddings (a gradient method's).
    """
    if "input_ids" not in model_kwargs:
        raise UnsupportedMethodError(
            "an alternative answer of its own needs the token ids to swap in; this method "
            "passes embeddings"
        )
    ids, mask = model_kwargs["input_ids"], model_kwargs["attention_mask"]
    kept = mask.sum(dim=1).long() - length  # each row's prompt
    width = int(kept.max()) + len(tokens)
    new_ids = ids.new_zeros(ids.shape[0], width)
    new_mask = mask.new_zeros(ids.shape[0], width)
    alternative = torch.as_tensor(list(tokens), device=ids.device, dtype=ids.dtype)
    for row, prompt in enumerate(kept.tolist()):
        new_ids[row, :prompt] = ids[row, :prompt]
        new_ids[row, prompt : prompt + len(tokens)] = alternative
        new_mask[row, : prompt + len(tokens)] = 1
    return {"input_ids": new_ids, "attention_mask": new_mask}


def output_target(adapter: Adapter, index: int) -> OutputTarget:
    """Output ``index`` of ``adapter`` as the kind its outputs are, with the model's label."""
    kind = NextTokenTarget if adapter.family == "decoder-lm" else ClassTarget
    return kind(index, adapter.label(index))


def target_record(adapter: Adapter, target: int | str | Target | None) -> Target | None:
    """
    A front end's target as the record library entry points take, without a forward.

    An index or a label becomes the adapter's kind of :class:`OutputTarget` (on a decoder LM a
    text names its first token); a :class:`Target` is taken as given; ``None`` or a blank text
    stays ``None``: the top prediction, which an entry point reads from the forward it runs
    (:func:`explained_target`).

    Raises:
        InvalidInputError: an index out of range or an unknown label.
    """
    if target is None or isinstance(target, Target):
        return target
    if isinstance(target, str) and not target.strip():
        return None
    return output_target(adapter, adapter.named_index(target))


def explained_target(adapter: Adapter, target: Target | None, logits: torch.Tensor) -> Target:
    """
    What an entry point explains: ``target``, or ``None``'s top prediction in ``logits``.

    An :class:`OutputTarget` is checked against the model's outputs and gets the model's label
    when it has none; any other kind is taken as given.

    Raises:
        InvalidInputError: an output index out of range.
    """
    if target is None:
        return output_target(adapter, int(logits.argmax()))
    if isinstance(target, OutputTarget):
        index = adapter.named_index(target.index)  # the range check
        return target if target.label else replace(target, label=adapter.label(index))
    return target


def resolve_target(
    adapter: Adapter, target: int | str | Target | None, logits: torch.Tensor
) -> Target:
    """
    A user's target as a record, read from ``logits`` where it is the top prediction.

    :func:`target_record`, then :func:`explained_target`.

    Raises:
        InvalidInputError: an index out of range or an unknown label.
    """
    return explained_target(adapter, target_record(adapter, target), logits)
