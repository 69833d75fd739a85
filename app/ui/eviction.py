"""
The KV cache tab, beside the Language model tab: which cached entries a decoder can forget.

The tasks, scorers, units, splits and defaults offered are the library's
(:mod:`attribution.eviction`); a run goes through the page's runner as an
:class:`~attribution.request.EvictRequest`, so it is priced by the library's gate before any
prefill and refused over the server's budget as ``POST /api/v1/evict`` is. It shows the curves
of :func:`viz.eviction.eviction_figures` (each scorer beside the random evictions' band), the
agreement table, the verdicts in words, one item's prompt coloured by a scorer's scores and by
the share of each token's entries kept at a keep ratio chosen with a slider (drawn again from
the study, never rerun), an export and a link that reopens the tab with the run's inputs and
runs it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from attrlab.app.ui.files import page_folder
from attrlab.app.ui.link import LinkedTab, page_base, share_query
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import (
    escaped,
    format_ratios,
    in_order,
    parse_ratios,
    readable,
    session,
    study_buttons,
    study_export_row,
    wire_study,
)
from attrlab.attribution.eviction import parse_tasks
from attrlab.attribution.eviction.request import (
    MAX_ITEMS,
    TASK_KINDS,
    TASK_SIZES,
    EvictionRequest,
)
from attrlab.attribution.eviction.scorers import SCORERS
from attrlab.attribution.eviction.study import EVICTION_UNITS, SPLITS
from attrlab.attribution.models import BUILTIN_MODELS, default_model
from attrlab.attribution.request import MAX_ORDERS, EvictRequest
from attrlab.viz.bundle import write_bundle
from attrlab.viz.eviction import (
    eviction_figures,
    eviction_files,
    kept_html,
    scores_html,
    verdict_lines,
)

if TYPE_CHECKING:
    from attrlab.attribution.eviction.study import EvictionStudy

__all__ = [
    "EvictionResult",
    "EvictionTab",
    "eviction_tab",
    "export_eviction",
    "item_html",
]

#: The tab key of a run (its Cancel stops only its own study) and of its links.
_TAB = "evict"
#: The figures shown, by their names in :func:`viz.eviction.eviction_figures`.
_FIGURES = ("eviction_log_prob", "eviction_exact_match", "eviction_kl", "eviction_agreement")


@dataclass(frozen=True)
class EvictionResult:
    """A study shown on the page and the fields that asked for it (a link's)."""

    study: EvictionStudy
    fields: dict[str, Any]


def eviction_tab(runner: PageRunner) -> LinkedTab:
    """Build the tab inside a ``gr.Tab``; what a shared link fills on it."""
    return EvictionTab(runner).linked_tab


class EvictionTab:
    """The KV cache tab: its components, and its handlers as methods."""

    def __init__(self, runner: PageRunner) -> None:
        self.runner = runner
        self.last = gr.State(None)  # EvictionResult
        self.linked = gr.State(False)  # a shared link filled the tab: run it once loaded
        self.asked = gr.State(True)  # Evict always runs
        gr.Markdown(
            "**Which cached entries can a decoder forget?** Prefill each task's prompt once, "
            "evict the key/value-cache entries each scorer ranks lowest at each keep ratio, and "
            "measure the answer (its log-probability, greedy exact match, KL from the full "
            "cache) beside random evictions; each scorer is also ranked against evicting each "
            "token alone. Scorers that know the answer are oracles, not deployable policies."
        )
        self._choices()
        self.run, self.cancel = study_buttons("evict", "Evict")
        self.summary = gr.Markdown("", elem_id="evict-summary")
        self._item_view()
        self.plots = {
            name: gr.Plot(visible=False, show_label=False, elem_id=f"{name}-plot")
            for name in _FIGURES
        }
        self.agreement = gr.Dataframe(
            interactive=False,
            label="Each scorer's agreement with evicting each token alone",
            elem_id="evict-agreement",
            wrap=True,
        )
        self.export, self.bundle, self.link = study_export_row("evict", "eviction run")
        #: What a study reads, in :meth:`study`'s order.
        self.fields = [self.model, self.task, self.count, self.max_tokens, self.seed, self.tasks]
        self.fields += [self.scorers, self.unit, self.split, self.ratios, self.draws]
        self.fields += [self.all_items]
        #: What a study fills, in its order.
        self.outputs = [self.summary, self.agreement, *self.plots.values(), self.item]
        self.outputs += [self.scorer, self.ratio, self.prompt, self.link, self.last]
        self._wire()

    def _choices(self) -> None:
        """The model and the tasks (generated or pasted); the scorers."""
        asked = EvictionRequest
        with gr.Row(equal_height=False):
            with gr.Column(scale=2):
                self.model = gr.Dropdown(
                    [name for name, m in BUILTIN_MODELS.items() if m.next_token],
                    value=default_model("text", next_token=True),
                    label="Model (a decoder LM)",
                    allow_custom_value=True,
                    elem_id="evict-model",
                )
                with gr.Row():
                    self.task = gr.Dropdown(
                        list(TASK_KINDS), value=asked.task, label="Task", elem_id="evict-task"
                    )
                    self.count = gr.Number(
                        asked.count,
                        precision=0,
                        minimum=1,
                        maximum=MAX_ITEMS,
                        label="Tasks",
                        elem_id="evict-count",
                    )
                    self.max_tokens = gr.Number(
                        asked.max_tokens,
                        precision=0,
                        minimum=TASK_SIZES[0],
                        maximum=TASK_SIZES[1],
                        label="Tokens each",
                        elem_id="evict-max-tokens",
                    )
                    self.seed = gr.Number(
                        asked.seed, precision=0, minimum=0, label="Seed", elem_id="evict-seed"
                    )
                self.tasks = gr.Textbox(
                    "",
                    label='Or your tasks: JSON Lines, one {"context", "question", "answer"} a '
                    "line (given: the task above is not made)",
                    lines=3,
                    elem_id="evict-tasks",
                )
            with gr.Column(scale=1, min_width=280):
                self.scorers = gr.CheckboxGroup(
                    [(f"{n} ({s.awareness})", n) for n, s in SCORERS.items()],
                    value=list(asked.scorers or SCORERS),
                    label="Scorers",
                    elem_id="evict-scorers",
                )
        self._settings()

    def _settings(self) -> None:
        """The unit, the budget split, the keep ratios, the random draws, unsolved items."""
        asked = EvictionRequest
        with gr.Row():
            self.unit = gr.Radio(
                list(EVICTION_UNITS), value=asked.unit, label="Unit", elem_id="evict-unit"
            )
            self.split = gr.Radio(
                list(SPLITS), value=asked.split, label="Budget split", elem_id="evict-split"
            )
            self.ratios = gr.Textbox(
                format_ratios(asked.ratios),
                label="Keep ratios (1 first, falling)",
                elem_id="evict-ratios",
            )
            self.draws = gr.Number(
                asked.draws,
                precision=0,
                minimum=2,
                maximum=MAX_ORDERS,
                label="Random evictions (at most)",
                elem_id="evict-draws",
            )
            self.all_items = gr.Checkbox(
                not asked.solved_only,
                label="Judge the items the full cache does not answer too",
                elem_id="evict-all-items",
            )

    def _item_view(self) -> None:
        """One item's prompt by a scorer, and what it keeps at a keep ratio (a slider)."""
        with gr.Row():
            self.item = gr.Dropdown([], label="Item", elem_id="evict-item")
            self.scorer = gr.Dropdown([], label="Coloured by", elem_id="evict-scorer")
            self.ratio = gr.Slider(
                0.05, 1.0, value=0.5, step=0.05, label="Keep ratio", elem_id="evict-ratio"
            )
        self.prompt = gr.HTML("", elem_id="evict-prompt")

    def _wire(self) -> None:
        wire_study(
            self.run,
            self.linked,
            self.cancel,
            self.runner.cancel_handler(_TAB),
            self.study,
            (self.asked, self.fields),
            self.outputs,
            "evict",
        )
        chosen = [self.last, self.item, self.scorer, self.ratio]
        self.ratio.change(self.view, chosen, self.prompt, api_name="evict_view")
        for chooser in (self.item, self.scorer):
            chooser.change(self.view, chosen, self.prompt, api_visibility="private")
        self.export.click(self.download, [self.last], self.bundle, api_name="evict_export")

    @property
    def linked_tab(self) -> LinkedTab:
        """What a shared link fills on this tab, and the flag that runs it."""
        names = ["model", "task", "count", "max_tokens", "seed", "tasks", "scorers", "unit"]
        names += ["split", "ratios", "draws", "all_items"]
        return LinkedTab(
            dict(zip(names, self.fields, strict=True)), [], self.linked, cleared=("tasks",)
        )

    @readable
    def study(
        self,
        asked_: bool,
        model_: str,
        task_: str | None,
        count_: float | None,
        max_tokens_: float | None,
        seed_: float | None,
        tasks_: str | None,
        scorers_: list[str],
        unit_: str | None,
        split_: str | None,
        ratios_: str,
        draws_: float | None,
        all_items_: bool,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ):
        """Run the eviction study (Evict, or a shared link once it filled the tab)."""
        if not asked_:  # the page's load set another tab's link flag
            return [gr.skip()] * len(self.outputs)
        asked = EvictionRequest
        pasted = (tasks_ or "").strip()
        study_ = asked(
            task=task_ or asked.task,
            count=asked.count if count_ is None else int(count_),
            max_tokens=asked.max_tokens if max_tokens_ is None else int(max_tokens_),
            seed=asked.seed if seed_ is None else int(seed_),
            tasks=tuple(parse_tasks(pasted, "the tasks")) if pasted else None,
            scorers=tuple(scorers_ or ()),
            unit=unit_ or asked.unit,
            split=split_ or asked.split,
            ratios=parse_ratios(ratios_),
            draws=asked.draws if draws_ is None else int(draws_),
            solved_only=not all_items_,
        )
        request_ = EvictRequest(model=model_, seed=study_.seed, study=study_)
        study: EvictionStudy = self.runner(request_, progress, session(request), _TAB)
        fields = {
            "tab": _TAB,
            "model": model_,
            "task": study_.task,
            "count": study_.count,
            "max_tokens": study_.max_tokens,
            "seed": study_.seed,
            "tasks": pasted,
            "scorers": list(study_.scorers or ()),
            "unit": study_.unit,
            "split": study_.split,
            "ratios": format_ratios(study_.ratios),
            "draws": study_.draws,
            "all_items": bool(all_items_),
        }
        return in_order(self.outputs, self._shown(EvictionResult(study, fields), request))

    def _shown(self, result: EvictionResult, request: gr.Request) -> dict[Any, Any]:
        """What a study fills: the summary, tables, figures, the first item's view, the link."""
        study = result.study
        figures = eviction_figures(study)
        items = [(f"{i + 1}: {v['label']}", str(i)) for i, v in enumerate(study.views)]
        first = next((i for i, v in enumerate(study.views) if v["judged"]), 0)
        scorers = list(study.views[first]["scores"])
        ratio = study.ratios[len(study.ratios) // 2]
        return {
            self.summary: _summary(study),
            self.agreement: study.agreement.round(4),
            **{
                plot: gr.update(value=figures.get(name), visible=name in figures)
                for name, plot in self.plots.items()
            },
            self.item: gr.update(choices=items, value=str(first)),
            self.scorer: gr.update(choices=scorers, value=scorers[0] if scorers else None),
            self.ratio: gr.update(minimum=min(study.ratios), value=ratio),
            self.prompt: item_html(study, first, scorers[0] if scorers else None, ratio),
            self.link: page_base(request) + share_query(result.fields),
            self.last: result,
        }

    @readable
    def view(
        self, result: EvictionResult | None, item_: str | None, scorer_: str | None, ratio_: float
    ) -> str:
        # no docstring: Gradio would show it as the API's description of the call
        if result is None:
            return ""
        return item_html(result.study, int(item_ or 0), scorer_, float(ratio_))

    @readable
    def download(self, result: EvictionResult | None) -> str:
        # no docstring: Gradio would show it as the API's description of the call
        if result is None:
            raise gr.Error("run an eviction study first; the export holds it")
        return str(export_eviction(result))


def item_html(study: EvictionStudy, index: int, scorer: str | None, ratio: float) -> str:
    """
    Item ``index``'s prompt coloured by ``scorer``, then what it keeps at the nearest ratio.

    Raises:
        ValueError: no such item.
    """
    if not 0 <= index < len(study.views):
        raise ValueError(f"the study has items 1 to {len(study.views)}; got {index + 1}")
    view = study.views[index]
    full = view["full"]
    heading = (
        f"<p><b>{html.escape(view['label'])}</b>: full cache answer log-prob "
        f"{full['log_prob']:.4g}, {'answered' if full['exact_match'] else 'not answered'} "
        "exactly</p>"
    )
    if scorer is None or scorer not in view["scores"]:
        return heading + (
            "<p>Not judged: the full cache does not answer it exactly (tick “Judge the items "
            "the full cache does not answer too” to score it).</p>"
        )
    nearest = min(range(len(study.ratios)), key=lambda i: abs(study.ratios[i] - ratio))
    kept_at = study.ratios[nearest]
    return (
        heading + f"<p>{html.escape(scorer)}'s score per token (red: kept first, blue: evicted "
        "first)</p>"
        + scores_html(view, scorer)
        + f"<p>Kept at keep ratio {kept_at:g} (red: every entry of the token kept, blue: "
        "every one evicted; between: a share of its layers and heads)</p>"
        + kept_html(view, scorer, nearest, kept_at)
    )


def _summary(study: EvictionStudy) -> str:
    """The full cache, the items judged, what the run cost, each scorer's verdicts."""
    text = (
        f"Full cache: answer log-prob **{study.full['log_prob']:.4g}**, exact match "
        f"{study.full['exact_match']:.3g}, over {study.items} items judged of "
        f"{len(study.views)} (contexts {', '.join(map(str, study.context))} tokens); "
        f"{study.unit}, {study.split} split; {study.forward_passes:,} forward passes."
    )
    verdicts = "".join(f"\n- {escaped(line)}" for line in verdict_lines(study))
    return text + "\n\nEach scorer's curve against random evictions:" + verdicts


def export_eviction(result: EvictionResult, png: bool = True) -> Path:
    """
    The study as a zip: its JSON, its tables as CSV, every figure as HTML (and PNG).

    The manifest's ``extra.inputs`` are the fields a link carries.
    """
    study = result.study
    fields = result.fields
    tasks = "your tasks" if fields.get("tasks") else f"{fields.get('count')} {fields.get('task')}"
    return write_bundle(
        {},
        eviction_figures(study),
        page_folder("export") / "attrlab-eviction",
        extra={"inputs": fields},
        png=png,
        input_label=f"{study.items} items judged of {tasks}"[:300],
        data=eviction_files(study),
        model=fields.get("model"),
    )
