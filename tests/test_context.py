"""
Context attribution (leave one feature out) with and without the prompt's key/value cache.

The cached path must give plain leave-one-out's scores, and plain leave-one-out those of a
loop written out here: delete the feature's tokens, run the model on what is left, read the
target's log-probabilities by hand. Models: GPT-2 (learned positions), LLaMA (RoPE: the
tokens after a removed feature move to new positions) and Gemma 3 with a sliding window of 4
(its layers' own cache keeps only the window).
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from _tiny_families import build_family

from attrlab.attribution.context import context_attribution
from attrlab.attribution.errors import (
    BudgetExceededError,
    InvalidInputError,
    JobCancelledError,
    UnsupportedMethodError,
)
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import (
    AnswerTarget,
    ContrastTarget,
    NextTokenTarget,
    StepTarget,
)

PROMPT = "the film was good and the actors were great but the plot felt slow"
KINDS = ("next_token", "answer", "contrast")


@pytest.fixture(scope="module", params=["tiny-random-gpt2", "tiny-random-llama"])
def decoder(request, load_model):
    return load_model(request.param)


@pytest.fixture(scope="module")
def sliding(load_model):
    """Gemma 3, float64, every layer attending to a window of 4 tokens."""
    return build_family(load_model("tiny-random-llama").tokenizer, "gemma3_text")


def _request(adapter, kind):
    """Inputs and target: the next token, a 4-token answer, or a contrast sharing its start."""
    if kind == "next_token":
        return adapter.preprocess(PROMPT), NextTokenTarget(2012)
    if kind == "answer":
        return answer_request(adapter, PROMPT, answer=" at times and then")
    # " at times" rather than " at night": both read from the answer's own sequence
    return answer_request(adapter, PROMPT, answer=" at times", contrast=" at night")


def _features(inputs):
    """At the start, after the first token (as after a BOS), in the middle, at the prompt's end."""
    prompt = len(inputs.tokens) - inputs.answer_length
    return [(0, 2), (1, 3), (5, 8), (prompt - 3, prompt), (prompt - 1, prompt)]


def _answer_log_prob(logits, tokens, before):
    """Σ_k log p(tokens[k]) read at position ``before + k`` (the token before each step)."""
    log_probs = logits[0].double().log_softmax(-1)
    return sum(float(log_probs[before + k, token]) for k, token in enumerate(tokens))


def _written_out(adapter, ids, target):
    """The target's score on token ids ``(1, T)``: one plain forward, read by hand."""
    with torch.no_grad():
        logits = adapter.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    length = int(ids.shape[1])
    if isinstance(target, NextTokenTarget):
        return float(logits[0, -1, target.index])
    if isinstance(target, AnswerTarget):
        answer = target.tokens
        return _answer_log_prob(logits, answer, length - 1 - len(answer))
    before = length - 1 - len(target.answer.tokens)  # the alternative follows the same prompt
    return _answer_log_prob(logits, target.answer.tokens, before) - _answer_log_prob(
        logits, target.alternative.tokens, before
    )


def _left_out_loop(adapter, inputs, target, features):
    """``F(x) − F(x without feature)`` per feature: the tokens deleted, one forward each."""
    ids = inputs.input_ids
    full = _written_out(adapter, ids, target)
    drops = []
    for start, stop in features:
        kept = [i for i in range(ids.shape[1]) if not start <= i < stop]
        drops.append(full - _written_out(adapter, ids[:, kept], target))
    return full, np.array(drops)


def _counted(adapter, call):
    """``call()``'s result and the token positions of each forward the model ran in it."""
    seen = []

    def count(_module, _args, kwargs):
        seen.append(int(kwargs["input_ids"].shape[1]))

    handle = adapter.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        return call(), seen
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", KINDS)
def test_cached_equals_plain_and_the_written_out_loop(decoder, kind):
    inputs, target = _request(decoder, kind)
    features = _features(inputs)
    cached, cached_seen = _counted(
        decoder, lambda: context_attribution(decoder, inputs, target, features)
    )
    plain, plain_seen = _counted(
        decoder, lambda: context_attribution(decoder, inputs, target, features, reuse_cache=False)
    )
    full, drops = _left_out_loop(decoder, inputs, target, features)
    assert cached.reused_cache and not plain.reused_cache
    assert cached.score == pytest.approx(full, abs=1e-5)
    assert plain.score == pytest.approx(full, abs=1e-5)
    np.testing.assert_allclose(plain.scores, drops, atol=1e-5)
    np.testing.assert_allclose(cached.scores, plain.scores, atol=1e-5)
    assert np.abs(drops).max() > 1e-3  # the features matter: equal scores are not all zeros
    assert cached.features == tuple(features)

    # plain: the whole input, then each shortened one; cached: the whole input, then only the
    # tokens after each feature (none after one that ends the prompt of a next-token target)
    length = len(inputs.tokens)
    assert sum(plain_seen) == length + sum(length - (stop - start) for start, stop in features)
    assert sum(cached_seen) == length + sum(length - stop for _, stop in features)
    assert sum(cached_seen) < sum(plain_seen)
    assert (plain.token_positions, plain.forward_passes) == (sum(plain_seen), len(plain_seen))
    assert (cached.token_positions, cached.forward_passes) == (
        sum(cached_seen),
        len(cached_seen),
    )


