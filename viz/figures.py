"""
Which figures a result gets, decided once: the page, its export bundle and the CLI ask here.

An attribution's figures follow what its Explanation carries (token scores or an image's map,
positional relevance, the conservation metrics, a standard error); a layer analysis's follow the
measures in its table. Each figure is drawn only when its builder is called.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.layers import HEAD_ESTIMATORS, agreement
from attrlab.attribution.methods.layers import LayerAnalysis
from attrlab.viz.answer import answer_layout, steps_figure
from attrlab.viz.image import image_figure, std_error_figure
from attrlab.viz.image_text import image_text_figure
from attrlab.viz.layers import (
    agreement_figure,
    head_heatmap,
    layer_lines,
    positional_figure,
    top_heads_figure,
)
from attrlab.viz.text import positional_figure_tokens, token_figure
from attrlab.viz.trust import conservation_figure
from attrlab.viz.view import IMAGE_VIEW, View

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "AGREEMENT",
    "CONSERVATION",
    "HEADS",
    "IMAGE_AND_TEXT",
    "LAYERS",
    "MAP",
    "POSITIONAL",
    "POSITIONAL_TOKENS",
    "SCORES",
    "STD_ERROR",
    "STEPS",
    "TOP_HEADS",
    "FigureBuilder",
    "figures_for",
    "head_measures",
    "is_layer_analysis",
]

#: Draws one figure when called.
FigureBuilder = Callable[[], "go.Figure"]

#: An attribution's figures: a text's token scores, or an image's map, and the extra views.
SCORES = "scores"
MAP = "map"
POSITIONAL_TOKENS = "token and positional relevance"
CONSERVATION = "conservation"
STD_ERROR = "standard error"
#: An image and a prompt's map: its image part over the pixels, its text part beside.
IMAGE_AND_TEXT = "image and text"
#: A decoder LM's answer run per step: the step × source matrix.
STEPS = "steps"
#: A layer analysis's figures; a heatmap per head measure is named ``HEADS + measure``.
LAYERS = "layers"
HEADS = "heads_"
POSITIONAL = "positional"
TOP_HEADS = "top_heads"
AGREEMENT = "agreement"


def figures_for(
    explanation: Explanation, image: np.ndarray | None = None, view: View | None = None
) -> dict[str, FigureBuilder]:
    """
    The figures ``explanation`` gets, by name in the order they are shown, each as its builder.

    Args:
        explanation: an attribution, or a layer analysis (the ``layers`` method's
            Explanation, whose table holds every measure).
        image: the explained image (its display copy), which an image's maps are drawn on.
        view: how an image's map is coloured (:class:`viz.view.View`; default: signed, each
            map over its 99th percentile of |score|).

    Returns:
        Name -> a builder of the figure. An image's builders raise ``ValueError`` when no
        ``image`` was given.
    """
    if is_layer_analysis(explanation) and explanation.layers is not None:
        top_k = int(explanation.params["top_k"])
        return _layer_figures(explanation.layers, top_k, explanation.target.label)
    return _attribution_figures(explanation, image, view)


def is_layer_analysis(explanation: Explanation) -> bool:
    """Whether ``explanation`` is the ``layers`` method's (its table is its result, not a map)."""
    return explanation.method == LayerAnalysis.name and explanation.layers is not None


def head_measures(table: pd.DataFrame) -> list[str]:
    """The measures of a layer table that score heads, in the table's order."""
    return list(dict.fromkeys(table.loc[table["head"].notna(), "measure"]))


def _attribution_figures(
    explanation: Explanation, image: np.ndarray | None, view: View | None
) -> dict[str, FigureBuilder]:
    def on_image(draw: Callable[[Explanation, np.ndarray], go.Figure]) -> FigureBuilder:
        def build() -> go.Figure:
            if image is None:
                raise ValueError("an image's maps are drawn on the image: none was given")
            return draw(explanation, image)

        return build

    text = explanation.tokens is not None
    figures: dict[str, FigureBuilder] = {}
    if text:
        figures[SCORES] = lambda: token_figure(explanation)
        if explanation.images:  # several images: the Explanation holds them
            figures[IMAGE_AND_TEXT] = lambda: image_text_figure(explanation, explanation.images)
        elif "image_heatmap" in explanation.maps:
            figures[IMAGE_AND_TEXT] = on_image(image_text_figure)
    else:
        figures[MAP] = on_image(functools.partial(image_figure, view=view or IMAGE_VIEW))
    if text and explanation.positional_scores is not None:
        figures[POSITIONAL_TOKENS] = lambda: positional_figure_tokens(explanation)
    if text and "steps" in explanation.maps and answer_layout(explanation) is not None:
        figures[STEPS] = lambda: steps_figure(explanation)
    if {"input_relevance", "target_logit"} <= set(explanation.metrics):
        figures[CONSERVATION] = lambda: conservation_figure(explanation)
    if not text and "std_error" in explanation.maps:
        figures[STD_ERROR] = on_image(std_error_figure)
    return figures


def _layer_figures(table: pd.DataFrame, top_k: int, target: str) -> dict[str, FigureBuilder]:
    measures = set(table["measure"])
    figures: dict[str, FigureBuilder] = {}
    if table["head"].isna().any():
        figures[LAYERS] = lambda: layer_lines(table, target=target)
    for measure in head_measures(table):
        figures[HEADS + measure] = functools.partial(head_heatmap, table, measure, target)
    if {"lrp_block", "positional_relevance"} <= measures:
        figures[POSITIONAL] = lambda: positional_figure(table)
    if set(HEAD_ESTIMATORS) & measures:
        figures[TOP_HEADS] = lambda: top_heads_figure(table, HEAD_ESTIMATORS)
        pairs = agreement(table, HEAD_ESTIMATORS, top_k)
        if not pairs.empty:
            figures[AGREEMENT] = lambda: agreement_figure(pairs)
    return figures
