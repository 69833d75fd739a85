"""
Rendering of Explanations, layer tables and checks: Plotly figures, overlays, highlights.

Exports are imported on first use (Plotly only where a figure is drawn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attribution.lazy import lazy_exports

if TYPE_CHECKING:
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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "heatmap_overlay": "viz.image",
        "image_figure": "viz.image",
        "agreement_figure": "viz.layers",
        "export_figure": "viz.layers",
        "head_heatmap": "viz.layers",
        "layer_lines": "viz.layers",
        "positional_figure": "viz.layers",
        "top_heads_figure": "viz.layers",
        "token_figure": "viz.text",
        "token_highlights": "viz.text",
        "method_agreement_figure": "viz.trust",
        "randomisation_figure": "viz.trust",
    },
)
