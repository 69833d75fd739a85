"""
Long-context tasks with a known answer: what a KV-cache eviction study measures a model on.

Three kinds are generated from a seed (a :class:`random.Random` of their own, never the global
one), sized to a budget of tokens, after RULER (Hsieh et al. 2024, https://arxiv.org/abs/2404.06654)
and the needle-in-a-haystack test (Kamradt 2023):

- :func:`kv_retrieval`: a list of key → value pairs; the question asks one key's value.
- :func:`needle`: one planted fact at a chosen depth of a filler text (:func:`needle_depths`
  gives the same haystack and needle at several depths).
- :func:`variable_tracking`: chains of assignments (``VAR QXMTA = 52917.``, then
  ``VAR HZKPB = VAR QXMTA.``, ...) spread through the filler; the question asks the value of
  one chain's last variable, so the model must follow that chain and not another.

The filler is the project's own prose (``assets/eval/lm_text.jsonl``, written for attrlab),
its paragraphs in a seeded order. :func:`read_tasks` reads a user's tasks from JSON Lines.

:func:`task_prompt` is the text the model reads, ``context``, then the question, then RULER's
answer prefix (the words the answer completes); :func:`task_inputs` tokenises it with the
answer teacher-forced (:mod:`attribution.request.answers`) and says how many leading tokens are
the context's: those an eviction study may drop, the question and answer always kept.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from itertools import accumulate
from pathlib import Path
from types import MappingProxyType
from typing import Any

from attrlab.attribution.errors import (
    InputTooLargeError,
    InvalidInputError,
    InvalidParameterError,
    parse_json,
    require_unicode,
)
from attrlab.attribution.inputs.rows import numbered_lines
from attrlab.attribution.models.base import Adapter, TextInputs
from attrlab.attribution.request.answers import (
    answer_inputs,
    answer_target,
    given_answer,
    prompt_inputs,
)
from attrlab.attribution.request.target import AnswerTarget

__all__ = [
    "GENERATORS",
    "MAX_TASKS",
    "ContextTask",
    "TaskInputs",
    "count_words",
    "kv_retrieval",
    "needle",
    "needle_depths",
    "parse_tasks",
    "read_tasks",
    "task_inputs",
    "task_prompt",
    "token_counter",
    "variable_tracking",
]

#: The most tasks :func:`read_tasks` reads from one file.
MAX_TASKS = 200
#: The largest size a generator makes, in its count's units (SmolLM2 reads 8,192 tokens).
_MAX_SIZE = 8192
#: The fields of a task line (:func:`read_tasks`).
_FIELDS = ("context", "question", "answer")
#: Keys' words: no word is another's prefix or suffix, so a key never appears inside another.
_ADJECTIVES = (
    "amber", "brisk", "copper", "dusty", "eager", "frozen", "gentle", "hollow", "ivory",
    "jolly", "khaki", "lunar", "mellow", "noble", "olive", "plain", "quiet", "rusty", "silver",
    "tidy", "urban", "velvet", "woolly", "yellow", "zesty", "bold", "crimson", "dim",
)  # fmt: skip
_NOUNS = (
    "anchor", "badger", "candle", "desert", "engine", "falcon", "garden", "harbor", "island",
    "jacket", "kettle", "ladder", "meadow", "needle", "orchard", "pepper", "quarry", "river",
    "saddle", "tunnel", "valley", "walnut", "window", "yacht", "zipper", "button", "comet",
)  # fmt: skip
#: A value: a number of this many digits (SmolLM2's tokenizer reads each digit as a token).
_DIGITS = 5


@dataclass(frozen=True)
class ContextTask:
    """
    A context, a question about it and the answer, known: one task of a long-context study.

    Attributes:
        context: The long text (pairs, a haystack, assignments among filler, a user's text).
        question: What is asked about it.
        answer: The answer's text, without a leading space (the prompt supplies it).
        task: The kind's name (``kv_retrieval``, ``needle``, ``variable_tracking``, ``jsonl``).
        answer_prefix: The words the answer completes at the prompt's end (RULER's answer
            prefix, ``"The value of amber-river is"``); empty: the answer follows "Answer:".
        details: How it was made, as JSON (seed, depth, hops, ...): a read-only copy (its
            objects are mappings that refuse changes, its arrays tuples).

    Raises:
        InvalidInputError: an empty context, question or answer, a field that is not a text,
            or details that JSON cannot hold.
    """

    context: str
    question: str
    answer: str
    task: str
    answer_prefix: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("context", "question", "answer", "task", "answer_prefix"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidInputError(f"a task's '{name}' is a text; got {type(value).__name__}")
            require_unicode(value, f"the task's '{name}'")
            if name != "answer_prefix" and not value.strip():
                raise InvalidInputError(f"a task's '{name}' is empty")
        if not isinstance(self.details, Mapping):
            raise InvalidInputError("a task's details are a JSON object")
        try:
            copied = json.loads(json.dumps(_thawed(self.details), allow_nan=False))
        except (TypeError, ValueError) as err:
            raise InvalidInputError(f"a task's details must be JSON: {err}") from None
        object.__setattr__(self, "details", _frozen(copied))

    def to_json(self) -> dict[str, Any]:
        """The task as a JSON object (:meth:`from_json` reads it back)."""
        return {
            "context": self.context,
            "question": self.question,
            "answer": self.answer,
            "task": self.task,
            "answer_prefix": self.answer_prefix,
            "details": _thawed(self.details),
        }

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> ContextTask:
        """
        The task :meth:`to_json` wrote.

        Raises:
            InvalidInputError: a missing field or one of the wrong type.
        """
        missing = [name for name in (*_FIELDS, "task") if name not in record]
        if missing:
            raise InvalidInputError(f"a task lacks {', '.join(map(repr, missing))}")
        details = record.get("details", {})
        if not isinstance(details, Mapping):
            raise InvalidInputError("a task's 'details' is a JSON object")
        return cls(
            context=record["context"],
            question=record["question"],
            answer=record["answer"],
            task=record["task"],
            answer_prefix=record.get("answer_prefix", ""),
            details=details,
        )


@dataclass(frozen=True)
class TaskInputs:
    """
    A task as the model reads it: context, question, answer, one teacher-forced sequence.

    Attributes:
        inputs: The tokens; the answer's are the last ``inputs.answer_length``.
        target: The answer as a target (its log-probability, per step or whole).
        context_tokens: How many leading tokens are the context's (any special token the
            tokenizer puts first included): the tokens an eviction study may drop.
    """

    inputs: TextInputs
    target: AnswerTarget
    context_tokens: int

    @property
    def question_tokens(self) -> int:
        """How many tokens the question and answer prefix take, between context and answer."""
        total = int(self.inputs.input_ids.shape[1])
        return total - self.context_tokens - self.inputs.answer_length


def count_words(text: str) -> int:
    """A text's words (runs of non-space characters): a rough count, about 0.75 of its tokens."""
    return len(text.split())


