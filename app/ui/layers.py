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
    label_list,
    labels_for,
    parse_heads,
    plot_clicks_js,
    read_target,
    readable,
    sample_labels,
    session,
)
from attrlab.app.worker import AblationRequest, AttentionRequest, ExplainRequest
from attrlab.attribution.answers import AnswerSpec
from attrlab.attribution.errors import AttrlabError, InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.layers import MEASURES
from attrlab.attribution.models import BUILTIN_MODELS, default_model
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

__all__ = ["layers_tab"]

#: The map re-run with heads ablated: one backward pass, so a click answers at once.
ABLATION_METHOD = "gradient_x_input"
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
    models = [name for name, m in BUILTIN_MODELS.items() if m.modality == "text"]
    last = gr.State(None)  # Result: the analysis (and the last ablation's maps), the fields
    linked = gr.State(False)  # a shared link filled this tab: run it once loaded
    asked = gr.State(True)  # Run always runs
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            model = gr.Dropdown(
                models,
                value=default_model("text"),
                label="Model (a transformer)",
                allow_custom_value=True,
                elem_id="layers-model",
            )
            text = gr.Textbox(SAMPLE_TEXT, label="Text or prompt", lines=2, elem_id="layers-input")
            with gr.Row():
                labels = gr.Textbox(
                    sample_labels(default_model("text")),
                    label="Labels (zero-shot models)",
                    elem_id="layers-labels",
                )
                target = gr.Textbox(
                    "", label="Target (label or index; empty = top)", elem_id="layers-target"
                )
                next_token = gr.Checkbox(
                    False, label="Next token (decoder LMs)", elem_id="layers-next-token"
                )
            with gr.Row():
                answer = gr.Textbox(
                    "",
                    label="Answer (decoder LMs; empty = the target token)",
                    placeholder=" Mary",
                    elem_id="layers-answer",
                )
                contrast = gr.Textbox(
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
                [text, model, next_token, answer, contrast],
                label="Examples",
            )
        with gr.Column(scale=1):
            measures = gr.CheckboxGroup(
                [(f"{m.name}: {m.cost}", m.name) for m in MEASURES.values()],
                value=["block_influence", "skip", "gradient", "lrp", "ablation"],
                label="Measures",
                elem_id="layers-measures",
            )
    with gr.Row():
        run = gr.Button("Analyse", variant="primary", elem_id="layers-run")
        cancel = gr.Button("Cancel", variant="stop", elem_id="layers-cancel")

    gr.Markdown("### Heads")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=420):
            measure = gr.Dropdown(
                [],
                label="Head measure",
                allow_custom_value=True,  # a link names it before the run lists the choices
                elem_id="layers-head-measure",
            )
            note = gr.Markdown("", elem_id="layers-measure-note")
            heatmap = gr.Plot(label="Layer × head (click a cell)", elem_id="layers-heatmap")
        with gr.Column(scale=1, min_width=260):
            grid = gr.Dataframe(
                interactive=False,
                label="Heads ranked by |value| (click a row)",
                elem_id="layers-grid",
                max_height=560,
                wrap=True,
            )
    clicked = gr.Textbox(visible="hidden", elem_id="layers-clicked")
    chosen = gr.State("")  # the clicked head, "L2H3"

    gr.Markdown("### The chosen head: its attention, and the prediction without it")
    with gr.Row(equal_height=False):
        heads = gr.Textbox(
            "", label="Heads to ablate (e.g. L2H3, L4H1)", scale=2, elem_id="layers-heads"
        )
        with gr.Column(scale=1, min_width=200):
            ablate_click = gr.Checkbox(
                True, label="a click also ablates the head", elem_id="layers-ablate-click"
            )
            add = gr.Checkbox(False, label="add clicked heads to the set", elem_id="layers-add")
        method = gr.Dropdown(
            ["gradient_x_input", "integrated_gradients", "attnlrp", "occlusion"],
            value=ABLATION_METHOD,
            label="Map re-run with the heads ablated",
            scale=1,
            elem_id="layers-ablation-method",
        )
        ablate = gr.Button("Ablate", scale=0, min_width=120, elem_id="layers-ablate")
    with gr.Row(equal_height=False):
        attention = gr.Plot(label="Attention of the chosen head", elem_id="layers-attention")
        with gr.Column():
            with gr.Row():
                before = gr.Label(num_top_classes=5, label="Prediction", elem_id="layers-before")
                after = gr.Label(
                    num_top_classes=5, label="With the heads ablated", elem_id="layers-after"
                )
            change = gr.Markdown("", elem_id="layers-change")
            ablation_plot = gr.Plot(
                label="Top predictions before and after", elem_id="layers-ablation"
            )
    compared = gr.HTML(elem_id="layers-maps")

    gr.Markdown("### Layers")
    lines = gr.Plot(label="Per layer", elem_id="layers-lines")
    with gr.Row(equal_height=False):
        with gr.Column():
            tokens = gr.HighlightedText(
                label="Token relevance (AttnLRP); click a token", elem_id="layers-tokens"
            )
            token_layers = gr.Plot(
                label="The clicked token's relevance per layer", elem_id="layers-token-layers"
            )
        with gr.Column():
            agreement = gr.Plot(label="Agreement of head estimators", elem_id="layers-agreement")
            card = gr.HTML(elem_id="layers-trust")
            positional = gr.Plot(
                label="Token and positional relevance per layer (PA-LRP)",
                visible=False,
                elem_id="layers-positional",
            )
    with gr.Row(equal_height=False):
        export = gr.Button("Export bundle", scale=0, min_width=160, elem_id="layers-export")
        bundle = gr.File(label="Bundle", height=90, elem_id="layers-bundle")
        link = gr.Textbox(
            label="Link to this view", lines=2, elem_id="layers-link", buttons=["copy"]
        )

    def shown_link(result: Result, request: gr.Request | None) -> str:
        return page_base(request) + share_query(result.fields)

    def analysed(
        fields_: list[Any], wanted: str | None, request: gr.Request | None, progress: Any
    ) -> list[Any]:
        """Run the analysis and show it; ``wanted``: the head measure shown, if it has one."""
        model_, text_, labels_, target_, next_, answer_, contrast_, measures_ = fields_
        if not measures_:
            raise gr.Error("choose at least one measure")
        base = _request_fields(model_, text_, labels_, target_, next_, answer_, contrast_)
        request_ = ExplainRequest(**base, method="layers", params={"measures": ",".join(measures_)})
        explanation: Explanation = runner(request_, progress, session(request), "layers")
        table = explanation.layers
        figures = viz.figures_for(explanation)
        names = head_measures(table)
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
        return [
            gr.update(choices=names, value=shown),
            *_head_views(explanation, shown),
            _shown(figures, LAYERS),
            _shown(figures, POSITIONAL),
            _shown(figures, AGREEMENT),
            trust_card_html(explanation),
            token_highlights(explanation) if explanation.tokens is not None else None,
            None,
            top(explanation),
            _measure_note(explanation, shown),
            shown_link(result, request),
            result,
            None,  # the last ablation's views belong to the last analysis
            "",
            None,
            None,
            "",
        ]

    analysis_outputs = [measure, heatmap, grid, lines, positional, agreement, card, tokens]
    analysis_outputs += [token_layers, before, note, link, last]
    analysis_outputs += [after, change, attention, ablation_plot, compared]
    inputs = [model, text, labels, target, next_token, answer, contrast, measures]

    @readable
    def analyse(
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
            return [gr.skip()] * len(analysis_outputs)
        fields_ = [model_, text_, labels_, target_, next_, answer_, contrast_, measures_]
        return analysed(fields_, measure_, request, progress)

    running = run.click(
        analyse,
        [asked, *inputs, measure],
        analysis_outputs,
        api_name="layers_analyse",
        concurrency_id="run-layers",
    )
    linked_run = linked.change(
        analyse,
        [linked, *inputs, measure],
        analysis_outputs,
        api_visibility="private",
        concurrency_id="run-layers",
    )
    # the user's choice only: a shared link sets the model, labels and next token together
    model.input(
        lambda name: [
            gr.update(value=bool(getattr(BUILTIN_MODELS.get(name), "next_token", False))),
            labels_for(name),
        ],
        model,
        [next_token, labels],
        api_visibility="private",
    )
    heatmap.change(None, None, None, js=_HEATMAP_CLICKS)

    @readable
    def redraw(measure_: str | None, result: Result | None, request: gr.Request):
        if result is None or not measure_:
            return [gr.skip()] * 5
        analysis = result.explanations[_ANALYSIS]
        views = [*_head_views(analysis, measure_), _measure_note(analysis, measure_)]
        result = _with_fields(result, measure=measure_)
        return [*views, shown_link(result, request), result]

    measure.input(  # the user's choice only: a run sets the measure with its views
        redraw, [measure, last], [heatmap, grid, note, link, last], api_visibility="private"
    )

    def picked(head: tuple[int, int], heads_: str, adding: bool, ablating: bool) -> list[str]:
        """The chosen head, and the set to ablate (this head, or the set with it added)."""
        set_ = heads_
        if ablating:
            current = list(parse_heads(heads_)) if adding else []
            set_ = format_heads([*current, head] if head not in current else current)
        return [format_heads([head]), set_]

    @readable
    def clicked_cell(value: str, heads_: str, adding: bool, ablating: bool):
        head = _one_head(value.partition("#")[0])  # "L2H3#<time>" from the listener
        return picked(head, heads_, adding, ablating)

    @readable
    def clicked_row(
        evt: gr.SelectData, heads_: str, adding: bool, ablating: bool, grid_: pd.DataFrame
    ):
        head = _one_head(str(grid_.iloc[evt.index[0], 0]))  # the row's "L2H3"
        return picked(head, heads_, adding, ablating)

    @readable
    def show_attention(
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
        weights = runner(request_, progress, session(request), "layers")
        texts = result.explanations[_ANALYSIS].token_texts or []
        return attention_figure(weights, texts, layer, head)

    def ablated(
        shown: str, method_: str, result: Result | None, request: gr.Request, progress: Any
    ) -> tuple[list[Any], Any]:
        """The ablation's views (prediction, after, change, maps, bars, link, state)."""
        if result is None:
            raise gr.Error("analyse an input first; ablation re-runs its prediction")
        try:
            chosen_ = parse_heads(shown)
        except InvalidParameterError as err:
            raise gr.Error(str(err)) from None
        if not chosen_:
            raise gr.Error("name at least one head, or click one in the heatmap or the table")
        base = _request_fields(**_instance(result))
        request_ = AblationRequest(**base, method=method_, heads=chosen_)
        outcome = runner(request_, progress, session(request), "layers")
        plain, zeroed = outcome.plain, outcome.ablated
        label = plain.target.label
        before, after = plain.target.probability, zeroed.target.probability
        assert before is not None and after is not None  # an ablation explains one output
        line = ablation_note(format_heads(chosen_), label, before, after)
        maps = {f"{method_} (as is)": plain, f"{method_} (heads ablated)": zeroed}
        kept = {_ANALYSIS: result.explanations[_ANALYSIS], method_: plain}
        kept[f"{method_}_heads_ablated"] = zeroed
        result = _with_fields(result, heads=format_heads(chosen_))
        result = dataclasses.replace(result, explanations=kept)
        figure = None
        if outcome.attention is not None and outcome.token_texts is not None:
            figure = attention_figure(outcome.attention, outcome.token_texts, *chosen_[0])
        views = [
            top(plain),
            top(zeroed),
            line,
            token_columns_html(maps) if plain.tokens is not None else "",
            ablation_figure(plain.predictions, zeroed.predictions, label),
            shown_link(result, request),
            result,
        ]
        return views, figure

    ablation_outputs = [before, after, change, compared, ablation_plot, link, last]

    @readable
    def run_ablation(
        shown: str, method_: str, result: Result | None, request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):  # fmt: skip
        views, figure = ablated(shown, method_, result, request, progress)
        return [*views, figure]

    def ablate_if(attention_too: bool) -> Any:
        """A handler ablating the named heads when asked; ``attention_too``: the first's view."""

        @readable
        def handler(
            asked: bool, shown: str, method_: str, result: Result | None, request: gr.Request,
            progress=gr.Progress(),  # noqa: B008
        ):  # fmt: skip
            if not asked or not shown.strip():
                return [gr.skip()] * (len(ablation_outputs) + 1)
            views, figure = ablated(shown, method_, result, request, progress)
            return [*views, figure if attention_too else gr.skip()]

        return handler

    private: dict[str, Any] = {"api_visibility": "private"}
    clicks = [
        clicked.change(
            clicked_cell, [clicked, heads, add, ablate_click], [chosen, heads], **private
        ),
        grid.select(clicked_row, [heads, add, ablate_click, grid], [chosen, heads], **private),
    ]
    shown_heads = [c.success(show_attention, [chosen, last], attention, **private) for c in clicks]
    # after a click the clicked head's attention stays (the ablated set may start elsewhere)
    ablations = [
        trigger(handler, inputs_, [*ablation_outputs, attention], **naming)
        for trigger, handler, inputs_, naming in (
            *(
                (shown.success, ablate_if(False), [ablate_click, heads, method, last], private)
                for shown in shown_heads
            ),
            (ablate.click, run_ablation, [heads, method, last], {"api_name": "layers_ablate"}),
            (linked_run.success, ablate_if(True), [linked, heads, method, last], private),
        )
    ]
    cancel.click(
        runner.cancel_handler("layers"),
        [],
        [],
        cancels=[running, linked_run, *ablations],
        api_name="layers_cancel",
    )

    @readable
    def clicked_token(evt: gr.SelectData, result: Result | None):
        if result is None:
            return None
        explanation = result.explanations[_ANALYSIS]
        per_layer = explanation.maps.get("token_per_layer")
        if per_layer is None:
            raise gr.Error("token relevance per layer comes with the 'lrp' measure")
        return token_layers_figure(per_layer, explanation.token_texts or [], evt.index)

    tokens.select(clicked_token, [last], token_layers, api_visibility="private")

    @readable
    def download(result: Result | None) -> str:
        """The analysis (and the last ablation's maps) as a zip, its layer table among them."""
        if result is None:
            raise gr.Error("analyse an input first; the bundle holds its results")
        maps = {k: e for k, e in result.explanations.items() if k != _ANALYSIS}
        pages = {"ablation_maps": token_columns_html(maps)} if maps else {}
        return str(export_bundle(result, pages=pages))

    export.click(download, [last], bundle, api_name="layers_export")
    return LinkedTab(
        {
            "model": model,
            "labels": labels,
            "text": text,
            "target": target,
            "next_token": next_token,
            "answer": answer,
            "contrast": contrast,
            "measures": measures,
            "measure": measure,
            "heads": heads,
        },
        [],
        linked,
    )


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
