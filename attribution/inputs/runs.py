"""
Many inputs × methods: rows stream in, results stream out, with progress and cancel.

The one loop over a dataset. The worker's batches (and through them ``attrlab batch``, its Ray
actors and the server's durable jobs), the leaderboard
(:func:`attribution.metrics.evaluate_methods`) and dataset mode
(:func:`attribution.layers.analyze_dataset`) run their inputs through it and keep only their
own wiring or aggregation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from attrlab.attribution.errors import AttrlabError, JobCancelledError
from attrlab.attribution.explain import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.inputs.features import with_features
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.vlm import ImagePrompt
from attrlab.attribution.request.answers import AnswerSpec, prompt_inputs
from attrlab.attribution.request.gate import clear_generation
from attrlab.attribution.request.run import (
    ProgressCallback,
    RunSettings,
    cancellable_forwards,
    stop_if_cancelled,
)
from attrlab.attribution.request.target import Target, target_record

__all__ = ["Prepared", "RowResult", "TargetedRow", "explain_rows", "prepare_input", "run_rows"]


class TargetedRow(Protocol):
    """An input row that names the output to explain (``None``: the top prediction)."""

    @property
    def target(self) -> int | str | None:
        """A class index or label."""


@dataclass(frozen=True)
class Prepared:
    """
    One input ready to explain: the model's inputs and what to explain on them.

    Attributes:
        inputs: The adapter's inputs (for a decoder's answer: prompt and answer, one sequence).
        target: What to explain on them (``None``: the top prediction).
        per_step: Add one map per step of the target (:func:`attribution.explain`).
    """

    inputs: Inputs
    target: Target | None = None
    per_step: bool = False


def prepare_input(
    adapter: Adapter,
    raw: Any,
    target: int | str | None,
    answer: AnswerSpec | None = None,
    cancel: threading.Event | None = None,
    granularity: str = "token",
    spans: Any = None,
    *,
    budgets: RunSettings | None = None,
) -> Prepared:
    """
    A request's input on the loaded model: every front end's one way from fields to inputs.

    ``raw`` (a text, an image, or an :class:`~attribution.models.vlm.ImagePrompt`, whose
    next token is explained as a one-token answer) is preprocessed and explained for
    ``target`` (an index or a label, as a record:
    :func:`~attribution.request.target.target_record`); with ``answer`` the text is a
    decoder LM's prompt, and inputs and target are the answer's
    (:func:`attribution.request.answers.answer_request`; ``target`` is then the next token that is
    the answer, where none is given or generated: a contrast's, or the chat template's).
    Generating an answer stops at its next forward once ``cancel`` is set. ``budgets``: the
    run's seconds and memory bound the generation too: it is priced before it starts
    (:func:`attribution.request.gate.clear_generation`) and stops once the seconds are spent. A text
    is explained at ``granularity`` (its words, sentences or ``spans``:
    :func:`attribution.inputs.features.with_features`).

    Raises:
        InvalidInputError: a ``target`` beside a given or generated answer (the answer is what
            is explained), and what the adapter or
            :func:`~attribution.request.answers.answer_request` refuses.
        JobCancelledError: ``cancel`` set while the answer is generated.
        TooSlowError, TooMuchMemoryError: a generation over ``budgets``, before it starts or
            (seconds) while it goes.
    """
    if answer is None and isinstance(raw, ImagePrompt):
        # a vision-language model's next token is a one-token answer (as its methods read it)
        answer = AnswerSpec()
    if answer is None:
        inputs = with_features(adapter.preprocess(raw), granularity, spans)
        return Prepared(inputs, target_record(adapter, target))
    max_seconds = None
    if budgets is not None and answer.generate is not None:
        prompt = prompt_inputs(adapter, raw, answer.chat)
        clear_generation(adapter, prompt, answer.generate, budgets)
        max_seconds = budgets.max_seconds
    with cancellable_forwards(adapter.model, cancel, max_seconds):
        inputs, record = answer.request(adapter, raw, target)
    return Prepared(with_features(inputs, granularity, spans), record, answer.per_step)


Row = TypeVar("Row")
Result = TypeVar("Result")
Targeted = TypeVar("Targeted", bound=TargetedRow)


def run_rows(
    rows: Iterable[Row],
    work: Callable[[Row], Result],
    cancel: threading.Event | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[Row, Result]]:
    """
    ``(row, work(row))`` for each row, in order, one row at a time.

    ``rows`` may be any iterable (the lines of a file): one is read only when the caller asks
    for the next result. ``cancel`` is checked before each row; ``progress`` receives the number
    of rows done once the caller has taken a row's result and asks for the next, so what the
    caller does with a result (scoring it, adding it to a sum) counts as part of its row.

    Raises:
        JobCancelledError: once ``cancel`` is set (no row starts after it).
    """
    for done, row in enumerate(rows, start=1):
        stop_if_cancelled(cancel)
        yield row, work(row)
        if progress is not None:
            progress(done)


@dataclass(frozen=True)
class RowResult(Generic[Targeted]):
    """One row, its prepared inputs, and per method its explanation or the error in its place."""

    row: Targeted
    #: What the methods explained, or the error that kept the row from being read.
    inputs: Inputs | AttrlabError
    outcomes: dict[str, Explanation | AttrlabError]

    def explained(self) -> tuple[Inputs, dict[str, Explanation]]:
        """
        The inputs and the explanations, for a caller that records no errors.

        Raises:
            AttrlabError: the first error recorded.
        """
        if isinstance(self.inputs, AttrlabError):
            raise self.inputs
        for outcome in self.outcomes.values():
            if isinstance(outcome, AttrlabError):
                raise outcome
        return self.inputs, {
            name: o for name, o in self.outcomes.items() if isinstance(o, Explanation)
        }


def explain_rows(
    adapter: Adapter,
    rows: Iterable[Targeted],
    methods: Sequence[str],
    prepare: Callable[[Targeted], Inputs | Prepared],
    *,
    params: Mapping[str, dict[str, Any]] | None = None,
    settings: RunSettings | None = None,
    progress: Callable[[int], None] | None = None,
    record_errors: Callable[[int, str | None], AttrlabError] | None = None,
    passes: ProgressCallback | None = None,
) -> Iterator[RowResult[Targeted]]:
    """
    Each row explained by each method (:func:`attribution.explain`), a row at a time.

    A row is prepared once (``prepare``: the adapter's inputs, explained for the row's own target,
    read as a record there; or a :class:`Prepared` record, whose target and ``per_step`` are used
    instead, as a decoder's answer needs), then explained by each method in turn, with that method's
    ``params`` and the same ``settings`` (its budgets are each explanation's own: the gate refuses
    one priced over the seconds; its progress is left out, as rows report theirs);
    ``settings.cancel`` and ``progress`` are :func:`run_rows`'. ``passes`` receives each
    explanation's own progress (forward passes done of its total), for a caller that shows the run
    in progress.

    Without ``record_errors`` the first error stops the loop. With it, a row's errors are its
    results and the next row goes on: an :class:`AttrlabError` from ``prepare`` (or the row's
    target) stands for every method, one from a method (or the gate before it) for that method; any
    other exception (a bug) is recorded as ``record_errors(row number, method)`` (``None`` for
    ``prepare``; row numbers count from 0), which is called while it is being handled, so that it
    may log it.

    Raises:
        JobCancelledError: once ``settings.cancel`` is set; a cancel is never recorded as a
            result.
    """
    each = replace(settings or RunSettings(), progress=passes)

    def explained(
        numbered: tuple[int, Targeted],
    ) -> tuple[Inputs | AttrlabError, dict[str, Explanation | AttrlabError]]:
        number, row = numbered
        try:
            ready = prepare(row)
            if not isinstance(ready, Prepared):
                ready = Prepared(ready, target_record(adapter, row.target))
        except Exception as err:
            problem = _recorded(err, record_errors, number, None)
            return problem, dict.fromkeys(methods, problem)
        outcomes: dict[str, Explanation | AttrlabError] = {}
        for method in methods:
            try:
                outcomes[method] = explain(
                    adapter,
                    method,
                    ready.inputs,
                    target=ready.target,
                    params=(params or {}).get(method),
                    settings=each,
                    per_step=ready.per_step,
                )
            except Exception as err:
                outcomes[method] = _recorded(err, record_errors, number, method)
        return ready.inputs, outcomes

    for (_, row), (inputs, outcomes) in run_rows(enumerate(rows), explained, each.cancel, progress):
        yield RowResult(row, inputs, outcomes)


def _recorded(
    err: Exception,
    record_errors: Callable[[int, str | None], AttrlabError] | None,
    number: int,
    method: str | None,
) -> AttrlabError:
    """What ``err`` is recorded as; raised again where nothing is recorded (or a cancel)."""
    if record_errors is None or isinstance(err, JobCancelledError):
        raise err
    if isinstance(err, AttrlabError):
        return err
    return record_errors(number, method)
