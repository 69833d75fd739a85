"""Token-level views of a text Explanation: figures and HTML highlights."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.inputs.features import Feature
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_html, token_label, token_tick, token_ticks
from attrlab.viz.view import TEXT_VIEW, View

__all__ = [
    "KEPT_OUT_STYLE",
    "diverging_colour",
    "kept_out",
    "kept_out_span",
    "positional_figure_tokens",
    "probability_text",
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


def scale_legend_html(view: View = TEXT_VIEW, meaning: str | None = None) -> str:
    """
    The view's colour scale as a horizontal gradient bar, with its ends and what it means.

    ``meaning`` replaces the view's own words (what the colours show) where the values are not
    a method's scores.
    """
    low, high = view.colour_range
    stops = ", ".join(f"rgb{view.colour(v)}" for v in np.linspace(low, high, 11))
    ends = (
        "<span>−1</span><span>0</span><span>+1</span>"
        if view.signed
        else ("<span>0</span><span>1</span>")
    )
    meaning = meaning or f"{view.describe()} ({_SIGN_MEANING[view.sign]})"
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
    text: str,
    raw: float,
    value: float,
    view: View,
    attributes: str = "",
    style: str = "",
    about: str = "",
) -> str:
    """
    One token's box, coloured by its scaled ``value`` in ``view``; ``raw`` in its tooltip.

    ``attributes`` and ``style`` are added to the element's own (a mark, a click target);
    ``about`` (plain text) precedes the score in the tooltip.
    """
    background = view.colour(value)
    extra = f" {attributes}" if attributes else ""
    more = f";{style}" if style else ""
    title = f"{html.escape(about)}: {raw:.6g}" if about else f"{raw:.6g}"
    return (
        f'<span data-score="{raw:.6g}" title="{title}"{extra} '
        f'style="background:rgb{background};color:{text_colour(background)};{TOKEN_STYLE}{more}">'
        f"{token_html(text)}</span>"
    )


#: Why a token is greyed: it is special, or (in a view by features) in no feature.
_SPECIAL = "special token: kept as it is, not coloured"
_NO_FEATURE = "in no feature: kept as it is, not coloured"


#: A token kept out of a map (a special or chat-template token, or one in no feature): grey,
#: on no colour of the scale.
KEPT_OUT_STYLE = f"{TOKEN_STYLE};background:#e5e7eb;color:#6b7280;border:1px dotted #9ca3af"


def kept_out(explanation: Explanation) -> np.ndarray:
    """Bool per token: the special tokens (a chat template's among them), shown greyed."""
    count = len(explanation.token_texts or [])
    if explanation.special_tokens is None:
        return np.zeros(count, dtype=bool)
    return np.asarray(explanation.special_tokens, dtype=bool)


def kept_out_span(text: str, raw: float, why: str = _SPECIAL, attributes: str = "") -> str:
    """A greyed token's box: ``why`` it is not coloured, and its ``raw`` score, in its title."""
    extra = f" {attributes}" if attributes else ""
    return (
        f'<span class="kept-out" data-score="{raw:.6g}" title="{html.escape(why)} '
        f'(score {raw:.6g})"{extra} style="{KEPT_OUT_STYLE}">{token_html(text)}</span>'
    )


@dataclass(frozen=True)
class _Box:
    """One box of a token view: a token, or a whole feature; ``why`` it is greyed, if it is."""

    text: str
    score: float
    why: str | None = None
    feature: int | None = None
    #: A feature's words on hover.
    about: str = ""


def _feature_words(feature: Feature) -> str:
    """A feature on hover: its text and how many tokens it holds."""
    tokens = "1 token" if feature.size == 1 else f"{feature.size} tokens"
    return f"{feature.text} ({tokens})"


def _boxes(explanation: Explanation) -> list[_Box]:
    """
    The boxes of a token view: a token each, or with features a feature each.

    A feature reads as its tokens' texts and holds its score (its tokens' sum); a token in no
    feature (special, an answer's, outside every span) is greyed, as special tokens always are.
    """
    texts = _texts(explanation, "token_columns_html")
    special = kept_out(explanation)
    features = explanation.features
    if features is None or explanation.feature_scores is None:
        return [
            _Box(text, float(score), _SPECIAL if special[i] else None)
            for i, (text, score) in enumerate(zip(texts, explanation.scores, strict=True))
        ]
    starts = {feature.start: k for k, feature in enumerate(features)}
    boxes, position = [], 0
    while position < len(texts):
        k = starts.get(position)
        if k is None:
            why = _SPECIAL if special[position] else _NO_FEATURE
            boxes.append(_Box(texts[position], float(explanation.scores[position]), why))
            position += 1
            continue
        feature = features[k]
        text = "".join(texts[feature.start : feature.stop])
        score = float(explanation.feature_scores[k])
        boxes.append(_Box(text, score, feature=k, about=_feature_words(feature)))
        position = feature.stop
    return boxes


def _column_html(
    method: str, explanation: Explanation, boxes: list[_Box], shown: np.ndarray, view: View
) -> str:
    """One method's column; ``shown``: the coloured boxes' scaled values, in order."""
    target = explanation.target
    values = iter(shown)
    spans = []
    for box in boxes:
        if box.why is not None:
            spans.append(kept_out_span(box.text, box.score, box.why))
        elif box.feature is not None:
            attributes = f'data-feature="{box.feature}"'
            value = float(next(values))
            spans.append(token_span(box.text, box.score, value, view, attributes, about=box.about))
        else:
            spans.append(token_span(box.text, box.score, float(next(values)), view))
    by = "" if explanation.granularity == "token" else f", by {explanation.granularity}"
    return (
        f'<div class="attr-column" data-method="{html.escape(method)}" '
        f'data-granularity="{html.escape(explanation.granularity)}" '
        'style="flex:1 1 240px;min-width:200px">'
        f'<div style="font-weight:600">{html.escape(method)}{by}</div>'
        f'<div style="font-size:0.85em;opacity:0.8;white-space:pre">→ {token_html(target.label)} '
        f"({probability_text(explanation)})</div>"
        f'<div style="line-height:1.9">{"".join(spans)}</div></div>'
    )


def probability_text(explanation: Explanation) -> str:
    """
    The target's probability, or for a contrast how many times likelier the answer is.

    A record with neither (a ratio past float range, an answer read in logits) gives its score.
    """
    values = explanation.target
    if values.probability_ratio is not None:
        return f"p(answer) / p(contrast) = {values.probability_ratio:.3g}"
    if values.probability is not None:
        return f"p={values.probability:.3f}"
    record = explanation.target_record
    if record is not None and record.alternative_answer is not None:
        return f"log p(answer) − log p(contrast) = {values.score:.4g}"
    return f"score {values.score:.4g}"


def token_columns_html(explanations: Mapping[str, Explanation], view: View = TEXT_VIEW) -> str:
    """
    The methods' token scores side by side, one column each, with the scale's legend once.

    Colours follow ``view`` (default: signed, each method over its own largest |score|, since
    methods have different units); each token's ``title`` and ``data-score`` hold its raw score.
    A text explained by words, sentences or spans shows a box per feature, coloured by its
    score (``data-feature``: its number; its text and score on hover). Special tokens (and,
    by features, tokens in no feature) are greyed and left out of the scale.
    """
    if not explanations:
        raise ValueError("token_columns_html needs at least one explanation")
    for method, explanation in explanations.items():
        if explanation.token_texts is None:
            raise ValueError(f"token_columns_html needs text explanations; {method!r} is not")
    boxes = {method: _boxes(e) for method, e in explanations.items()}
    coloured = {m: np.array([b.score for b in bs if b.why is None]) for m, bs in boxes.items()}
    scaled = view.scaled(coloured)
    columns = "".join(
        _column_html(method, e, boxes[method], scaled[method], view)
        for method, e in explanations.items()
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
