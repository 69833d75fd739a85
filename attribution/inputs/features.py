"""
Features of a text: tokens, words, sentences or given spans, and scores moved between levels.

A *feature* is a run of consecutive tokens explained as one: perturbation methods hide or keep
all its tokens together (:class:`~attribution.inputs.perturb.TextPerturbation`), and every per-token
map is summed within it (:func:`feature_scores`). Where a method computed one value per
feature, :func:`spread` shares it evenly among the feature's tokens, so that the per-token map
sums back to it.

How tokens fall into features, from the tokenizer's character offsets:

* ``token``: each token on its own (the default; no features are attached to the inputs).
* ``word``: the text's whitespace-separated words. Punctuation belongs to the word it touches
  (``"film."``, ``"don't"`` and ``"(yes)"`` are one word each); a mark between spaces is a word
  of its own. A token whose characters are all whitespace (``Ċ``, SentencePiece's lone ``▁``)
  joins the word after it, as byte-level BPE folds a space into the next word's token
  (``ĠMary``); at the end of the text it joins the word before it.
* ``sentence``: a plain splitter: a sentence ends after ``.``, ``!`` or ``?`` (and closing
  quotes or brackets) followed by whitespace, and at a blank line. Abbreviations (``e.g.``,
  ``Dr.``) end a sentence too. Whitespace-only tokens join the sentence after them.
* ``span``: character spans given by the user (``[(start, end), ...]``, one per retrieved
  document, say). Tokens outside every span belong to no feature: they stay as they are under
  every perturbation, like special tokens (the question around the documents is the context
  the documents are judged in, not a feature of its own). Features come in text order.

A token belongs to the word, sentence or span holding its first non-whitespace character (its
first character, for a whitespace-only token), so a token that straddles a span's edge goes
where it starts. Special tokens never belong to a feature, nor do tokens the inputs keep fixed
(:attr:`TextInputs.fixed_tokens`: an answer's); a feature never runs across one. Without
offsets (slow tokenizers) words come from the token texts (a token whose text starts with
whitespace starts a word), and sentences and spans are refused.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
import reprlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Inputs, TextInputs

__all__ = [
    "GRANULARITIES",
    "Feature",
    "check_features",
    "feature_scores",
    "features_of",
    "read_spans",
    "sentence_spans",
    "spread",
    "with_features",
]

#: What a text's features are: its tokens, words, sentences, or spans the user gives.
GRANULARITIES = ("token", "word", "sentence", "span")

#: SentencePiece's byte-fallback pieces.
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
#: A sentence's end: ``.``, ``!`` or ``?`` (with closing quotes or brackets) before whitespace,
#: or a blank line.
_SENTENCE_END = re.compile(r"""[.!?]+["'’”)\]]*(?=\s)|\n[ \t\r\f\v]*\n""")


@dataclass(frozen=True)
class Feature:
    """
    One feature of a text: the tokens ``start..stop-1`` (consecutive), explained together.

    Attributes:
        text: What the feature reads as (its characters of the text; a token's own text).
        start: Its first token's index.
        stop: One past its last token's index.
        char_start: Its first character in the text (``None`` without offsets).
        char_end: One past its last character (``None`` without offsets).
    """

    text: str
    start: int
    stop: int
    char_start: int | None = None
    char_end: int | None = None

    @property
    def size(self) -> int:
        """Number of tokens."""
        return self.stop - self.start

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Feature:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


def check_features(granularity: str, spans: Any = None, text: str | None = None) -> None:
    """
    Refuse a granularity and spans that cannot be explained.

    An unknown granularity, spans without ``span`` (or ``span`` without spans), and, given the
    text, spans that are not ``[start, end)`` pairs within it or that overlap. Needs no
    model: front ends call it before a job is queued.

    Raises:
        InvalidParameterError: an unknown granularity, or spans and granularity that disagree.
        InvalidInputError: a span that is not a pair of character positions in the text, or
            two that overlap.
    """
    if granularity not in GRANULARITIES:
        raise InvalidParameterError(
            f"granularity must be one of {', '.join(GRANULARITIES)}; got {granularity!r}"
        )
    if (granularity == "span") != (spans is not None):
        raise InvalidParameterError(
            "granularity=span needs spans, [[start, end], ...] in characters"
            if spans is None
            else f"spans are given with granularity=span only; got granularity={granularity}"
        )
    if spans is not None and text is not None:
        _checked_spans(spans, text)


