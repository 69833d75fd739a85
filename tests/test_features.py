"""
Words, sentences and spans of a text (issue 26): how tokens group, and what methods do with them.

The groups are written out by hand for each tokenizer family (WordPiece: MiniLM's own, fast and
slow; byte-level BPE: SmolLM2's own; SentencePiece: built offline, LLaMA style). The maps are
checked against the model itself: occlusion of a word against a loop written out here, SHAP's
feature values against the drop from hiding every feature, a gradient method's word scores
against its own token-level run.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest
import torch
import transformers as tf
from _tokenizers import sentencepiece
from fastapi import FastAPI
from fastapi.testclient import TestClient
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from attrlab.app.api import build_router, install_error_handlers
from attrlab.app.cli import main
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.inputs.features import (
    feature_scores,
    features_of,
    sentence_spans,
    spread,
    with_features,
)
from attrlab.attribution.metrics import EvalItem, evaluate_methods
from attrlab.attribution.metrics.faithfulness import faithfulness, faithfulness_passes
from attrlab.attribution.models.base import ImageInputs
from attrlab.attribution.models.builtin import _minilm_dir, smollm2_folder
from attrlab.attribution.models.text import tokenize
from attrlab.attribution.request.target import output_target, target_record

CPU = torch.device("cpu")
#: Punctuation on words, a word split into three tokens, a tab and a newline, a character that
#: takes several tokens (bytes) in every family.
TEXT = "When Mary met unaffable John,\n\tnaïve 𝔘!"
WORDS = ["When", "Mary", "met", "unaffable", "John,", "naïve", "𝔘!"]


@functools.cache
def _tokenizer(family: str) -> tf.PreTrainedTokenizerBase:
    if family == "wordpiece":
        return tf.AutoTokenizer.from_pretrained(_minilm_dir())
    if family == "byte-level":
        return tf.AutoTokenizer.from_pretrained(smollm2_folder())
    return sentencepiece(family)


def _groups(inputs, features) -> list[list[str]]:
    return [inputs.tokens[f.start : f.stop] for f in features]


@pytest.mark.parametrize(
    ("family", "groups"),
    [
        (
            "wordpiece",
            [
                ["when"], ["mary"], ["met"], ["una", "##ffa", "##ble"], ["john", ","],
                ["naive"], ["[UNK]", "!"],
            ],
        ),
        (
            "byte-level",  # the space before a word is in its token (Ġ); Ċ, ĉ join "naïve"
            [
                ["When"], ["ĠMary"], ["Ġmet"], ["Ġun", "aff", "able"], ["ĠJohn", ","],
                ["Ċ", "ĉ", "na", "Ã¯ve"], ["Ġ", "ðĿ", "Ķ", "ĺ", "!"],
            ],
        ),
        *[
            (
                layout,  # a lone ▁ joins the word after it; byte pieces join their word
                [
                    ["▁When"], ["▁Ma", "ry"], ["▁", "m", "e", "t"],
                    ["▁", "u", "n", "a", "f", "f", "a", "b", "l", "e"], ["▁John", "<0x2C>"],
                    ["<0x0A>", "<0x09>", "n", "a", "<0xC3>", "<0xAF>", "v", "e"],
                    ["▁", "<0xF0>", "<0x9D>", "<0x94>", "<0x98>", "<0x21>"],
                ],
            )
            for layout in ("metaspace", "normalizer")
        ],
    ],
)  # fmt: skip
def test_words_group_the_tokens_of_every_family(family, groups):
    inputs = tokenize(_tokenizer(family), TEXT, 512, True, CPU)
    words = features_of(inputs, "word")
    assert _groups(inputs, words) == groups
    assert [w.text for w in words] == WORDS
    assert [(w.char_start, w.char_end) for w in words] == [
        (0, 4), (5, 9), (10, 13), (14, 23), (24, 29), (31, 36), (37, 39),
    ]  # fmt: skip
    assert all(TEXT[w.char_start : w.char_end] == w.text for w in words)
    # special tokens ([CLS], [SEP], <s>) are in no word; every other token is in one
    held = {i for w in words for i in range(w.start, w.stop)}
    assert held == set(np.flatnonzero(~inputs.special_tokens.numpy()))


def test_without_offsets_words_come_from_the_token_texts():
    slow = BertTokenizerLegacy(os.path.join(_minilm_dir(), "vocab.txt"))
    inputs = tokenize(slow, TEXT, 512, True, CPU)
    assert inputs.offsets is None
    words = features_of(inputs, "word")
    # decoded WordPiece spaces out punctuation, so here a mark is a word of its own
    assert _groups(inputs, words) == [
        ["when"], ["mary"], ["met"], ["una", "##ffa", "##ble"], ["john"], [","], ["naive"],
        ["[UNK]"], ["!"],
    ]  # fmt: skip
    assert words[3].text == "unaffable" and words[3].char_start is None
    with pytest.raises(InvalidInputError, match="needs the tokenizer's character offsets"):
        features_of(inputs, "sentence")


def test_sentences_split_on_end_marks_and_blank_lines():
    text = 'He said "Stop." Then he left!  Why?\n\nA new paragraph\nwith a line break'
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        'He said "Stop."', "Then he left!", "Why?", "A new paragraph\nwith a line break",
    ]  # fmt: skip
    assert sentence_spans("3.14 is pi, e.g. here.") == [(0, 16), (17, 22)]  # plain: e.g. ends


@pytest.mark.parametrize(
    ("family", "groups"),
    [
        (
            "wordpiece",
            [["hello", "world", "."], ["is", "it", "?"], ["yes", "!"], ["new", "para"]],
        ),
        (
            "byte-level",  # whitespace tokens go with the sentence after them
            [
                ["Hello", "Ġ", "Ġworld", "."], ["Ġ", "ĠIs", "Ġit", "?"], ["ĠYes", "!"],
                ["Ċ", "Ċ", "New", "Ġpara"],
            ],
        ),
    ],
)  # fmt: skip
def test_sentences_group_the_tokens(family, groups):
    inputs = tokenize(_tokenizer(family), "Hello  world.  Is it? Yes!\n\nNew para", 512, True, CPU)
    sentences = features_of(inputs, "sentence")
    assert _groups(inputs, sentences) == groups
    assert [s.text for s in sentences] == ["Hello  world.", "Is it?", "Yes!", "New para"]


def test_spans_hold_their_tokens_and_leave_the_rest_out():
    inputs = tokenize(
        _tokenizer("byte-level"), "Q: who? [1] Mary left. [2] John came.", 512, True, CPU
    )
    spans = [(23, 37), (8, 22)]  # "[2] John came." and "[1] Mary left.", given out of order
    features = features_of(inputs, "span", spans)
    assert [f.text for f in features] == ["[1] Mary left.", "[2] John came."]
    assert [(f.char_start, f.char_end) for f in features] == [(8, 22), (23, 37)]
    assert _groups(inputs, features) == [
        ["Ġ[", "1", "]", "ĠMary", "Ġleft", "."], ["Ġ[", "2", "]", "ĠJohn", "Ġcame", "."],
    ]  # fmt: skip
    assert inputs.tokens[: features[0].start] == ["Q", ":", "Ġwho", "?"]  # in no feature


@pytest.mark.parametrize(
    ("granularity", "spans", "error", "message"),
    [
        ("paragraph", None, InvalidParameterError, "one of token, word, sentence, span"),
        ("span", None, InvalidParameterError, "granularity=span needs spans"),
        ("word", [[0, 4]], InvalidParameterError, "granularity=span only"),
        ("span", [], InvalidInputError, "non-empty list"),
        ("span", "0-4", InvalidInputError, "non-empty list"),
        ("span", [[0, 4, 8]], InvalidInputError, r"span 1 must be a \[start, end\] pair"),
        ("span", [[0, 4], [1.5, 3]], InvalidInputError, "span 2 must be"),
        ("span", [[True, 4]], InvalidInputError, "span 1 must be"),
        ("span", [[4, 4]], InvalidInputError, r"0 <= start < end <= 11"),
        ("span", [[-1, 3]], InvalidInputError, r"0 <= start < end <= 11"),
        ("span", [[5, 12]], InvalidInputError, r"span 1 \[5, 12\] must satisfy"),
        ("span", [[0, 5], [8, 11], [4, 7]], InvalidInputError, r"\[0, 5\] and \[4, 7\] overlap"),
        ("span", [[0, 4], [4, 5]], InvalidInputError, r"span \[4, 5\] holds no token"),
    ],
)
def test_bad_granularities_and_spans_are_refused_by_name(granularity, spans, error, message):
    inputs = tokenize(_tokenizer("wordpiece"), "Mary  John.", 512, True, CPU)  # [4, 5]: a space
    with pytest.raises(error, match=message):
        with_features(inputs, granularity, spans)


def test_an_image_has_no_words():
    image = ImageInputs(torch.zeros(1, 3, 8, 8), np.zeros((8, 8, 3), dtype=np.uint8), (8, 8))
    assert with_features(image, "token") is image
    with pytest.raises(InvalidInputError, match="granularity=word applies to text"):
        with_features(image, "word")


def test_spread_and_sum_move_scores_between_tokens_and_features():
    inputs = tokenize(_tokenizer("wordpiece"), "A unaffable film", 512, True, CPU)
    words = features_of(inputs, "word")  # [CLS] a | una ##ffa ##ble | film [SEP]
    per_token = spread(np.array([2.0, 3.0, -1.0]), words, 7)
    assert per_token.tolist() == [0.0, 2.0, 1.0, 1.0, 1.0, -1.0, 0.0]
    assert feature_scores(np.arange(7.0), words).tolist() == [1.0, 2 + 3 + 4, 5.0]


# --- methods at word, sentence and span level, on MiniLM (a real model: real differences) ---

#: ``[CLS] an una ##ffa ##ble critic , oddly , loved this film . [SEP]``
CRITIC = "An unaffable critic, oddly, loved this film."
#: Each word's token positions, counted by hand from the tokens above.
CRITIC_WORDS = [[1], [2, 3, 4], [5, 6], [7, 8], [9], [10], [11, 12]]


def _logit(minilm, ids: torch.Tensor, target: int) -> float:
    with torch.no_grad():
        out = minilm.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return float(out.logits[0, target])


def test_a_word_gets_the_sum_of_its_tokens_gradient_scores(minilm):
    inputs = minilm.preprocess(CRITIC)
    tokens = explain(minilm, "gradient_x_input", inputs, target=target_record(minilm, "positive"))
    words = explain(
        minilm,
        "gradient_x_input",
        with_features(inputs, "word"),
        target=target_record(minilm, "positive"),
    )
    assert words.granularity == "word"
    assert [f.text for f in words.features] == [
        "An", "unaffable", "critic,", "oddly,", "loved", "this", "film.",
    ]  # fmt: skip
    np.testing.assert_allclose(words.scores, tokens.scores, rtol=1e-6, atol=1e-9)
    expected = [sum(tokens.scores[i] for i in word) for word in CRITIC_WORDS]
    np.testing.assert_allclose(words.feature_scores, expected, rtol=1e-6, atol=1e-9)
    assert len(CRITIC_WORDS[1]) == 3 and words.feature_scores[1] != tokens.scores[2]


def test_occlusion_of_words_is_the_drop_from_hiding_each_word(minilm):
    inputs = with_features(minilm.preprocess(CRITIC), "word")
    e = explain(minilm, "occlusion", inputs)
    ids, pad = inputs.input_ids, minilm.tokenizer.pad_token_id
    clean = _logit(minilm, ids, e.target.index)
    drops = []
    for word in CRITIC_WORDS:
        hidden = ids.clone()
        hidden[0, word] = pad
        drops.append(clean - _logit(minilm, hidden, e.target.index))
    np.testing.assert_allclose(e.feature_scores, drops, rtol=1e-4, atol=1e-4)
    for word, drop in zip(CRITIC_WORDS, drops, strict=True):  # shared evenly among its tokens
        np.testing.assert_allclose(e.scores[word], drop / len(word), rtol=1e-4, atol=1e-4)
    assert e.timings.forward_passes == 1 + len(CRITIC_WORDS) + 1  # prediction, clean, words
    with pytest.raises(InvalidParameterError, match="window and stride slide over tokens"):
        explain(minilm, "occlusion", inputs, params={"window": 2})


def test_faithfulness_of_words_removes_whole_words_in_the_summed_maps_order(minilm):
    inputs = with_features(minilm.preprocess(CRITIC), "word")
    scores = np.zeros(len(inputs.tokens))
    scores[[2, 3, 4]] = 0.3  # "unaffable": 0.9 over three tokens, first among the words ...
    scores[9] = 0.5  # ... though "loved" is the top token
    scores[11] = 0.2  # "film." third
    target = 1
    mask, ids = minilm.tokenizer.mask_token_id, inputs.input_ids

    def p(hidden_words) -> float:
        hidden = ids.clone()
        for word in hidden_words:
            hidden[0, CRITIC_WORDS[word]] = mask
        with torch.no_grad():
            logits = minilm.model(input_ids=hidden, attention_mask=torch.ones_like(hidden)).logits
        return float(torch.softmax(logits.double(), -1)[0, target])

    order = [1, 4, 6, 0, 2, 3, 5]  # words by summed score, ties in text order
    ks = [1, 2, 3]  # int(k · 7 words) for k = 10 … 50 %, without 0 and repeats
    clean = p([])
    comprehensiveness = clean - np.mean([p(order[:k]) for k in ks])
    sufficiency = clean - np.mean([p(order[k:]) for k in ks])
    scored = faithfulness(
        minilm, inputs, scores, output_target(minilm, target), random_orders=0, text_removal="mask"
    )
    assert scored.metrics["comprehensiveness"] == pytest.approx(comprehensiveness, abs=1e-6)
    assert scored.metrics["sufficiency"] == pytest.approx(sufficiency, abs=1e-6)
    assert len(scored.curves["deletion_morf"]) == len(CRITIC_WORDS) + 1  # a point per word
    assert faithfulness_passes(inputs, random_orders=0) == 2 * 2 * (len(CRITIC_WORDS) + 1)


def test_a_leaderboard_by_words_scores_each_item_over_its_words(minilm):
    items = [EvalItem(CRITIC, "positive", "critic"), EvalItem("A dull, slow film.", None, "dull")]
    kwargs = {"random_orders": 0, "text_removal": "mask"}
    rows = evaluate_methods(minilm, items, ["gradient_x_input"], granularity="word", **kwargs)
    for item, row in zip(items, rows.itertuples(), strict=True):
        inputs = with_features(minilm.preprocess(item.raw), "word")
        e = explain(minilm, "gradient_x_input", inputs, target=target_record(minilm, item.target))
        scored = faithfulness(minilm, inputs, e.scores, e.target_record, **kwargs)
        assert len(scored.curves["deletion_morf"]) == len(inputs.features) + 1  # by words
        assert row.comprehensiveness == pytest.approx(scored.metrics["comprehensiveness"])
        assert row.sufficiency == pytest.approx(scored.metrics["sufficiency"])
    with pytest.raises(InvalidParameterError, match="spans of one text"):
        evaluate_methods(minilm, items, ["gradient_x_input"], granularity="span")


def test_shap_feature_values_add_up_to_hiding_every_sentence(minilm):
    text = "A dull start. Then it soars! The end is perfect."
    inputs = with_features(minilm.preprocess(text), "sentence")
    e = explain(
        minilm, "shap", inputs, target=target_record(minilm, "positive"), params={"max_evals": 100}
    )
    hidden = inputs.input_ids.clone()
    for sentence in e.features:
        hidden[0, sentence.start : sentence.stop] = minilm.tokenizer.mask_token_id
    everything = _logit(minilm, inputs.input_ids, e.target.index) - _logit(
        minilm, hidden, e.target.index
    )
    assert len(e.features) == 3
    np.testing.assert_allclose(e.feature_scores.sum(), everything, rtol=1e-4, atol=1e-4)


#: A question and two retrieved documents; the spans are the documents.
RAG = "Is the film good? [1] A dull plot. [2] Wonderful acting."
DOCUMENTS = [[18, 34], [35, 56]]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("occlusion", {}),
        ("rise", {"n_masks": 16}),
        ("sobol", {"n_designs": 4, "bootstrap": 0}),
        ("shap", {"max_evals": 12}),
    ],
)
def test_perturbation_methods_hide_whole_spans_and_nothing_else(
    minilm, monkeypatch, method, params
):
    inputs = with_features(minilm.preprocess(RAG), "span", DOCUMENTS)
    assert [f.text for f in inputs.features] == ["[1] A dull plot.", "[2] Wonderful acting."]
    seen: list[torch.Tensor] = []
    logits = minilm.logits

    def recorded(**kwargs: torch.Tensor) -> torch.Tensor:
        seen.append(kwargs["input_ids"].clone())
        return logits(**kwargs)

    monkeypatch.setattr(minilm, "logits", recorded)
    e = explain(minilm, method, inputs, params=params)
    original = inputs.input_ids[0]
    fills = {minilm.tokenizer.pad_token_id, minilm.tokenizer.mask_token_id}
    rows = torch.cat(seen)
    outside = torch.ones_like(original, dtype=torch.bool)
    patterns = set()
    for f in e.features:
        outside[f.start : f.stop] = False
        kept = (rows[:, f.start : f.stop] == original[f.start : f.stop]).all(1)
        hidden = torch.isin(rows[:, f.start : f.stop], torch.tensor(sorted(fills))).all(1)
        assert (kept | hidden).all()  # each document whole, or wholly hidden
        patterns.add(tuple(hidden.tolist()))
    assert (rows[:, outside] == original[outside]).all()  # the question and [CLS]/[SEP] stay
    assert len(patterns) > 1  # documents were hidden in some rows
    assert e.feature_scores.shape == (2,)
    if method == "sobol":  # over 2 documents, not 16 tokens: n_designs · (2 + 2) and a prediction
        assert e.timings.forward_passes == 4 * (2 + 2) + 1


def test_features_survive_json_and_npz_and_old_files_read(minilm, tmp_path):
    e = explain(minilm, "occlusion", with_features(minilm.preprocess(RAG), "span", DOCUMENTS))
    again = Explanation.from_json(e.to_json())
    e.save_npz(tmp_path / "e.npz")
    e.save_json(tmp_path / "e.json", arrays="e.npz")
    for read in (
        again,
        Explanation.load(tmp_path / "e.json"),
        Explanation.load(tmp_path / "e.npz"),
    ):
        assert read.granularity == "span"
        assert read.features == e.features
        assert [(f.char_start, f.char_end) for f in read.features] == [(18, 34), (35, 56)]
        np.testing.assert_array_equal(read.feature_scores, e.feature_scores)
    old = json.loads(e.to_json())
    for key in ("granularity", "features", "feature_scores"):
        del old[key]
    before = Explanation.from_dict(old)
    assert before.granularity == "token" and before.features is None
    assert before.feature_scores is None


# --- front ends: bad values are refused with a clear message before any model loads ---


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--granularity", "paragraph"], "granularity must be one of token, word, sentence, span"),
        (
            ["--granularity", "span", "--spans", "[[0, 2"],
            "--spans: spans '[[0, 2' are not readable",
        ),
        (["--granularity", "span", "--spans", "0-4", "ten"], "--spans: spans line 2 'ten' is not"),
        (["--granularity", "span", "--spans", "[[3, 1]]"], "0 <= start < end <= 14"),
        (["--granularity", "span", "--spans", "[[0, 5], [4, 9]]"], "overlap"),
        (["--granularity", "span"], "granularity=span needs spans"),
        (["--spans", "[[0, 4]]"], "granularity=span only"),
    ],
)
def test_cli_refuses_bad_granularities_and_spans(capsys, flags, message):
    argv = ["explain", "--model", "minilm-zeroshot", "--method", "occlusion", "--text"]
    assert main([*argv, "A lovely film.", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_explains_words(capsys):
    argv = ["explain", "--model", "minilm-zeroshot", "--method", "occlusion", "--text"]
    assert main([*argv, "A lovely film.", "--granularity", "word", "--format", "json"]) == 0
    e = Explanation.from_json(capsys.readouterr().out)
    assert [f.text for f in e.features] == ["A", "lovely", "film."]
    assert main([*argv, "A lovely film.", "--granularity", "word"]) == 0  # the table
    table = capsys.readouterr().out
    assert "words     score" in table and "film." in table.split("words")[1]
    spans = ["--granularity", "span", "--format", "json", "--spans"]
    assert main([*argv, "A lovely film.", *spans, "0-8", "9-14"]) == 0  # as the page types them
    e = Explanation.from_json(capsys.readouterr().out)
    assert [f.text for f in e.features] == ["A lovely", "film."]


@pytest.fixture(scope="module")
def rest():
    worker = ExplainWorker(device="cpu", max_models=1)
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(build_router(worker, None))
    with TestClient(app) as client:
        yield client
    worker.close()


@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        ({"granularity": "paragraph"}, 422, "granularity must be one of"),
        ({"granularity": "span", "spans": [[5, 2]]}, 400, "0 <= start < end <= 14"),
        ({"granularity": "span", "spans": [[0, 3], [2, 5]]}, 400, "overlap"),
        ({"granularity": "span", "spans": [[0, 1, 2]]}, 400, "must be a [start, end] pair"),
        ({"granularity": "span", "spans": [[0.5, 2]]}, 422, "spans"),
        ({"granularity": "span"}, 422, "needs spans"),
    ],
)
def test_rest_refuses_bad_granularities_and_spans(rest, extra, status, message):
    body = {"model": "minilm-zeroshot", "method": "occlusion", "text": "A lovely film!", **extra}
    response = rest.post("/api/v1/explain", json=body)
    assert response.status_code == status, response.text
    assert message in json.dumps(response.json()["error"])


def test_rest_explains_spans_and_refuses_them_in_a_batch(rest):
    body = {
        "model": "minilm-zeroshot",
        "method": "occlusion",
        "text": RAG,
        "granularity": "span",
        "spans": DOCUMENTS,
    }
    response = rest.post("/api/v1/explain", json=body)
    assert response.status_code == 200, response.text
    e = Explanation.from_dict(response.json())
    assert [f.text for f in e.features] == ["[1] A dull plot.", "[2] Wonderful acting."]
    batch = {"model": "minilm-zeroshot", "method": "occlusion", "granularity": "word"}
    response = rest.post("/api/v1/explain", json={**batch, "instances": [{"text": RAG}]})
    assert response.status_code == 422 and "each instance carries its own" in response.text