def token_counter(tokenizer: Any) -> Callable[[str], int]:
    """A count of a text's tokens by ``tokenizer`` (a Hugging Face one), no special tokens."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def kv_retrieval(
    seed: int,
    max_tokens: int = 500,
    count: Callable[[str], int] = count_words,
    pairs: int | None = None,
) -> ContextTask:
    """
    RULER's key–value retrieval: key → value pairs, one key's value asked.

    Each pair is a sentence ``The value of amber-river is 48213.``; keys are distinct word
    pairs, values distinct numbers of five digits, the asked pair at a seeded place. Without
    ``pairs`` the context is the list of as many pairs as fit, one a line (RULER's form); with
    ``pairs`` it is that many pairs spread evenly through the filler (as RULER's needles with
    several keys): the number of pairs to tell apart, not the size, is what makes the task
    hard for a small model.

    Args:
        seed: Makes the task (the same seed, the same task).
        max_tokens: The most ``count`` may give for the prompt with its answer.
        count: Counts a text's tokens (:func:`token_counter`); words by default.
        pairs: How many pairs (2 … 27) among filler, no word in two keys; ``None``: a list
            of pairs only.

    Raises:
        InvalidParameterError: ``pairs`` out of range, a ``max_tokens`` too small for two pairs
            (or ``pairs``) and the question, or above 8,192.
    """
    if pairs is not None:
        _check_whole("pairs", pairs, 2, len(_NOUNS))
    rng = random.Random(seed)
    if pairs is None:
        keys = [f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS]
        rng.shuffle(keys)
    else:  # no word in two keys: either word tells a key from the others
        words = zip(rng.sample(_ADJECTIVES, pairs), rng.sample(_NOUNS, pairs), strict=True)
        keys = [f"{a}-{n}" for a, n in words]
    values = _numbers(rng, len(keys))
    where = rng.random()
    sentences = _filler(rng) if pairs is not None else []

    def make(size: int) -> ContextTask:
        shown = size if pairs is None else pairs
        asked = min(int(where * shown), shown - 1)
        lines = [f"The value of {k} is {v}." for k, v in zip(keys[:shown], values, strict=False)]
        context = "\n".join(lines) if pairs is None else _spread(sentences[:size], lines)
        key = keys[asked]
        return ContextTask(
            context=context,
            question=f"What is the value of {key}?",
            answer=values[asked],
            task="kv_retrieval",
            answer_prefix=f"The value of {key} is",
            details={
                "seed": seed,
                "pairs": shown,
                "asked": asked,
                "key": key,
                "sentences": 0 if pairs is None else size,
            },
        )

    if pairs is None:
        return _fit(make, 2, len(keys), max_tokens, count)
    return _fit(make, 0, len(sentences), max_tokens, count)


def needle(
    seed: int,
    depth: float = 0.5,
    max_tokens: int = 500,
    count: Callable[[str], int] = count_words,
) -> ContextTask:
    """
    A needle in a haystack: one planted fact at ``depth`` of a filler text.

    The needle, ``The special magic number for amber-river is 48213.``, stands between two
    sentences of the filler: at the boundary nearest ``depth`` × the filler's characters (as
    Kamradt's test places it at a fraction of the tokens, then backs up to a sentence's end),
    so within half a sentence of the depth asked.

    Args:
        seed: Makes the haystack, the key and the number (not the depth).
        depth: Where the needle stands, 0.0 (first) … 1.0 (last).
        max_tokens: The most ``count`` may give for the prompt with its answer.
        count: Counts a text's tokens (:func:`token_counter`); words by default.

    Raises:
        InvalidParameterError: a depth outside 0 … 1, a ``max_tokens`` too small for the needle
            and the question, or above 8,192.
    """
    if isinstance(depth, bool) or not isinstance(depth, int | float) or not 0.0 <= depth <= 1.0:
        raise InvalidParameterError(f"the needle's depth is 0.0 … 1.0; got {depth!r}")
    rng = random.Random(seed)
    sentences = _filler(rng)
    key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
    value = _numbers(rng, 1)[0]
    fact = f"The special magic number for {key} is {value}."

    def make(size: int) -> ContextTask:
        # the boundary between sentences nearest depth × the filler's characters
        starts = [0, *accumulate(len(sentence) + 1 for sentence in sentences[:size])]
        at = min(range(size + 1), key=lambda k: abs(starts[k] - depth * starts[-1]))
        return ContextTask(
            context=" ".join([*sentences[:at], fact, *sentences[at:size]]),
            question=f"What is the special magic number for {key} mentioned in the text?",
            answer=value,
            task="needle",
            answer_prefix=f"The special magic number for {key} is",
            details={"seed": seed, "depth": depth, "sentences": size, "at": at, "key": key},
        )

    return _fit(make, 0, len(sentences), max_tokens, count)


def needle_depths(
    seed: int,
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    max_tokens: int = 500,
    count: Callable[[str], int] = count_words,
) -> list[ContextTask]:
    """The needle task of ``seed`` at each of ``depths``: one haystack, one needle, moved."""
    return [needle(seed, depth, max_tokens, count) for depth in depths]


def variable_tracking(
    seed: int,
    hops: int = 2,
    chains: int = 2,
    max_tokens: int = 500,
    count: Callable[[str], int] = count_words,
) -> ContextTask:
    """
    RULER's variable tracking: follow one chain of assignments among others, through filler.

    Each chain starts ``VAR QXMTA = 52917.`` and passes the value on ``hops`` times
    (``VAR HZKPB = VAR QXMTA.``); the chains' statements alternate, each chain's in order,
    spread evenly through the filler. The question asks the value of one chain's last
    variable, and the answer completes ``VAR HZKPB =`` as a chain's first statement does
    (RULER asks instead which variables hold a value: a list, which a small model rarely
    writes out; here the answer is one number, and the other chains' numbers, or a variable,
    are the wrong answers within reach).

    Args:
        seed: Makes the task.
        hops: Assignments after each chain's first (1 … 8).
        chains: How many chains (1 … 4); with one, its number is the only one in the context.
        max_tokens: The most ``count`` may give for the prompt with its answer.
        count: Counts a text's tokens (:func:`token_counter`); words by default.

    Raises:
        InvalidParameterError: ``hops`` or ``chains`` out of range, a ``max_tokens`` too small
            for the statements and the question, or above 8,192.
    """
    _check_whole("hops", hops, 1, 8)
    _check_whole("chains", chains, 1, 4)
    rng = random.Random(seed)
    sentences = _filler(rng)
    names = _variable_names(rng, chains * (hops + 1))
    values = _numbers(rng, chains)
    links = [names[c * (hops + 1) : (c + 1) * (hops + 1)] for c in range(chains)]
    statements = [
        f"VAR {chain[0]} = {value}." if step == 0 else f"VAR {chain[step]} = VAR {chain[step - 1]}."
        for step in range(hops + 1)
        for chain, value in zip(links, values, strict=True)
    ]
    asked = rng.randrange(chains)
    last = links[asked][-1]

    def make(size: int) -> ContextTask:
        return ContextTask(
            context=_spread(sentences[:size], statements),
            question=f"What is the value of VAR {last}?",
            answer=values[asked],
            task="variable_tracking",
            answer_prefix=f"VAR {last} =",
            details={
                "seed": seed,
                "hops": hops,
                "chains": links,
                "asked": asked,
                "sentences": size,
            },
        )

    return _fit(make, 0, len(sentences), max_tokens, count)


#: Each generated kind by name: ``GENERATORS[kind](seed, max_tokens=..., count=...)``.
GENERATORS: Mapping[str, Callable[..., ContextTask]] = MappingProxyType(
    {"kv_retrieval": kv_retrieval, "needle": needle, "variable_tracking": variable_tracking}
)


def read_tasks(path: str | Path) -> list[ContextTask]:
    """
    A user's tasks: JSON Lines, one ``{"context", "question", "answer"}`` object per line.

    As :func:`parse_tasks` reads the file's text, its lines named by the file.

    Raises:
        InvalidInputError: the file unreadable or not UTF-8, and as :func:`parse_tasks`.
        InputTooLargeError: more than :data:`MAX_TASKS` tasks.
    """
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"{source.name}: not UTF-8 text") from None
    except OSError as err:
        raise InvalidInputError(f"{source.name}: cannot be read ({err.strerror})") from None
    return parse_tasks(text, source.name)


def parse_tasks(text: str, name: str = "the tasks") -> list[ContextTask]:
    """
    Tasks written as JSON Lines (a file's text, or pasted): one object per line.

    Each ``{"context", "question", "answer"}`` field is a non-empty text and no other field is
    read; blank lines are skipped. The tasks are of kind ``jsonl``, each with its line number
    in ``details``.

    Raises:
        InvalidInputError: no task, or a line that is not such an object (named ``name line
            N``).
        InputTooLargeError: more than :data:`MAX_TASKS` tasks.
    """
    tasks: list[ContextTask] = []
    for number, line in numbered_lines(text):
        if len(tasks) == MAX_TASKS:
            raise InputTooLargeError(f"{name} holds more than {MAX_TASKS} tasks")
        tasks.append(_task_line(parse_json(line, f"{name} line {number}"), number, name))
    if not tasks:
        raise InvalidInputError(
            f'{name} holds no task: give one {{"context", "question", "answer"}} per line'
        )
    return tasks


def task_prompt(task: ContextTask) -> tuple[str, str]:
    """
    The text the model reads, and the answer that follows it (with its leading space).

    ``context``, a blank line, ``Question: …``, then ``Answer:`` and the answer prefix: the
    answer continues the prefix as a sentence does, ``… is 48213``. The context's trailing
    whitespace is dropped, so the blank line is the only space between it and the question.
    """
    lead = " ".join(["Answer:", task.answer_prefix]).rstrip()
    prompt = f"{task.context.rstrip()}\n\nQuestion: {task.question.strip()}\n{lead}"
    return prompt, " " + task.answer.strip()


def task_inputs(adapter: Adapter, task: ContextTask) -> TaskInputs:
    """
    ``task`` on ``adapter``: its prompt with the answer teacher-forced, the context's tokens told.

    The context is tokenised alone (with the special tokens the adapter puts first) and the
    question after it alone, so no token spans the two: the first ``context_tokens`` tokens
    are exactly the context's own tokenisation. (Where a tokenizer would merge the context's
    last characters with the blank line after them, this splits them; SmolLM2's does not.)

    Raises:
        InvalidInputError: not a decoder LM, or a task longer than the model reads.
    """
    prompt, answer = task_prompt(task)
    context_text = task.context.rstrip()
    context = prompt_inputs(adapter, context_text)
    question = given_answer(adapter, prompt[len(context_text) :])
    before_answer = replace(answer_inputs(adapter, context, question), answer_length=0)
    found = given_answer(adapter, answer)
    inputs = answer_inputs(adapter, before_answer, found)
    return TaskInputs(
        inputs, answer_target(adapter, inputs, found), int(context.input_ids.shape[1])
    )


def _fit(
    make: Callable[[int], ContextTask],
    least: int,
    most: int,
    max_tokens: int,
    count: Callable[[str], int],
) -> ContextTask:
    """
    ``make(n)`` for the largest ``n`` in ``least … most`` whose prompt fits ``max_tokens``.

    Found by bisection: a task only grows with ``n`` (more pairs, more sentences).
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise InvalidParameterError(f"max_tokens is a whole number; got {max_tokens!r}")
    if max_tokens > _MAX_SIZE:
        raise InvalidParameterError(f"max_tokens is at most {_MAX_SIZE}; got {max_tokens}")

    def fits(n: int) -> bool:
        prompt, answer = task_prompt(make(n))
        return count(prompt + answer) <= max_tokens

    if not fits(least):
        raise InvalidParameterError(
            f"max_tokens={max_tokens} leaves no room for this task's question and answer: "
            f"the smallest takes {count(''.join(task_prompt(make(least))))}"
        )
    low, high = least, most  # fits(low) holds
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return make(low)


def _frozen(value: Any) -> Any:
    """A JSON value that cannot change: objects as read-only mappings, arrays as tuples."""
    if isinstance(value, dict):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    return value


def _thawed(value: Any) -> Any:
    """:func:`_frozen`'s value as plain JSON again (dicts and lists)."""
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thawed(item) for item in value]
    return value


