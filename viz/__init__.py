"""Rendering of Explanations, layer tables and checks: Plotly figures, overlays, highlights."""

from viz.image import heatmap_overlay, image_figure
from viz.layers import (
    agreement_figure,
    export_figure,
    head_heatmap,
    layer_lines,
    positional_figure,
    top_heads_figure,
)
from viz.text import token_figure, token_highlights
from viz.trust import method_agreement_figure, randomisation_figure

__all__ = [
    "agreement_figure",
    "export_figure",
    "head_heatmap",
    "heatmap_overlay",
    "image_figure",
    "layer_lines",
    "method_agreement_figure",
    "positional_figure",
    "randomisation_figure",
    "token_figure",
    "token_highlights",
    "top_heads_figure",
]
