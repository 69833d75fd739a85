"""Views of an edit and compare: how each method's map and the class probability changed."""

from __future__ import annotations

import html
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go

from attrlab.attribution.compare import MapChange
from attrlab.viz.image import map_panels_figure
from attrlab.viz.text import TOKEN_STYLE, diverging_colour, text_colour
from attrlab.viz.tokens import token_html

__all__ = ["change_figure", "change_html"]

_LEGEND = (
    "change of relevance ÷ each method's largest |change| (red: the token supports the class "
    "more after the edit); dashed: a token the edit added or replaced"
)


def _headline(change: MapChange) -> str:
    target = change.after.target
    return (
        f"p({token_html(target.label)}) {change.before.target.probability:.4f} → "
        f"{target.probability:.4f} ({change.probability_change:+.4f})"
    )


def _tokens_html(change: MapChange) -> str:
    texts = change.after.token_texts or []
    known = change.difference[~np.isnan(change.difference)]
    peak = float(np.abs(known).max()) if known.size else 0.0
    spans = []
    for text, delta, edited in zip(texts, change.difference, change.edited or [], strict=True):
        if edited:
            spans.append(
                '<span data-edited="true" title="added or replaced by the edit" '
                f'style="border:1px dashed currentColor;{TOKEN_STYLE}">{token_html(text)}</span>'
            )
            continue
        background = diverging_colour(float(delta) / peak if peak > 0 else 0.0)
        spans.append(
            f'<span data-change="{float(delta):.6g}" title="{float(delta):+.6g}" '
            f'style="background:rgb{background};color:{text_colour(background)};{TOKEN_STYLE}">'
            f"{token_html(text)}</span>"
        )
    return "".join(spans)


def change_html(changes: Mapping[str, MapChange]) -> str:
    """Per method, side by side: the probability's change and each token's change of relevance."""
    columns = "".join(
        f'<div class="attr-change" data-method="{html.escape(method)}" '
        'style="flex:1 1 240px;min-width:200px">'
        f'<div style="font-weight:600">{html.escape(method)}</div>'
        f'<div style="font-size:0.85em">{_headline(change)}</div>'
        f'<div style="line-height:1.9">{_tokens_html(change)}</div></div>'
        for method, change in changes.items()
    )
    return (
        '<div class="attr-changes" style="display:flex;flex-wrap:wrap;gap:16px">'
        f'{columns}</div><div style="font-size:0.85em">{html.escape(_LEGEND)}</div>'
    )


def change_figure(changes: Mapping[str, MapChange], image: np.ndarray) -> go.Figure:
    """Per method, the change of its map (after − before) over the edited ``image``."""
    if not changes:
        raise ValueError("change_figure needs at least one comparison")
    panels = {f"{m}: {_headline(c)}": (m, c.difference) for m, c in changes.items()}
    return map_panels_figure(panels, image, 0.6, quantity="change")
