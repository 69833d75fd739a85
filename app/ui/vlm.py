"""
The Vision-language tab: what in an image and a prompt an answer rests on; its visual tokens.

Each method ticked runs as an :class:`~attribution.request.ExplainRequest` with the image (or
the images, in order, when more are uploaded) and the prompt (the answer given, the model's own
greedy answer, or its next token; against a contrast if given: the answer fields become the
library's :class:`~attribution.request.answers.AnswerSpec` as on the Language model tab), and the
visual-token study, of the same answer, as a :class:`~attribution.request.VisualTokensRequest`:
both go through the page's runner and the library's gate, priced and refused over the server's
budgets as ``POST /api/v1/explain`` and ``POST /api/v1/visual-tokens`` are. It shows each
method's map over each image with the text map beside it (the whole answer's, or one step's,
chosen without rerunning), each image's and the text's shares, with Trust cards each map's
faithfulness over image regions (each visual token, or SLIC superpixels) and text tokens, the
visual-token curves with their verdicts in words, each scorer's agreement with exact removal and
ShortV's layers, an export and a link (which carries the patching section's fields too, but no
upload: neither the further images nor the patching section's other image). What reads one
image (the study, patching, the trust cards' superpixels) is refused by the library in words
when more images are uploaded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from attrlab.app.settings import ServerSettings
from attrlab.app.ui.answers import AskedAnswer
from attrlab.app.ui.files import (
    EXAMPLE_PREFIX,
    example_images,
    example_of,
    page_folder,
    received_input,
    uploaded_image,
)
from attrlab.app.ui.link import LinkedTab, page_base, share_query
from attrlab.app.ui.patching import patching_choices, patching_summary
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import (
    IMAGE_CORRUPTIONS,
    escaped,
    format_box,
    format_ratios,
    in_order,
    method_names,
    parse_box,
    parse_ratios,
    readable,
    session,
    study_buttons,
    study_export_row,
    whole,
    wire_study,
)
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.image_text import image_heatmaps
from attrlab.attribution.metrics.faithfulness import MAX_SUPERPIXELS
from attrlab.attribution.models import BUILTIN_MODELS
from attrlab.attribution.patching import (
    Blurred,
    ImageCorruption,
    Masked,
    Noised,
    OtherImage,
    PatchingReport,
    agreement_reading,
)
from attrlab.attribution.request import (
    MAX_ORDERS,
    ExplainRequest,
    PatchRequest,
    VisualTokensRequest,
)
from attrlab.attribution.request.answers import MAX_NEW_TOKENS, AnswerSpec
from attrlab.attribution.visual_tokens import VisualTokenRequest
from attrlab.attribution.visual_tokens.request import VisualTokenReport
from attrlab.attribution.visual_tokens.scorers import VISUAL_SCORERS
from attrlab.viz.answer import answer_layout
from attrlab.viz.bundle import write_bundle
from attrlab.viz.image_text import image_text_figure
from attrlab.viz.patching import patching_figure_names, patching_figures, patching_files
from attrlab.viz.trust import trust_card_html
from attrlab.viz.visual_tokens import (
    answer_origin,
    dropped_where,
    visual_tokens_figures,
    visual_tokens_files,
)

__all__ = [
    "VisionLanguageResult",
    "VisionLanguageTab",
    "export_vision_language",
    "served_image_text_models",
    "vision_language_tab",
]

#: The tab key of a run (its Cancel stops only its own requests) and of its links.
_TAB = "vlm"
#: The methods ticked when the tab opens (one pass and a backward each).
_FIRST_METHODS = ("gradient_x_input",)
#: The visual-token study's figures shown, by their names in
#: :func:`viz.visual_tokens.visual_tokens_figures`.
_TOKEN_FIGURES = (
    "visual_tokens_log_prob",
    "visual_tokens_exact_match",
    "visual_tokens_kl",
    "visual_tokens_agreement",
    "shortv",
)
#: The step dropdown's choice for the whole answer's map.
_WHOLE = "whole"
#: The key of a patching study's runs (its Cancel stops only them).
_PATCH_TAB = "vlm-patch"


@dataclass(frozen=True)
class VisionLanguageResult:
    """A run shown on the page: each method's Explanation, the study, the fields asked."""

    explanations: dict[str, Explanation]
    report: VisualTokenReport | None
    fields: dict[str, Any]


