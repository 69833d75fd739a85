"""
An explain tab (a text, a prompt's next token or an image): methods side by side, and trust.

:class:`ExplainTab` builds one tab's components and wires them to its own methods; the figures
and the export come from :mod:`app.ui.results`, a shared link from :mod:`app.ui.link`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from attrlab.app.bounds import page_params
from attrlab.app.errors import public_message
from attrlab.app.ui.files import (
    EXAMPLE_PREFIX,
    example_images,
    example_of,
    received_input,
    uploaded_image,
)
from attrlab.app.ui.link import LinkedTab, page_base, share_query, view_fields
from attrlab.app.ui.methods import MethodControls
from attrlab.app.ui.results import (
    Result,
    changes,
    comparison_view,
    detail_choices,
    detail_figure,
    export_bundle,
    summary,
    top,
    trust_cards,
)
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import (
    IOI_PROMPT,
    SAMPLE_PROMPT,
    SAMPLE_TEXT,
    label_list,
    labels_for,
    read_target,
    readable,
    sample_labels,
    session,
    whole,
)
from attrlab.attribution.compare import occluded
from attrlab.attribution.errors import AttrlabError
from attrlab.attribution.inputs.features import GRANULARITIES, read_spans
from attrlab.attribution.methods.catalog import SUGGESTED_METHODS
from attrlab.attribution.models import BUILTIN_MODELS, default_model, load_image
from attrlab.attribution.request import CheckRequest, ExplainRequest, PreviewRequest
from attrlab.viz import (
    image_grid_figure,
    method_agreement_figure,
    randomisation_figure,
    token_columns_html,
)
from attrlab.viz.image import display_copy
from attrlab.viz.tokens import token_label, token_probabilities
from attrlab.viz.view import CLIP_MIN, IMAGE_VIEW, SIGNS, TEXT_VIEW, View

__all__ = ["Asked", "AskedFeatures", "ExplainTab", "TabSpec"]

#: The name of each tab's REST routes (``explain_text``, ``predict_next_token``, ...).
_API_NAMES = {"text": "text", "next": "next_token", "image": "image"}
#: The image maps' opacity when a run is shown.
_OPACITY = 0.55


@dataclass
class TabSpec:
    """What differs between the explain tabs."""

    key: str  # "text", "next" or "image"
    title: str
    modality: str
    next_token: bool = False


@dataclass(frozen=True)
class Asked:
    """
    What a tab's own fields (:attr:`ExplainTab.asked_fields`) add to a request and its link.

    Attributes:
        request: Fields of the worker's request (an answer, a granularity and its spans).
        link: Fields of the run's shared link and export, as typed.
        preview: Fields of Predict's request (the chat template's prompt).
    """

    request: dict[str, Any]
    link: dict[str, Any]
    preview: dict[str, Any]


@dataclass(frozen=True)
class AskedFeatures:
    """A text tab's granularity and spans as typed; what the worker gets and a link carries."""

    granularity: str = "token"
    spans: str = ""

    def asked(self) -> Asked:
        """
        The request's ``granularity`` and ``spans`` (those of ``span`` only), and the link's.

        Raises:
            InvalidInputError: spans that are not one ``start-end`` a line (nor JSON pairs).
        """
        granularity = self.granularity or "token"
        spans = read_spans(self.spans or "") if granularity == "span" else None
        link = {"granularity": None if granularity == "token" else granularity}
        link["spans"] = self.spans if granularity == "span" else None
        return Asked({"granularity": granularity, "spans": spans}, link, {})


