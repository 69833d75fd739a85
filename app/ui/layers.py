"""
The Layers & heads tab: which layers and heads carried a prediction; choose a head to see it.

The layer × head heatmap of a measure (what its sign means stated with the target named) and
the heads ranked by it; clicking a cell or a row shows that head's attention for this input
and, unless unticked, zeroes it and re-runs the prediction and a map live. Per-layer measures
as small multiples, the estimators' agreement, an export bundle and a link to the view.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd

from attrlab import viz
from attrlab.app.ui.link import LinkedTab, page_base, share_query
from attrlab.app.ui.results import Result, export_bundle, top
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import (
    IOI_PROMPT,
    SAMPLE_PROMPT,
    SAMPLE_TEXT,
    format_heads,
    in_order,
    label_list,
    labels_for,
    parse_heads,
    plot_clicks_js,
    read_target,
    readable,
    sample_labels,
    session,
)
from attrlab.attribution.errors import AttrlabError, InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.layers import MEASURES
from attrlab.attribution.methods.catalog import SUGGESTED_METHODS
from attrlab.attribution.models import BUILTIN_MODELS, default_model
from attrlab.attribution.request import AblationRequest, AttentionRequest, ExplainRequest
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.viz import (
    ablation_figure,
    ablation_note,
    attention_figure,
    head_rank_table,
    measure_note,
    token_highlights,
    token_layers_figure,
)
from attrlab.viz.figures import AGREEMENT, HEADS, LAYERS, POSITIONAL, head_measures
from attrlab.viz.text import token_columns_html
from attrlab.viz.trust import trust_card_html

if TYPE_CHECKING:
    from attrlab.viz.figures import FigureBuilder

__all__ = ["LayersTab", "layers_tab"]

#: The analysis's name among a run's explanations (the export's file stem).
_ANALYSIS = "layers"
#: A click on a heatmap cell writes ``L<layer>H<head>#<time>`` into the hidden box, whose
#: change event runs the same handler as a click on the table.
_HEATMAP_CLICKS = plot_clicks_js(
    "layers-heatmap",
    """
    const box = document.querySelector('#layers-clicked textarea, #layers-clicked input');
    if (!box) return;
    box.value = `L${point.y}H${point.x}#${Date.now()}`;
    box.dispatchEvent(new Event('input', {bubbles: true}));
    """,
)


def layers_tab(runner: PageRunner) -> LinkedTab:
    """Build the tab; every request goes through ``runner``. Returns what a link fills."""
    return LayersTab(runner).linked_tab


class LayersTab:
    """
    The Layers & heads tab: its components, and its handlers as methods.

    Made inside a ``gr.Tab``; the components are laid out and wired when it is made. The last
    analysis (and the last ablation's maps) stays in the session (``last``).
    """

    def __init__(self, runner: PageRunner) -> None:
        self.runner = runner
        self.last = gr.State(
            None
        )  # Result: the analysis (and the last ablation's maps), the fields
        self.linked = gr.State(False)  # a shared link filled this tab: run it once loaded
        self.asked = gr.State(True)  # Run always runs
        self._question()
        self._heads_section()
        self._chosen_head_section()
        self._layers_section()
        self._export_row()
        #: What an analysis reads, in :meth:`analyse`'s order.
        self.fields = [self.model, self.text, self.labels, self.target, self.next_token]
        self.fields += [self.answer, self.contrast, self.measures]
        #: What an analysis fills, in its order: its views, then the last ablation's emptied.
        self.analysis_outputs = [self.measure, self.heatmap, self.grid, self.lines]
        self.analysis_outputs += [self.positional, self.agreement, self.card, self.tokens]
        self.analysis_outputs += [self.token_layers, self.before, self.note, self.link, self.last]
        self.analysis_outputs += [self.after, self.change, self.attention, self.ablation_plot]
        self.analysis_outputs += [self.compared]
        #: What an ablation fills (the chosen head's attention aside), in its order.
        self.ablation_outputs = [self.before, self.after, self.change, self.compared]
        self.ablation_outputs += [self.ablation_plot, self.link, self.last]
        self._wire()

    # --- layout ---------------------------------------------------------------------------

    def _question(self) -> None:
        """The model, the input and what to explain of it, the measures, Run and Cancel."""
        models = [name for name, m in BUILTIN_MODELS.items() if m.modality == "text"]
        with gr.Row(equal_height=False):
            with gr.Column(scale=2):
                self.model = gr.Dropdown(
                    models,
                    value=default_model("text"),
                    label="Model (a transformer)",
                    allow_custom_value=True,
                    elem_id="layers-model",
                )
                self.text = gr.Textbox(
                    SAMPLE_TEXT, label="Text or prompt", lines=2, elem_id="layers-input"
                )
                with gr.Row():
                    self.labels = gr.Textbox(
                        sample_labels(default_model("text")),
                        label="Labels (zero-shot models)",
                        elem_id="layers-labels",
                    )
                    self.target = gr.Textbox(
                        "", label="Target (label or index; empty = top)", elem_id="layers-target"
                    )
                    self.next_token = gr.Checkbox(
                        False, label="Next token (decoder LMs)", elem_id="layers-next-token"
                    )
                with gr.Row():
                    self.answer = gr.Textbox(
                        "",
                        label="Answer (decoder LMs; empty = the target token)",
                        placeholder=" Mary",
                        elem_id="layers-answer",
                    )
                    self.contrast = gr.Textbox(
                        "",
                        label="Rather than (a contrast)",
                        placeholder=" John",
                        elem_id="layers-contrast",
                    )
                gr.Examples(
                    [
                        [SAMPLE_TEXT, "minilm-zeroshot", False, "", ""],
                        [SAMPLE_PROMPT, "smollm2-135m", True, "", ""],
                        [IOI_PROMPT, "smollm2-135m", True, " Mary", " John"],
                    ],
                    [self.text, self.model, self.next_token, self.answer, self.contrast],
                    label="Examples",
                )
            with gr.Column(scale=1):
                self.measures = gr.CheckboxGroup(
                    [(f"{m.name}: {m.cost}", m.name) for m in MEASURES.values()],
                    value=["block_influence", "skip", "gradient", "lrp", "ablation"],
                    label="Measures",
                    elem_id="layers-measures",
                )
        with gr.Row():
            self.run = gr.Button("Analyse", variant="primary", elem_id="layers-run")
            self.cancel = gr.Button("Cancel", variant="stop", elem_id="layers-cancel")

    def _heads_section(self) -> None:
        """A head measure's heatmap and the heads ranked by it; a click chooses a head."""
        gr.Markdown("### Heads")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                self.measure = gr.Dropdown(
                    [],
                    label="Head measure",
                    allow_custom_value=True,  # a link names it before the run lists the choices
                    elem_id="layers-head-measure",
                )
                self.note = gr.Markdown("", elem_id="layers-measure-note")
                self.heatmap = gr.Plot(
                    label="Layer × head (click a cell)", elem_id="layers-heatmap"
                )
            with gr.Column(scale=1, min_width=260):
                self.grid = gr.Dataframe(
                    interactive=False,
                    label="Heads ranked by |value| (click a row)",
                    elem_id="layers-grid",
                    max_height=560,
                    wrap=True,
                )
        self.clicked = gr.Textbox(visible="hidden", elem_id="layers-clicked")
        self.chosen = gr.State("")  # the clicked head, "L2H3"

    def _chosen_head_section(self) -> None:
        """The heads to ablate, the chosen head's attention, the prediction without them."""
        gr.Markdown("### The chosen head: its attention, and the prediction without it")
        with gr.Row(equal_height=False):
            self.heads = gr.Textbox(
                "", label="Heads to ablate (e.g. L2H3, L4H1)", scale=2, elem_id="layers-heads"
            )
            with gr.Column(scale=1, min_width=200):
                self.ablate_click = gr.Checkbox(
                    True, label="a click also ablates the head", elem_id="layers-ablate-click"
                )
                self.add = gr.Checkbox(
                    False, label="add clicked heads to the set", elem_id="layers-add"
                )
            self.method = gr.Dropdown(
                list(SUGGESTED_METHODS["ablation"]),
                value=SUGGESTED_METHODS["ablation"][0],
                label="Map re-run with the heads ablated",
                scale=1,
                elem_id="layers-ablation-method",
            )
            self.ablate = gr.Button("Ablate", scale=0, min_width=120, elem_id="layers-ablate")
        with gr.Row(equal_height=False):
            self.attention = gr.Plot(
                label="Attention of the chosen head", elem_id="layers-attention"
            )
            with gr.Column():
                with gr.Row():
                    self.before = gr.Label(
                        num_top_classes=5, label="Prediction", elem_id="layers-before"
                    )
                    self.after = gr.Label(
                        num_top_classes=5, label="With the heads ablated", elem_id="layers-after"
                    )
                self.change = gr.Markdown("", elem_id="layers-change")
                self.ablation_plot = gr.Plot(
                    label="Top predictions before and after", elem_id="layers-ablation"
                )
        self.compared = gr.HTML(elem_id="layers-maps")

    def _layers_section(self) -> None:
        """The per-layer measures, the tokens' relevance, the estimators' agreement."""
        gr.Markdown("### Layers")
        self.lines = gr.Plot(label="Per layer", elem_id="layers-lines")
        with gr.Row(equal_height=False):
            with gr.Column():
                self.tokens = gr.HighlightedText(
                    label="Token relevance (AttnLRP); click a token", elem_id="layers-tokens"
                )
                self.token_layers = gr.Plot(
                    label="The clicked token's relevance per layer", elem_id="layers-token-layers"
                )
            with gr.Column():
                self.agreement = gr.Plot(
                    label="Agreement of head estimators", elem_id="layers-agreement"
                )
                self.card = gr.HTML(elem_id="layers-trust")
                self.positional = gr.Plot(
                    label="Token and positional relevance per layer (PA-LRP)",
                    visible=False,
                    elem_id="layers-positional",
                )

    def _export_row(self) -> None:
        with gr.Row(equal_height=False):
            self.export = gr.Button(
                "Export bundle", scale=0, min_width=160, elem_id="layers-export"
            )
            self.bundle = gr.File(label="Bundle", height=90, elem_id="layers-bundle")
            self.link = gr.Textbox(
                label="Link to this view", lines=2, elem_id="layers-link", buttons=["copy"]
            )

    # --- wiring ---------------------------------------------------------------------------

    def _wire(self) -> None:
        private: dict[str, Any] = {"api_visibility": "private"}
        running = self.run.click(
            self.analyse,
            [self.asked, *self.fields, self.measure],
            self.analysis_outputs,
            api_name="layers_analyse",
            concurrency_id="run-layers",
        )
        linked_run = self.linked.change(
            self.analyse,
            [self.linked, *self.fields, self.measure],
            self.analysis_outputs,
            api_visibility="private",
            concurrency_id="run-layers",
        )
        # the user's choice only: a shared link sets the model, labels and next token together
        self.model.input(self.model_chosen, self.model, [self.next_token, self.labels], **private)
        self.heatmap.change(None, None, None, js=_HEATMAP_CLICKS)
        self.measure.input(  # the user's choice only: a run sets the measure with its views
            self.redraw,
            [self.measure, self.last],
            [self.heatmap, self.grid, self.note, self.link, self.last],
            **private,
        )
        picking = [self.heads, self.add, self.ablate_click]
        clicks = [
            self.clicked.change(
                self.clicked_cell, [self.clicked, *picking], [self.chosen, self.heads], **private
            ),
            self.grid.select(
                self.clicked_row, [*picking, self.grid], [self.chosen, self.heads], **private
            ),
        ]
        # one bound handler for both clicks: Gradio queues events by their handler's identity
        show_attention = self.show_attention
        shown_heads = [
            click.success(show_attention, [self.chosen, self.last], self.attention, **private)
            for click in clicks
        ]
        # after a click the clicked head's attention stays (the ablated set may start elsewhere)
        ablated_shown = [self.ablate_click, self.heads, self.method, self.last]
        outputs = [*self.ablation_outputs, self.attention]
        ablations = [
            *(
                shown.success(self.ablate_clicked, ablated_shown, outputs, **private)
                for shown in shown_heads
            ),
            self.ablate.click(
                self.run_ablation,
                [self.heads, self.method, self.last],
                outputs,
                api_name="layers_ablate",
            ),
            linked_run.success(
                self.ablate_linked,
                [self.linked, self.heads, self.method, self.last],
                outputs,
                **private,
            ),
        ]
        self.cancel.click(
            self.runner.cancel_handler("layers"),
            [],
            [],
            cancels=[running, linked_run, *ablations],
            api_name="layers_cancel",
        )
        self.tokens.select(self.clicked_token, [self.last], self.token_layers, **private)
        self.export.click(self.download, [self.last], self.bundle, api_name="layers_export")

    @property
    def linked_tab(self) -> LinkedTab:
        """What a shared link fills on this tab, and the flag that runs it."""
        return LinkedTab(
            {
                "model": self.model,
                "labels": self.labels,
                "text": self.text,
                "target": self.target,
                "next_token": self.next_token,
                "answer": self.answer,
                "contrast": self.contrast,
                "measures": self.measures,
                "measure": self.measure,
                "heads": self.heads,
            },
            [],
            self.linked,
        )

    # --- handlers -------------------------------------------------------------------------

    @readable
    def analyse(
        self,
        asked: bool,
        model_,
        text_,
        labels_,
        target_,
        next_,
        answer_,
        contrast_,
        measures_,
        measure_,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """Analyse (Run, or a shared link once it filled the tab); the head measure shown stays."""
        if not asked:  # the page's load set another tab's link flag
            return [gr.skip()] * len(self.analysis_outputs)
        fields_ = [model_, text_, labels_, target_, next_, answer_, contrast_, measures_]
        return self._analysed(fields_, measure_, request, progress)

    def _analysed(
        self, fields_: list[Any], wanted: str | None, request: gr.Request | None, progress: Any
    ) -> list[Any]:
        """Run the analysis and show it; ``wanted``: the head measure shown, if it has one."""
        model_, text_, labels_, target_, next_, answer_, contrast_, measures_ = fields_
        if not measures_:
            raise gr.Error("choose at least one measure")
        base = _request_fields(model_, text_, labels_, target_, next_, answer_, contrast_)
        request_ = ExplainRequest(**base, method="layers", params={"measures": ",".join(measures_)})
        explanation: Explanation = self.runner(request_, progress, session(request), "layers")
        figures = viz.figures_for(explanation)
        names = head_measures(explanation.layers)
        shown = wanted if wanted in names else (names[0] if names else None)
        result = Result(
            {_ANALYSIS: explanation},
            fields={
                "tab": "layers",
                "model": model_,
                "text": base["text"],
                "labels": None if next_ else labels_,
                "target": str(explanation.target.index),  # as explained
                "next_token": bool(next_),
                "answer": answer_ or "",
                "contrast": contrast_ or "",
                "measures": list(measures_),
                "measure": shown,
            },
        )
        heatmap, grid = _head_views(explanation, shown)
        views = {
            self.measure: gr.update(choices=names, value=shown),
            self.heatmap: heatmap,
            self.grid: grid,
            self.lines: _shown(figures, LAYERS),
            self.positional: _shown(figures, POSITIONAL),
            self.agreement: _shown(figures, AGREEMENT),
            self.card: trust_card_html(explanation),
            self.tokens: token_highlights(explanation) if explanation.tokens is not None else None,
            self.token_layers: None,
            self.before: top(explanation),
            self.note: _measure_note(explanation, shown),
            self.link: _link(result, request),
            self.last: result,
            # the last ablation's views belong to the last analysis
            self.after: None,
            self.change: "",
            self.attention: None,
            self.ablation_plot: None,
            self.compared: "",
        }
        return in_order(self.analysis_outputs, views)

    def model_chosen(self, name: str) -> list[Any]:
        """A model's next-token default and its labels field."""
        return [
            gr.update(value=bool(getattr(BUILTIN_MODELS.get(name), "next_token", False))),
            labels_for(name),
        ]

    @readable
    def redraw(self, measure_: str | None, result: Result | None, request: gr.Request):
        """Another head measure: its heatmap, ranking and note, and the link naming it."""
        if result is None or not measure_:
            return [gr.skip()] * 5
        analysis = result.explanations[_ANALYSIS]
        views = [*_head_views(analysis, measure_), _measure_note(analysis, measure_)]
        result = _with_fields(result, measure=measure_)
        return [*views, _link(result, request), result]

    @readable
    def clicked_cell(self, value: str, heads_: str, adding: bool, ablating: bool):
        """A heatmap cell clicked: the chosen head and the set to ablate."""
        head = _one_head(value.partition("#")[0])  # "L2H3#<time>" from the listener
        return _picked(head, heads_, adding, ablating)

    @readable
    def clicked_row(
        self, evt: gr.SelectData, heads_: str, adding: bool, ablating: bool, grid_: pd.DataFrame
    ):
        """A ranked head's row clicked: the chosen head and the set to ablate."""
        head = _one_head(str(grid_.iloc[evt.index[0], 0]))  # the row's "L2H3"
        return _picked(head, heads_, adding, ablating)

    @readable
    def show_attention(
        self,
        head_: str,
        result: Result | None,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """One head's attention on the analysed input, as it is (nothing ablated)."""
        if result is None:
            raise gr.Error("analyse an input first; the attention is of its tokens")
        layer, head = _one_head(head_)
        base = _request_fields(**_instance(result))
        request_ = AttentionRequest(**base, layer=layer, head=head)
        weights = self.runner(request_, progress, session(request), "layers")
        texts = result.explanations[_ANALYSIS].token_texts or []
        return attention_figure(weights, texts, layer, head)

    @readable
    def run_ablation(
        self, shown: str, method_: str, result: Result | None, request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):  # fmt: skip
        # Ablate (no docstring: Gradio would show it as the API's description of the call)
        return self._ablated(shown, method_, result, request, progress, attention_too=True)

    @readable
    def ablate_clicked(
        self, asked: bool, shown: str, method_: str, result: Result | None, request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):  # fmt: skip
        """After a click, when asked: the set ablated; the clicked head's attention stays."""
        if not asked or not shown.strip():
            return [gr.skip()] * (len(self.ablation_outputs) + 1)
        return self._ablated(shown, method_, result, request, progress, attention_too=False)

    @readable
    def ablate_linked(
        self, asked: bool, shown: str, method_: str, result: Result | None, request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):  # fmt: skip
        """After a shared link's analysis, when it names heads: them ablated, the first's view."""
        if not asked or not shown.strip():
            return [gr.skip()] * (len(self.ablation_outputs) + 1)
        return self._ablated(shown, method_, result, request, progress, attention_too=True)

    def _ablated(
        self,
        shown: str,
        method_: str,
        result: Result | None,
        request: gr.Request,
        progress: Any,
        attention_too: bool,
    ) -> list[Any]:
        """The ablation's views; ``attention_too``: the first head's attention drawn too."""
        if result is None:
            raise gr.Error("analyse an input first; ablation re-runs its prediction")
        try:
            chosen_ = parse_heads(shown)
        except InvalidParameterError as err:
            raise gr.Error(str(err)) from None
        base = _request_fields(**_instance(result))
        request_ = AblationRequest(**base, method=method_, heads=chosen_)
        outcome = self.runner(request_, progress, session(request), "layers")
        plain, zeroed = outcome.plain, outcome.ablated
        label = plain.target.label
        before, after = plain.target.probability, zeroed.target.probability
        assert before is not None and after is not None  # an ablation explains one output
        maps = {f"{method_} (as is)": plain, f"{method_} (heads ablated)": zeroed}
        kept = {_ANALYSIS: result.explanations[_ANALYSIS], method_: plain}
        kept[f"{method_}_heads_ablated"] = zeroed
        result = _with_fields(result, heads=format_heads(chosen_))
        result = dataclasses.replace(result, explanations=kept)
        figure = None
        if outcome.attention is not None and outcome.token_texts is not None:
            figure = attention_figure(outcome.attention, outcome.token_texts, *chosen_[0])
        views = {
            self.before: top(plain),
            self.after: top(zeroed),
            self.change: ablation_note(format_heads(chosen_), label, before, after),
            self.compared: token_columns_html(maps) if plain.tokens is not None else "",
            self.ablation_plot: ablation_figure(plain.predictions, zeroed.predictions, label),
            self.link: _link(result, request),
            self.last: result,
            self.attention: figure if attention_too else gr.skip(),
        }
        return in_order([*self.ablation_outputs, self.attention], views)

    @readable
    def clicked_token(self, evt: gr.SelectData, result: Result | None):
        """A token clicked: its relevance per layer."""
        if result is None:
            return None
        explanation = result.explanations[_ANALYSIS]
        per_layer = explanation.maps.get("token_per_layer")
        if per_layer is None:
            raise gr.Error("token relevance per layer comes with the 'lrp' measure")
        return token_layers_figure(per_layer, explanation.token_texts or [], evt.index)

    @readable
    def download(self, result: Result | None) -> str:
        """The analysis (and the last ablation's maps) as a zip, its layer table among them."""
        if result is None:
            raise gr.Error("analyse an input first; the bundle holds its results")
        maps = {k: e for k, e in result.explanations.items() if k != _ANALYSIS}
        pages = {"ablation_maps": token_columns_html(maps)} if maps else {}
        return str(export_bundle(result, pages=pages))


def _link(result: Result, request: gr.Request | None) -> str:
    """The link that reopens the tab with ``result``'s fields."""
    return page_base(request) + share_query(result.fields)


def _picked(head: tuple[int, int], heads_: str, adding: bool, ablating: bool) -> list[str]:
    """The chosen head, and the set to ablate (this head, or the set with it added)."""
    set_ = heads_
    if ablating:
        current = list(parse_heads(heads_)) if adding else []
        set_ = format_heads([*current, head] if head not in current else current)
    return [format_heads([head]), set_]


def _one_head(text: str) -> tuple[int, int]:
    """The one head ``text`` names (``"L2H3"``); a clear error for anything else."""
    try:
        heads = parse_heads(text)
    except InvalidParameterError as err:
        raise gr.Error(str(err)) from None
    if len(heads) != 1:
        raise gr.Error(f"name one head, e.g. L2H3; got {text.strip()!r}")
    return heads[0]


def _request_fields(
    model: str,
    text: str,
    labels: str | None,
    target: Any,
    next_token: bool,
    answer: str | None = None,
    contrast: str | None = None,
) -> dict[str, Any]:
    """
    A request's model and input fields from the tab's.

    An answer or a contrast (a decoder's) takes the target's place: the analysis explains
    ``log p(answer)``, or ``log p(answer) − log p(contrast)`` (the answer, if empty, the model's
    next token).
    """
    fields: dict[str, Any] = {
        "model": model,
        "text": text or "",
        "labels": None if next_token else label_list(labels),  # a decoder's classes are tokens
        "target": read_target(target),
        "next_token": bool(next_token),
    }
    if answer or contrast:
        try:
            spec = AnswerSpec(answer=answer or None, contrast=contrast or None)
        except AttrlabError as err:
            raise gr.Error(str(err)) from None
        fields.update(answer=spec, target=None)
    return fields


def _instance(result: Result) -> dict[str, Any]:
    """The analysed input's fields (its target as explained), for the requests that follow."""
    fields = result.fields
    return {
        "model": fields["model"],
        "text": fields["text"],
        "labels": fields["labels"],
        "target": fields["target"],
        "next_token": fields["next_token"],
        "answer": fields.get("answer"),
        "contrast": fields.get("contrast"),
    }


def _with_fields(result: Result, **changed: Any) -> Result:
    """``result`` with some of its fields changed (a new one: the session keeps the old)."""
    return dataclasses.replace(result, fields={**result.fields, **changed})


def _shown(figures: Mapping[str, FigureBuilder], name: str) -> Any:
    """The figure ``name`` where the rule gives it one, else its place hidden."""
    if name not in figures:
        return gr.update(value=None, visible=False)
    return gr.update(value=figures[name](), visible=True)


def _head_views(explanation: Explanation, measure: str | None) -> list[Any]:
    """The heatmap of a head measure (by the figure rule) and its heads ranked."""
    if measure is None:
        return [None, None]
    figures = viz.figures_for(explanation)
    if HEADS + measure not in figures:
        raise gr.Error(f"this analysis has no head measure {measure!r}")
    table = explanation.layers
    assert table is not None  # an analysis with head measures has its table
    return [figures[HEADS + measure](), head_rank_table(table, measure)]


def _measure_note(explanation: Explanation, measure: str | None) -> str:
    """What the head measure's values and their sign mean, the explained target named."""
    meaning = measure_note(measure, explanation.target.label) if measure else ""
    if not meaning:
        return ""
    shown = html.escape(meaning, quote=False)
    return f"**{measure}**: {shown} Click a cell or a row to choose a head."
