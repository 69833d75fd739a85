"""Token-level views of a text Explanation: figures and HTML highlights."""

from __future__ import annotations

import html
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.target import ContrastTarget
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_html, token_label, token_tick, token_ticks
from attrlab.viz.view import TEXT_VIEW, View

__all__ = [
    "diverging_colour",
    "positional_figure_tokens",
    "scale_legend_html",
    "text_colour",
    "token_columns_html",
    "token_figure",
    "token_highlights",
    "token_span",
]


def token_highlights(explanation: Explanation, view: View = TEXT_VIEW) -> list[tuple[str, float]]:
    """(token as shown, score scaled by ``view``) pairs; by default in [-1, 1] over max |score|."""
    texts = _texts(explanation, "token_highlights")
    scores = view.scaled({"": explanation.scores})[""]
    return [(token_label(text), float(s)) for text, s in zip(texts, scores, strict=True)]


def _texts(explanation: Explanation, view: str) -> list[str]:
    if explanation.token_texts is None:
        raise ValueError(f"{view} needs a text explanation")
    return explanation.token_texts


def token_figure(explanation: Explanation) -> go.Figure:
    """
    Bar chart of token scores in reading order, on the ends of the diverging scale.

    A sampling method's standard error per token (``maps["std_error"]``) shows as error bars.
    """
    ticks = token_ticks(_texts(explanation, "token_figure"))
    scores = explanation.scores
    positions = list(range(len(scores)))
    error = explanation.maps.get("std_error")
    shown_error = error is not None and np.shape(error) == np.shape(scores)
    figure = go.Figure(
        go.Bar(
            x=positions,
            y=scores,
            marker_color=[f"rgb{diverging_colour(1.0 if s >= 0 else -1.0)}" for s in scores],
            hovertext=ticks,
            error_y={"type": "data", "array": error, "visible": True} if shown_error else None,
        )
    )
    figure.update_layout(
        template=TEMPLATE,
        title=f"{explanation.method} → {token_tick(explanation.target.label)}"
        + (" (bars: ± standard error)" if shown_error else ""),
        xaxis={"tickmode": "array", "tickvals": positions, "ticktext": ticks},
        yaxis_title="relevance",
        margin={"l": 40, "r": 10, "t": 40, "b": 80},
        height=320,
    )
    return figure


_SIGN_MEANING = {
    "signed": "red supports the target, blue opposes",
    "positive": "red supports the target; opposing tokens stay white",
    "absolute": "darker: larger magnitude, either sign",
}


def diverging_colour(value: float) -> tuple[int, int, int]:
    """RGB of ``value`` in [-1, 1] on the signed view's diverging scale (ColorBrewer RdBu)."""
    return TEXT_VIEW.colour(value)


def text_colour(background: tuple[int, int, int]) -> str:
    """Dark text on light backgrounds, light text on dark ones (WCAG relative luminance)."""
    linear = [
        c / 255 / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in background
    ]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "#111111" if luminance > 0.179 else "#ffffff"


def scale_legend_html(view: View = TEXT_VIEW) -> str:
    """The view's colour scale as a horizontal gradient bar, with its ends and what it means."""
    low, high = view.colour_range
    stops = ", ".join(f"rgb{view.colour(v)}" for v in np.linspace(low, high, 11))
    ends = (
        "<span>−1</span><span>0</span><span>+1</span>"
        if view.signed
        else ("<span>0</span><span>1</span>")
    )
    meaning = f"{view.describe()} ({_SIGN_MEANING[view.sign]})"
    return (
        f'<div class="attr-legend" data-view="{html.escape(view.sign)}" '
        'style="max-width:360px;margin:8px 0;font-size:0.85em">'
        f'<div style="height:12px;border-radius:3px;background:linear-gradient(to right, {stops})">'
        "</div>"
        f'<div style="display:flex;justify-content:space-between">{ends}</div>'
        f"<div>{html.escape(meaning)}</div></div>"
    )


