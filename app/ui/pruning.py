"""
Pruning curves on the Layers & heads tab, beside the patching study: what the model can lose.

The units (the library's kinds: layers, heads, neurons, channels, experts), the sparsity, the
per-layer allocation and the removal offered are the library's own
(:mod:`attribution.engine`); a run goes through the page's runner (progress, Cancel, the
server's pass budget) and shows the study's areas and verdicts in words and the figures of
:func:`viz.patching.pruning_figures` for the kinds that have them: the curves, the allocated
curves, the per-layer score maps and the agreement with exact removal, and a link that reopens
the section with the run's inputs and runs it. The last study stays in the session for the
patching view's export.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gradio as gr

from attrlab.app.ui.link import LinkedTab, page_base, share_query
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import in_order, readable, session, study_buttons, wire_study
from attrlab.attribution.engine import SPARSITIES, model_unit_kinds
from attrlab.attribution.engine.allocation import allocation_names
from attrlab.attribution.engine.choices import shared_removals
from attrlab.attribution.request import MAX_ORDERS, PruneRequest
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.viz.patching import PRUNING_FIGURE_ROLES, pruning_figure_names, pruning_figures
from attrlab.viz.table import pruning_text

if TYPE_CHECKING:
    from attrlab.attribution.engine.study import PruningStudy

__all__ = ["PruningSection"]

#: The tab key of a run (its Cancel stops only its own study).
_TAB = "pruning"
#: The removal choice that leaves each kind its default.
_DEFAULT_REMOVAL = ("each kind's default", "")


def _removal_choices(units: list[str] | None) -> list[tuple[str, str]]:
    return [_DEFAULT_REMOVAL, *((name, name) for name in shared_removals(units or ()))]


class PruningSection:
    """
    The pruning section: its components, and its handlers as methods.

    Made inside the patching view, whose model and prompts it reads; the last study is in
    :attr:`last` (a ``gr.State``).
    """

    def __init__(
        self,
        runner: PageRunner,
        model: gr.Dropdown,
        clean: gr.Textbox,
        corrupted: gr.Textbox,
        answer: gr.Textbox,
        contrast: gr.Textbox,
    ) -> None:
        self.runner = runner
        #: The patching view's model and prompts, which a study reads (and a link fills).
        self.shared = {"model": model, "text": clean, "corrupted": corrupted}
        self.shared |= {"answer": answer, "contrast": contrast}
        self.last = gr.State(None)  # PruningStudy
        self.linked = gr.State(False)  # a shared link filled the section: run it once loaded
        self.asked = gr.State(True)  # Prune always runs
        gr.Markdown(
            "**Pruning curves.** Rank the layers, heads, neurons, channels or experts on the "
            "clean prompt (the library's estimators, and exact residual patching against the "
            "corrupted prompt), remove the least important first over a small dataset, and see "
            "which ranking the model survives best, beside random removal orders (their mean "
            "and range)."
        )
        self._choices()
        self.prune, self.cancel = study_buttons("pruning", "Prune")
        self.scores = gr.Markdown("", elem_id="pruning-scores")
        self.link = gr.Textbox(
            label="Link to this pruning run", lines=2, elem_id="pruning-link", buttons=["copy"]
        )
        self.kinds = model_unit_kinds()  # read once: the page's outputs are fixed when built
        self.plots = {
            (unit, role): gr.Plot(
                visible=False,
                show_label=False,
                elem_id=f"pruning-{unit}s" + ("" if role == "curves" else f"-{role}"),
            )
            for unit in self.kinds
            for role in PRUNING_FIGURE_ROLES
        }
        #: What a study reads, in :meth:`study`'s order.
        self.fields = [model, clean, corrupted, answer, contrast, self.texts, self.units]
        self.fields += [self.draws, self.sparsity, self.allocation, self.removal, self.agreement]
        #: What a study fills, in its order.
        self.outputs = [self.scores, *self.plots.values(), self.link, self.last]
        self._wire()

    def _choices(self) -> None:
        """The texts, the units and random orders; sparsity, allocation, removal, agreement."""
        with gr.Row(equal_height=False):
            self.texts = gr.Textbox(
                "",
                label="Texts to prune over, one per line (empty: the bundled sentences)",
                lines=3,
                elem_id="pruning-texts",
            )
            with gr.Column(scale=0, min_width=220):
                self.units = gr.CheckboxGroup(
                    model_unit_kinds(), value=["layer"], label="Units", elem_id="pruning-units"
                )
                self.draws = gr.Number(
                    PruneRequest.draws,
                    precision=0,
                    minimum=1,  # the library's least and most (what a link may carry)
                    maximum=MAX_ORDERS,
                    label="Random orders",
                    elem_id="pruning-draws",
                )
        with gr.Row():
            self.sparsity = gr.Radio(
                list(SPARSITIES),
                value=PruneRequest.sparsity,
                label="Sparsity (global: the least important of all layers; per_layer: each "
                "layer its share)",
                elem_id="pruning-sparsity",
            )
            self.allocation = gr.Dropdown(
                [("none", ""), *((name, name) for name in allocation_names())],
                value="",
                label="Per-layer allocation (per_layer sparsity)",
                elem_id="pruning-allocation",
            )
            self.removal = gr.Dropdown(
                _removal_choices(["layer"]),
                value="",
                label="Removal (one the chosen units share)",
                elem_id="pruning-removal",
            )
            self.agreement = gr.Checkbox(
                False,
                label="Agreement with exact removal (each unit removed alone)",
                elem_id="pruning-agreement",
            )

    def _wire(self) -> None:
        wire_study(
            self.prune,
            self.linked,
            self.cancel,
            self.runner.cancel_handler(_TAB),
            self.study,
            (self.asked, self.fields),
            self.outputs,
            "pruning",
        )
        self.units.change(
            self.removals, [self.units, self.removal], self.removal, api_visibility="private"
        )

    @property
    def linked_tab(self) -> LinkedTab:
        """What a shared link fills on this section, and the flag that runs it."""
        fields = [self.texts, self.units, self.draws, self.sparsity, self.allocation]
        fields += [self.removal, self.agreement]
        names = ["texts", "units", "draws", "sparsity", "allocation", "removal", "agreement"]
        default_units = list(self.units.value or ())

        def removals(link: Mapping[str, Any]) -> list[tuple[str, str]]:
            return _removal_choices(link.get("units", default_units))

        return LinkedTab(
            self.shared | dict(zip(names, fields, strict=True)),
            [],
            self.linked,
            follows={"removal": removals},
            cleared=("corrupted", "answer", "contrast", "texts", "allocation", "removal"),
        )

    @staticmethod
    def removals(units_: list[str] | None, removal_: str | None = None) -> Any:
        # no docstring: Gradio would show it as the API's description of the call
        choices = _removal_choices(units_)
        kept = removal_ if removal_ in {value for _, value in choices} else ""
        return gr.update(choices=choices, value=kept)

    @readable
    def study(
        self,
        asked_: bool,
        model_: str,
        clean_: str,
        corrupted_: str,
        answer_: str,
        contrast_: str,
        texts_: str,
        units_: list[str],
        draws_: float | None,
        sparsity_: str,
        allocation_: str | None,
        removal_: str | None,
        agreement_: bool,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """Run the pruning study (Prune, or a shared link once it filled the section); show it."""
        if not asked_:  # the page's load set another tab's link flag
            return [gr.skip()] * len(self.outputs)
        lines = tuple(line.strip() for line in (texts_ or "").splitlines() if line.strip())
        request_ = PruneRequest(
            model=model_,
            text=clean_ or "",
            answer=AnswerSpec.from_json({"answer": answer_ or None, "contrast": contrast_ or None}),
            corrupted=corrupted_ or None,
            texts=lines or None,
            units=tuple(units_ or ()),
            draws=PruneRequest.draws if draws_ is None else int(draws_),
            sparsity=sparsity_ or PruneRequest.sparsity,
            allocation=allocation_ or None,
            removal=removal_ or None,
            agreement=bool(agreement_),
        )
        pruned: PruningStudy = self.runner(request_, progress, session(request), _TAB)
        figures = pruning_figures(pruned)
        fields = {
            "tab": _TAB,
            "model": model_,
            "text": clean_,
            "corrupted": request_.corrupted or "",
            "answer": answer_ or "",
            "contrast": contrast_ or "",
            "texts": "\n".join(lines),
            "units": list(request_.units or ()),
            "draws": request_.draws,
            "sparsity": request_.sparsity,
            "allocation": request_.allocation or "",
            "removal": request_.removal or "",
            "agreement": request_.agreement,
        }
        views: dict[Any, Any] = {
            self.scores: f"```\n{pruning_text(pruned)}\n```",
            self.link: page_base(request) + share_query(fields),
            self.last: pruned,
        }
        for (unit, role), plot in self.plots.items():
            name = pruning_figure_names(unit, pruned.allocation).get(role)
            views[plot] = (
                gr.update(value=figures[name], visible=True)
                if name in figures
                else gr.update(value=None, visible=False)
            )
        return in_order(self.outputs, views)