def served_image_text_models(settings: ServerSettings) -> list[str]:
    """
    The models of the server's list that may take an image and a prompt.

    Every listed model but the built-in ones of another modality (none built in takes an image
    and a prompt); a server that serves any model lists none, and the field takes any name.
    """
    return sorted(
        spec
        for spec in settings.models or ()
        if spec not in BUILTIN_MODELS or BUILTIN_MODELS[spec].modality == "image-text"
    )


def vision_language_tab(runner: PageRunner) -> LinkedTab:
    """Build the tab inside a ``gr.Tab``; what a shared link fills on it."""
    return VisionLanguageTab(runner).linked_tab


class VisionLanguageTab:
    """The Vision-language tab: its components, and its handlers as methods."""

    def __init__(self, runner: PageRunner) -> None:
        self.runner = runner
        self.last = gr.State(None)  # VisionLanguageResult
        self.linked = gr.State(False)  # a shared link filled the tab: run it once loaded
        self.asked = gr.State(True)  # Run always runs
        gr.Markdown(
            "**Which part of the image and which words does the answer rest on, and which "
            "visual tokens does the model need?** Each method's map is split into its image "
            "part, drawn over the pixels each visual token stands for, and its text part. The "
            "study drops the visual tokens each scorer ranks lowest, at the input or from a "
            "block on, beside random orders, and ranks each scorer against dropping each token "
            "alone. The answer is the one given (teacher-forced), the model's own greedy "
            "answer (generated once per run of a method or the study, then explained and "
            "studied as if given), or its next token. Under them, patching with a corrupted "
            "image (blurred, noised, masked, or another image) for the same prompt."
        )
        self._inputs()
        self._study_settings()
        self.run, self.cancel = study_buttons(_TAB, "Run")
        self.summary = gr.Markdown("", elem_id="vlm-summary")
        self.step = gr.Dropdown(
            [("whole answer", _WHOLE)], value=_WHOLE, label="Answer step", elem_id="vlm-step"
        )
        self.maps = {
            name: gr.Plot(visible=False, show_label=False, elem_id=f"vlm-{name}-plot")
            for name in [value for _, value in self.methods.choices]
        }
        self.shares = gr.Dataframe(
            interactive=False,
            label="The image's and the text's shares of |relevance|, per method and step",
            elem_id="vlm-shares",
        )
        self.trust_cards = gr.HTML("", elem_id="vlm-trust-cards")
        self.plots = {
            name: gr.Plot(visible=False, show_label=False, elem_id=f"{name}-plot")
            for name in _TOKEN_FIGURES
        }
        self.agreement = gr.Dataframe(
            interactive=False,
            label="Each scorer's agreement with dropping each visual token alone",
            elem_id="vlm-agreement",
            wrap=True,
        )
        self._patching()
        self.export, self.bundle, self.link = study_export_row(_TAB, "vision-language run")
        #: What a run reads, in :meth:`study`'s order.
        self.fields = [self.model, self.image, self.more_images, self.prompt, self.answer]
        self.fields += [self.contrast, self.generate, self.max_new_tokens, self.stop]
        self.fields += [self.per_step, self.methods, self.seed, self.scorers, self.layer]
        self.fields += [self.attention_layer, self.ratios, self.draws, self.shortv]
        #: The patching section's, read only for the link (the other image cannot travel).
        self.fields += [self.corruption, self.sigma, self.box]
        self.fields += [self.components, self.estimators, self.directions]
        self.fields += [self.trust, self.trust_superpixels]
        #: What a run fills, in its order.
        self.outputs = [self.summary, self.step, *self.maps.values(), self.shares]
        self.outputs += [self.trust_cards]
        self.outputs += [*self.plots.values(), self.agreement, self.link, self.last]
        self._wire()

    def _inputs(self) -> None:
        """The model, the image, the prompt, the answer (and contrast), the methods."""
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=280):
                self.model = gr.Dropdown(
                    served_image_text_models(self.runner.worker.settings),
                    value=None,
                    label="Model: a vision-language model (hub id or folder, as the server allows)",
                    allow_custom_value=True,
                    elem_id="vlm-model",
                )
                # the upload's own file, undecoded: the library decodes it after checking its
                # size from the header
                self.image = received_input(
                    gr.Image(
                        label="Image",
                        type="filepath",
                        image_mode=None,
                        height=240,
                        elem_id="vlm-image",
                    )
                )
                gr.Examples(
                    [[str(p)] for p in example_images().values()],
                    [self.image],
                    label="Examples",
                    elem_id="vlm-examples",
                )
                # each upload's own file, undecoded, as the first image's
                self.more_images = received_input(
                    gr.File(
                        label="More images, after the first in this order (the families that "
                        "take several; no link carries them)",
                        file_count="multiple",
                        file_types=["image"],
                        type="filepath",
                        elem_id="vlm-more-images",
                    )
                )
            with gr.Column(scale=2, min_width=400):
                self.prompt = gr.Textbox(
                    "What is in the picture?", label="Prompt", lines=2, elem_id="vlm-prompt"
                )
                with gr.Row():
                    self.answer = gr.Textbox(
                        "",
                        label="Answer to explain (empty: the model's own next token)",
                        info="Left out when generating.",
                        elem_id="vlm-answer",
                    )
                    self.contrast = gr.Textbox(
                        "",
                        label="Rather than (a contrast)",
                        elem_id="vlm-contrast",
                    )
                with gr.Row(equal_height=True):
                    self.generate = gr.Checkbox(
                        False,
                        label="Generate the answer (greedy)",
                        scale=2,
                        elem_id="vlm-generate",
                    )
                    self.max_new_tokens = gr.Number(
                        AskedAnswer.max_new_tokens,
                        label="Max new tokens",
                        precision=0,
                        minimum=1,
                        maximum=MAX_NEW_TOKENS,
                        scale=1,
                        min_width=100,
                        elem_id="vlm-max-new-tokens",
                    )
                    self.stop = gr.Textbox(
                        "", label="Stop at", scale=1, min_width=100, elem_id="vlm-stop"
                    )
                self.per_step = gr.Checkbox(
                    True, label="A map per answer step", elem_id="vlm-per-step"
                )
                self.methods = gr.CheckboxGroup(
                    method_names("image-text"),
                    value=list(_FIRST_METHODS),
                    label="Methods (maps over the image and the prompt)",
                    elem_id="vlm-methods",
                )
                with gr.Row():
                    self.trust = gr.Checkbox(
                        False,
                        label="Trust cards (faithfulness vs random orders)",
                        elem_id="vlm-trust",
                    )
                    self.trust_superpixels = gr.Number(
                        None,
                        precision=0,
                        minimum=0,
                        maximum=MAX_SUPERPIXELS,
                        label="Trust cards' image regions: SLIC superpixels (empty: each visual "
                        "token)",
                        elem_id="vlm-trust-superpixels",
                    )
                self.seed = gr.Number(0, precision=0, minimum=0, label="Seed", elem_id="vlm-seed")

    def _study_settings(self) -> None:
        """The visual-token study: scorers, where tokens are dropped, ratios, draws, ShortV."""
        asked = VisualTokenRequest
        with gr.Accordion("Visual tokens: which ones the answer needs", open=True):
            self.scorers = gr.CheckboxGroup(
                [(f"{n} ({s.awareness})", n) for n, s in VISUAL_SCORERS.items()],
                value=list(VISUAL_SCORERS),
                label="Scorers (none ticked: no study)",
                elem_id="vlm-scorers",
            )
            with gr.Row():
                self.layer = gr.Number(
                    asked.layer,
                    precision=0,
                    minimum=0,
                    label="Drop at block (0: the input)",
                    elem_id="vlm-layer",
                )
                self.attention_layer = gr.Number(
                    asked.attention_layer,
                    precision=0,
                    minimum=0,
                    label="Attention scorers read block",
                    elem_id="vlm-attention-layer",
                )
                self.ratios = gr.Textbox(
                    format_ratios(asked.ratios),
                    label="Keep ratios (1 first, falling)",
                    elem_id="vlm-ratios",
                )
                self.draws = gr.Number(
                    asked.draws,
                    precision=0,
                    minimum=2,
                    maximum=MAX_ORDERS,
                    label="Random orders (at most)",
                    elem_id="vlm-draws",
                )
                self.shortv = gr.Checkbox(
                    asked.shortv, label="ShortV's layer contribution", elem_id="vlm-shortv"
                )

    def _patching(self) -> None:
        """Patching with a corrupted image: how it is corrupted, the study's names, results."""
        with gr.Accordion("Patching with a corrupted image", open=False):
            gr.Markdown(
                "The same prompt and answer (given, or the next token: a generated one is not "
                "patched here) with the image above and a corrupted one: each "
                "residual, attention and MLP site at every visual and text position of the "
                "language model patched exactly, and AtP, AtP* and RelP against it. The "
                "corrupted image must be laid out as the clean one (as many visual tokens): "
                "another image is resized to the clean one's size. The tab's link carries these "
                "fields, but not the other image (an upload)."
            )
            with gr.Row():
                self.corruption = gr.Radio(
                    list(IMAGE_CORRUPTIONS),
                    value="blurred",
                    label="Corrupted image",
                    elem_id="vlm-corruption",
                )
                self.sigma = gr.Number(
                    4.0,
                    minimum=0,
                    label="Sigma (blur: pixels; noise: pixel values 0…255)",
                    elem_id="vlm-sigma",
                )
                self.box = gr.Textbox(
                    "", label="Masked box: x0, y0, x1, y1 (pixels)", elem_id="vlm-box"
                )
            self.other = received_input(
                gr.Image(
                    label="Another image",
                    type="filepath",
                    image_mode=None,
                    height=160,
                    elem_id="vlm-other-image",
                )
            )
            self.components, self.estimators, self.directions = patching_choices("vlm")
            self.patch, self.patch_cancel = study_buttons("vlm-patch", "Patch")
            self.patch_summary = gr.Markdown("", elem_id="vlm-patch-summary")
            self.patch_agreement = gr.Dataframe(
                interactive=False,
                label="Each estimator against exact patching",
                elem_id="vlm-patch-agreement",
                wrap=True,
            )
            self.patch_plots = {
                name: gr.Plot(
                    visible=False, show_label=False, elem_id="vlm-" + name.replace("_", "-")
                )
                for name in patching_figure_names(image=True)
            }
        self.patched = gr.State(None)  # PatchingReport
        #: What a patching study reads, in :meth:`patching`'s order.
        self.patch_fields = [self.model, self.image, self.more_images, self.prompt, self.answer]
        self.patch_fields += [self.generate, self.seed]
        self.patch_fields += [self.corruption, self.sigma, self.box, self.other]
        self.patch_fields += [self.components, self.estimators, self.directions]
        #: What it fills.
        self.patch_outputs = [self.patch_summary, self.patch_agreement]
        self.patch_outputs += [*self.patch_plots.values(), self.patched]

    def _wire(self) -> None:
        patching = self.patch.click(
            self.patching,
            self.patch_fields,
            self.patch_outputs,
            api_name="vlm_patch_run",
            concurrency_id="run-vlm_patch",
        )
        self.patch_cancel.click(
            self.runner.cancel_handler(_PATCH_TAB),
            [],
            [],
            cancels=[patching],
            api_name="vlm_patch_cancel",
        )
        wire_study(
            self.run,
            self.linked,
            self.cancel,
            self.runner.cancel_handler(_TAB),
            self.study,
            (self.asked, self.fields),
            self.outputs,
            _TAB,
        )
        self.step.change(
            self.view, [self.last, self.step], list(self.maps.values()), api_name="vlm_view"
        )
        self.export.click(
            self.download, [self.last, self.patched], self.bundle, api_name="vlm_export"
        )

    @property
    def linked_tab(self) -> LinkedTab:
        """What a shared link fills on this tab, and the flag that runs it."""
        names = ["model", "image", "prompt", "answer", "contrast", "generate", "max_new_tokens"]
        names += ["stop", "per_step", "methods", "seed", "scorers", "layer", "attention_layer"]
        names += ["ratios", "draws", "shortv", "corruption", "sigma", "box", "components"]
        names += ["estimators", "directions", "trust", "trust_superpixels"]
        carried = [field for field in self.fields if field is not self.more_images]  # uploads
        return LinkedTab(
            dict(zip(names, carried, strict=True)),
            [],
            self.linked,
            cleared=("answer", "contrast", "stop", "box"),
        )

    @readable
    def study(
        self,
        asked_: bool,
        model_: str | None,
        image_: str | None,
        more_images_: list[str] | None,
        prompt_: str | None,
        answer_: str | None,
        contrast_: str | None,
        generate_: bool,
        max_new_tokens_: float | None,
        stop_: str | None,
        per_step_: bool,
        methods_: list[str],
        seed_: float | None,
        scorers_: list[str],
        layer_: float | None,
        attention_layer_: float | None,
        ratios_: str,
        draws_: float | None,
        shortv_: bool,
        corruption_: str | None,
        sigma_: float | None,
        box_: str | None,
        components_: list[str],
        estimators_: list[str],
        directions_: list[str],
        trust_: bool,
        trust_superpixels_: float | None,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """Explain the image and prompt by each method, and study its visual tokens."""
        if not asked_:  # the page's load set another tab's link flag
            return [gr.skip()] * len(self.outputs)
        if not methods_ and not scorers_:
            raise gr.Error("tick a method (maps) or a scorer (the visual-token study)")
        image = _images(image_, more_images_)
        prompt = prompt_ or ""
        asked_answer = AskedAnswer(
            answer=answer_ or "",
            contrast=contrast_ or "",
            generate=bool(generate_),
            max_new_tokens=max_new_tokens_,
            stop=stop_ or "",
            per_step=bool(per_step_),
        )
        spec = asked_answer.spec()  # None: the model's next token
        seed = 0 if seed_ is None else whole(seed_)
        asked = VisualTokenRequest
        tokens = VisualTokenRequest.for_answer(
            spec if scorers_ else None,  # no scorer ticked: no study, only its link fields
            image=image,
            prompt=prompt,
            scorers=tuple(scorers_ or ()),
            layer=asked.layer if layer_ is None else whole(layer_),
            attention_layer=(
                asked.attention_layer if attention_layer_ is None else whole(attention_layer_)
            ),
            ratios=parse_ratios(ratios_),
            draws=asked.draws if draws_ is None else whole(draws_),
            shortv=bool(shortv_),
        )
        if scorers_:  # refused before any method runs
            tokens.check()
        model = (model_ or "").strip() or None  # none: the library asks for one
        where = (session(request), _TAB)
        trust = bool(trust_)
        # the trust cards' regions, read with the trust cards only (the browser sends an empty
        # box as 0: each visual token)
        superpixels = whole(trust_superpixels_) if trust and trust_superpixels_ else None
        explanations = {
            method: self.runner(
                ExplainRequest(
                    model=model,
                    image=image,
                    text=prompt,
                    method=method,
                    answer=spec,
                    seed=seed,
                    evaluate=trust,
                    evaluate_superpixels=superpixels,
                ),
                progress,
                *where,
            )
            for method in methods_ or ()
        }
        report = None
        if scorers_:
            study = VisualTokensRequest(model=model, seed=seed, study=tokens)
            report = self.runner(study, progress, *where)
        example = example_of(image) if isinstance(image, bytes) else None  # no upload travels
        fields = {
            "tab": _TAB,
            "model": model,
            "image": EXAMPLE_PREFIX + example if example else None,
            "prompt": prompt,
            **asked_answer.link_fields(),
            "methods": list(methods_ or ()),
            "seed": seed,
            "scorers": list(scorers_ or ()),
            "layer": tokens.layer,
            "attention_layer": tokens.attention_layer,
            "ratios": format_ratios(tokens.ratios),
            "draws": tokens.draws,
            "shortv": tokens.shortv,
            **_patching_link(corruption_, sigma_, box_, components_, estimators_, directions_),
            "trust": trust,
            "trust_superpixels": superpixels,
        }
        result = VisionLanguageResult(explanations, report, fields)
        return in_order(self.outputs, self._shown(result, request))

    def _shown(self, result: VisionLanguageResult, request: gr.Request) -> dict[Any, Any]:
        """What a run fills: the summary, the maps, the shares, the study, the link."""
        report = result.report
        figures = visual_tokens_figures(report) if report is not None else {}
        return {
            self.summary: _summary(result),
            self.step: gr.update(choices=_steps(result.explanations), value=_WHOLE),
            **self._maps(result, None),
            self.shares: shares_table(result.explanations),
            self.trust_cards: (
                "".join(trust_card_html(e) for e in result.explanations.values())
                if result.fields.get("trust")
                else ""
            ),
            **{
                plot: gr.update(value=figures.get(name), visible=name in figures)
                for name, plot in self.plots.items()
            },
            self.agreement: (
                report.study.agreement.round(4) if report is not None else pd.DataFrame()
            ),
            self.link: page_base(request) + share_query(result.fields),
            self.last: result,
        }

    def _maps(self, result: VisionLanguageResult, step: int | None) -> dict[Any, Any]:
        """Each method's map over the image (``step``: one answer step's; else the whole)."""
        return {
            plot: gr.update(
                value=map_figure(result.explanations[name], step)
                if name in result.explanations
                else None,
                visible=name in result.explanations,
            )
            for name, plot in self.maps.items()
        }

    @readable
    def patching(
        self,
        model_: str | None,
        image_: str | None,
        more_images_: list[str] | None,
        prompt_: str | None,
        answer_: str | None,
        generate_: bool,
        seed_: float | None,
        corruption_: str | None,
        sigma_: float | None,
        box_: str | None,
        other_: str | None,
        components_: list[str],
        estimators_: list[str],
        directions_: list[str],
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """Patch the model's sites between the image and its corruption (Patch)."""
        if generate_:
            raise gr.Error(
                "patching reads a given answer or the model's next token, not a generated one: "
                "untick Generate (and give the answer, or leave it empty)"
            )
        image = _images(image_, more_images_)  # the library refuses several
        seed = 0 if seed_ is None else whole(seed_)
        corruption = _corruption(corruption_ or "blurred", sigma_, box_, other_, seed)
        study = PatchRequest(
            model=(model_ or "").strip() or None,  # none: the library asks for one
            seed=seed,
            clean=prompt_ or "",
            answer=AnswerSpec(answer=answer_ or None),
            image=image,
            image_corruption=corruption,
            components=tuple(components_ or ()),
            estimators=tuple(estimators_ or ()),
            directions=tuple(directions_ or ()),
        )
        report: PatchingReport = self.runner(study, progress, session(request), _PATCH_TAB)
        figures = patching_figures(report)
        lines = agreement_reading(report)
        reading = "".join(f"\n- {escaped(line)}" for line in lines)
        views: dict[Any, Any] = {
            self.patch_summary: patching_summary(report) + ("\n" + reading if lines else ""),
            self.patch_agreement: report.agreement.round(4),
            **{
                plot: gr.update(value=figures.get(name), visible=name in figures)
                for name, plot in self.patch_plots.items()
            },
            self.patched: report,
        }
        return in_order(self.patch_outputs, views)

    @readable
    def view(self, result: VisionLanguageResult | None, step_: str | None) -> list[Any]:
        # no docstring: Gradio would show it as the API's description of the call
        if result is None:
            return [gr.skip()] * len(self.maps)
        step = None if step_ in (None, "", _WHOLE) else int(str(step_))
        return list(self._maps(result, step).values())

    @readable
    def download(self, result: VisionLanguageResult | None, patched: PatchingReport | None) -> str:
        # no docstring: Gradio would show it as the API's description of the call
        if result is None:
            raise gr.Error("run the tab first; the export holds its maps and study")
        return str(export_vision_language(result, patched=patched))


def _images(first: str | None, more: list[str] | None) -> bytes | list[bytes]:
    """
    The tab's image's bytes, or every image's in order when more are uploaded.

    Raises:
        gr.Error: no first image, or an upload gone.
        InvalidInputError: a file this process did not receive.
    """
    image = uploaded_image(first)
    return [image, *(uploaded_image(path) for path in more)] if more else image


def _corruption(
    kind: str, sigma: float | None, box: str | None, other: str | None, seed: int
) -> ImageCorruption:
    """
    The corruption the fields ask for (the library checks its sigma and box).

    Raises:
        InvalidParameterError: an unknown kind, or a box that is not four numbers.
        gr.Error: another image asked for and none uploaded.
    """
    if kind not in IMAGE_CORRUPTIONS:
        raise InvalidParameterError(f"the corrupted image is one of {', '.join(IMAGE_CORRUPTIONS)}")
    if kind == "another image":
        if not other:
            raise gr.Error("upload the other image first (under Corrupted image)")
        return OtherImage(uploaded_image(other))
    if kind == "masked":
        return Masked(parse_box(box))
    amount = 0.0 if sigma is None else float(sigma)
    return Blurred(amount) if kind == "blurred" else Noised(amount, seed)


def _patching_link(
    kind: str | None,
    sigma: float | None,
    box: str | None,
    components: list[str],
    estimators: list[str],
    directions: list[str],
) -> dict[str, Any]:
    """
    The patching section's link fields, as they stand: its corruption and its sigma or box.

    A box that is not four numbers is left out (the section refuses it when Patch is pressed).
    """
    fields: dict[str, Any] = {"corruption": kind}
    if kind in ("blurred", "noised") and sigma is not None:
        fields["sigma"] = float(sigma)
    if kind == "masked":
        with contextlib.suppress(InvalidParameterError):  # not the run's input: left out
            fields["box"] = format_box(parse_box(box))
    lists = {"components": components, "estimators": estimators, "directions": directions}
    return fields | {name: list(chosen or ()) for name, chosen in lists.items()}


def map_figure(explanation: Explanation, step: int | None) -> Any:
    """One method's map over its image or a panel per image (the whole answer's, or a step's)."""
    # an image and a prompt's Explanation holds its image, or its images for several
    pictures = explanation.images or explanation.image
    if pictures is None:
        raise ValueError(f"{explanation.method}'s map holds no image to draw it over")
    if "steps" not in explanation.maps:
        step = None  # a method that gives no map per step shows its whole map
    return image_text_figure(explanation, pictures, step=step)


def _steps(explanations: dict[str, Explanation]) -> list[tuple[str, str]]:
    """The step dropdown's choices: the whole answer, then each step of the first layout."""
    choices = [("whole answer", _WHOLE)]
    for explanation in explanations.values():
        layout = answer_layout(explanation)
        if layout is not None and "steps" in explanation.maps:
            labels = [s.label for s in layout.steps]
            return choices + [
                (f"step {k + 1}: {label!r}", str(k)) for k, label in enumerate(labels)
            ]
    return choices


def shares_table(explanations: dict[str, Explanation]) -> pd.DataFrame:
    """
    Each method's image and text shares: the whole answer's, then each step's.

    With several images, each image's share beside the images' (``image 1 share``, ...).
    """
    count = max((len(image_heatmaps(e.maps)) for e in explanations.values()), default=1)
    each = [(f"image_{n}", f"image {n} share") for n in range(1, count + 1)] if count > 1 else []
    # each part's key in the metrics (``{key}_share``) and the step maps, and its column
    parts = [("image", "image share"), *each, ("text", "text share")]
    rows = []
    for method, explanation in explanations.items():
        maps, metrics = explanation.maps, explanation.metrics
        rows.append(
            {"method": method, "step": "whole answer"}
            | {column: metrics.get(f"{key}_share") for key, column in parts}
        )
        for k in range(len(maps.get("step_image_share", ()))):
            rows.append(
                {"method": method, "step": str(k + 1)}
                | {column: maps[f"step_{key}_share"][k] for key, column in parts}
            )
    columns = ["method", "step", *(column for _, column in parts)]
    return pd.DataFrame(rows, columns=columns).round(4)


def _summary(result: VisionLanguageResult) -> str:
    """What was explained, each method's shares, the study's full model and verdicts."""
    lines = []
    nan = float("nan")
    for method, explanation in result.explanations.items():
        metrics = explanation.metrics
        count = len(image_heatmaps(explanation.maps))
        share = f"{metrics.get('image_share', nan):.0%}"
        each = ", ".join(
            f"{n}: {metrics.get(f'image_{n}_share', nan):.0%}" for n in range(1, count + 1)
        )
        image = f"images {share} ({each})" if count > 1 else f"image {share}"
        lines.append(
            f"- **{method}** → {escaped(explanation.target.label)}: {image}, text "
            f"{metrics.get('text_share', nan):.0%} of |relevance|"
        )
    text = "Maps:\n" + "\n".join(lines) if lines else "No method ticked: no maps."
    report = result.report
    if report is None:
        return text + "\n\nNo scorer ticked: no visual-token study."
    study = report.study
    how = answer_origin(report)
    said = escaped(repr(report.answer["text"]))
    text += (
        f"\n\nVisual tokens dropped {dropped_where(report)} (answer {said}, "
        f"{how}): the full model's answer log-prob **{study.full['log_prob']:.4g}**, exact "
        f"match {study.full['exact_match']:.3g}; {study.forward_passes:,} forward passes. "
        "Each scorer's curve against random orders:"
    )
    text += "".join(f"\n- {escaped(v.summary())}" for v in study.curves.verdicts)
    text += "".join(
        f"\n- {escaped(name)}: not for this model ({escaped(why)})"
        for name, why in study.not_applicable.items()
    )
    return text


def export_vision_language(
    result: VisionLanguageResult, png: bool = True, patched: PatchingReport | None = None
) -> Path:
    """
    The run as a zip: each method's Explanation and map, the study's data and figures.

    The manifest's ``extra.inputs`` are the fields a link carries. With ``patched`` (the
    patching study run beside it) its figures and its report and tables too.
    """
    report = result.report
    figures = {
        f"{method}_image_and_text": map_figure(explanation, None)
        for method, explanation in result.explanations.items()
    }
    data: dict[str, str] = {}
    if report is not None:
        figures.update(visual_tokens_figures(report))
        data.update(visual_tokens_files(report))
    if patched is not None:
        figures.update(patching_figures(patched))
        data.update(patching_files(patched))
    fields = result.fields
    return write_bundle(
        result.explanations,
        figures,
        page_folder("export") / "attrlab-vision-language",
        extra={"inputs": fields},
        png=png,
        input_label=f"an image and the prompt {fields.get('prompt', '')!r}"[:300],
        data=data,
        model=fields.get("model"),
    )
