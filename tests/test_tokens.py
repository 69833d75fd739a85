"""
Tokens are shown as the text they stand for, for every tokenizer family.

Byte-level BPE (SmolLM2's real tokenizer, GPT-2 style), SentencePiece (LLaMA style: ``▁`` word
starts and byte fallback; built here with ``tokenizers`` in both the Metaspace layout and the
older normaliser layout), WordPiece (MiniLM's real tokenizer, fast and slow). The expected
texts are written out by hand; the raw tokens stay the tokenizer's own.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf
from _tokenizers import sentencepiece
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from attrlab.app.cli import main
from attrlab.attribution import explain
from attrlab.attribution.explain import preview
from attrlab.attribution.explanation import (
    Explanation,
    ModelInfo,
    Prediction,
    TargetValues,
)
from attrlab.attribution.inputs.tokens import texts_from_tokens, vocabulary_text
from attrlab.attribution.models.builtin import _minilm_dir, smollm2_folder
from attrlab.attribution.models.text import tokenize
from attrlab.viz.table import explanation_table
from attrlab.viz.text import token_columns_html, token_figure
from attrlab.viz.tokens import token_label, token_probabilities, token_tick

#: Tokenizer notation that must never reach a person.
MARKERS = ("Ġ", "Ċ", "ĉ", "▁", "##", "<0x")
CPU = torch.device("cpu")


def _no_markers(texts: list[str]) -> None:
    shown = [t for t in texts if t not in ("[CLS]", "[SEP]", "<s>")]
    assert not [t for t in shown if any(m in t for m in MARKERS)], texts


@pytest.fixture(scope="module")
def byte_level() -> tf.PreTrainedTokenizerBase:
    """SmolLM2's own tokenizer (GPT-2-style byte-level BPE), without its model."""
    return tf.AutoTokenizer.from_pretrained(smollm2_folder())


@pytest.fixture(scope="module")
def wordpiece() -> tf.PreTrainedTokenizerBase:
    return tf.AutoTokenizer.from_pretrained(_minilm_dir())


def test_byte_level_tokens_read_as_the_text(byte_level):
    text = "When Mary met unaffable John,\n\tnaïve 𝔘!"
    inputs = tokenize(byte_level, text, 512, True, CPU)
    assert inputs.tokens == [
        "When", "ĠMary", "Ġmet", "Ġun", "aff", "able", "ĠJohn", ",", "Ċ", "ĉ", "na", "Ã¯ve",
        "Ġ", "ðĿ", "Ķ", "ĺ", "!",
    ]  # fmt: skip
    # 𝔘 is four bytes over three tokens: the one completing it stands for it
    assert inputs.token_texts == [
        "When", " Mary", " met", " un", "aff", "able", " John", ",", "\n", "\t", "na", "ïve",
        " ", "", "", "𝔘", "!",
    ]  # fmt: skip
    assert "".join(inputs.token_texts) == text
    assert inputs.offsets is not None and inputs.offsets[1] == (4, 9)  # " Mary"


@pytest.mark.parametrize("layout", ["metaspace", "normalizer"])
def test_sentencepiece_tokens_read_as_the_text(layout):
    tokenizer = sentencepiece(layout)
    text = "When Mary and John\nwent é"
    inputs = tokenize(tokenizer, text, 512, True, CPU)
    assert inputs.tokens == [
        "<s>", "▁When", "▁Ma", "ry", "▁and", "▁John", "<0x0A>", "w", "e", "n", "t", "▁",
        "<0xC3>", "<0xA9>",
    ]  # fmt: skip
    assert inputs.token_texts == [
        "<s>", "When", " Ma", "ry", " and", " John", "\n", "w", "e", "n", "t", " ", "", "é",
    ]  # fmt: skip
    assert "".join(inputs.token_texts[1:]) == text  # the pieces of "Mary" make the word
    # A word-start marker before a byte-encoded character adds no text of its own.
    digit = tokenize(tokenizer, "1 a", 512, True, CPU)
    assert digit.tokens == ["<s>", "▁", "<0x31>", "▁", "a"]
    assert digit.token_texts == ["<s>", "", "1", " ", "a"]


