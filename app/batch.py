"""
``attrlab batch``: every method on every row of a dataset, written as JSON Lines or Parquet.

The same function explains a chunk of rows on the local worker and inside each Ray actor
(:mod:`app.engine_ray`), so both engines give the same rows. Output is resumable: rows whose
id already has a result for every method are skipped, and results are written as each chunk
finishes (JSON Lines appended and flushed; Parquet rewritten through a temporary file and an
atomic rename), so an interrupted run loses at most the chunk in progress.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from attrlab.app.jobs import cut_torn_tail, instance_json
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import AttrlabError, InvalidInputError, parse_json
from attrlab.attribution.inputs.rows import dataset_line, numbered_lines
from attrlab.attribution.models.placement import Placement
from attrlab.attribution.request import BatchRequest, Instance
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.attribution.request.run import ProgressCallback

__all__ = [
    "IMAGE_SUFFIXES",
    "BatchConfig",
    "DatasetRow",
    "ResultFile",
    "dataset_rows",
    "explain_rows",
    "numbered_lines",  # the library's reader, which the page's uploads take from here
    "pending_rows",
    "result_arrow",
    "result_rows",
    "result_table",
    "unique_ids",
]

#: A row's top predictions: each output's index, label and probability.
PREDICTION_TYPE = pa.struct(
    [("index", pa.int64()), ("label", pa.string()), ("probability", pa.float64())]
)
#: Columns of a batch result row, one per input and method (``attrlab batch``'s JSON Lines and
#: Parquet, the page's downloads and a job's Parquet), with their Arrow types: one schema
#: whatever the rows hold. ``id`` is the dataset row's id (a job's: the instance's number,
#: int64). ``scores`` is the map flattened in row-major order, ``scores_shape`` its shape
#: (``[tokens]`` or ``[height, width]``); ``explanation_json`` the whole Explanation as JSON
#: (``Explanation.from_json`` reads it). A row with an error has only it beside its key.
RESULT_TYPES = {
    "id": pa.string(),
    "method": pa.string(),
    "target": pa.int64(),
    "label": pa.string(),
    "probability": pa.float64(),
    "predictions": pa.list_(PREDICTION_TYPE),
    "tokens": pa.list_(pa.string()),
    "scores": pa.list_(pa.float64()),
    "scores_shape": pa.list_(pa.int64()),
    "error": pa.string(),
    "explanation_json": pa.string(),
}
RESULT_COLUMNS = list(RESULT_TYPES)


@dataclass(frozen=True)
class DatasetRow:
    """
    One input of a dataset: its id, a text, the image file's bytes or both, an optional target.

    An image with a text is a vision-language model's image and prompt. A row with a text may
    instead ask about a decoder LM's answer (``answer``), and be explained
    by its words, sentences or spans (``granularity``, ``spans``).
    """

    id: str
    text: str | None = None
    image: bytes | None = None
    target: int | str | None = None
    answer: AnswerSpec | None = None
    granularity: str = "token"
    spans: list[list[int]] | None = None
    #: Why the row could not be read (bad JSON, a missing file): recorded as its result.
    problem: str | None = None

    def instance(self) -> Instance:
        """The row as the worker's input."""
        return Instance(
            text=self.text,
            image=self.image,
            target=self.target,
            answer=self.answer,
            granularity=self.granularity,
            spans=self.spans,
            problem=self.problem,
        )


#: Image files a folder (or an uploaded zip) contributes as rows.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def dataset_rows(
    lines: Iterable[tuple[int, str]], read_image: Callable[[str], bytes] | None
) -> Iterator[DatasetRow]:
    """
    Rows from JSONL lines ``(number, line)`` (see :func:`attribution.inputs.rows.dataset_line`).

    ``read_image`` reads an ``"image"`` line's name (a file beside the dataset, or a member of
    an uploaded zip); without one, image lines are refused (a page's upload names no server
    file). A line that cannot be read carries its problem, recorded as its result.
    """
    for number, line in lines:
        row = dataset_line(number, line)
        if row.problem is not None or row.image is None:
            yield DatasetRow(
                id=row.id,
                text=row.text,
                target=row.target,
                answer=row.answer,
                granularity=row.granularity,
                spans=row.spans,
                problem=row.problem,
            )
            continue
        if read_image is None:
            problem = f"line {number}: images come in a zip upload beside the JSONL"
            yield DatasetRow(id=row.id, problem=problem)
            continue
        try:
            image = read_image(row.image)
        except AttrlabError as err:
            yield DatasetRow(id=row.id, problem=f"line {number}: {err}")
            continue
        yield DatasetRow(
            id=row.id,
            text=row.text,  # an image's prompt, for a vision-language model
            image=image,
            target=row.target,
            answer=row.answer,
            granularity=row.granularity,
            spans=row.spans,
        )


