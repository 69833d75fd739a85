"""
Bits per part on the Layers & heads tab, below the pruning curves: what quantising each costs.

The part kinds, widths and defaults offered are the library's (:mod:`attribution.bits`); a run
goes through the page's runner as a :class:`~attribution.request.BitsRequest`, so it is priced
by the library's gate before any weight is quantised and refused over the server's budget as
``POST /api/v1/bits`` is. It shows the figures of :func:`viz.bits.bits_figures` (the sensitivity
heatmap, the proxies' agreement, the allocation curves with the random band), the agreement
table and the verdicts in words, an export (figures, JSON and CSV) and a link that reopens the
section with the run's inputs and runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from attrlab.app.ui.files import page_folder
from attrlab.app.ui.link import LinkedTab, page_base, share_query
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import (
    BIT_CHOICES,
    GROUP_CHOICES,
    escaped,
    format_budgets,
    in_order,
    parse_budgets,
    readable,
    session,
    study_buttons,
    study_export_row,
    wire_study,
)
from attrlab.attribution.bits import DEFAULT_KINDS, PART_KINDS
from attrlab.attribution.request import MAX_ORDERS, BitsRequest
from attrlab.viz.bits import bits_figures, bits_files
from attrlab.viz.bundle import write_bundle

if TYPE_CHECKING:
    from attrlab.attribution.bits import BitsStudy

__all__ = ["BitsResult", "BitsSection", "export_bits"]

#: The tab key of a run (its Cancel stops only its own study).
_TAB = "bits"
#: The figures shown, by role: the first scheme's heatmap (the page asks one group size).
_ROLES = ("sensitivity", "agreement", "allocation")


@dataclass(frozen=True)
class BitsResult:
    """A study shown on the page and the fields that asked for it (a link's)."""

    study: BitsStudy
    fields: dict[str, Any]


class BitsSection:
    """
    The bits section: its components, and its handlers as methods.

    Made inside the patching view, whose model it reads; the last study is in :attr:`last`.
    """

    def __init__(self, runner: PageRunner, model: gr.Dropdown) -> None:
        self.runner = runner
        self.model = model
        self.last = gr.State(None)  # BitsResult
        self.linked = gr.State(False)  # a shared link filled the section: run it once loaded
        self.asked = gr.State(True)  # Quantise always runs
        gr.Markdown(
            "**Bits per part** (a decoder LM, or a text classifier typed in the model box). "
            "Quantise each part alone, weight-only, and measure the next-token loss (a "
            "classifier: the KL from the unquantised model) over a text set; score the parts "
            "by cheap proxies and see which agree; give each proxy's bit allocation under an "
            "average budget, beside uniform bits and random allocations."
        )
        self._choices()
        self.run, self.cancel = study_buttons("bits", "Quantise")
        self.summary = gr.Markdown("", elem_id="bits-summary")
        self.agreement = gr.Dataframe(
            interactive=False,
            label="Each proxy's rank agreement with the measured sensitivity",
            elem_id="bits-agreement",
            wrap=True,
        )
        self.plots = {
            role: gr.Plot(visible=False, show_label=False, elem_id=f"bits-{role}-plot")
            for role in _ROLES
        }
        self.export, self.bundle, self.link = study_export_row("bits", "bits run")
        #: What a study reads, in :meth:`study`'s order.
        self.fields = [model, self.texts, self.kinds, self.widths, self.group_size]
        self.fields += [self.budgets, self.draws]
        #: What a study fills, in its order.
        self.outputs = [self.summary, self.agreement, *self.plots.values(), self.link, self.last]
        self._wire()

    def _choices(self) -> None:
        """The texts; the part kinds, widths, group size, budgets and random allocations."""
        with gr.Row(equal_height=False):
            self.texts = gr.Textbox(
                "",
                label="Texts, one per line (empty: the bundled set: paragraphs for a decoder "
                "LM, sentences for a classifier)",
                lines=3,
                elem_id="bits-texts",
            )
            with gr.Column(scale=0, min_width=260):
                self.kinds = gr.CheckboxGroup(
                    list(PART_KINDS), value=list(DEFAULT_KINDS), label="Parts", elem_id="bits-kinds"
                )
                self.widths = gr.CheckboxGroup(
                    list(BIT_CHOICES),
                    value=[str(b) for b in BitsRequest.bits],
                    label="Bit widths",
                    elem_id="bits-widths",
                )
        with gr.Row():
            self.group_size = gr.Dropdown(
                list(GROUP_CHOICES),
                value=str(BitsRequest.group_sizes[0]),
                label="Weights per group (one scale and zero point each)",
                elem_id="bits-group-size",
            )
            self.budgets = gr.Textbox(
                format_budgets(BitsRequest.budgets),
                label="Average bits per weight of the allocations (between 2 and 8)",
                elem_id="bits-budgets",
            )
            self.draws = gr.Number(
                BitsRequest.draws,
                precision=0,
                minimum=2,
                maximum=MAX_ORDERS,
                label="Random allocations (at most)",
                elem_id="bits-draws",
            )

    def _wire(self) -> None:
        wire_study(
            self.run,
            self.linked,
            self.cancel,
            self.runner.cancel_handler(_TAB),
            self.study,
            (self.asked, self.fields),
            self.outputs,
            "bits",
        )
        self.export.click(self.download, [self.last], self.bundle, api_name="bits_export")

    @property
    def linked_tab(self) -> LinkedTab:
        """What a shared link fills on this section, and the flag that runs it."""
        names = ["model", "texts", "kinds", "bits", "group_size", "budgets", "draws"]
        return LinkedTab(
            dict(zip(names, self.fields, strict=True)), [], self.linked, cleared=("texts",)
        )

    @readable
    def study(
        self,
        asked_: bool,
        model_: str,
        texts_: str,
        kinds_: list[str],
        widths_: list[str],
        group_size_: str | None,
        budgets_: str,
        draws_: float | None,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """Run the bits study (Quantise, or a shared link once it filled the section)."""
        if not asked_:  # the page's load set another tab's link flag
            return [gr.skip()] * len(self.outputs)
        lines = tuple(line.strip() for line in (texts_ or "").splitlines() if line.strip())
        group = group_size_ or str(BitsRequest.group_sizes[0])
        request_ = BitsRequest(
            model=model_,
            texts=lines or None,
            kinds=tuple(kinds_ or ()),
            bits=tuple(int(b) for b in widths_ or ()),
            group_sizes=(None if group == "channel" else int(group),),
            budgets=parse_budgets(budgets_),
            draws=BitsRequest.draws if draws_ is None else int(draws_),
        )
        study: BitsStudy = self.runner(request_, progress, session(request), _TAB)
        figures = bits_figures(study)
        fields = {
            "tab": _TAB,
            "model": model_,
            "texts": "\n".join(lines),
            "kinds": list(request_.kinds or ()),
            "bits": [str(b) for b in request_.bits],
            "group_size": group,
            "budgets": format_budgets(request_.budgets),
            "draws": request_.draws,
        }
        chosen = {
            "sensitivity": next(f for n, f in figures.items() if n.startswith("bits_sensitivity")),
            "agreement": figures["bits_agreement"],
            "allocation": figures["bits_allocation"],
        }
        views: dict[Any, Any] = {
            self.summary: _summary(study),
            self.agreement: study.agreement.round(4),
            **{
                plot: gr.update(value=chosen[role], visible=True)
                for role, plot in self.plots.items()
            },
            self.link: page_base(request) + share_query(fields),
            self.last: BitsResult(study, fields),
        }
        return in_order(self.outputs, views)

    @readable
    def download(self, result: BitsResult | None) -> str:
        # no docstring: Gradio would show it as the API's description of the call
        if result is None:
            raise gr.Error("run a bits study first; the export holds it")
        return str(export_bits(result))


def _summary(study: BitsStudy) -> str:
    """The unquantised model, what the run cost, each proxy's verdicts, the warnings."""
    base = f"loss **{study.base_loss:.4g}**, " if study.measure == "loss" else ""
    text = (
        f"Unquantised: {base}mean target log-prob {study.base_log_prob:.4g} over "
        f"{study.texts} texts ({study.tokens:,} predictions). {study.entries} table entries, "
        f"{study.forward_passes:,} forward passes, {study.backward_passes:,} backward. "
        f"Sensitivity: {'the loss change' if study.measure == 'loss' else 'the KL'}."
    )
    verdicts = "".join(f"\n- {escaped(v.summary())}" for v in study.verdicts.values())
    warnings = "".join(f"\n\n⚠ {escaped(w)}" for w in study.warnings)
    return text + ("\n\nEach proxy's allocation against random ones:" + verdicts) + warnings


def export_bits(result: BitsResult, png: bool = True) -> Path:
    """
    The study as a zip: its JSON, its tables as CSV, every figure as HTML (and PNG).

    The manifest's ``extra.inputs`` are the fields a link carries.
    """
    study = result.study
    texts = result.fields.get("texts") or "the bundled texts"
    return write_bundle(
        {},
        bits_figures(study),
        page_folder("export") / "attrlab-bits",
        extra={"inputs": result.fields},
        png=png,
        input_label=f"{study.texts} texts: {texts}"[:300],
        data=bits_files(study),
        model=study.model,
    )
