"""
Activation patching on the Layers & heads tab: which layers, positions and heads carry a change.

A clean prompt and its corruption (a prompt of as many tokens, or noise on chosen positions:
causal tracing), an answer and a contrast; the components, estimators and directions offered
are the library's own (:mod:`attribution.patching`). A run goes through the page's runner
(progress, Cancel, the server's pass budget) and shows the figures of :mod:`viz.patching`, the
estimators' agreement with exact patching and its reading in words, an export and a link.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from attrlab.app.ui.bits import BitsSection
from attrlab.app.ui.files import page_folder
from attrlab.app.ui.link import LinkedTab, page_base, share_query
from attrlab.app.ui.pruning import PruningSection
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import (
    IOI_CORRUPTED,
    IOI_PROMPT,
    in_order,
    parse_positions,
    readable,
    session,
    study_export_row,
    wire_study,
)
from attrlab.attribution.models import BUILTIN_MODELS, default_model
from attrlab.attribution.patching import COMPONENTS, DIRECTIONS, ESTIMATORS, agreement_reading
from attrlab.attribution.patching.problem import MAX_SEEDS
from attrlab.attribution.request import PatchRequest
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.viz.bundle import write_bundle
from attrlab.viz.patching import (
    patching_figure_names,
    patching_figures,
    patching_files,
    pruning_figures,
    pruning_files,
)

if TYPE_CHECKING:
    from attrlab.attribution.engine.study import PruningStudy
    from attrlab.attribution.patching import PatchingReport

__all__ = [
    "PatchingResult",
    "PatchingView",
    "export_patching",
    "patching_choices",
    "patching_summary",
    "patching_view",
]

#: The tab key of a run (its Cancel stops only its own view's study; pruning has its own).
_TAB = "patching"


@dataclass(frozen=True)
class PatchingResult:
    """A study shown on the page: its report and the fields that asked for it (a link's)."""

    report: PatchingReport
    fields: dict[str, Any]


def patching_view(runner: PageRunner) -> dict[str, LinkedTab]:
    """
    Build the patching view; every study goes through ``runner``.

    Returns what a link fills, by the link's tab: the patching study's, the pruning run's and
    the bits run's.
    """
    view = PatchingView(runner)
    return {
        _TAB: view.linked_tab,
        "pruning": view.pruning.linked_tab,
        "bits": view.bits.linked_tab,
    }


class PatchingView:
    """
    The patching view: its components, and its handlers as methods.

    Made inside a ``gr.Tab``; the components are laid out and wired when it is made. The last
    study stays in the session (``last``), the last pruning study beside it (``pruned``).
    """

    def __init__(self, runner: PageRunner) -> None:
        self.runner = runner
        self.last = gr.State(None)  # PatchingResult
        self.linked = gr.State(False)  # a shared link filled the view: run it once loaded
        self.asked = gr.State(True)  # Run always runs
        gr.Markdown(
            "Patch one component at a time between a clean prompt and its corruption, and read "
            "how far each moves the answer's score from the corrupted run's (0) to the clean "
            "one's (1). The cheap estimators are scored against exact patching."
        )
        self._question()
        self._results()
        self.pruning = PruningSection(
            runner, self.model, self.clean, self.corrupted, self.answer, self.contrast
        )
        self.pruned = self.pruning.last
        self._export_row()
        self.bits = BitsSection(runner, self.model)
        #: What a study reads, in :meth:`study`'s order.
        self.fields = [self.model, self.clean, self.corrupted, self.noise, self.seeds]
        self.fields += [self.answer, self.contrast, self.components, self.estimators]
        self.fields += [self.directions]
        #: What a study fills, in its order.
        self.outputs = [self.summary, self.reading, self.agreement, *self.plots.values()]
        self.outputs += [self.link, self.last]
        self._wire()

    # --- layout ---------------------------------------------------------------------------

    def _question(self) -> None:
        """The model, the prompts or the noise, the answer, what to patch and how; Run."""
        models = [name for name, m in BUILTIN_MODELS.items() if m.next_token]
        with gr.Row(equal_height=False):
            with gr.Column(scale=2):
                self.model = gr.Dropdown(
                    models,
                    value=default_model("text", next_token=True),
                    label="Model (a decoder LM)",
                    allow_custom_value=True,
                    elem_id="patching-model",
                )
                self.clean = gr.Textbox(
                    IOI_PROMPT, label="Clean prompt", lines=2, elem_id="patching-clean"
                )
                self.corrupted = gr.Textbox(
                    IOI_CORRUPTED,
                    label="Corrupted prompt (as many tokens as the clean one)",
                    lines=2,
                    elem_id="patching-corrupted",
                )
                with gr.Row():
                    self.noise = gr.Textbox(
                        "",
                        label="…or noise on these clean token positions (causal tracing)",
                        placeholder="3,4",
                        elem_id="patching-noise",
                    )
                    self.seeds = gr.Number(
                        PatchRequest.noise_seeds,  # the library's default number of draws
                        precision=0,
                        minimum=1,
                        maximum=MAX_SEEDS,
                        label="Noise draws",
                        elem_id="patching-seeds",
                    )
                with gr.Row():
                    self.answer = gr.Textbox(
                        " Mary", label="Answer (empty: the next token)", elem_id="patching-answer"
                    )
                    self.contrast = gr.Textbox(
                        " John", label="Rather than", elem_id="patching-contrast"
                    )
            with gr.Column(scale=1):
                self._choices()
        with gr.Row():
            self.run = gr.Button("Patch", variant="primary", elem_id="patching-run")
            self.cancel = gr.Button("Cancel", variant="stop", elem_id="patching-cancel")

    def _choices(self) -> None:
        """The components, estimators and directions: the library's own."""
        self.components, self.estimators, self.directions = patching_choices("patching")

    def _results(self) -> None:
        """The study's summary, its reading in words, the agreement table and the figures."""
        self.summary = gr.Markdown("", elem_id="patching-summary")
        self.reading = gr.Markdown("", elem_id="patching-reading")
        self.agreement = gr.Dataframe(
            interactive=False,
            label="Each estimator against exact patching",
            elem_id="patching-agreement",
            wrap=True,
        )
        self.plots = {
            name: gr.Plot(
                visible=False, elem_id="patching-" + name.replace("_", "-"), show_label=False
            )
            for name in patching_figure_names()
        }

    def _export_row(self) -> None:
        self.export, self.bundle, self.link = study_export_row("patching", "study")

    # --- wiring ---------------------------------------------------------------------------

    def _wire(self) -> None:
        wire_study(
            self.run,
            self.linked,
            self.cancel,
            self.runner.cancel_handler(_TAB),
            self.study,
            (self.asked, self.fields),
            self.outputs,
            "patching",
        )
        self.export.click(
            self.download, [self.last, self.pruned], self.bundle, api_name="patching_export"
        )

    @property
    def linked_tab(self) -> LinkedTab:
        """What a shared link fills on this view, and the flag that runs it."""
        return LinkedTab(
            {
                "model": self.model,
                "text": self.clean,
                "corrupted": self.corrupted,
                "noise_positions": self.noise,
                "noise_seeds": self.seeds,
                "answer": self.answer,
                "contrast": self.contrast,
                "components": self.components,
                "estimators": self.estimators,
                "directions": self.directions,
            },
            [],
            self.linked,
        )

    # --- handlers -------------------------------------------------------------------------

    @readable
    def study(
        self,
        asked_: bool,
        model_: str,
        clean_: str,
        corrupted_: str,
        noise_: str,
        seeds_: float | None,
        answer_: str,
        contrast_: str,
        components_: list[str],
        estimators_: list[str],
        directions_: list[str],
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """Run the study (Patch, or a shared link once it filled the view) and show it."""
        if not asked_:  # the page's load set another tab's link flag
            return [gr.skip()] * len(self.outputs)
        positions = parse_positions(noise_)
        request_ = PatchRequest(
            model=model_,
            clean=clean_ or "",
            corrupted=corrupted_ or None,  # with noise too: refused in words
            noise_positions=positions,
            noise_seeds=PatchRequest.noise_seeds if seeds_ is None else int(seeds_),
            answer=AnswerSpec.from_json({"answer": answer_ or None, "contrast": contrast_ or None}),
            components=tuple(components_ or ()),
            estimators=tuple(estimators_ or ()),
            directions=tuple(directions_ or ()),
        )
        report: PatchingReport = self.runner(request_, progress, session(request), _TAB)
        figures = patching_figures(report)
        fields = {
            "tab": _TAB,
            "model": model_,
            "text": clean_,
            "corrupted": request_.corrupted or "",
            "noise_positions": ",".join(map(str, positions or ())),
            "noise_seeds": request_.noise_seeds if positions else None,
            "answer": answer_ or "",
            "contrast": contrast_ or "",
            "components": list(components_),
            "estimators": list(estimators_),
            "directions": list(directions_),
        }
        lines = agreement_reading(report)
        views: dict[gr.components.Component, Any] = {
            self.summary: patching_summary(report),
            self.reading: "\n".join(f"- {line}" for line in lines) if lines else "",
            self.agreement: report.agreement.round(4),
            **{
                plot: gr.update(value=figures[name], visible=True)
                if name in figures
                else gr.update(value=None, visible=False)
                for name, plot in self.plots.items()
            },
            self.link: page_base(request) + share_query(fields),
            self.last: PatchingResult(report, fields),
        }
        return in_order(self.outputs, views)

    @readable
    def download(self, result: PatchingResult | None, pruned: PruningStudy | None) -> str:
        # no docstring: Gradio would show it as the API's description of the call
        if result is None:
            raise gr.Error("run a study first; the export holds its report")
        return str(export_patching(result, pruned=pruned))


def patching_choices(prefix: str) -> tuple[gr.CheckboxGroup, gr.CheckboxGroup, gr.CheckboxGroup]:
    """
    A patching study's components, estimators and directions: the library's own.

    Every estimator and direction ticked, every component but a head at each position (the
    costliest by far: asked for, not a default); ids ``{prefix}-components`` and so on.
    """
    components = gr.CheckboxGroup(
        [(f"{c.name}: {c.description}", c.name) for c in COMPONENTS.values()],
        value=[c.name for c in COMPONENTS.values() if not (c.per_head and c.per_position)],
        label="Components",
        elem_id=f"{prefix}-components",
    )
    estimators = gr.CheckboxGroup(
        [(f"{e.title}: {e.cost}", e.name) for e in ESTIMATORS.values()],
        value=list(ESTIMATORS),
        label="Estimators (exact patching is the reference)",
        elem_id=f"{prefix}-estimators",
    )
    directions = gr.CheckboxGroup(
        list(DIRECTIONS),
        value=list(DIRECTIONS),
        label="Directions (denoising: clean into corrupted; noising: the reverse)",
        elem_id=f"{prefix}-directions",
    )
    return components, estimators, directions


def patching_summary(report: PatchingReport) -> str:
    """The scores patching moves between, what it cost, and the library's warnings."""
    gap = report.clean_score - report.corrupted_score
    target = html.escape(report.target, quote=False)
    text = (
        f"Target **{target}**: score {report.clean_score:.4g} on the clean prompt, "
        f"{report.corrupted_score:.4g} corrupted (gap {gap:.4g}); "
        f"{report.forward_passes:,} forward rows, {report.backward_passes:,} backward passes."
    )
    return text + "".join(f"\n\n⚠ {html.escape(w, quote=False)}" for w in report.warnings)


def export_patching(
    result: PatchingResult, png: bool = True, pruned: PruningStudy | None = None
) -> Path:
    """
    The study as a zip: its report JSON, its tables as CSV, every figure as HTML (and PNG).

    The manifest's ``extra.inputs`` are the fields a link carries. With ``pruned`` (the
    pruning study run beside it) its curves' figures and its JSON and tables too.
    """
    fields = result.fields
    shown = fields.get("corrupted") or f"noise on positions {fields.get('noise_positions')}"
    figures = patching_figures(result.report)
    data = patching_files(result.report)
    if pruned is not None:
        figures |= pruning_figures(pruned)
        data |= pruning_files(pruned)
    return write_bundle(
        {},
        figures,
        page_folder("export") / "attrlab-patching",
        extra={"inputs": fields},
        png=png,
        input_label=f"clean: {fields.get('text')!s}; corrupted: {shown}",
        data=data,
        model=str(fields.get("model")),
    )