#: A span as a person types it: ``start-end`` (``start:end`` and ``start, end`` read too).
_TYPED_SPAN = re.compile(r"\s*([0-9]{1,9})\s*[-:,]\s*([0-9]{1,9})\s*")


def read_spans(typed: str) -> list[list[int]] | None:
    """
    Spans as a person types them: one per line, ``start-end`` in characters (end excluded).

    A JSON list of ``[start, end]`` pairs reads too (what the CLI and REST take). Blank lines
    are skipped; no span at all is ``None``. Whether the spans fit the text is
    :func:`check_features`' to say.

    Raises:
        InvalidInputError: a line that is not ``start-end``, or JSON that is not a list.
    """
    if typed.lstrip().startswith("["):
        try:
            given = json.loads(typed)
        except ValueError:
            raise InvalidInputError(
                f"spans {reprlib.repr(typed)} are not readable JSON; write one span per line, "
                "start-end, or a JSON list of [start, end] pairs"
            ) from None
        if not isinstance(given, list):
            raise InvalidInputError("spans in JSON are a list of [start, end] pairs")
        return given
    spans = []
    for number, line in enumerate(typed.splitlines(), start=1):
        if not line.strip():
            continue
        match = _TYPED_SPAN.fullmatch(line)
        if match is None:
            raise InvalidInputError(
                f"spans line {number} {reprlib.repr(line.strip())} is not start-end in "
                "characters, e.g. 0-42"
            )
        spans.append([int(match[1]), int(match[2])])
    return spans or None


def _checked_spans(spans: Any, text: str) -> list[tuple[int, int]]:
    """The spans as ``(start, end)`` in text order, or a clear error."""
    if not isinstance(spans, Sequence) or isinstance(spans, str) or not spans:
        raise InvalidInputError(
            f"spans must be a non-empty list of [start, end] character pairs; got "
            f"{reprlib.repr(spans)}"
        )
    pairs = []
    for number, span in enumerate(spans, start=1):
        ok = isinstance(span, Sequence) and not isinstance(span, str) and len(span) == 2
        if not ok or not all(isinstance(n, int) and not isinstance(n, bool) for n in span):
            raise InvalidInputError(
                f"span {number} must be a [start, end] pair of character positions; got "
                f"{reprlib.repr(span)}"
            )
        start, end = int(span[0]), int(span[1])
        if not 0 <= start < end <= len(text):
            raise InvalidInputError(
                f"span {number} [{start}, {end}] must satisfy 0 <= start < end <= "
                f"{len(text)} (the text's length in characters)"
            )
        pairs.append((start, end))
    ordered = sorted(pairs)
    for (a_start, a_end), (b_start, b_end) in itertools.pairwise(ordered):
        if b_start < a_end:
            raise InvalidInputError(
                f"spans [{a_start}, {a_end}] and [{b_start}, {b_end}] overlap; a character "
                "belongs to one span at most"
            )
    return ordered


def with_features(inputs: Inputs, granularity: str = "token", spans: Any = None) -> Inputs:
    """
    ``inputs`` explained at ``granularity``: a copy carrying its :func:`features_of`.

    ``token`` is every method's own level: the copy carries no features. An image has no
    other level.

    Raises:
        InvalidParameterError, InvalidInputError: as :func:`check_features` and
            :func:`features_of`.
    """
    check_features(granularity, spans)
    if inputs.modality != "text":
        if granularity != "token":
            raise InvalidInputError(
                f"granularity={granularity} applies to text; an image is explained per pixel"
            )
        return inputs
    text = cast("TextInputs", inputs)
    if granularity == "token":
        return replace(text, granularity="token", features=None)
    return replace(
        text, granularity=granularity, features=tuple(features_of(text, granularity, spans))
    )