@dataclass(frozen=True)
class BatchConfig:
    """What every row is explained with (plain data: it travels to Ray actors)."""

    model: str
    methods: tuple[str, ...]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None
    seed: int = 0
    evaluate: bool = False
    device: str | None = None
    placement: Placement = field(default_factory=Placement)


def explain_rows(
    worker: ExplainWorker,
    config: BatchConfig,
    rows: Sequence[DatasetRow],
    progress: ProgressCallback | None = None,
) -> list[dict[str, Any]]:
    """
    Result rows (see :data:`RESULT_COLUMNS`) for ``rows``, in order, one per row and method.

    The rows run as one worker batch, that is through the library's loop over inputs ×
    methods (:func:`attribution.inputs.runs.explain_rows`); this adds only the file's row shape. A
    row that cannot be explained gets its error in each of its result rows. ``progress``
    receives the batch's (explanations done, explanations) as its rows finish.
    """
    request = BatchRequest(
        model=config.model,
        labels=config.labels,
        seed=config.seed,
        instances=tuple(r.instance() for r in rows),
        methods=config.methods,
        params=config.params,
        evaluate=config.evaluate,
    )
    results = worker.explain(request, progress)
    return [
        result
        for row, outcome in zip(rows, results, strict=True)
        for result in result_rows(row.id, instance_json(outcome))
    ]


