"""
The Layers & heads tab: which layers and heads carried a prediction, and click-to-ablate.

The layer × head grid of a measure, per-layer lines and the estimators' agreement; a clicked
head (or a set) is zeroed and the prediction and its map are re-run live.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd

from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import (
    SAMPLE_PROMPT,
    SAMPLE_TEXT,
    label_list,
    labels_for,
    read_target,
    readable,
    sample_labels,
)
from attrlab.app.worker import AblationRequest, ExplainRequest
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.models import BUILTIN_MODELS, default_model
from attrlab.viz.tokens import token_label, token_probabilities

if TYPE_CHECKING:
    from attrlab.viz.figures import FigureBuilder

__all__ = ["format_heads", "layers_tab", "parse_heads"]

_HEAD = re.compile(r"^\s*L?\s*(\d+)\s*[H:./ ]\s*(\d+)\s*$", re.IGNORECASE)
#: The map re-run with heads ablated: one backward pass, so a click answers at once.
ABLATION_METHOD = "gradient_x_input"


def parse_heads(text: str | None) -> tuple[tuple[int, int], ...]:
    """``"L2H3, L4H1"`` -> ``((2, 3), (4, 1))``; a clear error for anything else."""
    heads: list[tuple[int, int]] = []
    for part in (text or "").replace(";", ",").split(","):
        if not part.strip():
            continue
        found = _HEAD.match(part)
        if found is None:
            raise InvalidParameterError(
                f"cannot read the head {part.strip()!r}: write heads as L<layer>H<head>, "
                "e.g. L2H3, L4H1"
            )
        head = (int(found[1]), int(found[2]))
        if head not in heads:
            heads.append(head)
    return tuple(heads)


def format_heads(heads: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> str:
    """The inverse of :func:`parse_heads`."""
    return ", ".join(f"L{layer}H{head}" for layer, head in heads)


def layers_tab(runner: PageRunner) -> None:
    """Build the tab; every request goes through ``runner``."""
    from attrlab.attribution.layers import MEASURES

    models = [name for name, m in BUILTIN_MODELS.items() if m.modality == "text"]
    last = gr.State(None)  # (the analysis Explanation, the request's fields)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            model = gr.Dropdown(
                models,
                value=default_model("text"),
                label="Model (a transformer)",
                allow_custom_value=True,
                elem_id="layers-model",
            )
            text = gr.Textbox(
                SAMPLE_TEXT,
                label="Text or prompt",
                lines=2,
                elem_id="layers-input",
            )
            with gr.Row():
                labels = gr.Textbox(
                    sample_labels(default_model("text")), label="Labels (zero-shot models)"
                )
                target = gr.Textbox("", label="Target (label or index; empty = top)")
                next_token = gr.Checkbox(False, label="Next token (decoder LMs)")
            gr.Examples(
                [[SAMPLE_TEXT, "minilm-zeroshot", False], [SAMPLE_PROMPT, "smollm2-135m", True]],
                [text, model, next_token],
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
    with gr.Row(equal_height=False):
        with gr.Column():
            measure = gr.Dropdown([], label="Head measure", elem_id="layers-head-measure")
            heatmap = gr.Plot(label="Layer × head", elem_id="layers-heatmap")
        with gr.Column():
            gr.Markdown("Click a head to ablate it (tick *add* to build a set).")
            grid = gr.Dataframe(
                interactive=False, label="Heads (click one)", elem_id="layers-grid", max_height=320
            )
    with gr.Row():
        lines = gr.Plot(label="Per layer", elem_id="layers-lines")
        positional = gr.Plot(
            label="Token and positional relevance per layer (PA-LRP)",
            visible=False,
            elem_id="layers-positional",
        )
        agreement = gr.Plot(label="Agreement of head estimators", elem_id="layers-agreement")
    with gr.Row(equal_height=False):
        tokens = gr.HighlightedText(
            label="Token relevance (AttnLRP); click a token", elem_id="layers-tokens"
        )
        token_layers = gr.Plot(
            label="The clicked token's relevance per layer", elem_id="layers-token-layers"
        )
    gr.Markdown("### Ablate heads")
    with gr.Row():
        heads = gr.Textbox("", label="Heads (e.g. L2H3, L4H1)", elem_id="layers-heads")
        add = gr.Checkbox(False, label="add clicked heads to the set")
        method = gr.Dropdown(
            ["gradient_x_input", "integrated_gradients", "attnlrp", "occlusion"],
            value=ABLATION_METHOD,
            label="Map re-run with the heads ablated",
        )
        ablate = gr.Button("Ablate", elem_id="layers-ablate")
    with gr.Row(equal_height=False):
        before = gr.Label(num_top_classes=5, label="Prediction", elem_id="layers-before")
        after = gr.Label(num_top_classes=5, label="With the heads ablated", elem_id="layers-after")
        with gr.Column():
            change = gr.Markdown("", elem_id="layers-change")
            attention = gr.Plot(label="Attention of the first head", elem_id="layers-attention")
    compared = gr.HTML(elem_id="layers-maps")

    def fields(model_, text_, labels_, target_, next_):
        return {
            "model": model_,
            "text": text_ or "",
            "labels": None if next_ else label_list(labels_),  # a decoder's classes are tokens
            "target": read_target(target_),
            "next_token": bool(next_),
        }

    @readable
    def analyse(
        model_,
        text_,
        labels_,
        target_,
        next_,
        measures_,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        from attrlab.viz.figures import AGREEMENT, LAYERS, figures_for, head_measures

        if not measures_:
            raise gr.Error("choose at least one measure")
        base = fields(model_, text_, labels_, target_, next_)
        request_ = ExplainRequest(**base, method="layers", params={"measures": ",".join(measures_)})
        explanation: Explanation = runner(request_, progress, request.session_hash, "layers")
        table = explanation.layers
        figures = figures_for(explanation)
        head_names = head_measures(table)
        shown_measure = head_names[0] if head_names else None
        highlighted = None
        if explanation.tokens is not None:
            from attrlab.viz import token_highlights

            highlighted = token_highlights(explanation)
        state = (explanation, {**base, "target": explanation.target.index})
        return [
            gr.update(choices=head_names, value=shown_measure),
            *_head_views(table, shown_measure),
            figures[LAYERS](),
            _positional_view(figures),
            figures[AGREEMENT]() if AGREEMENT in figures else None,
            highlighted,
            None,
            token_probabilities(explanation.predictions),
            state,
        ]

    running = run.click(
        analyse,
        [model, text, labels, target, next_token, measures],
        [measure, heatmap, grid, lines, positional, agreement, tokens, token_layers, before, last],
        api_name="layers_analyse",
        concurrency_id="run-layers",
    )
    cancel.click(
        runner.cancel_handler("layers"),
        [],
        [],
        cancels=[running],
        api_name="layers_cancel",
    )
    model.change(
        lambda name: [
            gr.update(value=bool(getattr(BUILTIN_MODELS.get(name), "next_token", False))),
            labels_for(name),
        ],
        model,
        [next_token, labels],
        api_visibility="private",
    )

    @readable
    def redraw(measure_, state):
        if state is None or not measure_:
            return [None, None]
        return _head_views(state[0].layers, measure_)

    measure.change(redraw, [measure, last], [heatmap, grid], api_visibility="private")

    def clicked_head(evt: gr.SelectData, shown: str, adding: bool, grid_: pd.DataFrame):
        row, column = evt.index
        if column == 0:  # the layer column
            raise gr.Error("click a head's cell, not the layer's name")
        head = (int(str(grid_.iloc[row, 0]).lstrip("L")), column - 1)
        chosen = list(parse_heads(shown)) if adding else []
        if head not in chosen:
            chosen.append(head)
        return format_heads(chosen)

    @readable
    def run_ablation(shown: str, method_: str, state, request: gr.Request, progress=gr.Progress()):  # noqa: B008
        from attrlab.viz import ablation_figure, attention_figure
        from attrlab.viz.text import token_columns_html

        if state is None:
            raise gr.Error("analyse an input first; ablation re-runs its prediction")
        try:
            chosen = parse_heads(shown)
        except InvalidParameterError as err:
            raise gr.Error(str(err)) from None
        if not chosen:
            raise gr.Error("name at least one head, or click one in the grid")
        _, base = state
        request_ = AblationRequest(**base, method=method_, heads=chosen)
        result = runner(request_, progress, request.session_hash, "layers")
        plain, ablated = result.plain, result.ablated
        delta = ablated.target.probability - plain.target.probability
        line = (
            f"**{format_heads(chosen)}** ablated: p({token_label(plain.target.label)}) "
            f"{plain.target.probability:.4f} → {ablated.target.probability:.4f} ({delta:+.4f})"
        )
        figure = None
        if result.attention is not None and result.token_texts is not None:
            figure = attention_figure(result.attention, result.token_texts, *chosen[0])
        maps = {f"{method_} (as is)": plain, f"{method_} (heads ablated)": ablated}
        return [
            token_probabilities(plain.predictions),
            token_probabilities(ablated.predictions),
            line + "\n\n",
            figure,
            token_columns_html(maps) if plain.tokens is not None else "",
            ablation_figure(plain.predictions, ablated.predictions, plain.target.label),
        ]

    ablation_plot = gr.Plot(label="Top predictions before and after", elem_id="layers-ablation")
    ablation_outputs = [before, after, change, attention, compared, ablation_plot]
    grid.select(clicked_head, [heads, add, grid], heads, api_visibility="private").success(
        run_ablation, [heads, method, last], ablation_outputs, api_visibility="private"
    )
    ablate.click(run_ablation, [heads, method, last], ablation_outputs, api_name="layers_ablate")

    @readable
    def clicked_token(evt: gr.SelectData, state):
        from attrlab.viz import token_layers_figure

        if state is None:
            return None
        explanation = state[0]
        per_layer = explanation.maps.get("token_per_layer")
        if per_layer is None:
            raise gr.Error("token relevance per layer comes with the 'lrp' measure")
        return token_layers_figure(per_layer, explanation.token_texts, evt.index)

    tokens.select(clicked_token, [last], token_layers, api_visibility="private")


def _positional_view(figures: Mapping[str, FigureBuilder]) -> Any:
    """PA-LRP's token against positional relevance per layer, where the model has both."""
    from attrlab.viz.figures import POSITIONAL

    if POSITIONAL not in figures:
        return gr.update(value=None, visible=False)
    return gr.update(value=figures[POSITIONAL](), visible=True)


def _head_views(table: pd.DataFrame, measure: str | None) -> list[Any]:
    from attrlab.viz import head_grid_table, head_heatmap

    if measure is None:
        return [None, None]
    return [head_heatmap(table, measure), head_grid_table(table, measure)]