def features_of(
    inputs: TextInputs, granularity: str, spans: Sequence[Sequence[int]] | None = None
) -> list[Feature]:
    """
    The features of a tokenised text at ``granularity`` (module docstring), in text order.

    Args:
        inputs: The tokenised text.
        granularity: One of :data:`GRANULARITIES`.
        spans: ``span`` only: ``[(start, end), ...]`` character spans of ``inputs.text``.

    Raises:
        InvalidParameterError: as :func:`check_features`.
        InvalidInputError: bad spans, a span holding no token, sentences or spans without
            the tokenizer's offsets, or a text with no feature at all.
    """
    check_features(granularity, spans)
    eligible = ~inputs.fixed_tokens.cpu().numpy()
    if granularity == "token":
        features = [_token_feature(inputs, int(i)) for i in np.flatnonzero(eligible)]
    elif inputs.offsets is None:
        if granularity != "word":
            raise InvalidInputError(
                f"granularity={granularity} needs the tokenizer's character offsets, which "
                "this model's (slow) tokenizer does not give; use word or token"
            )
        features = _runs(inputs, eligible, _words_from_texts(inputs, eligible), None)
    else:
        units = {
            "word": lambda: [(m.start(), m.end()) for m in re.finditer(r"\S+", inputs.text)],
            "sentence": lambda: sentence_spans(inputs.text),
            "span": lambda: _checked_spans(spans, inputs.text),
        }[granularity]()
        homes = _homes(inputs, eligible, units, whitespace_joins=granularity != "span")
        if granularity == "span":
            _every_span_held(homes, units, inputs)
        features = _runs(inputs, eligible, homes, units)
    if not features:
        raise InvalidInputError("the text has no tokens to explain besides special tokens")
    return features


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence of ``text`` (module docstring), whitespace trimmed."""
    bounds, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        blank_line = text[match.start()] == "\n"
        bounds.append((start, match.start() if blank_line else match.end()))
        start = match.end()
    bounds.append((start, len(text)))
    trimmed = []
    for begin, end in bounds:
        piece = text[begin:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            trimmed.append((begin + lead, begin + len(piece.rstrip())))
    return trimmed


def _token_feature(inputs: TextInputs, index: int) -> Feature:
    span = inputs.offsets[index] if inputs.offsets is not None else (None, None)
    return Feature(inputs.token_texts[index], index, index + 1, *span)


def _token_spans(inputs: TextInputs) -> list[tuple[int, int]]:
    """
    Each token's characters: its offsets, with SentencePiece's byte-fallback runs taken apart.

    The tokenizers library gives every byte piece of a run the whole run's characters
    (``<0x2C>``, ``<0x0A>``, ``<0x09>`` each the three characters they spell); where the
    run's pieces are its characters' UTF-8 bytes, each piece gets its byte's character.
    """
    spans = list(inputs.offsets or [])
    i = 0
    while i < len(spans):
        stop = i + 1
        while stop < len(spans) and spans[stop] == spans[i]:
            stop += 1
        start, end = spans[i]
        chars = inputs.text[start:end]
        pieces = inputs.tokens[i:stop]
        bytewise = all(_BYTE_PIECE.fullmatch(p) for p in pieces)
        if stop - i > 1 and bytewise and len(chars.encode()) == stop - i:
            at = i
            for k, char in enumerate(chars, start=start):
                for _ in char.encode():
                    spans[at] = (k, k + 1)
                    at += 1
        i = stop
    return spans


def _homes(
    inputs: TextInputs,
    eligible: np.ndarray,
    units: list[tuple[int, int]],
    whitespace_joins: bool,
) -> list[int | None]:
    """
    Per token, the unit (word, sentence, span) holding it, or ``None``.

    ``whitespace_joins``: a whitespace-only token outside every unit goes with the next token
    of its run (the last one's unit at the end).
    """
    text, offsets = inputs.text, _token_spans(inputs)
    starts = [start for start, _ in units]
    homes: list[int | None] = [None] * len(eligible)
    floating = [False] * len(eligible)
    for i in np.flatnonzero(eligible):
        start, end = offsets[i]
        anchor = next((k for k in range(start, end) if not text[k].isspace()), None)
        floating[i] = anchor is None and whitespace_joins
        at = start if anchor is None else anchor
        unit = bisect.bisect_right(starts, at) - 1
        if unit >= 0 and at < units[unit][1] and start < end:
            homes[i] = unit
            floating[i] = False
    return _settled(homes, floating, eligible)


def _words_from_texts(inputs: TextInputs, eligible: np.ndarray) -> list[int | None]:
    """Per token, its word's number, from token texts alone (no offsets)."""
    homes: list[int | None] = [None] * len(eligible)
    floating = [False] * len(eligible)
    word, previous = -1, False
    for i, text in enumerate(inputs.token_texts):
        if not eligible[i]:
            previous = False
            continue
        if not text.strip():  # whitespace, or the first bytes of a character: with the next
            floating[i] = True
        else:
            if not previous or text[0].isspace():
                word += 1
            homes[i] = word
        previous = True
    return _settled(homes, floating, eligible)


def _settled(
    homes: list[int | None], floating: list[bool], eligible: np.ndarray
) -> list[int | None]:
    """Floating tokens given the next settled token's home in their run, else the previous."""
    settled = list(homes)
    following: int | None = None
    for i in reversed(range(len(homes))):
        if not eligible[i]:
            following = None
        elif floating[i]:
            settled[i] = following
        else:
            following = homes[i]
    preceding: int | None = None
    for i in range(len(homes)):
        if not eligible[i]:
            preceding = None
        elif floating[i] and settled[i] is None:
            settled[i] = preceding
        elif not floating[i]:
            preceding = homes[i]
    return settled


def _runs(
    inputs: TextInputs,
    eligible: np.ndarray,
    homes: list[int | None],
    units: list[tuple[int, int]] | None,
) -> list[Feature]:
    """A feature per run of consecutive eligible tokens of one home (``units``: their spans)."""
    spans = _token_spans(inputs)
    features = []
    i = 0
    while i < len(homes):
        home = homes[i]
        if home is None or not eligible[i]:
            i += 1
            continue
        stop = i + 1
        while stop < len(homes) and eligible[stop] and homes[stop] == home:
            stop += 1
        if units is None or not spans:
            features.append(Feature("".join(inputs.token_texts[i:stop]).strip(), i, stop))
        else:
            first, last = min(s for s, _ in spans[i:stop]), max(e for _, e in spans[i:stop])
            # the unit's characters its tokens reach (a truncated text: part of its last unit)
            begin, end = max(units[home][0], first), min(units[home][1], last)
            features.append(Feature(inputs.text[begin:end], i, stop, begin, end))
        i = stop
    return features


def _every_span_held(
    homes: list[int | None], spans: list[tuple[int, int]], inputs: TextInputs
) -> None:
    held = set(homes)
    for number, (start, end) in enumerate(spans):
        if number not in held:
            why = " (the text was truncated)" if inputs.truncated else ""
            raise InvalidInputError(
                f"span [{start}, {end}] holds no token of the model input{why}: give spans "
                "around text the model reads"
            )


def feature_scores(scores: np.ndarray, features: Sequence[Feature]) -> np.ndarray:
    """
    Per-token ``scores`` ``(..., T)`` summed within each feature: ``(..., n_features)``.

    A word split into several tokens gets the sum of its tokens' scores.
    """
    scores = np.asarray(scores, dtype=np.float64)
    return np.stack([scores[..., f.start : f.stop].sum(-1) for f in features], axis=-1)


def spread(values: np.ndarray, features: Sequence[Feature], n_tokens: int) -> np.ndarray:
    """
    Per-feature ``values`` ``(..., n_features)`` as a per-token map ``(..., n_tokens)``.

    Each feature's value is shared evenly among its tokens, so that :func:`feature_scores` of
    the map gives the values back (up to rounding); tokens in no feature get 0.
    """
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros((*values.shape[:-1], n_tokens), dtype=np.float64)
    for j, feature in enumerate(features):
        out[..., feature.start : feature.stop] = values[..., j : j + 1] / feature.size
    return out
