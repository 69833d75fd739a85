"""The Batch tab: a dataset explained with every chosen method, downloaded as JSONL and Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gradio as gr

from attrlab.app.batch import result_rows
from attrlab.app.jobs import instance_json
from attrlab.app.ui.files import page_folder, received_file, received_input, uploaded_rows
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import label_list, labels_for, method_names, readable, sample_labels
from attrlab.app.worker import BatchRequest
from attrlab.attribution.models import BUILTIN_MODELS, default_model

__all__ = ["batch_tab"]


def _example_dataset() -> Path:
    from importlib import resources

    return Path(str(resources.files("attrlab.assets").joinpath("examples", "reviews.jsonl")))


def batch_tab(runner: PageRunner) -> None:
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
                sorted(set(method_names("text")) | set(method_names("image"))),
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
        records: list[dict[str, Any]] = [
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
