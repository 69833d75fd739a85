"""The Evaluate tab: the faithfulness leaderboard of chosen methods, on bundled or uploaded sets."""

from __future__ import annotations

from typing import Any

import gradio as gr

from attrlab.app.ui.files import received_file, received_input, uploaded_rows
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import label_list, labels_for, method_names, readable, sample_labels
from attrlab.attribution.methods.catalog import SUGGESTED_METHODS
from attrlab.attribution.metrics.leaderboard import bundled_items, summarise
from attrlab.attribution.models import BUILTIN_MODELS, default_model
from attrlab.attribution.request import MAX_CURVE_STEPS, MAX_ORDERS, EvaluateRequest, Instance
from attrlab.attribution.request.defaults import EVALUATION_ORDERS, EVALUATION_STEPS
from attrlab.viz.evaluate import leaderboard_figure, readable_table

__all__ = ["EvaluateTab", "evaluate_tab"]


def _classifiers(modality: str) -> list[str]:
    return [
        name for name, m in BUILTIN_MODELS.items() if m.modality == modality and not m.next_token
    ]


def evaluate_tab(runner: PageRunner) -> None:
    """Every chosen method on the bundled examples, scored for faithfulness."""
    EvaluateTab(runner)


class EvaluateTab:
    """The Evaluate tab: its components, and its handlers as methods (wired when made)."""

    def __init__(self, runner: PageRunner) -> None:
        self.runner = runner
        #: The bundled examples of each modality (the Items slider's end).
        self.counts = {m: len(bundled_items(m)) for m in ("text", "image")}
        self._inputs()
        self._results()
        self._wire()

    def _inputs(self) -> None:
        """The modality, model, labels and methods; how many items, steps and random orders."""
        counts = self.counts
        gr.Markdown(
            "Each method's map on each bundled example, scored against random orders of the same "
            "input (text: comprehensiveness and sufficiency; images: deletion and insertion)."
        )
        with gr.Row():
            self.modality = gr.Radio(["text", "image"], value="text", label="Inputs")
            self.model = gr.Dropdown(
                _classifiers("text"),
                value=default_model("text"),
                label="Model",
                allow_custom_value=True,
                elem_id="evaluate-model",
            )
            self.labels = gr.Textbox(
                sample_labels(default_model("text")), label="Labels (zero-shot models)"
            )
        self.methods = gr.CheckboxGroup(
            method_names("text"),
            value=list(SUGGESTED_METHODS["evaluate_text"]),
            label="Methods",
            elem_id="evaluate-methods",
        )
        with gr.Row():
            self.items = gr.Slider(
                1, counts["text"], value=min(4, counts["text"]), step=1, label="Items"
            )
            self.steps = gr.Slider(
                5, MAX_CURVE_STEPS, value=EVALUATION_STEPS, step=1, label="Curve steps (images)"
            )
            self.orders = gr.Slider(
                1, MAX_ORDERS, value=EVALUATION_ORDERS, step=1, label="Random orders (most)"
            )
            self.upload = received_input(
                gr.File(
                    label="Or your own set (.jsonl of texts, .zip of images)",
                    file_types=[".jsonl", ".zip"],
                    height=90,
                    elem_id="evaluate-upload",
                )
            )
        with gr.Row():
            self.run = gr.Button("Evaluate", variant="primary", elem_id="evaluate-run")
            self.cancel = gr.Button("Cancel", variant="stop")

    def _results(self) -> None:
        """The leaderboard, its figure, and the per-item scores."""
        # long labels wrap, so the columns fit the page; the method stays put when scrolled. Its
        # eight columns (viz.evaluate.readable_table): method, items, then per score its mean and
        # interval and its comparison with random orders, then the cost
        self.table = gr.Dataframe(
            label="Leaderboard",
            elem_id="evaluate-table",
            wrap=True,
            pinned_columns=1,
            column_widths=["15%", "5%", "16%", "16%", "16%", "16%", "8%", "8%"],
        )
        self.plot = gr.Plot(label="Scores against random orders", elem_id="evaluate-plot")
        with gr.Accordion("Per item", open=False):
            self.per_item_table = gr.Dataframe(
                elem_id="evaluate-per-item", wrap=True, pinned_columns=2
            )

    def _wire(self) -> None:
        self.modality.change(
            self.switch,
            self.modality,
            [self.model, self.methods, self.items, self.labels],
            api_visibility="private",
        )
        self.model.change(labels_for, self.model, self.labels, api_visibility="private")
        question = [self.modality, self.model, self.labels, self.methods]
        running = self.run.click(
            self.evaluate,
            [*question, self.items, self.steps, self.orders, self.upload],
            [self.table, self.plot, self.per_item_table],
            api_name="evaluate",
            concurrency_id="run-evaluate",
        )
        self.cancel.click(
            self.runner.cancel_handler("evaluate"),
            [],
            [],
            cancels=[running],
            api_visibility="private",
        )

    def switch(self, kind: str) -> list[Any]:
        # no docstring, as the handler it replaces (Gradio reads it as the call's description)
        defaults = list(SUGGESTED_METHODS[f"evaluate_{kind}"])
        return [
            gr.update(choices=_classifiers(kind), value=default_model(kind)),
            gr.update(choices=method_names(kind), value=defaults),
            gr.update(maximum=self.counts[kind], value=min(4, self.counts[kind])),
            labels_for(default_model(kind)),
        ]

    @readable
    def evaluate(
        self,
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
        # no docstring: Gradio would show it as the API's description of the call
        instances: tuple[Instance, ...] = ()
        if path:  # an uploaded set, all of it (within the server's batch bound)
            settings = self.runner.worker.settings
            rows = uploaded_rows(received_file(path), settings.max_body_bytes, settings.max_batch)
            if not rows:
                raise gr.Error("the upload holds no rows")
            instances = tuple(r.instance() for r in rows)
        request_ = EvaluateRequest(
            model=model_,
            labels=label_list(labels_),
            modality=kind,
            methods=tuple(chosen or ()),
            items=None if instances else int(count),
            steps=int(steps_),
            random_orders=int(orders_),
            instances=instances,
        )
        per_item = self.runner(request_, progress, request.session_hash, "evaluate")
        summary = summarise(per_item, kind)
        return [
            readable_table(summary, kind),
            leaderboard_figure(per_item, kind),
            readable_table(per_item, kind),
        ]