def test_answer_steps_sum_to_the_whole_answer(decoder):
    inputs, target = _request(decoder, "answer")
    features = _features(inputs)
    whole = context_attribution(decoder, inputs, target, features).scores
    steps = [
        context_attribution(decoder, inputs, StepTarget(target, k), features).scores
        for k in range(target.steps)
    ]
    np.testing.assert_allclose(np.sum(steps, axis=0), whole, atol=1e-5)


def test_sliding_window_attention(sliding):
    inputs = sliding.preprocess(PROMPT)
    target = NextTokenTarget(2012)
    features = [(0, 2), (3, 5), (8, 11), (12, 14)]  # 14 tokens: beyond the window of 4
    cached = context_attribution(sliding, inputs, target, features)
    plain = context_attribution(sliding, inputs, target, features, reuse_cache=False)
    _, drops = _left_out_loop(sliding, inputs, target, features)
    np.testing.assert_allclose(plain.scores, drops, atol=1e-10)
    np.testing.assert_allclose(cached.scores, drops, atol=1e-10)
    assert np.abs(drops).max() > 1e-6


def test_feature_records_and_numpy_bounds(decoder):
    inputs, target = _request(decoder, "next_token")
    as_pairs = context_attribution(decoder, inputs, target, [(2, 4), (6, 9)])
    as_records = context_attribution(
        decoder, inputs, target, [range(2, 4), (np.int64(6), np.int64(9))]
    )
    np.testing.assert_array_equal(as_records.scores, as_pairs.scores)
    assert as_pairs.texts == (
        "".join(inputs.token_texts[2:4]),
        "".join(inputs.token_texts[6:9]),
    )


def test_progress_cancel_and_budget(decoder):
    inputs, target = _request(decoder, "answer")
    features = _features(inputs)
    reported = []
    context_attribution(
        decoder, inputs, target, features, RunContext(progress=lambda *p: reported.append(p))
    )
    assert reported[-1] == (len(features) + 1, len(features) + 1)
    cancel = threading.Event()

    def cancel_after_first(done, total):
        cancel.set()

    with pytest.raises(JobCancelledError):
        context_attribution(
            decoder,
            inputs,
            target,
            features,
            RunContext(progress=cancel_after_first, cancel=cancel),
        )
    with pytest.raises(BudgetExceededError, match="features"):
        context_attribution(decoder, inputs, target, features, RunContext(max_forward_passes=3))


def test_refusals(decoder, load_model):
    inputs, target = _request(decoder, "answer")
    prompt = len(inputs.tokens) - inputs.answer_length
    bad = {
        "at least one feature": [],
        "token range": [(3, 3)],
        "0 <= start": [("a", 2)],
        "the answer's": [(prompt - 1, prompt + 1)],
        "whole prompt": [(0, prompt)],
    }
    for message, features in bad.items():
        with pytest.raises(InvalidInputError, match=message):
            context_attribution(decoder, inputs, target, features)
    with_bos = replace(
        inputs, special_tokens=inputs.special_tokens.clone().index_fill(0, torch.tensor([0]), True)
    )
    with pytest.raises(InvalidInputError, match="covers token 0"):
        context_attribution(decoder, with_bos, target, [(0, 2)])
    with pytest.raises(InvalidInputError, match="answer of 4 tokens"):
        context_attribution(decoder, inputs, NextTokenTarget(5), [(2, 4)])
    apart_inputs, apart = answer_request(decoder, PROMPT, answer=" at times", contrast=" in the")
    assert isinstance(apart, ContrastTarget) and not apart.shares_input
    with pytest.raises(UnsupportedMethodError, match="sequence of its own"):
        context_attribution(decoder, apart_inputs, apart, [(2, 4)])
    bert = load_model("tiny-random-bert")
    with pytest.raises(InvalidInputError, match="decoder LM"):
        context_attribution(bert, bert.preprocess(PROMPT), NextTokenTarget(5), [(1, 2)])
