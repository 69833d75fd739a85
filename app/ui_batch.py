"""The Evaluate tab (the faithfulness leaderboard) and the Batch tab (a dataset, downloaded)."""

from __future__ import annotations

import itertools
import json
import lzma
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gradio as gr

from attrlab.app.batch import (
    IMAGE_SUFFIXES,
    DatasetRow,
    dataset_rows,
    numbered_lines,
    result_rows,
    unique_ids,
)
from attrlab.app.jobs import instance_json
from attrlab.app.ui import (
    label_list,
    labels_for,
    method_entries,
    page_folder,
    readable,
    received_file,
    received_input,
    sample_labels,
)
from attrlab.app.worker import MAX_CURVE_STEPS, MAX_ORDERS, BatchRequest, EvaluateRequest, Instance
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.models import BUILTIN_MODELS, default_model

__all__ = ["batch_tab", "evaluate_tab", "uploaded_rows"]


def _methods(modality: str) -> list[str]:
    return [e["name"] for e in method_entries(modality)]


def _classifiers(modality: str) -> list[str]:
    return [
        name for name, m in BUILTIN_MODELS.items() if m.modality == modality and not m.next_token
    ]


def evaluate_tab(runner: Any) -> None:
    """Every chosen method on the bundled examples, scored for faithfulness."""
    from attrlab.attribution.metrics.leaderboard import bundled_items

    counts = {m: len(bundled_items(m)) for m in ("text", "image")}
    gr.Markdown(
        "Each method's map on each bundled example, scored against random orders of the same "
        "input (text: comprehensiveness and sufficiency; images: deletion and insertion)."
    )
    with gr.Row():
        modality = gr.Radio(["text", "image"], value="text", label="Inputs")
        model = gr.Dropdown(
            _classifiers("text"),
            value=default_model("text"),
            label="Model",
            allow_custom_value=True,
            elem_id="evaluate-model",
        )
        labels = gr.Textbox(sample_labels(default_model("text")), label="Labels (zero-shot models)")
    methods = gr.CheckboxGroup(
        _methods("text"),
        value=["gradient_x_input", "integrated_gradients", "attnlrp"],
        label="Methods",
        elem_id="evaluate-methods",
    )
    with gr.Row():
        items = gr.Slider(1, counts["text"], value=min(4, counts["text"]), step=1, label="Items")
        steps = gr.Slider(5, MAX_CURVE_STEPS, value=20, step=1, label="Curve steps (images)")
        orders = gr.Slider(1, MAX_ORDERS, value=2, step=1, label="Random orders")
        upload = received_input(
            gr.File(
                label="Or your own set (.jsonl of texts, .zip of images)",
                file_types=[".jsonl", ".zip"],
                height=90,
                elem_id="evaluate-upload",
            )
        )
    with gr.Row():
        run = gr.Button("Evaluate", variant="primary", elem_id="evaluate-run")
        cancel = gr.Button("Cancel", variant="stop")
    table = gr.Dataframe(label="Leaderboard", elem_id="evaluate-table")
    plot = gr.Plot(label="Scores against random orders", elem_id="evaluate-plot")
    with gr.Accordion("Per item", open=False):
        per_item_table = gr.Dataframe()

    def switch(kind: str) -> list[Any]:
        defaults = ["gradient_x_input", "integrated_gradients"]
        return [
            gr.update(choices=_classifiers(kind), value=default_model(kind)),
            gr.update(choices=_methods(kind), value=defaults),
            gr.update(maximum=counts[kind], value=min(4, counts[kind])),
            labels_for(default_model(kind)),
        ]

    modality.change(switch, modality, [model, methods, items, labels], api_visibility="private")
    model.change(labels_for, model, labels, api_visibility="private")

    @readable
    def evaluate(
        kind,
        model_,
        labels_,
        chosen,
        count,
        steps_,
        orders_,
        path,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        from attrlab.attribution.metrics.leaderboard import summarise
        from attrlab.viz.evaluate import leaderboard_figure

        if not chosen:
            raise gr.Error("choose at least one method")
        instances: tuple[Instance, ...] = ()
        if path:  # an uploaded set, all of it (within the server's batch bound)
            settings = runner.worker.settings
            rows = uploaded_rows(received_file(path), settings.max_body_bytes, settings.max_batch)
            if not rows:
                raise gr.Error("the upload holds no rows")
            instances = tuple(r.instance() for r in rows)
        request_ = EvaluateRequest(
            model=model_,
            labels=label_list(labels_),
            modality=kind,
            methods=tuple(chosen),
            items=None if instances else int(count),
            steps=int(steps_),
            random_orders=int(orders_),
            instances=instances,
        )
        per_item = runner(request_, progress, request.session_hash, "evaluate")
        if per_item.empty:
            raise gr.Error("nothing was evaluated: none of these methods applies to this model")
        summary = summarise(per_item, kind)
        return [summary.round(4), leaderboard_figure(per_item, kind), per_item.round(4)]

    running = run.click(
        evaluate,
        [modality, model, labels, methods, items, steps, orders, upload],
        [table, plot, per_item_table],
        api_name="evaluate",
        concurrency_id="run-evaluate",
    )
    cancel.click(
        runner.cancel_handler("evaluate"),
        [],
        [],
        cancels=[running],
        api_visibility="private",
    )


#: What reading a damaged, encrypted or oddly compressed zip member raises.
_UNREADABLE = (
    zipfile.BadZipFile,
    RuntimeError,
    NotImplementedError,
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
)


def uploaded_rows(
    path: str | Path | None, max_bytes: int, max_rows: int | None
) -> list[DatasetRow]:
    """
    Rows of a page upload: a JSONL file of texts, or a zip of images (with or without a JSONL).

    ``path`` is a file the page received (handlers pass it through
    :func:`app.ui.received_file`). Nothing in it names a server file: image lines of a JSONL
    name members of the same zip. The zip is read within bounds: at most ``max_bytes``
    unpacked in all, and at most ``max_rows`` rows (None: no limit), each checked before it is
    read.
    """
    if not path:
        raise InvalidInputError("upload a .jsonl file or a .zip of images first")
    upload = Path(path)
    if upload.suffix.lower() == ".jsonl":
        text = _utf8(upload.read_bytes(), upload.name)
        return _bounded(dataset_rows(numbered_lines(text), None), max_rows)
    if upload.suffix.lower() != ".zip":
        raise InvalidInputError("upload a .jsonl file or a .zip of images")
    try:
        archive = zipfile.ZipFile(upload)
    except zipfile.BadZipFile:
        raise InvalidInputError("the upload is not a readable zip file") from None
    with archive:
        members = {i.filename: i for i in archive.infolist() if not i.is_dir()}
        unpacked = [0]

        def read(name: str) -> bytes:
            info = members.get(name)
            if info is None:
                raise InvalidInputError(f"the zip has no member '{name}'")
            unpacked[0] += info.file_size
            if unpacked[0] > max_bytes:
                raise InvalidInputError(
                    f"the zip unpacks to more than {max_bytes:,} bytes (at '{name}'); this "
                    "server reads at most that much of an upload"
                )
            try:
                return archive.read(info)
            except _UNREADABLE as err:
                raise InvalidInputError(f"zip member '{name}' cannot be read: {err}") from None

        listed = [n for n in members if n.lower().endswith(".jsonl")]
        if listed:
            text = _utf8(read(listed[0]), listed[0])
            return _bounded(dataset_rows(numbered_lines(text), read), max_rows)
        images = sorted(n for n in members if Path(n).suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise InvalidInputError("the zip holds neither a .jsonl file nor images")
        return _bounded((DatasetRow(id=Path(n).name, image=read(n)) for n in images), max_rows)


def _bounded(rows: Iterable[DatasetRow], max_rows: int | None) -> list[DatasetRow]:
    """The rows, refusing before reading past ``max_rows`` of them, and repeated ids."""
    kept = list(itertools.islice(rows, None if max_rows is None else max_rows + 1))
    if max_rows is not None and len(kept) > max_rows:
        raise InvalidInputError(
            f"the upload holds more than {max_rows} rows; this server explains at most "
            f"{max_rows} at a time"
        )
    return unique_ids(kept)


def _example_dataset() -> Path:
    from importlib import resources

    return Path(str(resources.files("attrlab.assets").joinpath("examples", "reviews.jsonl")))


def _utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"'{Path(name).name}' is not UTF-8 text") from None


def batch_tab(runner: Any) -> None:
    """A dataset explained with every chosen method; results as JSON Lines and Parquet."""
    gr.Markdown(
        'Upload a **.jsonl** file (one `{"text": ..., "target"?: ...}` per line) or a '
        '**.zip** of images (or of images and a .jsonl naming them with `"image"`).'
    )
    with gr.Row():
        upload = received_input(
            gr.File(label="Dataset", file_types=[".jsonl", ".zip"], elem_id="batch-upload")
        )
        with gr.Column():
            model = gr.Dropdown(
                [n for n, m in BUILTIN_MODELS.items() if not m.next_token],
                value=default_model("text"),
                label="Model",
                allow_custom_value=True,
                elem_id="batch-model",
            )
            labels = gr.Textbox(
                sample_labels(default_model("text")), label="Labels (zero-shot models)"
            )
            methods = gr.CheckboxGroup(
                sorted(set(_methods("text")) | set(_methods("image"))),
                value=["gradient_x_input"],
                label="Methods",
                elem_id="batch-methods",
            )
            trust = gr.Checkbox(False, label="Trust cards (faithfulness scores)")
    gr.Examples([[str(_example_dataset())]], [upload], label="Example")
    with gr.Row():
        run = gr.Button("Run batch", variant="primary", elem_id="batch-run")
        cancel = gr.Button("Cancel", variant="stop")
    status = gr.Markdown("", elem_id="batch-status")
    table = gr.Dataframe(label="Results", elem_id="batch-table")
    files = gr.File(label="Download", file_count="multiple", elem_id="batch-files")

    @readable
    def run_batch(
        path,
        model_,
        labels_,
        chosen,
        evaluate,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        import pyarrow as pa

        from attrlab.app.batch import parquet_file, result_table

        if not chosen:
            raise gr.Error("choose at least one method")
        settings = runner.worker.settings
        rows = uploaded_rows(received_file(path), settings.max_body_bytes, settings.max_batch)
        if not rows:
            raise gr.Error("the upload holds no rows")
        request_ = BatchRequest(
            model=model_,
            labels=label_list(labels_),
            instances=tuple(r.instance() for r in rows),
            methods=tuple(chosen),
            evaluate=bool(evaluate),
        )
        results = runner(request_, progress, request.session_hash, "batch")
        # the REST jobs' result format: {"index", "explanations"} per input
        records = [
            {"index": source.id, "explanations": instance_json(outcome)}
            for source, outcome in zip(rows, results, strict=True)
        ]
        folder = page_folder("batch")
        jsonl = folder / "results.jsonl"
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        parquet = folder / "results.parquet"
        parquet_file(records, key_type=pa.string()).replace(parquet)  # its ids are text
        flat = [row for r in records for row in result_rows(r["index"], r["explanations"])]
        shown = result_table(flat).drop(columns=["scores", "explanation"])
        failed = int(shown["error"].notna().sum())
        line = f"{len(rows)} inputs × {len(chosen)} methods: {len(flat) - failed} explained"
        line += f", {failed} failed (see the error column)" if failed else ""
        return [line, shown, [str(jsonl), str(parquet)]]

    model.change(labels_for, model, labels, api_visibility="private")
    running = run.click(
        run_batch,
        [upload, model, labels, methods, trust],
        [status, table, files],
        api_name="batch",
        concurrency_id="run-batch",
    )
    cancel.click(
        runner.cancel_handler("batch"),
        [],
        [],
        cancels=[running],
        api_visibility="private",
    )