#: A token's box; ``white-space:pre`` keeps a word's leading space as a gap inside it.
TOKEN_STYLE = "padding:1px 3px;margin:1px;border-radius:3px;display:inline-block;white-space:pre"


def token_span(
    text: str, raw: float, value: float, view: View, attributes: str = "", style: str = ""
) -> str:
    """
    One token's box, coloured by its scaled ``value`` in ``view``; ``raw`` in its tooltip.

    ``attributes`` and ``style`` are added to the element's own (a mark, a click target).
    """
    background = view.colour(value)
    extra = f" {attributes}" if attributes else ""
    more = f";{style}" if style else ""
    return (
        f'<span data-score="{raw:.6g}" title="{raw:.6g}"{extra} '
        f'style="background:rgb{background};color:{text_colour(background)};{TOKEN_STYLE}{more}">'
        f"{token_html(text)}</span>"
    )


def _column_html(method: str, explanation: Explanation, shown: np.ndarray, view: View) -> str:
    target = explanation.target
    texts = _texts(explanation, "token_columns_html")
    spans = [
        token_span(text, float(raw), float(value), view)
        for text, raw, value in zip(texts, explanation.scores, shown, strict=True)
    ]
    return (
        f'<div class="attr-column" data-method="{html.escape(method)}" '
        'style="flex:1 1 240px;min-width:200px">'
        f'<div style="font-weight:600">{html.escape(method)}</div>'
        f'<div style="font-size:0.85em;opacity:0.8;white-space:pre">→ {token_html(target.label)} '
        f"({_probability(explanation)})</div>"
        f'<div style="line-height:1.9">{"".join(spans)}</div></div>'
    )


def _probability(explanation: Explanation) -> str:
    """The target's probability, or for a contrast how many times likelier the answer is."""
    if isinstance(explanation.target_record, ContrastTarget):
        return f"p(answer) / p(contrast) = {explanation.target.probability:.3g}"
    return f"p={explanation.target.probability:.3f}"


def token_columns_html(explanations: Mapping[str, Explanation], view: View = TEXT_VIEW) -> str:
    """
    The methods' token scores side by side, one column each, with the scale's legend once.

    Colours follow ``view`` (default: signed, each method over its own largest |score|, since
    methods have different units); each token's ``title`` and ``data-score`` hold its raw score.
    """
    if not explanations:
        raise ValueError("token_columns_html needs at least one explanation")
    for method, explanation in explanations.items():
        if explanation.token_texts is None:
            raise ValueError(f"token_columns_html needs text explanations; {method!r} is not")
    scaled = view.scaled({m: e.scores for m, e in explanations.items()})
    columns = "".join(
        _column_html(method, e, scaled[method], view) for method, e in explanations.items()
    )
    return (
        '<div class="attr-columns" style="display:flex;flex-wrap:wrap;gap:16px">'
        f"{columns}</div>{scale_legend_html(view)}"
    )


def positional_figure_tokens(explanation: Explanation) -> go.Figure:
    """PA-LRP per token: token and positional relevance as stacked bars, tokens on the x axis."""
    if explanation.token_texts is None or explanation.positional_scores is None:
        raise ValueError("positional_figure_tokens needs a text explanation with positional scores")
    ticks = token_ticks(explanation.token_texts)
    positions = list(range(len(ticks)))
    figure = go.Figure(
        [
            go.Bar(x=positions, y=explanation.scores, name="token", hovertext=ticks),
            go.Bar(
                x=positions, y=explanation.positional_scores, name="positional", hovertext=ticks
            ),
        ]
    )
    target = token_tick(explanation.target.label)
    figure.update_layout(
        barmode="relative",
        title=f"{explanation.method} → {target}: token and positional relevance",
        xaxis={"tickmode": "array", "tickvals": positions, "ticktext": ticks},
        yaxis_title="relevance",
        template=TEMPLATE,
        height=320,
    )
    return figure
