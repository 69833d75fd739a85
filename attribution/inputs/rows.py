"""
The one reader of dataset lines: JSON Lines, one ``{"id"?, "text" | "image", "target"?}`` each.

A line with both ``"image"`` and ``"text"`` is an image and its prompt, a vision-language
model's input (whether the batch's model takes it is checked where the rows run:
:func:`~attribution.request.records.check_instance_modalities`). A line with a text may also
ask about a decoder LM's answer: ``answer`` or ``generate`` (with ``stop``), ``contrast``,
``chat``, ``per_step`` (:class:`~attribution.request.answers.AnswerSpec`), and be explained by
its words, sentences or spans: ``granularity`` and ``spans``
(:mod:`attribution.inputs.features`; whether the spans fit the text is checked where it is
explained, or up front by :func:`~attribution.inputs.features.check_features`).

Every front end that reads a dataset file reads it here (``attrlab batch``, ``layers`` and
``evaluate`` with ``--input``, the page's uploads), and the REST API refuses a target with the
same words (:func:`target_problem`), so a line means the same thing on every path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from attrlab.attribution.errors import AttrlabError, InvalidInputError, parse_json, require_unicode
from attrlab.attribution.inputs.features import check_features
from attrlab.attribution.request.answers import AnswerSpec

__all__ = ["DatasetLine", "dataset_line", "numbered_lines", "target_problem"]


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    r"""
    ``(line number, line)`` of the non-blank lines of a JSON Lines text.

    A line ends at ``\n`` (a ``\r`` before it dropped) and only there: the other breaks of
    :meth:`str.splitlines` (U+2028, U+2029, U+0085) may stand raw inside a JSON string, so
    splitting there would cut a good line and misnumber the rest. A leading byte order mark
    (an editor's) is not part of the first line.
    """
    lines = text.removeprefix("\ufeff").split("\n")
    return ((n, line.removesuffix("\r")) for n, line in enumerate(lines, start=1) if line.strip())


def target_problem(target: Any) -> str | None:
    """
    Why ``target`` (as given in JSON) names no output, or None for a label, an index or none.

    JSON's ``true`` is refused: Python counts it as the integer 1, so it would silently
    explain class 1.
    """
    if target is None or (isinstance(target, str | int) and not isinstance(target, bool)):
        return None
    return "target must be a label or an index"


@dataclass(frozen=True)
class DatasetLine:
    """One JSONL line as read: its id, a text, an image's name or both, a target, or a problem."""

    id: str
    text: str | None = None
    image: str | None = None
    target: int | str | None = None
    #: What the line asks about a decoder LM's answer to its text (``None``: its prediction).
    answer: AnswerSpec | None = None
    #: What the text's scores are given to (:data:`~attribution.inputs.features.GRANULARITIES`).
    granularity: str = "token"
    #: The character spans of granularity ``span``.
    spans: list[list[int]] | None = None
    #: Why the line cannot be a row ("line 3: not JSON (...)"); the other fields are then unset.
    problem: str | None = None


def dataset_line(number: int, line: str) -> DatasetLine:
    """
    Line ``number`` of a JSONL dataset: ``{"id"?, "text" | "image": name, "target"?}``.

    ``"text"`` and ``"image"`` together are an image and its prompt. A line with a text may
    carry the fields of an :class:`~attribution.request.answers.AnswerSpec`.

    It never raises: a line that is not JSON (nested too deeply to read, too), not an object,
    or has a field of the wrong type or a string that is not valid Unicode (a lone surrogate,
    which JSON can escape) comes back with its problem, naming the line. The id is ``line-N``
    unless the line gives one (a string or a whole number).
    """
    key = f"line-{number}"
    try:
        record = parse_json(line, f"line {number}")
    except InvalidInputError as err:
        return DatasetLine(id=key, problem=str(err))
    if not isinstance(record, dict) or not ("text" in record or "image" in record):
        return DatasetLine(
            id=key,
            problem=f'line {number}: give an object with "text" or "image" (a path), or both '
            "(an image and its prompt)",
        )
    given = record.get("id")
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, str | int):
            return DatasetLine(id=key, problem=f"line {number}: id must be a string or a number")
        key = str(given)
    target = record.get("target")
    problem = target_problem(target)
    if problem is not None:
        return DatasetLine(id=key, problem=f"line {number}: {problem}")
    given_fields = [name for name in ("text", "image") if name in record]
    for name in given_fields:
        if not isinstance(record[name], str):
            return DatasetLine(id=key, problem=f"line {number}: {name} must be a string")
    try:  # JSON's "\ud800" escapes make strings no file name, tokenizer or Parquet can hold
        for name in ("id", *given_fields, "target", "answer", "stop", "contrast"):
            if isinstance(record.get(name), str):
                require_unicode(record[name], f"line {number}: the {name}")
    except InvalidInputError as err:
        return DatasetLine(id=f"line-{number}", problem=str(err))
    if not isinstance(record.get("spans", []), list):
        return DatasetLine(id=key, problem=f"line {number}: spans must be a list of [start, end]")
    try:
        answer = AnswerSpec.from_json(record)
        granularity, spans = record.get("granularity", "token"), record.get("spans")
        check_features(granularity, spans)  # each span, and its fit to the text: later
    except AttrlabError as err:
        return DatasetLine(id=key, problem=f"line {number}: {err}")
    if answer is not None and "text" not in record:
        return DatasetLine(id=key, problem=f"line {number}: an answer follows a text, not an image")
    return DatasetLine(
        id=key,
        target=target,
        answer=answer,
        granularity=granularity,
        spans=spans,
        **{name: record[name] for name in given_fields},
    )
