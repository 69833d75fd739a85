"""Rendering of Explanation objects: Plotly figures, RGB overlays, token highlights."""

from viz.image import heatmap_overlay, image_figure
from viz.text import token_figure, token_highlights

__all__ = ["heatmap_overlay", "image_figure", "token_figure", "token_highlights"]
