"""
The text each token of an input stands for: what people read instead of the raw tokens.

Tokenizers spell tokens in their own notation: byte-level BPE (GPT-2, SmolLM2, Qwen) maps bytes
to printable characters (``ĠMary``, ``Ċ`` for a newline, ``Ã¯`` for half of ``ï``),
SentencePiece marks a word start with ``▁`` and unknown characters as bytes (``<0x0A>``),
WordPiece marks a word's continuation with ``##``. None of that is text.

A token *stands for* the characters of the input it completes: its own characters and the
whitespace before them (so ``" Mary"`` in "When Mary", whether the tokenizer folded the space
into the token or skipped it), and nothing (``""``) when the next token still spells the same
characters (the first bytes of a character several tokens share; SentencePiece's word-start
``▁`` before a byte-encoded character). A special token the tokenizer added (``[CLS]``,
``<s>``) stands for itself. So the texts of a sentence's ordinary tokens concatenate back to
the sentence, up to whitespace after its last token.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

__all__ = ["continuation_texts", "texts_from_tokens", "token_texts", "vocabulary_text"]

#: A probe token's text: the text of one vocabulary entry is what it adds after the probe, so
#: that decoders which drop a leading space at the start of a text keep it (SentencePiece).
_PROBE = "a"
#: SentencePiece's byte-fallback pieces.
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
#: What a raw token looks like when a tokenizer added it (``[CLS]``, ``<s>``, ``<|im_end|>``).
_SPECIAL = re.compile(r"\[[A-Za-z_]+\]|<[^<>\s]+>")


def token_texts(
    tokenizer: Any,
    text: str,
    ids: Sequence[int],
    special: Sequence[bool],
    offsets: Sequence[tuple[int, int]] | None = None,
) -> list[str]:
    """
    The text each of ``ids`` stands for in ``text`` (module docstring).

    Args:
        tokenizer: The Hugging Face tokenizer that gave ``ids``.
        text: The tokenised text.
        ids: The token ids of ``text`` (special tokens included).
        special: Per token, whether the tokenizer added it (its special-tokens mask).
        offsets: Per token, its ``(start, end)`` characters in ``text`` (a fast tokenizer's
            offset mapping); without them (slow tokenizers) the texts come from decoding.
    """
    if offsets is None:
        return _decoded_texts(tokenizer, ids, special)
    tokens = tokenizer.convert_ids_to_tokens(list(ids))
    return _offset_texts(text, tokens, offsets, special)


def vocabulary_text(tokenizer: Any, index: int) -> str:
    """
    The text vocabulary entry ``index`` stands for after other text (a next-token label).

    ``" Mary"`` for GPT-2's ``ĠMary``, SentencePiece's ``▁Mary`` and WordPiece's ``mary`` alike,
    ``"ry"`` for ``ry`` or ``##ry``; a special token is itself.
    """
    if index in tokenizer.all_special_ids:
        return str(tokenizer.convert_ids_to_tokens(index))
    probe = tokenizer.encode(_PROBE, add_special_tokens=False)[-1:]
    return _decoded_texts(tokenizer, [*probe, index], [False] * (len(probe) + 1))[-1]


def continuation_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """
    The text each of ``ids`` stands for as a continuation of other text (an answer's tokens).

    Decoded after a probe token, so tokenizers that drop a leading space at the start of a
    text (SentencePiece, WordPiece) keep it: ``[" Paris", ","]``, never ``["Paris", ","]``.
    """
    probe = tokenizer.encode(_PROBE, add_special_tokens=False)[-1:]
    texts = _decoded_texts(tokenizer, [*probe, *ids], [False] * (len(probe) + len(ids)))
    return texts[len(probe) :]


def _offset_texts(
    text: str,
    tokens: Sequence[str],
    offsets: Sequence[tuple[int, int]],
    special: Sequence[bool],
) -> list[str]:
    """Texts from character offsets: each token takes the characters up to its end."""
    # Where the next ordinary token starts, for each position (None after the last).
    following: list[int | None] = [None] * len(tokens)
    start: int | None = None
    for i in reversed(range(len(tokens))):
        following[i] = start
        if not special[i]:
            start = int(offsets[i][0])
    texts = []
    done = 0  # characters of ``text`` already given to a token
    for token, (_, end), added, after in zip(tokens, offsets, special, following, strict=True):
        if added:
            texts.append(str(token))
        elif after is not None and after < end:  # the next token still spells these characters
            texts.append("")
        else:
            texts.append(text[done:end])
            done = max(done, int(end))
    return texts


def _decoded_texts(tokenizer: Any, ids: Sequence[int], special: Sequence[bool]) -> list[str]:
    """Texts by decoding ever longer prefixes: each token takes what it adds to the decoding."""
    texts = []
    kept: list[int] = []
    shown = ""  # the decoding of ``kept`` up to its last whole character
    for index, added in zip(ids, special, strict=True):
        if added:
            texts.append(str(tokenizer.convert_ids_to_tokens(int(index))))
            continue
        kept.append(int(index))
        decoded = tokenizer.decode(kept, clean_up_tokenization_spaces=False)
        if decoded.endswith("\ufffd"):  # a character's first bytes: the next token completes it
            texts.append("")
            continue
        common = len(_common_prefix(shown, decoded))
        texts.append(decoded[common:])
        shown = decoded
    return texts


def _common_prefix(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return a[:i]
    return a if len(a) <= len(b) else b


def texts_from_tokens(tokens: Sequence[str]) -> list[str]:
    """
    Token texts read from the raw tokens alone, for Explanations saved without them.

    The notation is recognised from the tokens: byte-level BPE (``Ġ`` or ``Ċ`` in some token),
    SentencePiece (``▁``), WordPiece (``##`` continuations or ``[CLS]`` / ``[SEP]``), else the
    tokens are taken as written. Tokens that look added (``[CLS]``, ``<s>``) stand for
    themselves. Where the tokenizer is at hand, :func:`token_texts` is exact; this is not
    (WordPiece spacing before punctuation, lowercased words).
    """
    joined = "".join(tokens)
    if "Ġ" in joined or "Ċ" in joined:
        spell = _byte_level_bytes
    elif "▁" in joined:
        spell = _sentencepiece_bytes
    elif any(t.startswith("##") or t in ("[CLS]", "[SEP]") for t in tokens):
        spell = _wordpiece_bytes
    else:
        spell = _plain_bytes
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    texts = []
    first = True
    for token in tokens:
        if _SPECIAL.fullmatch(token) and not _BYTE_PIECE.fullmatch(token):
            texts.append(token)
            continue
        texts.append(decoder.decode(spell(token, first)))
        first = False
    return texts


def _byte_level_bytes(token: str, first: bool) -> bytes:
    table = _byte_level_table()
    if all(c in table for c in token):
        return bytes(table[c] for c in token)
    return token.encode()


def _sentencepiece_bytes(token: str, first: bool) -> bytes:
    piece = _BYTE_PIECE.fullmatch(token)
    if piece:
        return bytes([int(piece.group(1), 16)])
    spelled = token.replace("▁", " ")
    return (spelled.removeprefix(" ") if first else spelled).encode()


def _wordpiece_bytes(token: str, first: bool) -> bytes:
    if token.startswith("##"):
        return token[2:].encode()
    return (token if first else " " + token).encode()


def _plain_bytes(token: str, first: bool) -> bytes:
    return token.encode()


@cache
def _byte_level_table() -> dict[str, int]:
    """
    GPT-2's printable character for each byte, inverted (character -> byte).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, ...)
    are spelled by the characters from U+0100 on, in byte order (space -> ``Ġ`` U+0120).
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}
