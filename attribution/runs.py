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
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.run import ProgressCallback, RunSettings, stop_if_cancelled

__all__ = ["RowResult", "TargetedRow", "explain_rows", "run_rows"]


class TargetedRow(Protocol):
    """An input row that names the output to explain (``None``: the top prediction)."""

    @property
    def target(self) -> int | str | None:
        """A class index or label."""


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
    prepare: Callable[[Targeted], Inputs],
    *,
    params: Mapping[str, dict[str, Any]] | None = None,
    settings: RunSettings | None = None,
    progress: Callable[[int], None] | None = None,
    record_errors: Callable[[int, str | None], AttrlabError] | None = None,
    passes: ProgressCallback | None = None,
) -> Iterator[RowResult[Targeted]]:
    """
    Each row explained by each method (:func:`attribution.explain`), a row at a time.

    A row is prepared once (``prepare``: the adapter's inputs), then explained with its own
    target by each method in turn, with that method's ``params`` and the same ``settings``
    (its budgets are each explanation's own: the gate refuses one priced over the seconds;
    its progress is left out, as rows report theirs); ``settings.cancel`` and ``progress``
    are :func:`run_rows`'. ``passes`` receives each explanation's own progress (forward
    passes done of its total), for a caller that shows the run in progress.

    Without ``record_errors`` the first error stops the loop. With it, a row's errors are its
    results and the next row goes on: an :class:`AttrlabError` from ``prepare`` stands for every
    method, one from a method (or the gate before it) for that method; any other exception (a
    bug) is recorded as ``record_errors(row number, method)`` (``None`` for ``prepare``; row numbers
    count from 0), which is called while it is being handled, so that it may log it.

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
            inputs = prepare(row)
        except Exception as err:
            problem = _recorded(err, record_errors, number, None)
            return problem, dict.fromkeys(methods, problem)
        outcomes: dict[str, Explanation | AttrlabError] = {}
        for method in methods:
            try:
                outcomes[method] = explain(
                    adapter,
                    method,
                    inputs,
                    target=row.target,
                    params=(params or {}).get(method),
                    settings=each,
                )
            except Exception as err:
                outcomes[method] = _recorded(err, record_errors, number, method)
        return inputs, outcomes

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