def test_wordpiece_tokens_read_as_the_text(wordpiece):
    text = "When Mary met unaffable John,\n\tnaïve 𝔘!"
    inputs = tokenize(wordpiece, text, 512, True, CPU)
    assert inputs.tokens == [
        "[CLS]", "when", "mary", "met", "una", "##ffa", "##ble", "john", ",", "naive",
        "[UNK]", "!", "[SEP]",
    ]  # fmt: skip
    # the text as written (case, accents, the character the vocabulary lacks), spaces before
    assert inputs.token_texts == [
        "[CLS]", "When", " Mary", " met", " una", "ffa", "ble", " John", ",", "\n\tnaïve",
        " 𝔘", "!", "[SEP]",
    ]  # fmt: skip
    assert inputs.offsets is not None and inputs.offsets[0] == (0, 0)  # [CLS] covers no text


def test_a_slow_tokenizer_reads_its_texts_by_decoding():
    slow = BertTokenizerLegacy(os.path.join(_minilm_dir(), "vocab.txt"))
    assert not slow.is_fast  # no offsets: the texts come from decoding
    inputs = tokenize(slow, "When Mary met unaffable John", 512, True, CPU)
    assert inputs.offsets is None
    assert inputs.token_texts == [
        "[CLS]", "when", " mary", " met", " una", "ffa", "ble", " john", "[SEP]",
    ]  # fmt: skip


def test_every_family_hides_its_markers(byte_level, wordpiece):
    text = "Mary and\nJohn were unaffable to naïve résumé ünïcödé lands 🙂, 𝔘 龘."
    for tokenizer in (byte_level, wordpiece, sentencepiece("metaspace")):
        inputs = tokenize(tokenizer, text, 512, True, CPU)
        assert any(m in "".join(inputs.tokens) for m in MARKERS)  # the raw tokens have them
        _no_markers(inputs.token_texts)
        ordinary = [
            t for t, s in zip(inputs.token_texts, inputs.special_tokens, strict=True) if not s
        ]
        assert "".join(ordinary) == text  # each character once: no garbage, nothing twice


def test_next_token_labels_are_texts(byte_level, wordpiece):
    ids = byte_level.convert_tokens_to_ids
    assert vocabulary_text(byte_level, ids("ĠMary")) == " Mary"
    assert vocabulary_text(byte_level, ids("Ċ")) == "\n"
    assert vocabulary_text(byte_level, ids("ĠĠĠ")) == "   "
    assert vocabulary_text(byte_level, ids("<|im_end|>")) == "<|im_end|>"
    sp = sentencepiece("metaspace")
    assert vocabulary_text(sp, sp.convert_tokens_to_ids("▁Ma")) == " Ma"  # decode alone: "Ma"
    assert vocabulary_text(sp, sp.convert_tokens_to_ids("ry")) == "ry"
    assert vocabulary_text(sp, sp.convert_tokens_to_ids("<0x0A>")) == "\n"
    assert vocabulary_text(wordpiece, wordpiece.convert_tokens_to_ids("mary")) == " mary"
    assert vocabulary_text(wordpiece, wordpiece.convert_tokens_to_ids("##ffa")) == "ffa"


#: Raw tokens of files written before token texts, and the texts read from them, per notation.
_OLD_FILES = {
    "byte-level": (
        ["When", "ĠMary", "Ċ", "na", "Ã¯ve", "ðĿ", "Ķ", "ĺ"],
        ["When", " Mary", "\n", "na", "ïve", "", "", "𝔘"],
    ),
    "sentencepiece": (
        ["<s>", "▁When", "▁Ma", "ry", "<0x0A>", "<0xC3>", "<0xA9>"],
        ["<s>", "When", " Ma", "ry", "\n", "", "é"],
    ),
    "wordpiece": (
        ["[CLS]", "when", "una", "##ffa", "[SEP]"],
        ["[CLS]", "when", " una", "ffa", "[SEP]"],
    ),
}


@pytest.mark.parametrize(("tokens", "texts"), _OLD_FILES.values(), ids=_OLD_FILES.keys())
def test_files_without_token_texts_read_them_from_the_tokens(tokens, texts):
    assert texts_from_tokens(tokens) == texts
    old = _explanation(tokens).to_dict()
    del old["token_texts"]
    old["schema_version"] = 2
    assert Explanation.from_dict(old).token_texts == texts