def result_rows(key: Any, explanations: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One instance's wire results (method -> Explanation JSON or error) as result rows."""
    rows = []
    for method, outcome in explanations.items():
        row: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
        row.update(id=key, method=method)
        if "error" in outcome:
            row["error"] = outcome["error"]["message"]
        else:
            scores = np.asarray(outcome["scores"], dtype=np.float64)
            row.update(
                target=outcome["target"]["index"],
                label=outcome["target"]["label"],
                # one output's or an answer's; a contrast has none (its probability_ratio
                # is in explanation_json)
                probability=outcome["target"].get("probability"),
                predictions=outcome["predictions"],
                tokens=outcome["tokens"],
                scores=scores.ravel().tolist(),
                scores_shape=list(scores.shape),
                explanation_json=json.dumps(outcome),
            )
        rows.append(row)
    return rows


def result_table(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """
    Result rows as a frame with :data:`RESULT_COLUMNS`.

    ``target`` holds integers or missing, ``probability`` numbers or NaN (so a frame of errors
    only has the types of one with results).
    """
    table = pd.DataFrame.from_records(list(rows), columns=RESULT_COLUMNS)
    return table.astype({"target": "Int64", "probability": "float64"})


def result_arrow(rows: Iterable[dict[str, Any]], key_type: pa.DataType | None = None) -> pa.Table:
    """
    Result rows as an Arrow table of one fixed schema, whatever the rows hold.

    Without it a column that is all missing (no error in a run, no score in another) would
    get Arrow's null type, and a resumed run's file would differ from a fresh one's. ``id`` is
    of ``key_type``: text by default (a dataset's ids), int64 for a job's instance numbers.
    """
    types = {**RESULT_TYPES, "id": key_type or RESULT_TYPES["id"]}
    return pa.Table.from_pandas(
        result_table(rows), schema=pa.schema(list(types.items())), preserve_index=False
    )


def parquet_file(results: Iterable[dict[str, Any]], chunk: int = 256) -> Path:
    """
    Job results (``{"index", "explanations"}`` per instance) as a temporary Parquet file.

    One row per instance and method (:data:`RESULT_TYPES`), its ``id`` the instance's
    ``index`` (int64). Written a chunk of instances at a time, so memory stays
    bounded by one chunk; the caller serves the file (it lies in the system's temporary folder).
    """
    handle, name = tempfile.mkstemp(prefix="attrlab-results-", suffix=".parquet")
    os.close(handle)
    try:
        _write_parquet(results, name, chunk)
    except BaseException:  # a failed write leaves no file behind
        os.unlink(name)
        raise
    return Path(name)


def _write_parquet(results: Iterable[dict[str, Any]], name: str, chunk: int) -> None:
    writer = None
    try:
        rows_left = iter(results)
        while part := list(itertools.islice(rows_left, chunk)):
            rows = [r for row in part for r in result_rows(row["index"], row["explanations"])]
            table = result_arrow(rows, pa.int64())
            if writer is None:
                writer = pq.ParquetWriter(name, table.schema)
            writer.write_table(table)
        if writer is None:  # no results yet: an empty table with the columns
            pq.write_table(result_arrow([], pa.int64()), name)
    finally:
        if writer is not None:
            writer.close()


class ResultFile:
    """A batch's output, ``.jsonl`` or ``.parquet``: the rows already there, and appending."""

    def __init__(self, path: Path) -> None:
        if path.suffix not in (".jsonl", ".parquet"):
            raise InvalidInputError(f"the output must end in .jsonl or .parquet; got '{path}'")
        if not path.parent.is_dir():
            raise InvalidInputError(f"the output's folder '{path.parent}' does not exist")
        self.path = path
        self.rows = self._read() if path.exists() else []
        try:  # before any work: a place that cannot be written would lose it
            _partial(path).touch()
            _partial(path).unlink()
            if path.suffix == ".jsonl" and path.exists():  # appended to in place
                path.open("a").close()
        except OSError as err:
            raise InvalidInputError(f"cannot write the output '{path}': {err.strerror}") from None

    def keep_settings(self, settings: dict[str, Any]) -> None:
        """
        Refuse a run whose settings differ from those of the rows already in the output.

        ``settings``: ``model``, ``labels``, ``seed``, ``evaluate``, ``quantization`` (the
        weights' format changes the maps; where the layers are placed does not) and ``params``
        (method -> its resolved parameters), kept beside the output in
        ``<output>.settings.json``. A method new to the output adds its parameters. An output
        written before settings were kept is not checked; one kept before quantisation was
        has none.

        Raises:
            InvalidInputError: naming the setting that differs.
        """
        path = self.path.with_name(self.path.name + ".settings.json")
        stored: dict[str, Any] = {**settings, "params": {}}
        if path.exists() and self.rows:
            try:
                stored = parse_json(path.read_text(encoding="utf-8"), "the settings")
                keys = ("model", "labels", "seed", "evaluate")
                checks = [(key, stored[key], settings[key]) for key in keys]
                checks += [("quantization", stored.get("quantization"), settings["quantization"])]
                checks += [
                    (f"{method}'s parameters", stored["params"][method], params)
                    for method, params in settings["params"].items()
                    if method in stored["params"]
                ]
            except (OSError, ValueError, KeyError, TypeError, InvalidInputError) as err:
                raise InvalidInputError(f"cannot read '{path}': {err}") from None
            for what, before, asked in checks:
                if before != asked:
                    raise InvalidInputError(
                        f"the output '{self.path}' holds results made with {what} {before!r}; "
                        f"this run asks for {asked!r}: give another output file"
                    )
        elif self.rows:  # from before settings were kept: nothing to check against
            return
        stored["params"] = {**stored["params"], **settings["params"]}
        partial = _partial(path)
        try:
            partial.write_text(json.dumps(stored, indent=1), encoding="utf-8")
            partial.replace(path)
        except OSError as err:
            raise InvalidInputError(f"cannot write '{path}': {err.strerror}") from None

    def _read(self) -> list[dict[str, Any]]:
        if self.path.suffix == ".parquet":
            try:  # Arrow's rows: a missing value is None, as in rows written by this run
                rows = pq.read_table(self.path).to_pylist()
            except (OSError, ValueError) as err:
                raise InvalidInputError(f"cannot read '{self.path}' to resume: {err}") from None
        else:
            rows = []
            try:
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise InvalidInputError(f"cannot read '{self.path}' to resume: {err}") from None
            lines = text.splitlines()
            for number, line in enumerate(lines, start=1):
                try:
                    rows.append(parse_json(line, f"line {number}"))
                except InvalidInputError:  # only the last line can be cut short by a stop
                    if number < len(lines):
                        rows.append(None)  # not ours: refused below
        if not all(isinstance(row, dict) and {"id", "method"} <= row.keys() for row in rows):
            raise InvalidInputError(
                f"'{self.path}' is not the output of attrlab batch (its rows have no id and "
                "method), so it is not resumed or overwritten: give another output file"
            )
        if any(row.keys() != set(RESULT_COLUMNS) for row in rows):
            raise InvalidInputError(
                f"'{self.path}' was written by another version of attrlab batch (its rows' "
                f"columns are not {', '.join(RESULT_COLUMNS)}), so it is not resumed: give "
                "another output file"
            )
        return rows

    def failed(self) -> int:
        """How many of the rows hold an error."""
        return sum(1 for row in self.rows if row.get("error") is not None)

    def done(self, methods: Sequence[str]) -> set[str]:
        """
        Ids with a result for every method (the file is not changed).

        An id with only some of ``methods`` (an interrupted chunk, a method added since) is
        redone; its earlier rows for those methods go when the new ones are written.
        """
        seen: dict[str, set[str]] = {}
        for row in self.rows:
            seen.setdefault(str(row["id"]), set()).add(row["method"])
        return {key for key, found in seen.items() if set(methods) <= found}

    def append(self, rows: list[dict[str, Any]]) -> None:
        """
        Add rows durably: JSON Lines appended and flushed, Parquet rewritten atomically.

        Rows that redo an (id, method) already on file replace it in one atomic rewrite, so a
        stop at any point leaves every finished row once. Parquet has no append: each chunk
        rewrites the file (fine for the result sizes of a command-line run; use JSON Lines
        for very large outputs).
        """
        redone = {(str(row["id"]), row["method"]) for row in rows}
        earlier = [row for row in self.rows if (str(row["id"]), row["method"]) not in redone]
        try:
            if self.path.suffix == ".jsonl" and len(earlier) == len(self.rows):
                cut_torn_tail(self.path)
                with self.path.open("a", encoding="utf-8") as file:
                    file.writelines(json.dumps(row) + "\n" for row in rows)
                    file.flush()
                    os.fsync(file.fileno())
                self.rows += rows
                return
            self._rewrite(earlier + rows)
        except OSError as err:  # a full disk: what was written stays, a rerun resumes
            raise InvalidInputError(
                f"cannot write the output '{self.path}': {err.strerror}; the rows written so far "
                "are kept, and running the same command again resumes"
            ) from None

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        """Replace the file's rows atomically (a temporary file, then a rename)."""
        partial = _partial(self.path)
        if self.path.suffix == ".jsonl":
            partial.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        else:
            pq.write_table(result_arrow(rows), partial)
        partial.replace(self.path)
        self.rows = rows


def _partial(path: Path) -> Path:
    """Where ``path``'s new content is written before it replaces the file in one rename."""
    return path.with_name(path.name + ".partial")


def pending_rows(rows: Iterable[DatasetRow], done: set[str]) -> Iterator[DatasetRow]:
    """The rows whose id is not done yet."""
    return (row for row in rows if row.id not in done)


def unique_ids(rows: Iterable[DatasetRow]) -> list[DatasetRow]:
    """
    The rows, refusing a dataset where two rows share an id (``1`` and ``"1"`` are one id).

    An id names a row's results: shared, they could not be told apart, nor resumed.

    Raises:
        InvalidInputError: naming the first id given twice.
    """
    rows = list(rows)
    seen: set[str] = set()
    for row in rows:
        if row.id in seen:
            raise InvalidInputError(
                f"the id '{row.id}' names more than one row (ids name the rows of the output, "
                "so each must be unique; a row without an id is named line-N)"
            )
        seen.add(row.id)
    return rows
