"""
A run's results as the explain tabs keep them, and what is drawn and exported from them.

Which figures each explanation gets is :func:`viz.figures.figures_for`'s rule.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
import numpy as np

from attrlab import viz
from attrlab.app.errors import public_message
from attrlab.app.ui.files import page_folder
from attrlab.attribution.compare import MapChange, compare_explanations
from attrlab.attribution.errors import AttrlabError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.verdicts import Verdict
from attrlab.viz import (
    answer_html,
    change_figure,
    change_html,
    image_grid_figure,
    method_agreement_figure,
    randomisation_figure,
    token_columns_html,
    trust_figure,
)
from attrlab.viz.answer import answer_layout
from attrlab.viz.bundle import write_bundle
from attrlab.viz.figures import MAP
from attrlab.viz.tokens import token_probabilities
from attrlab.viz.trust import trust_card_html
from attrlab.viz.view import IMAGE_VIEW, TEXT_VIEW

if TYPE_CHECKING:
    from attrlab.viz.view import View

__all__ = [
    "Result",
    "changes",
    "comparison_view",
    "detail_choices",
    "detail_figure",
    "export_bundle",
    "input_label",
    "summary",
    "top",
    "trust_cards",
]


@dataclass
class Result:
    """What a run leaves in the session: its explanations, checks, input and inputs."""

    explanations: dict[str, Explanation]
    agreement: Any = None  # DataFrame of method pairs (two or more methods)
    randomisation: Any = None  # DataFrame (randomisation check)
    #: The image's display copy (:func:`viz.image.display_copy`): every figure draws it, and
    #: the session keeps no full-size copy.
    image: np.ndarray | None = None
    #: The image's own (height, width), as explained; the export records it.
    image_size: tuple[int, int] | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    #: Per method, the change from the previous run (an edit and compare).
    changes: dict[str, MapChange] = field(default_factory=dict)
    #: Per method, the randomisation check's verdict (with ``randomisation``).
    randomisation_verdicts: dict[str, Verdict] = field(default_factory=dict)


def detail_choices(result: Result) -> list[str]:
    """The details menu of a run: ``"method · figure"`` for every figure of every method."""
    return [
        f"{method} · {name}"
        for method, explanation in result.explanations.items()
        for name in viz.figures_for(explanation, result.image)
    ]


def detail_figure(result: Result, choice: str, view: View | None = None) -> Any:
    """The figure a details menu's ``choice`` names (an image's map in ``view``)."""
    method, _, name = choice.partition(" · ")
    figures = viz.figures_for(result.explanations[method], result.image, view)
    if name not in figures:
        raise ValueError(f"{method} has no figure {name!r}")
    return figures[name]()


def summary(result: Result) -> dict[str, Any]:
    """The raw results shown as JSON: each method's Explanation, an image's map left out."""
    kept = ["target", "target_record", "predictions", "params", "metrics", "verdicts"]
    kept += ["timings", "warnings", "seed"]
    out = {}
    for method, e in result.explanations.items():
        data = e.to_dict()
        # a text's scores are short; an image's map stays in the figure and the export
        shown = [*kept, "tokens", "token_texts", "scores"] if e.tokens is not None else kept
        out[method] = {k: data[k] for k in shown if k in data}
    return out


def _figures(result: Result, view: View | None) -> dict[str, Any]:
    """Every figure of a run, for the export (the maps in ``view``)."""
    figures: dict[str, Any] = {}
    if result.image is not None:
        figures["maps"] = image_grid_figure(
            result.explanations, result.image, view=view or IMAGE_VIEW
        )
    for choice in detail_choices(result):  # a text's scores, conservation, positional, error
        if result.image is None or not choice.endswith(f" · {MAP}"):
            figures[choice.replace(" · ", "_").replace(" ", "_")] = detail_figure(result, choice)
    if result.agreement is not None and len(result.agreement):
        figures["agreement"] = method_agreement_figure(result.agreement)
    if result.randomisation is not None and len(result.randomisation):
        figures["randomisation"] = randomisation_figure(result.randomisation)
    with suppress(ValueError):  # no faithfulness scores were asked for
        figures["trust"] = trust_figure(result.explanations)
    return figures


def _pages(result: Result, view: View | None) -> dict[str, str]:
    """The page's HTML views of a run: token columns (in ``view``), trust cards, comparison."""
    pages = {"trust_cards": trust_cards(result)}
    if result.image is None:
        pages["maps"] = token_columns_html(result.explanations, view or TEXT_VIEW)
        answers = [  # a language model's answer, marked in each method's map
            answer_html(e, view or TEXT_VIEW)
            for e in result.explanations.values()
            if answer_layout(e) is not None
        ]
        if answers:
            pages["answer"] = "".join(answers)
        if result.changes:
            pages["comparison"] = change_html(result.changes)
    return pages


def input_label(result: Result) -> str:
    """The run's input in words: its text, or its image's name and size."""
    if result.image_size is None:
        return str(result.fields.get("text") or "")
    height, width = result.image_size
    example = result.fields.get("image")  # a bundled example's link value, example:NAME
    if example:
        what = f"the bundled example {str(example).partition(':')[2]}"
    else:
        name = result.fields.get("image_name")
        what = "an uploaded image" + (f" ({name})" if name else "")
    return f"{what}, {width}×{height} px"


def trust_cards(result: Result) -> str:
    """Each method's trust card, its randomisation verdict among its own."""
    return "".join(
        trust_card_html(
            e, [result.randomisation_verdicts[m]] if m in result.randomisation_verdicts else []
        )
        for m, e in result.explanations.items()
    )


def export_bundle(
    result: Result,
    png: bool = True,
    view: View | None = None,
    pages: dict[str, str] | None = None,
) -> Path:
    """
    The run as a zip: Explanation JSON and arrays per method, figures, pages, inputs.

    ``pages``: the HTML views to include (default: the explain tabs' token columns in
    ``view``, trust cards and comparison).
    """
    folder = page_folder("export") / "attrlab-export"
    folder.mkdir()
    inputs = dict(result.fields)
    if result.image_size is not None:  # the maps in the figures are drawn on a smaller copy
        inputs["image_size"] = list(result.image_size)
    return write_bundle(
        result.explanations,
        _figures(result, view),
        folder,
        extra={"inputs": inputs},
        png=png,
        pages=_pages(result, view) if pages is None else pages,
        input_label=input_label(result),
        view=view,
    )


def changes(previous: Result, result: Result) -> dict[str, MapChange]:
    """Each method run both times: how its map and the class's probability changed."""
    common = [m for m in result.explanations if m in previous.explanations]
    if not common:
        raise gr.Error("compare runs of the same methods; this run shares none with the last")
    try:
        return {
            m: compare_explanations(previous.explanations[m], result.explanations[m])
            for m in common
        }
    except AttrlabError as err:
        raise gr.Error(public_message(str(err))) from None


def comparison_view(result: Result) -> Any:
    """The comparison shown under the maps (hidden without one)."""
    if not result.changes:
        return gr.update(value=None, visible=False)
    if result.image is not None:
        return gr.update(value=change_figure(result.changes, result.image), visible=True)
    return gr.update(value=change_html(result.changes), visible=True)


def top(explanation: Explanation) -> dict[str, float]:
    """The prediction panel: the top outputs and their probabilities."""
    return token_probabilities(explanation.predictions)
