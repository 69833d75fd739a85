"""
Rendering of Explanations, layer tables and checks: Plotly figures, overlays, highlights.

Exports are imported on first use (Plotly only where a figure is drawn). Importing this package
registers it as the library's renderer (:mod:`attribution.rendering`): an Explanation's
``figure()`` and a notebook's display of a result are drawn here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

from attrlab.attribution.lazy import lazy_exports
from attrlab.attribution.rendering import Renderer, register_renderer

if TYPE_CHECKING:
    from attrlab.viz.answer import answer_html, step_row_html, steps_figure
    from attrlab.viz.bits import bits_figures, bits_files
    from attrlab.viz.bundle import safe_name, write_bundle, write_figures
    from attrlab.viz.compare import change_figure, change_html
    from attrlab.viz.evaluate import leaderboard_figure, leaderboard_text
    from attrlab.viz.eviction import (
        eviction_figures,
        eviction_files,
        eviction_text,
        kept_html,
        scores_html,
    )
    from attrlab.viz.figures import figures_for
    from attrlab.viz.image import (
        display_copy,
        heatmap_overlay,
        image_figure,
        image_grid_figure,
        std_error_figure,
    )
    from attrlab.viz.layers import (
        ablation_figure,
        ablation_note,
        agreement_figure,
        attention_figure,
        export_figure,
        head_heatmap,
        head_rank_table,
        layer_lines,
        measure_note,
        positional_figure,
        token_layers_figure,
        top_heads_figure,
    )
    from attrlab.viz.notebook import (
        bits_html,
        comparison_html,
        eviction_html,
        explanation_html,
        pruning_html,
        visual_tokens_html,
    )
    from attrlab.viz.patching import (
        estimator_scatter,
        patching_figures,
        patching_head_grid,
        patching_heatmaps,
        patching_image_figure,
        pruning_figure,
        pruning_figures,
    )
    from attrlab.viz.table import (
        bits_text,
        explanation_table,
        layers_text,
        patching_text,
        pruning_text,
    )
    from attrlab.viz.text import (
        positional_figure_tokens,
        scale_legend_html,
        token_columns_html,
        token_figure,
        token_highlights,
    )
    from attrlab.viz.trust import (
        conservation_figure,
        method_agreement_figure,
        randomisation_figure,
        trust_card_html,
        trust_figure,
    )
    from attrlab.viz.view import IMAGE_VIEW, TEXT_VIEW, View
    from attrlab.viz.visual_tokens import visual_tokens_figures, visual_tokens_text

__all__ = [
    "IMAGE_VIEW",
    "TEXT_VIEW",
    "View",
    "ablation_figure",
    "ablation_note",
    "agreement_figure",
    "answer_html",
    "attention_figure",
    "bits_figures",
    "bits_files",
    "bits_html",
    "bits_text",
    "change_figure",
    "change_html",
    "comparison_html",
    "conservation_figure",
    "display_copy",
    "estimator_scatter",
    "eviction_figures",
    "eviction_files",
    "eviction_html",
    "eviction_text",
    "explanation_html",
    "explanation_table",
    "export_figure",
    "figures_for",
    "head_heatmap",
    "head_rank_table",
    "heatmap_overlay",
    "image_figure",
    "image_grid_figure",
    "kept_html",
    "layer_lines",
    "layers_text",
    "leaderboard_figure",
    "leaderboard_text",
    "measure_note",
    "method_agreement_figure",
    "patching_figures",
    "patching_head_grid",
    "patching_heatmaps",
    "patching_image_figure",
    "patching_text",
    "positional_figure",
    "positional_figure_tokens",
    "pruning_figure",
    "pruning_figures",
    "pruning_html",
    "pruning_text",
    "randomisation_figure",
    "safe_name",
    "scale_legend_html",
    "scores_html",
    "std_error_figure",
    "step_row_html",
    "steps_figure",
    "token_columns_html",
    "token_figure",
    "token_highlights",
    "token_layers_figure",
    "top_heads_figure",
    "trust_card_html",
    "trust_figure",
    "visual_tokens_figures",
    "visual_tokens_html",
    "visual_tokens_text",
    "write_bundle",
    "write_figures",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "safe_name": "attrlab.viz.bundle",
        "leaderboard_text": "attrlab.viz.evaluate",
        "display_copy": "attrlab.viz.image",
        "pruning_text": "attrlab.viz.table",
        "bits_text": "attrlab.viz.table",
        "bits_figures": "attrlab.viz.bits",
        "bits_files": "attrlab.viz.bits",
        "bits_html": "attrlab.viz.notebook",
        "eviction_figures": "attrlab.viz.eviction",
        "eviction_files": "attrlab.viz.eviction",
        "eviction_text": "attrlab.viz.eviction",
        "eviction_html": "attrlab.viz.notebook",
        "kept_html": "attrlab.viz.eviction",
        "scores_html": "attrlab.viz.eviction",
        "patching_text": "attrlab.viz.table",
        "layers_text": "attrlab.viz.table",
        "explanation_table": "attrlab.viz.table",
        "answer_html": "attrlab.viz.answer",
        "step_row_html": "attrlab.viz.answer",
        "steps_figure": "attrlab.viz.answer",
        "change_figure": "attrlab.viz.compare",
        "change_html": "attrlab.viz.compare",
        "write_bundle": "attrlab.viz.bundle",
        "write_figures": "attrlab.viz.bundle",
        "leaderboard_figure": "attrlab.viz.evaluate",
        "figures_for": "attrlab.viz.figures",
        "heatmap_overlay": "attrlab.viz.image",
        "image_figure": "attrlab.viz.image",
        "image_grid_figure": "attrlab.viz.image",
        "std_error_figure": "attrlab.viz.image",
        "ablation_figure": "attrlab.viz.layers",
        "ablation_note": "attrlab.viz.layers",
        "agreement_figure": "attrlab.viz.layers",
        "attention_figure": "attrlab.viz.layers",
        "export_figure": "attrlab.viz.layers",
        "head_heatmap": "attrlab.viz.layers",
        "head_rank_table": "attrlab.viz.layers",
        "layer_lines": "attrlab.viz.layers",
        "measure_note": "attrlab.viz.layers",
        "positional_figure": "attrlab.viz.layers",
        "token_layers_figure": "attrlab.viz.layers",
        "top_heads_figure": "attrlab.viz.layers",
        "comparison_html": "attrlab.viz.notebook",
        "explanation_html": "attrlab.viz.notebook",
        "pruning_html": "attrlab.viz.notebook",
        "estimator_scatter": "attrlab.viz.patching",
        "patching_figures": "attrlab.viz.patching",
        "patching_head_grid": "attrlab.viz.patching",
        "patching_heatmaps": "attrlab.viz.patching",
        "patching_image_figure": "attrlab.viz.patching",
        "pruning_figure": "attrlab.viz.patching",
        "pruning_figures": "attrlab.viz.patching",
        "positional_figure_tokens": "attrlab.viz.text",
        "scale_legend_html": "attrlab.viz.text",
        "token_columns_html": "attrlab.viz.text",
        "token_figure": "attrlab.viz.text",
        "token_highlights": "attrlab.viz.text",
        "conservation_figure": "attrlab.viz.trust",
        "method_agreement_figure": "attrlab.viz.trust",
        "randomisation_figure": "attrlab.viz.trust",
        "trust_card_html": "attrlab.viz.trust",
        "trust_figure": "attrlab.viz.trust",
        "visual_tokens_figures": "attrlab.viz.visual_tokens",
        "visual_tokens_html": "attrlab.viz.notebook",
        "visual_tokens_text": "attrlab.viz.visual_tokens",
        "IMAGE_VIEW": "attrlab.viz.view",
        "TEXT_VIEW": "attrlab.viz.view",
        "View": "attrlab.viz.view",
    },
)

# The package is the renderer: each drawing function it exports is imported on first use.
register_renderer(cast(Renderer, sys.modules[__name__]))