def _explanation(tokens: list[str], texts: list[str] | None = None, **fields) -> Explanation:
    return Explanation(
        model=ModelInfo("toy", None, "text"),
        method="gradient_x_input",
        params={},
        target=TargetValues(3, " Mary", 1.0, 0.5),
        predictions=[
            Prediction(3, " Mary", 0.5),
            Prediction(4, "\n", 0.2),
            Prediction(5, " ", 0.1),
        ],
        scores=np.linspace(-1.0, 1.0, len(tokens)),
        tokens=tokens,
        token_texts=texts,
        **fields,
    )


def test_token_texts_travel_in_json_and_npz(tmp_path: Path):
    e = _explanation(["When", "ĠMary", "Ċ"], ["When", " Mary", "\n"])
    assert Explanation.from_json(e.to_json()).token_texts == ["When", " Mary", "\n"]
    e.save_npz(tmp_path / "e.npz")
    restored = Explanation.load_npz(tmp_path / "e.npz")
    assert restored.tokens == ["When", "ĠMary", "Ċ"] and restored.token_texts == e.token_texts
    with pytest.raises(ValueError, match="2 token texts for 3 tokens"):
        _explanation(["When", "ĠMary", "Ċ"], ["When", " Mary"])


def test_labels_make_whitespace_visible():
    assert token_label(" Mary") == " Mary"
    assert [token_label(t) for t in (" ", "\n", "\t", "\n   ", "\r\n")] == [
        "␣",
        "↵",
        "⇥",
        "↵␣␣␣",
        "↵",
    ]
    assert token_label("") == "◌"  # the first bytes of a character the next token completes
    assert token_label("a\tb") == "a⇥b"
    assert token_tick(" <b>") == '<span style="color:#a0a0a0">␣</span>&lt;b&gt;'
    assert token_probabilities(_explanation(["a"]).predictions) == {
        " Mary": 0.5,
        "↵": 0.2,
        "␣": 0.1,
    }


def test_views_show_the_texts_not_the_tokens():
    e = _explanation(["When", "ĠMary", "Ċ", "ĠĠ"], ["When", " Mary", "\n", "  "])
    page = token_columns_html({"m": e})
    assert ">When<" in page and "> Mary<" in page and ">↵<" in page and ">␣␣<" in page
    assert "white-space:pre" in page and "Ġ" not in page and "Ċ" not in page
    ticks = list(token_figure(e).layout.xaxis.ticktext)
    assert ticks == ["When", '<span style="color:#a0a0a0">␣</span>Mary', "↵", "␣␣"]
    table = explanation_table(e)
    assert "top-5     ' Mary' 0.5000 | '↵' 0.2000 | '␣' 0.1000" in table
    rows = table.split("tokens    score\n")[1].splitlines()[:4]
    assert [r[2:7] for r in rows] == ["When ", " Mary", "↵    ", "␣␣   "]


def test_cli_table_shows_token_texts(capsys):
    argv = ["explain", "--model", "tiny-random-gpt2", "--method", "gradient_x_input"]
    argv += ["--device", "cpu", "--text", "When Mary met unaffable John", "--format", "table"]
    assert main(argv) == 0
    rows = capsys.readouterr().out.split("tokens    score\n")[1].splitlines()[:7]
    # WordPiece pieces "una", "##ffa", "##ble" shown as the word's parts, the text's case kept
    assert [r.split("  ")[1] for r in rows] == [
        "When", " Mary", " met", " una", "ffa", "ble", " John",
    ]  # fmt: skip


@pytest.mark.slow
def test_smollm2_explanation_and_predictions_read_as_text(smollm2):
    prompt = "When Mary and John went to the store, John gave a drink to"
    e = explain(smollm2, "gradient_x_input", smollm2.preprocess(prompt), None)
    assert e.tokens[:4] == ["When", "ĠMary", "Ġand", "ĠJohn"]  # raw, for programs
    assert e.token_texts == [
        "When", " Mary", " and", " John", " went", " to", " the", " store", ",", " John",
        " gave", " a", " drink", " to",
    ]  # fmt: skip
    assert e.target.label == e.predictions[0].label == " Mary"
    lines = preview(smollm2, smollm2.preprocess("Line one.\nLine two.\n"))
    newline = next(p for p in lines.predictions if p.label == "\n")  # the model's top guess
    assert newline.index == smollm2.tokenizer.convert_tokens_to_ids("Ċ")
    shown = token_probabilities(lines.predictions)
    assert "↵" in shown and all(label.strip() for label in shown)  # no blank entry