class ExplainTab:
    """
    One explain tab: its components, and its handlers as methods.

    Made inside a ``gr.Tab``; the components are laid out and wired when it is made. The last
    run stays in the session (``last``); :attr:`linked` says what a shared link fills and runs.
    """

    def __init__(
        self, spec: TabSpec, runner: PageRunner, cost: Callable[[ExplainRequest], str]
    ) -> None:
        self.spec = spec
        self.runner = runner
        self.cost = cost
        self.key = spec.key
        self.api = _API_NAMES[spec.key]
        self.image = spec.modality == "image"
        #: How the maps are coloured (the view controls set it; a run and the export read it).
        self.default_view = IMAGE_VIEW if self.image else TEXT_VIEW
        self.last = gr.State(None)
        self.view = gr.State(self.default_view)
        #: The tab's own fields of the question (a text's granularity, a language model's
        #: answer), read by :meth:`asked`: last among :meth:`explain`'s and :meth:`preview`'s
        #: inputs, first among :meth:`price`'s. None on the image tab.
        self.asked_fields: list[Any] = []
        self._layout()
        self.params_box = gr.JSON(visible=False)  # method -> parameters, from the widgets
        self.linked = gr.State(False)  # a shared link filled this tab: run it once loaded
        #: What Run hands to :meth:`explain`, in its order.
        self.fields = [self.model, self.labels, self.source, self.target, self.controls.picker]
        self.fields += [self.trust, self.randomise, self.seed, self.params_box]
        self.fields += [self.compare, self.last, *self.asked_fields]
        #: What :meth:`show` fills, in its order.
        self.shown = [self.maps, self.agreement, self.detail_choice, self.detail, self.cards]
        self.shown += [self.randomisation, self.raw, self.link, self.last, self.prediction]
        self.shown += [self.comparison]
        self.shown += [self.opacity] if self.opacity is not None else []
        self._wire()

    # --- layout ---------------------------------------------------------------------------

    def _layout(self) -> None:
        """
        Inputs on the left; the prediction, Run and the results on the right.

        At 1280 × 800 the results (or the run's progress, drawn on the maps) start beside the
        inputs, near Run, not below them.
        """
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=400):
                self._inputs()
                self._options()
            with gr.Column(scale=7, min_width=480):
                self._settings()
                self._outputs()

    def _inputs(self) -> None:
        spec, key = self.spec, self.key
        models = [
            name
            for name, m in BUILTIN_MODELS.items()
            if m.modality == spec.modality and m.next_token == spec.next_token
        ]
        initial = default_model(spec.modality, next_token=spec.next_token)
        with gr.Row():
            self.model = gr.Dropdown(
                models,
                value=initial,
                label="Model: built-in alias, hub id or local folder (as the server allows)",
                allow_custom_value=True,
                scale=2,
                elem_id=f"{key}-model",
            )
            self.labels = gr.Textbox(
                (sample_labels(initial) or "") if key == "text" else "",
                label="Labels (zero-shot models)",
                visible=key == "text",
                scale=1,
                elem_id=f"{key}-labels",
            )
        self._source()
        self.controls = MethodControls.build(spec.modality, list(SUGGESTED_METHODS[key]), key)

    def _source(self) -> None:
        """The tab's input: an image (and the occlusion's size), or a text or prompt."""
        spec, key = self.spec, self.key
        self.occlusion: gr.Slider | None = None
        if self.image:
            # The upload's own file, undecoded (no image_mode: Gradio would convert it):
            # the library decodes it, after checking its size from the header.
            self.source: Any = received_input(
                gr.Image(
                    label="Image",
                    type="filepath",
                    image_mode=None,
                    height=240,
                    elem_id=f"{key}-input",
                )
            )
            gr.Examples(
                [[str(p)] for p in example_images().values()],
                [self.source],
                label="Examples",
                elem_id=f"{key}-examples",
            )
            self.occlusion = gr.Slider(
                4,
                128,
                32,
                step=4,
                label="Click the image to occlude a square of this size (pixels)",
                elem_id=f"{key}-occlusion",
            )
        else:
            self.source = gr.Textbox(
                SAMPLE_PROMPT if spec.next_token else SAMPLE_TEXT,
                label="Prompt" if spec.next_token else "Text",
                lines=2,
                elem_id=f"{key}-input",
            )
            gr.Examples(
                _example_texts(spec.next_token),
                [self.source],
                label="Examples",
                elem_id=f"{key}-examples",
            )
            self._features()

    def _features(self) -> None:
        """A text's granularity, and the spans of ``span``."""
        key = self.key
        with gr.Row(equal_height=True):
            self.granularity = gr.Radio(
                list(GRANULARITIES),
                value="token",
                label="Explain by",
                info=(
                    "tokens, words, sentences or the spans you give: perturbation methods hide "
                    "whole features, every map is summed within each"
                ),
                scale=2,
                elem_id=f"{key}-granularity",
            )
            self.spans = gr.Textbox(
                "",
                label="Spans: one a line, start-end in characters of the text (end excluded)",
                placeholder="0-42\n43-120",
                lines=2,
                visible=False,
                scale=2,
                elem_id=f"{key}-spans",
            )
        self.asked_fields += [self.granularity, self.spans]

    def _options(self) -> None:
        """The run's options: trust cards, the randomisation check, compare, the seed."""
        key = self.key
        with gr.Row():
            self.trust = gr.Checkbox(
                False,
                label="Trust cards (faithfulness vs random orders)",
                elem_id=f"{key}-trust-option",
            )
            self.randomise = gr.Checkbox(
                False,
                label="Randomisation check (a run per layer)",
                elem_id=f"{key}-randomise-option",
            )
        with gr.Row():
            self.compare = gr.Checkbox(
                False,
                label="Compare with the previous run (edit the input; same class)",
                elem_id=f"{key}-compare",
            )
            self.seed = gr.Number(
                0, label="Seed", precision=0, minimum=0, min_width=80, elem_id=f"{key}-seed"
            )

    def _settings(self) -> None:
        """The target and Predict, the prediction, the cost line, Run and Cancel."""
        key = self.key
        with gr.Row(equal_height=False):
            self.target = gr.Dropdown(
                [("top prediction", "")],
                value="",
                label="Explain (from the top-5)",
                allow_custom_value=True,
                scale=2,
                elem_id=f"{key}-target",
            )
            self.predict = gr.Button(
                "Predict next tokens" if self.spec.next_token else "Predict",
                scale=1,
                elem_id=f"{key}-predict",
            )
        self.prediction = gr.Label(
            num_top_classes=5, label="Top-5 predictions", elem_id=f"{key}-prediction"
        )
        self.cost_line = gr.Markdown("", elem_id=f"{key}-cost")
        with gr.Row():
            self.run = gr.Button("Run", variant="primary", min_width=120, elem_id=f"{key}-run")
            self.cancel = gr.Button(
                "Cancel", variant="stop", min_width=100, elem_id=f"{key}-cancel"
            )

    def _outputs(self) -> None:
        key = self.key
        self.opacity: gr.Slider | None = None
        if self.image:
            self.maps: Any = gr.Plot(label="Maps", elem_id=f"{key}-maps")
            self.opacity = gr.Slider(
                0.0, 1.0, _OPACITY, step=0.05, label="Opacity", elem_id=f"{key}-opacity"
            )
        else:
            self.maps = gr.HTML(elem_id=f"{key}-maps")
        self._view_controls()
        with gr.Row():
            self.agreement = gr.Plot(label="Agreement between methods", elem_id=f"{key}-agreement")
            with gr.Column():
                self.detail_choice = gr.Dropdown(
                    [], label="Details", elem_id=f"{key}-detail-choice"
                )
                self.detail = gr.Plot(label="Details", elem_id=f"{key}-detail")
        if self.image:
            self.comparison: Any = gr.Plot(
                label="Change from the previous run", visible=False, elem_id=f"{key}-comparison"
            )
        else:
            self.comparison = gr.HTML(visible=False, elem_id=f"{key}-comparison")
        self.cards = gr.HTML(elem_id=f"{key}-trust")
        self.randomisation = gr.Plot(
            label="Randomisation check", visible=False, elem_id=f"{key}-randomisation"
        )
        with gr.Row(equal_height=False):
            self.export = gr.Button(
                "Export bundle", scale=0, min_width=160, elem_id=f"{key}-export"
            )
            self.bundle = gr.File(label="Bundle", height=90, elem_id=f"{key}-bundle")
            self.link = gr.Textbox(
                label="Link to this view",
                info=(
                    "It carries a bundled example by name; an uploaded image cannot travel in "
                    "a link (the tab opens without it)"
                )
                if self.image
                else None,
                lines=2,
                elem_id=f"{key}-link",
                buttons=["copy"],
            )
        with gr.Accordion("Raw results (JSON)", open=False, elem_id=f"{key}-raw-results"):
            self.raw = gr.JSON(elem_id=f"{key}-raw")

    def _view_controls(self) -> None:
        """How the maps are shown: the sign, the clip percentile, one scale or one per method."""
        key, default = self.key, self.default_view
        with gr.Row(elem_id=f"{key}-view"):
            self.view_sign = gr.Radio(
                list(SIGNS),
                value=default.sign,
                label="Show scores",
                info="signed; |score|; positive part (negative set to 0)",
                elem_id=f"{key}-view-sign",
            )
            self.view_clip = gr.Slider(
                CLIP_MIN,
                100.0,
                default.clip_percentile,
                step=0.5,
                label="Scale ends at this percentile of |score| (100: the largest)",
                elem_id=f"{key}-view-clip",
            )
            self.view_shared = gr.Checkbox(
                default.shared_scale,
                label="One scale for all methods",
                elem_id=f"{key}-view-shared",
            )

    # --- wiring ---------------------------------------------------------------------------

    def _wire(self) -> None:
        key, api, controls = self.key, self.api, self.controls
        listing = [controls.picker, controls.unavailable, controls.notes]
        previewed = [self.model, self.labels, self.source, self.target, self.seed]
        self.predict.click(
            self.preview,
            [*previewed, controls.picker, *self.asked_fields],
            [self.prediction, self.target, *listing],
            api_name=f"predict_{api}",
        )
        if not self.image:  # the spans' box is there for granularity span only
            self.granularity.change(
                lambda granularity: gr.update(visible=granularity == "span"),
                self.granularity,
                self.spans,
                api_visibility="private",
                show_progress="hidden",
            )
        controls.wire()
        if self.occlusion is not None:
            self.source.select(
                self.occlude_at,
                [self.source, self.occlusion],
                self.source,
                api_visibility="private",
            )
        # the user's choices only: a shared link sets model, labels and target together
        self.model.input(
            self.forget_model,
            controls.picker,
            [self.prediction, self.target, *listing],
            api_visibility="private",
        ).then(labels_for, self.model, self.labels, api_visibility="private")
        self.labels.input(  # other classes: the predictions and the chosen one are stale
            self.forget_prediction, None, [self.prediction, self.target], api_visibility="private"
        )
        gathered = self.run.click(
            self.gather,
            [controls.picker, *controls.components],
            self.params_box,
            api_visibility="private",
            show_progress="hidden",
        )
        running = gathered.success(  # not with the last run's parameters when one is refused
            self.explain,
            self.fields,
            self.shown,
            api_name=f"explain_{api}",
            concurrency_id=f"run-{key}",
            # progress on the maps, under Run: the last predictions stay readable meanwhile
            show_progress_on=[self.maps],
        )
        # A run draws the default view (its inputs, the API's, stay as they were); a run shown
        # while another view is chosen is drawn again in it.
        viewed = [self.view, self.last, self.detail_choice]
        viewed += [self.opacity] if self.opacity is not None else []
        redrawn = [self.maps, self.detail, self.link]
        running.success(self.apply_view, viewed, redrawn, api_visibility="private")
        linked_run = self.linked.change(
            self.gather,
            [controls.picker, *controls.components],
            self.params_box,
            api_visibility="private",
            show_progress="hidden",
        ).success(
            self.run_linked,
            [self.linked, *self.fields],
            self.shown,
            api_visibility="private",
            concurrency_id=f"run-{key}",
            show_progress_on=[self.maps],
        )
        linked_run.success(self.apply_view, viewed, redrawn, api_visibility="private")
        for ran in (running, linked_run):
            self.after_run(ran)
        self.cancel.click(
            self.runner.cancel_handler(key),
            [],
            [],
            cancels=[running, linked_run],
            api_name=f"cancel_{api}",
        )
        self.detail_choice.change(
            self.redraw_detail,
            [self.detail_choice, self.last, self.view],
            self.detail,
            show_progress="hidden",
            api_visibility="private",
        )
        if self.opacity is not None:
            self.opacity.release(
                self.redraw_maps,
                [self.opacity, self.last, self.view],
                self.maps,
                show_progress="hidden",
                api_name=f"opacity_{api}",
            )
        view_inputs = [self.view_sign, self.view_clip, self.view_shared]
        # the user's changes only: a shared link sets the controls and the view together
        gr.on(
            [self.view_sign.input, self.view_clip.release, self.view_shared.input],
            self.redraw_view,
            [
                *view_inputs,
                self.last,
                self.detail_choice,
                *([self.opacity] if self.opacity is not None else []),
            ],
            [self.view, self.maps, self.detail, self.link],
            show_progress="hidden",
            api_name=f"view_{api}",
        )
        self.export.click(
            self.download, [self.last, self.view], self.bundle, api_name=f"export_{api}"
        )
        self._wire_price()

    def after_run(self, ran: Any) -> None:
        """What follows a run once it is shown (``ran``: its event); nothing on most tabs."""

    def _wire_price(self) -> None:
        """The cost line, priced again whenever an input of the price changes."""
        controls = self.controls
        triggers = [self.model.change, self.source.change if self.image else self.source.blur]
        triggers += [controls.picker.change, self.trust.change, self.randomise.change]
        triggers += [self.target.change, self.labels.change]
        triggers += [w.change for w in controls.components]
        triggers += [  # a typed text once it is left, as the input's
            c.blur if isinstance(c, gr.Textbox) else c.change for c in self.asked_fields
        ]
        priced = [*self.asked_fields, self.model, self.labels, self.source, self.target]
        priced += [self.seed, self.trust, self.randomise]
        gr.on(
            triggers,
            self.price,
            [*priced, controls.picker, *controls.components],
            self.cost_line,
            show_progress="hidden",
            api_visibility="private",
            concurrency_limit=1,
            concurrency_id=f"cost-{self.key}",
            trigger_mode="always_last",
        )

    @property
    def linked_tab(self) -> LinkedTab:
        """What a shared link fills on this tab, and the flag that runs it."""
        return LinkedTab(
            {
                "model": self.model,
                "labels": self.labels,
                "text": None if self.image else self.source,
                "image": self.source if self.image else None,
                "target": self.target,
                "granularity": None if self.image else self.granularity,
                "spans": None if self.image else self.spans,
                "methods": self.controls.picker,
                "seed": self.seed,
                "trust": self.trust,
                "randomise": self.randomise,
                "view": self.view_sign,
                "clip": self.view_clip,
                "shared": self.view_shared,
            },
            self.controls.widgets,
            self.linked,
            self.view,
            self.default_view,
        )

    # --- handlers -------------------------------------------------------------------------

    def instance(
        self, model_: str, labels_: str, source_: Any, target_: Any, seed_: Any
    ) -> dict[str, Any]:
        """The request's input and model fields from the page."""
        if self.image:
            data: dict[str, Any] = {"image": uploaded_image(source_)}
        else:
            data = {"text": source_ or ""}
        return {
            "model": model_,
            "labels": label_list(labels_) if self.key == "text" else None,
            "target": read_target(target_),
            "seed": whole(seed_) or 0,
            "next_token": self.spec.next_token,
            **data,
        }

    def asked(self, *values: Any) -> Asked:
        """
        What the values of :attr:`asked_fields` add to a request, its link and Predict's.

        Raises:
            InvalidInputError, InvalidParameterError: fields the library refuses, in words.
        """
        if self.image:
            return Asked({}, {}, {})
        return AskedFeatures(*values[:2]).asked()

    @readable
    def preview(
        self,
        model_,
        labels_,
        source_,
        target_,
        seed_,
        chosen,
        request: gr.Request | None = None,
        *asked_: Any,
    ) -> list:
        """Predict: the top outputs, the target's choices and the methods for the model."""
        fields = (
            self.instance(model_, labels_, source_, target_, seed_) | self.asked(*asked_).preview
        )
        shown = self.runner(
            PreviewRequest(**fields),
            gr.Progress(),
            session(request),
            self.key,
        )
        reasons = shown.capabilities
        choices = [("top prediction", "")] + [
            (
                f"'{token_label(p.label)}' ({p.probability:.3f})"
                if self.spec.next_token
                else p.label,
                str(p.index),
            )
            for p in shown.predictions
        ]
        return [
            token_probabilities(shown.predictions),
            gr.update(choices=choices, value=""),
            *self.controls.listed(chosen or [], reasons),
        ]

    @readable
    def occlude_at(self, image: Any, size: float, evt: gr.SelectData) -> Any:
        """The image with a square around the clicked point occluded (edit and compare)."""
        if image is None or not isinstance(evt.index, list | tuple) or len(evt.index) != 2:
            return gr.skip()  # a selection that is not a click on a shown image
        x, y = evt.index
        picture = load_image(uploaded_image(image), self.runner.worker.settings.max_image_pixels)
        return occluded(np.asarray(picture), int(x), int(y), int(size))

    def forget_model(self, chosen: list[str] | None) -> list[Any]:
        """Another model: its predictions, classes and methods are not known yet."""
        return [
            None,
            gr.update(choices=[("top prediction", "")], value=""),
            *self.controls.listed(chosen or [], {}),
        ]

    def forget_prediction(self) -> list[Any]:
        """Other labels: the predictions and the chosen class are stale."""
        return [None, gr.update(choices=[("top prediction", "")], value="")]

    @readable
    def explain(
        self,
        model_,
        labels_,
        source_,
        target_,
        methods,
        trust_,
        randomise_,
        seed_,
        params,
        compare_,
        previous: Result | None,
        request: gr.Request | None = None,
        progress=gr.Progress(),  # noqa: B008
        *asked_: Any,
    ) -> list:
        """Run: each chosen method's explanation (and the checks asked for), shown."""
        params = page_params(params)  # bounded as REST's, before anything reads into it
        asked = self.asked(*asked_)
        base = self.instance(model_, labels_, source_, target_, seed_) | asked.request
        values = (source_, labels_, methods, trust_, randomise_, params, compare_, previous)
        result = self.run_methods(base, *values, request, progress)
        result.fields |= asked.link
        return self.show(result, request)

    def run_methods(
        self,
        base: dict[str, Any],
        source_: Any,
        labels_: str,
        methods: list[str] | None,
        trust_: bool,
        randomise_: bool,
        params: dict[str, dict[str, Any]],
        compare_: bool,
        previous: Result | None,
        request: gr.Request | None,
        progress: Any,
    ) -> Result:
        """The run of ``methods`` on the request fields ``base`` (:meth:`instance`'s)."""
        methods = list(methods or [])
        example = None
        if self.image:  # decoded once, here: the worker takes the decoded image
            example = example_of(base["image"])  # a link can carry a bundled example by name
            base["image"] = load_image(base["image"], self.runner.worker.settings.max_image_pixels)
        if compare_ and previous is None:
            raise gr.Error("run once before comparing: the comparison needs a previous run")
        if compare_ and previous is not None and base.get("answer") is None:
            # the class the previous run explained (an answer is explained again as asked)
            base["target"] = next(iter(previous.explanations.values())).target.index
        if len(methods) == 1 and not randomise_:
            explanation = self.runner(
                ExplainRequest(
                    **base,
                    method=methods[0],
                    params=params.get(methods[0], {}),
                    evaluate=bool(trust_),
                ),
                progress,
                session(request),
                self.key,
            )
            result = Result({methods[0]: explanation})
        else:
            check = self.runner(
                CheckRequest(
                    **base,
                    methods=tuple(methods),
                    params={m: p for m, p in params.items() if m in methods},
                    evaluate=bool(trust_),
                    randomise=bool(randomise_),
                ),
                progress,
                session(request),
                self.key,
            )
            result = Result(
                check.explanations,
                check.agreement,
                check.randomisation,
                randomisation_verdicts=check.randomisation_verdicts,
            )
        if self.image:
            result.image = display_copy(base["image"])
            result.image_size = (base["image"].height, base["image"].width)
        result.fields = {
            "tab": self.key,
            "model": base["model"],
            "methods": methods,
            "text": base.get("text"),
            "image": EXAMPLE_PREFIX + example if example else None,
            "image_name": Path(source_).name if self.image and not example else None,
            "labels": labels_ if self.key == "text" else None,
            "target": "" if base["target"] is None else str(base["target"]),  # as explained
            "seed": base["seed"],
            "params": params,
            "trust": bool(trust_),
            "randomise": bool(randomise_),
        }
        if compare_ and previous is not None:
            result.changes = changes(previous, result)
        return result

    def show(self, result: Result, request: gr.Request | None) -> list[Any]:
        """The updates of :attr:`shown` for a run's ``result``, in the default view."""
        view = self.default_view

        compared = result.agreement is not None and len(result.agreement) > 0
        checked = result.randomisation is not None and len(result.randomisation) > 0
        choices = detail_choices(result)
        cards_html = trust_cards(result)
        return [
            self._maps(result, view, _OPACITY),
            gr.update(
                value=method_agreement_figure(result.agreement) if compared else None,
                visible=compared,
            ),
            gr.update(choices=choices, value=choices[0] if choices else None),
            detail_figure(result, choices[0], view) if choices else None,
            f'<div class="trust-cards">{cards_html}</div>',
            gr.update(
                value=randomisation_figure(result.randomisation) if checked else None,
                visible=checked,
            ),
            summary(result),
            self._link(result, view, request),
            result,
            top(next(iter(result.explanations.values()))),
            comparison_view(result),
            *([gr.update(value=_OPACITY)] if self.opacity is not None else []),
        ]

    def gather(self, chosen: list[str] | None, *values: Any) -> dict[str, dict[str, Any]]:
        """The chosen methods' parameters from their widgets' ``values``."""
        widgets = self.controls.components
        return self.controls.params(chosen or [], dict(zip(widgets, values, strict=True)))

    def run_linked(
        self,
        request: gr.Request | None = None,
        progress=gr.Progress(),  # noqa: B008
        linked_: bool = False,
        *values: Any,
    ) -> list[Any]:
        """
        Run the tab a shared link filled (``values``: its :attr:`fields`').

        The page's load sets every tab's flag. Gradio gives ``request`` and ``progress`` at
        their places, so they come first here, before the fields of any tab.
        """
        if not linked_:
            return [gr.skip()] * len(self.shown)
        common = len(values) - len(self.asked_fields)  # explain's own: request, progress follow
        return self.explain(*values[:common], request, progress, *values[common:])

    @readable
    def redraw_detail(
        self, choice: str | None, result: Result | None, view_: View | None = None
    ) -> Any:
        """The details figure the menu names (an image's map in the page's view)."""
        if result is None or not choice:
            return None
        return detail_figure(result, choice, view_ or self.default_view)

    @readable
    def redraw_maps(self, alpha: float, result: Result | None, view_: View | None = None) -> Any:
        """The image maps again, at the slider's opacity."""
        if result is None or result.image is None:
            raise gr.Error("run an explanation first; the slider sets its maps' opacity")
        return self._maps(result, view_ or self.default_view, alpha)

    @readable
    def redraw_view(
        self,
        sign: Any,
        clip: Any,
        shared: Any,
        result: Result | None,
        choice: str | None,
        opacity_: float = _OPACITY,
        request: gr.Request | None = None,
    ) -> list[Any]:
        """The maps (and details) again in the controls' view, and its link; nothing re-runs."""
        try:
            view = View(sign, float(clip), bool(shared))
        except (TypeError, ValueError) as err:
            raise gr.Error(f"that view cannot be shown: {err}") from None
        if result is None:  # no maps yet: the next run is drawn in this view
            return [view, gr.skip(), gr.skip(), gr.skip()]
        return [view, *self._redrawn(view, result, choice, opacity_, request)]

    def apply_view(
        self,
        view_: View | None,
        result: Result | None,
        choice: str | None,
        opacity_: float = _OPACITY,
        request: gr.Request | None = None,
    ) -> list[Any]:
        """After a run: its maps, details and link in the chosen view, unless it is the default."""
        if result is None or view_ is None or view_ == self.default_view:
            return [gr.skip()] * 3
        return self._redrawn(view_, result, choice, opacity_, request)

    def _redrawn(
        self,
        view: View,
        result: Result,
        choice: str | None,
        alpha: float,
        request: gr.Request | None,
    ) -> list[Any]:
        """The maps, the details and the link of ``result`` in ``view``."""
        return [
            self._maps(result, view, alpha),
            self.redraw_detail(choice, result, view),
            self._link(result, view, request),
        ]

    def _maps(self, result: Result, view: View, alpha: float) -> Any:
        """The maps of a run: token columns, or the image panels at ``alpha``, in ``view``."""
        if result.image is not None:
            return image_grid_figure(result.explanations, result.image, alpha, view)
        return token_columns_html(result.explanations, view)

    def _link(self, result: Result, view: View, request: gr.Request | None) -> str:
        """The link to a run in ``view`` (an image only when it is a bundled example)."""
        fields = {**result.fields, **view_fields(view, self.default_view)}
        return page_base(request) + share_query(fields)

    @readable
    def download(self, result: Result | None, view_: View | None = None) -> str:
        """The last run's export bundle, its maps in the page's view."""
        if result is None:
            raise gr.Error("run an explanation first; the bundle holds its results")
        return str(export_bundle(result, view=view_ or self.default_view))

    def price(self, *values: Any) -> str:
        """
        The cost line: each chosen method's price before Run.

        ``values``: those of :attr:`asked_fields`, the model, labels, input, target, seed, the
        trust and randomise options, the chosen methods, then the methods' widgets.
        """
        count = len(self.asked_fields)
        asked_, fields, widgets = values[:count], values[count : count + 8], values[count + 8 :]
        model_, labels_, source_, target_, seed_, trust_, randomise_, chosen = fields
        if not chosen:
            return ""
        try:
            base = self.instance(model_, labels_, source_, target_, seed_)
            base |= self.asked(*asked_).request
        except gr.Error as err:
            return f"Cost: cannot estimate ({err.message})"
        except AttrlabError as err:
            return f"Cost: cannot estimate ({public_message(str(err))})"
        methods = list(chosen)
        components = self.controls.components
        params = self.controls.params(methods, dict(zip(components, widgets, strict=True)))
        lines = [
            m
            + ": "
            + self.cost(
                ExplainRequest(**base, method=m, params=params.get(m, {}), evaluate=bool(trust_))
            )
            for m in methods
        ]
        # the check re-runs each method once per randomised layer: not priced here
        unpriced = " (the randomisation check's re-runs are not counted)" if randomise_ else ""
        return "Cost before Run: " + "; ".join(lines) + unpriced


def _example_texts(next_token: bool) -> list[list[str]]:
    if next_token:
        return [
            [SAMPLE_PROMPT],
            [IOI_PROMPT],
        ]
    lines = resources.files("attrlab.assets").joinpath("sentiment_samples.txt").read_text("utf-8")
    return [[line.split("\t")[0]] for line in lines.splitlines() if line.strip()][:4]
