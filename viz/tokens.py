"""
How a token's text (and a next-token label) reads wherever tokens are shown.

Every view takes a token's text (:mod:`attribution.inputs.tokens`: ``" Mary"``, never ``ĠMary``) and
shows it through one of these: a token of whitespace alone as visible marks (``␣`` a space,
``↵`` a line break, ``⇥`` a tab), a token that completes no character (the first bytes of one
several tokens share) as ``◌``, and line breaks and tabs inside a token as the same marks.
A word's leading space stays a space in plain text and HTML (a narrow gap before the word) and
is a light ``␣`` in Plotly labels, where a space would be dropped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attrlab.attribution.explanation import Prediction

__all__ = ["token_html", "token_label", "token_probabilities", "token_tick", "token_ticks"]

#: Marks for whitespace: a token of whitespace alone, and breaks inside a token.
_MARKS = {" ": "␣", "\n": "↵", "\t": "⇥"}
#: A token that completes no character of the text.
_PART = "◌"
#: Colour of the mark of a word's leading space in Plotly labels: visible but light.
_LIGHT = "#a0a0a0"


def token_label(text: str) -> str:
    """Plain text: ``" Mary"`` stays, ``" "`` -> ``␣``, a line break -> ``↵``, ``""`` -> ``◌``."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text:
        return _PART
    if text.isspace():
        return "".join(_MARKS.get(c, _MARKS[" "]) for c in text)
    return text.replace("\n", _MARKS["\n"]).replace("\t", _MARKS["\t"])


def token_html(text: str) -> str:
    """:func:`token_label`, HTML-escaped (shown in an element with ``white-space:pre``)."""
    return html.escape(token_label(text))


def token_tick(text: str) -> str:
    """:func:`token_label` as Plotly text (ticks, hover, titles): a leading space a light ␣."""
    label = token_label(text)
    word = label.lstrip(" ")
    spaces = len(label) - len(word)
    if not spaces:
        return html.escape(label)
    return f'<span style="color:{_LIGHT}">{_MARKS[" "] * spaces}</span>{html.escape(word)}'


def token_ticks(texts: Sequence[str]) -> list[str]:
    """:func:`token_tick` of each text."""
    return [token_tick(text) for text in texts]


def token_probabilities(predictions: Iterable[Prediction]) -> dict[str, float]:
    """Top predictions for a label panel: each label as :func:`token_label`, its probability."""
    return {token_label(p.label): p.probability for p in predictions}