def _spread(sentences: Sequence[str], statements: Sequence[str]) -> str:
    """``statements`` in order among ``sentences``, the k-th of S after ``round(k·n/(S+1))``."""
    parts: list[str] = []
    shown = 0
    for k, statement in enumerate(statements, start=1):
        upto = round(k * len(sentences) / (len(statements) + 1))
        parts += [*sentences[shown:upto], statement]
        shown = upto
    return " ".join([*parts, *sentences[shown:]])


def _check_whole(name: str, value: Any, least: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise InvalidParameterError(f"{name} is a whole number {least} … {most}; got {value!r}")


def _numbers(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct numbers of :data:`_DIGITS` digits, as texts."""
    first = 10 ** (_DIGITS - 1)
    return [str(v) for v in rng.sample(range(first, 10 * first), n)]


def _variable_names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct names of five capital letters."""
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    return names


def _filler(rng: random.Random) -> list[str]:
    """
    The filler's sentences: the bundled paragraphs in a seeded order, enough for 8,192 words.

    Each pass over the 26 paragraphs (about 2,400 words, 3,100 SmolLM2 tokens) is shuffled
    anew; a sentence ends at ``.``, ``!`` or ``?`` before a space.
    """
    paragraphs = _paragraphs()
    sentences: list[str] = []
    for _ in range(4):
        order = list(paragraphs)
        rng.shuffle(order)
        sentences += [s for p in order for s in re.split(r"(?<=[.!?])\s+", p.strip())]
    return sentences


def _paragraphs() -> list[str]:
    root = resources.files("attrlab.assets").joinpath("eval")
    lines = root.joinpath("lm_text.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def _task_line(record: Any, number: int, name: str) -> ContextTask:
    where = f"{name} line {number}"
    if not isinstance(record, dict):
        raise InvalidInputError(f'{where}: not a {{"context", "question", "answer"}} object')
    unknown = sorted(set(record) - set(_FIELDS))
    if unknown:
        raise InvalidInputError(f"{where}: unknown field {', '.join(map(repr, unknown))}")
    for name in _FIELDS:
        if name not in record:
            raise InvalidInputError(f"{where}: no '{name}'")
        value = record[name]
        if not isinstance(value, str):
            raise InvalidInputError(f"{where}: '{name}' is not a text")
        if not value.strip():
            raise InvalidInputError(f"{where}: '{name}' is empty")
        require_unicode(value, f"{where}: '{name}'")
    return ContextTask(
        record["context"], record["question"], record["answer"], "jsonl", details={"line": number}
    )
