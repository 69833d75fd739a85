"""
The Batch tab: a dataset explained with every chosen method, shown as a table and downloaded.

The downloads are ``attrlab batch``'s output (one row per input and method, JSON Lines and
Parquet); a row of the table opens that row's map.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import gradio as gr

from attrlab import viz
from attrlab.app.batch import ResultFile, result_rows, result_table
from attrlab.app.jobs import instance_json
from attrlab.app.ui.files import page_folder, received_file, received_input, uploaded_rows
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import label_list, labels_for, method_names, readable, sample_labels
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.methods.catalog import SUGGESTED_METHODS
from attrlab.attribution.models import BUILTIN_MODELS, default_model, load_image
from attrlab.attribution.request import BatchRequest
from attrlab.viz.figures import MAP, SCORES
from attrlab.viz.image import display_copy

__all__ = ["BatchTab", "batch_tab"]


def _example_dataset() -> Path:
    return Path(str(resources.files("attrlab.assets").joinpath("examples", "reviews.jsonl")))


def batch_tab(runner: PageRunner) -> None:
    """A dataset explained with every chosen method; results as JSON Lines and Parquet."""
    BatchTab(runner)


class BatchTab:
    """The Batch tab: its components, and its handlers as methods (wired when made)."""

    def __init__(self, runner: PageRunner) -> None:
        self.runner = runner
        self._inputs()
        self._results()
        self._wire()

    def _inputs(self) -> None:
        """The dataset, the model, its labels and the methods; Run and Cancel."""
        gr.Markdown(
            'Upload a **.jsonl** file (one `{"text": ..., "target"?: ...}` per line) or a '
            '**.zip** of images (or of images and a .jsonl naming them with `"image"`).'
        )
        with gr.Row():
            self.upload = received_input(
                gr.File(label="Dataset", file_types=[".jsonl", ".zip"], elem_id="batch-upload")
            )
            with gr.Column():
                self.model = gr.Dropdown(
                    [n for n, m in BUILTIN_MODELS.items() if not m.next_token],
                    value=default_model("text"),
                    label="Model",
                    allow_custom_value=True,
                    elem_id="batch-model",
                )
                self.labels = gr.Textbox(
                    sample_labels(default_model("text")), label="Labels (zero-shot models)"
                )
                self.methods = gr.CheckboxGroup(
                    sorted(set(method_names("text")) | set(method_names("image"))),
                    value=list(SUGGESTED_METHODS["batch"]),
                    label="Methods",
                    elem_id="batch-methods",
                )
                self.trust = gr.Checkbox(False, label="Trust cards (faithfulness scores)")
        gr.Examples([[str(_example_dataset())]], [self.upload], label="Example")
        with gr.Row():
            self.run = gr.Button("Run batch", variant="primary", elem_id="batch-run")
            self.cancel = gr.Button("Cancel", variant="stop")

    def _results(self) -> None:
        """The results table, the downloads, and the selected row's map."""
        self.status = gr.Markdown("", elem_id="batch-status")
        self.table = gr.Dataframe(
            label="Results (select a row to see its map)",
            elem_id="batch-table",
            interactive=False,
            wrap=True,
        )
        self.files = gr.File(label="Download", file_count="multiple", elem_id="batch-files")
        self.chosen_row = gr.Markdown("", elem_id="batch-row")
        self.row_map = gr.Plot(label="Map of the selected row", elem_id="batch-map", visible=False)
        # the run's result rows, and each image input's bytes (its map is drawn on it)
        self.kept = gr.State(None)

    def _wire(self) -> None:
        self.model.change(labels_for, self.model, self.labels, api_visibility="private")
        running = self.run.click(
            self.run_batch,
            [self.upload, self.model, self.labels, self.methods, self.trust],
            [self.status, self.table, self.files, self.kept, self.chosen_row, self.row_map],
            api_name="batch",
            concurrency_id="run-batch",
        )
        self.table.select(
            self.open_row, self.kept, [self.chosen_row, self.row_map], api_visibility="private"
        )
        self.cancel.click(
            self.runner.cancel_handler("batch"),
            [],
            [],
            cancels=[running],
            api_visibility="private",
        )

    @readable
    def run_batch(
        self,
        path,
        model_,
        labels_,
        chosen,
        evaluate,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        # no docstring: Gradio would show it as the API's description of the call
        settings = self.runner.worker.settings
        rows = uploaded_rows(received_file(path), settings.max_body_bytes, settings.max_batch)
        if not rows:
            raise gr.Error("the upload holds no rows")
        request_ = BatchRequest(
            model=model_,
            labels=label_list(labels_),
            instances=tuple(r.instance() for r in rows),
            methods=tuple(chosen or ()),
            evaluate=bool(evaluate),
        )
        outcomes = self.runner(request_, progress, request.session_hash, "batch")
        flat = [
            row
            for source, outcome in zip(rows, outcomes, strict=True)
            for row in result_rows(source.id, instance_json(outcome))
        ]
        folder = page_folder("batch")
        downloads = [folder / "results.jsonl", folder / "results.parquet"]
        for path_ in downloads:  # attrlab batch's own writer: the same files
            ResultFile(path_).append(flat)
        failed = sum(row["error"] is not None for row in flat)
        line = f"{len(rows)} inputs × {len(chosen)} methods: {len(flat) - failed} explained"
        line += f", {failed} failed (see the error column)" if failed else ""
        images = {r.id: r.image for r in rows if r.image is not None}
        return [
            line,
            shown_rows(flat),
            [str(p) for p in downloads],
            {"rows": flat, "images": images},
            "",
            gr.update(visible=False, value=None),
        ]

    @readable
    def open_row(self, kept: dict[str, Any] | None, selected: gr.SelectData):
        """The selected row's map: its token scores, or its map on the image."""
        if not kept or selected.row_value is None:
            raise gr.Error("run a batch first")
        key, method = str(selected.row_value[0]), str(selected.row_value[1])
        max_pixels = self.runner.worker.settings.max_image_pixels
        row = next(r for r in kept["rows"] if str(r["id"]) == key and r["method"] == method)
        if row["error"] is not None:
            return [f"**{key} · {method}** has no map: {row['error']}", gr.update(visible=False)]
        probability = row["probability"]  # none for a contrast (its explanation has its ratio)
        shown = "" if probability is None else f" (p = {probability:.4f})"
        return [
            f"**{key} · {method}**: {row['label']}{shown}",
            gr.update(visible=True, value=row_figure(row, kept["images"].get(key), max_pixels)),
        ]


#: The columns the results table shows (the maps and whole explanations are in the downloads).
SHOWN_COLUMNS = ["id", "method", "target", "label", "probability", "error"]


def shown_rows(rows: list[dict[str, Any]]) -> Any:
    """The result rows as the table shows them: the summary columns, probabilities rounded."""
    shown = result_table(rows)[SHOWN_COLUMNS]
    return shown.assign(probability=shown["probability"].round(4))


def row_figure(row: dict[str, Any], image: bytes | None, max_pixels: int | None = None) -> Any:
    """
    A result row's map: the library's figure rule on its Explanation.

    An image's map is drawn on the image (``image``: its file's bytes, read within
    ``max_pixels``).
    """
    explanation = Explanation.from_json(row["explanation_json"])
    picture = None if image is None else display_copy(load_image(image, max_pixels))
    figures = viz.figures_for(explanation, picture)
    return figures[SCORES if SCORES in figures else MAP]()
