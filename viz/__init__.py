"""Rendering of Explanation objects and layer tables: Plotly figures, overlays, highlights."""

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

__all__ = [
    "agreement_figure",
    "export_figure",
    "head_heatmap",
    "heatmap_overlay",
    "image_figure",
    "layer_lines",
    "positional_figure",
    "token_figure",
    "token_highlights",
    "top_heads_figure",
]
