"""
Rendering of Explanations, layer tables and checks: Plotly figures, overlays, highlights.

Exports are imported on first use (Plotly only where a figure is drawn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from viz.bundle import write_bundle
    from viz.compare import change_figure, change_html
    from viz.evaluate import leaderboard_figure
    from viz.image import heatmap_overlay, image_figure, image_grid_figure, std_error_figure
    from viz.layers import (
        ablation_figure,
        agreement_figure,
        attention_figure,
        export_figure,
        head_grid_table,
        head_heatmap,
        layer_lines,
        positional_figure,
        token_layers_figure,
        top_heads_figure,
    )
    from viz.text import (
        positional_figure_tokens,
        scale_legend_html,
        token_columns_html,
        token_figure,
        token_highlights,
    )
    from viz.trust import (
        conservation_gauge,
        method_agreement_figure,
        randomisation_figure,
        trust_card_html,
        trust_figure,
    )

__all__ = [
    "ablation_figure",
    "agreement_figure",
    "attention_figure",
    "change_figure",
    "change_html",
    "conservation_gauge",
    "export_figure",
    "head_grid_table",
    "head_heatmap",
    "heatmap_overlay",
    "image_figure",
    "image_grid_figure",
    "layer_lines",
    "leaderboard_figure",
    "method_agreement_figure",
    "positional_figure",
    "positional_figure_tokens",
    "randomisation_figure",
    "scale_legend_html",
    "std_error_figure",
    "token_columns_html",
    "token_figure",
    "token_highlights",
    "token_layers_figure",
    "top_heads_figure",
    "trust_card_html",
    "trust_figure",
    "write_bundle",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "change_figure": "viz.compare",
        "change_html": "viz.compare",
        "write_bundle": "viz.bundle",
        "leaderboard_figure": "viz.evaluate",
        "heatmap_overlay": "viz.image",
        "image_figure": "viz.image",
        "image_grid_figure": "viz.image",
        "std_error_figure": "viz.image",
        "ablation_figure": "viz.layers",
        "agreement_figure": "viz.layers",
        "attention_figure": "viz.layers",
        "export_figure": "viz.layers",
        "head_grid_table": "viz.layers",
        "head_heatmap": "viz.layers",
        "layer_lines": "viz.layers",
        "positional_figure": "viz.layers",
        "token_layers_figure": "viz.layers",
        "top_heads_figure": "viz.layers",
        "positional_figure_tokens": "viz.text",
        "scale_legend_html": "viz.text",
        "token_columns_html": "viz.text",
        "token_figure": "viz.text",
        "token_highlights": "viz.text",
        "conservation_gauge": "viz.trust",
        "method_agreement_figure": "viz.trust",
        "randomisation_figure": "viz.trust",
        "trust_card_html": "viz.trust",
        "trust_figure": "viz.trust",
    },
)
