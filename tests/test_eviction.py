"""Key/value eviction (issue 39): the cache, the scorers' definitions, budgets, the study."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.eviction.cache import evicted_logits, keep_all, prefill
from attrlab.attribution.eviction.scorers import SCORERS, by_position, snapkv
from attrlab.attribution.eviction.study import (
    EVICTION_METRICS,
    EvictionItem,
    eviction_rows,
    eviction_study,
    exact_spans,
    kept_masks,
    layer_budgets,
)
from attrlab.attribution.methods._routing import _RoutedConfig
from attrlab.attribution.request.answers import answer_request

PROMPT = "the quick brown fox jumps over the lazy dog and then it sleeps in the warm sun"


@pytest.fixture(scope="module")
def llama(load_model):
    return load_model("tiny-random-llama")


@pytest.fixture(scope="module")
def item(llama):
    inputs, target = answer_request(llama, PROMPT, answer=" all day")
    return EvictionItem(inputs, target)


def _full_cache(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    return cache


def test_keeping_everything_is_the_full_cache_bit_for_bit(llama, item):
    cache = prefill(llama, item.inputs)
    model = llama.model
    prompt = item.inputs.input_ids[:, : cache.positions]
    with torch.no_grad():
        reference = model(
            input_ids=cache.queries[None], cache=_full_cache(model, prompt), use_cache=True
        ).logits
    assert torch.equal(evicted_logits(llama, cache, keep_all(cache, 1)), reference)
    # the answer forward reads the prompt's last token then the answer's tokens but its last
    answer = item.inputs.answer_length
    assert cache.queries.tolist() == item.inputs.input_ids[0, -answer - 1 : -1].tolist()
    assert cache.answer.tolist() == item.inputs.input_ids[0, -answer:].tolist()


def test_masking_an_entry_equals_a_cache_without_it(llama, item):
    cache = prefill(llama, item.inputs)
    kept = keep_all(cache, 1)
    generator = torch.Generator().manual_seed(3)
    for layer in range(cache.layers):  # a different set of 4 per layer and key/value head
        for head in range(cache.kv_heads):
            kept[0, layer, head, torch.randperm(cache.positions, generator=generator)[:4]] = False
    dropped = DynamicCache()
    for layer in range(cache.layers):
        keys = torch.stack([cache.keys[layer][h][kept[0, layer, h]] for h in range(2)])
        values = torch.stack([cache.values[layer][h][kept[0, layer, h]] for h in range(2)])
        dropped.update(keys[None], values[None], layer)
    steps = len(cache.queries)
    positions = torch.arange(cache.positions, cache.positions + steps)[None]
    with torch.no_grad():
        reference = llama.model(
            input_ids=cache.queries[None], cache=dropped, position_ids=positions, use_cache=True
        ).logits
    evicted = evicted_logits(llama, cache, kept)
    torch.testing.assert_close(evicted, reference, rtol=0, atol=1e-6)
    assert (evicted - evicted_logits(llama, cache, keep_all(cache, 1))).abs().max() > 1e-3


def test_the_routes_are_undone_after_an_error(llama, item):
    cache = prefill(llama, item.inputs)
    before = evicted_logits(llama, cache, keep_all(cache, 1))

    def fail(*_: object) -> None:
        raise RuntimeError("forced inside the routed forward")

    handle = llama.blocks()[1].register_forward_hook(fail)
    try:
        for routed in (
            lambda: prefill(llama, item.inputs),
            lambda: evicted_logits(llama, cache, keep_all(cache, 2)),
        ):
            with pytest.raises(RuntimeError, match="forced"):
                routed()
            assert not any(isinstance(m.config, _RoutedConfig) for m in llama.attention_modules())
    finally:
        handle.remove()
    with pytest.raises(InvalidParameterError):  # a wrong mask shape, refused before any route
        evicted_logits(llama, cache, torch.ones(1, 1, 1, 1, dtype=torch.bool))
    assert torch.equal(evicted_logits(llama, cache, keep_all(cache, 1)), before)


def _probabilities(llama, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's attention probabilities ``(H, P, P)`` from a plain eager forward."""
    with torch.no_grad():
        out = llama.model(input_ids=ids, output_attentions=True)
    return [a[0].double() for a in out.attentions]


def test_each_scorer_equals_its_definition(llama, item):
    cache = prefill(llama, item.inputs, window=4)
    ids = item.inputs.input_ids[:, : cache.positions]
    probabilities = _probabilities(llama, ids)
    full = _full_cache(llama.model, ids)
    P, H, K = cache.positions, 4, 2
    group = H // K
    for layer, attention in enumerate(probabilities):
        keys = full.layers[layer].keys[0].double()
        values = full.layers[layer].values[0].double()
        for kv in range(K):
            heads = range(kv * group, (kv + 1) * group)
            for j in range(P):
                h2o = sum(float(attention[h, i, j]) for h in heads for i in range(P)) / group
                got = SCORERS["h2o"].score(cache)[layer, kv, j]
                assert float(got) == pytest.approx(h2o, rel=1e-5)
                vatp = h2o * float(values[kv, j].abs().sum())
                assert float(SCORERS["vatp"].score(cache)[layer, kv, j]) == pytest.approx(
                    vatp, rel=1e-5
                )
                knorm = -float(torch.sqrt((keys[kv, j] ** 2).sum()))
                assert float(SCORERS["knorm"].score(cache)[layer, kv, j]) == pytest.approx(
                    knorm, rel=1e-5
                )
                caote = 0.0
                for h in heads:
                    alpha = float(attention[h, P - 1, j])
                    output = sum(attention[h, P - 1, m] * values[kv, m] for m in range(P))
                    distance = float(torch.sqrt(((values[kv, j] - output) ** 2).sum()))
                    caote += alpha / (1 - alpha) * distance / group
                assert float(SCORERS["caote"].score(cache)[layer, kv, j]) == pytest.approx(
                    caote, rel=1e-4
                )
                tova = sum(float(attention[h, P - 1, j]) for h in range(H)) / H
                assert float(SCORERS["tova"].score(cache)[layer, kv, j]) == pytest.approx(
                    tova, rel=1e-5
                )


def test_snapkv_pools_the_window_and_keeps_it(llama, item):
    window, kernel = 3, 3
    cache = prefill(llama, item.inputs, window=window)
    P = cache.positions
    attention = _probabilities(llama, item.inputs.input_ids[:, :P])[1]
    scores = snapkv(cache, window=window, kernel=kernel)
    summed = [
        [sum(float(attention[h, i, j]) for h in (2, 3) for i in range(P - window, P)) / 2]
        for j in range(P)
    ]
    for j in range(P - window):
        # average pooling over kernel positions, the zero padding counted
        pooled = sum(summed[m][0] for m in range(j - 1, j + 2) if 0 <= m < P) / kernel
        assert float(scores[1, 1, j]) == pytest.approx(pooled, rel=1e-5)
    assert torch.isinf(scores[:, :, P - window :]).all()
    with pytest.raises(InvalidParameterError, match="window"):
        snapkv(cache, window=8)  # wider than the prefill kept


def test_scissorhands_counts_queries_at_or_above_their_uniform_share(llama):
    inputs, _ = answer_request(llama, f"{PROMPT} {PROMPT} {PROMPT}", answer=" all")
    cache = prefill(llama, inputs)
    P = cache.positions
    assert P > 40  # beyond the 32-query history window
    attention = _probabilities(llama, inputs.input_ids[:, :P])[1]
    scores = SCORERS["scissorhands"].score(cache)
    history = range(P - 32, P)
    for j in range(P - 32):
        counted = sum(1 for h in (0, 1) for i in history if attention[h, i, j] >= 1 / (i + 1))
        assert float(scores[1, 0, j]) == counted / 2
    assert torch.isinf(scores[:, :, P - 32 :]).all()  # the recent tokens stay


def test_streaming_llm_keeps_sinks_and_the_recent_window(llama, item):
    cache = prefill(llama, item.inputs)
    scores = SCORERS["streaming_llm"].score(cache)
    C = cache.context
    for ratio in (1.0, 0.5, 0.3):
        kept = kept_masks(cache, scores, ratio, "kv_entry")
        k = round(ratio * C)
        expected = [j < min(4, k) or j >= C - (k - min(4, k)) for j in range(C)]
        assert kept[0, 0, :C].tolist() == expected
    assert kept_masks(cache, scores, 1.0, "kv_entry").all()  # a window covering the prompt


def test_budgets_uniform_and_pyramid():
    assert layer_budgets(3, 20, 0.5, "uniform").tolist() == [10, 10, 10]
    pyramid = layer_budgets(4, 100, 0.4, "pyramid")
    assert pyramid[0] > pyramid[-1] and pyramid[-1] == 2  # 40 / β, β = 20
    assert abs(int(pyramid.sum()) - 160) <= 2  # the mean budget, to rounding
    with pytest.raises(InvalidParameterError):
        layer_budgets(3, 20, 0.5, "global")


def test_ties_keep_the_later_position(llama, item):
    cache = prefill(llama, item.inputs)
    flat = torch.zeros(cache.context, dtype=torch.float64)
    kept = kept_masks(cache, flat, 0.25, "kv_position")
    count = round(0.25 * cache.context)
    assert kept[0, 0, : cache.context].nonzero().ravel().tolist() == list(
        range(cache.context - count, cache.context)
    )


def test_a_planted_token_is_found_and_every_scorer_is_judged(llama):
    """Only one token has an embedding: the model's next token rests on it alone."""
    adapter = copy.deepcopy(llama)
    planted = int(adapter.preprocess(PROMPT).input_ids[0, 5])
    with torch.no_grad():
        embeddings = adapter.model.get_input_embeddings().weight
        keep = embeddings[planted].clone() * 10
        embeddings.zero_()
        embeddings[planted] = keep
    inputs, target = answer_request(adapter, PROMPT)  # its own next token, held as the answer
    study = eviction_study(
        adapter,
        [EvictionItem(inputs, target)],
        ["exact_loo", "h2o", "streaming_llm", "atp_kv"],
        unit="kv_position",
        ratios=(1.0, 0.8, 0.5, 0.2),
        draws=5,
    )
    cache = prefill(adapter, inputs)
    alone = keep_all(cache, cache.context).clone()
    alone[torch.arange(cache.context), :, :, torch.arange(cache.context)] = False
    log_probs = F.log_softmax(evicted_logits(adapter, cache, alone).double(), -1)
    answer = log_probs[:, -1, cache.answer[-1]]
    assert int(answer.argmin()) == 5  # the exact effect is largest at the planted token
    statuses = {(v.check.split(":")[1], v.check.split(":")[2]) for v in study.curves.verdicts}
    assert statuses == {
        (s, m) for s in ("exact_loo", "h2o", "streaming_llm", "atp_kv") for m in EVICTION_METRICS
    }
    areas = study.curves.scores.set_index(["order", "metric"])
    # keeping the planted token to the last, the exact order is as good as the luckiest draw
    exact, drawn = areas.loc[("exact_loo", "log_prob")], areas.loc[("random", "log_prob")]
    assert exact["auc"] >= drawn["high"] - 1e-9 and exact["auc"] > drawn["auc"]
    assert set(study.agreement["scorer"]) == {"h2o", "streaming_llm", "atp_kv"}


def test_the_prompt_is_prefilled_once_per_item(llama, item):
    """Every point of every curve is an answer forward: token positions counted at the embedding."""
    seen: list[int] = []
    handle = llama.model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _o: seen.append(int(args[0].numel()))
    )
    try:
        study = eviction_study(llama, [item], ["h2o", "knorm"], ratios=(1.0, 0.5, 0.1), draws=5)
    finally:
        handle.remove()
    prompt = item.inputs.input_ids.shape[1] - item.inputs.answer_length - 1
    steps = item.inputs.answer_length
    assert seen.count(prompt) == 1  # the one prefill
    answer_rows = sum(n // steps for n in seen if n != prompt)
    assert sum(seen) == prompt + answer_rows * steps
    assert study.forward_passes == 1 + answer_rows
    assert answer_rows <= eviction_rows([study.context[0]], 2, 3, draws=5)


def test_by_position_sums_layers_and_heads_with_kept_entries_at_the_top():
    scores = torch.tensor([[[1.0, 2.0, torch.inf]], [[3.0, 0.0, 1.0]]])
    np.testing.assert_allclose(by_position(scores), [4.0, 2.0, 5.0])


def test_bad_requests_are_refused(llama, item):
    with pytest.raises(InvalidParameterError, match="unknown eviction scorer"):
        eviction_study(llama, [item], ["nope"])
    with pytest.raises(InvalidParameterError, match="keep ratios"):
        eviction_study(llama, [item], ["h2o"], ratios=(0.5, 0.2))
    with pytest.raises(InvalidParameterError, match="split"):
        eviction_study(llama, [item], ["h2o"], split="global")
    with pytest.raises(InvalidParameterError, match="unit"):
        eviction_study(llama, [item], ["h2o"], unit="head")


def test_the_full_cache_row_reads_the_answer_as_a_plain_forward_does(llama, item):
    study = eviction_study(llama, [item], ["knorm"], ratios=(1.0, 0.5), draws=2)
    ids = item.inputs.input_ids
    steps = item.inputs.answer_length
    with torch.no_grad():
        log_probs = F.log_softmax(llama.model(input_ids=ids).logits[0].double(), -1)
    rows = range(ids.shape[1] - steps - 1, ids.shape[1] - 1)
    answer = ids[0, -steps:]
    expected = sum(float(log_probs[r, t]) for r, t in zip(rows, answer, strict=True))
    greedy = all(int(log_probs[r].argmax()) == int(t) for r, t in zip(rows, answer, strict=True))
    assert study.full["log_prob"] == pytest.approx(expected, abs=1e-4)
    assert study.full["exact_match"] == float(greedy)
    curve = study.curves.curves
    at_full = curve[(curve.removed == 0) & (curve.metric == "kl")]["value"]
    assert np.allclose(at_full, 0.0, atol=1e-9)  # the full cache is its own reference


def test_long_contexts_take_their_exact_effects_in_spans(llama, item):
    assert exact_spans(5) == [(i, i + 1) for i in range(5)]
    assert exact_spans(1030)[:2] == [(0, 3), (3, 6)] and exact_spans(1030)[-1] == (1029, 1030)
    assert exact_spans(7, span=3) == [(0, 3), (3, 6), (6, 7)]
    spans = eviction_study(llama, [item], ["h2o"], ratios=(1.0, 0.5), draws=2, span=4)
    tokens = eviction_study(llama, [item], ["h2o"], ratios=(1.0, 0.5), draws=2, span=1)
    # the same scorer, judged against 4-token spans rather than single tokens
    assert spans.agreement.loc[0, "spearman"] != tokens.agreement.loc[0, "spearman"]
    curves_only = eviction_study(llama, [item], ["h2o"], ratios=(1.0, 0.5), draws=2, span=0)
    assert curves_only.agreement.empty
    assert curves_only.forward_passes < tokens.forward_passes - item.inputs.input_ids.shape[1] // 2
    with pytest.raises(InvalidParameterError, match="exact_loo"):
        eviction_study(llama, [item], ["exact_loo"], span=0)


def test_the_views_show_each_token_kept_or_evicted(llama, item):
    import json

    study = eviction_study(
        llama, [item], ["h2o", "knorm"], unit="kv_position", ratios=(1.0, 0.5, 0.25), draws=2
    )
    view = study.views[0]
    context = study.context[0]
    assert view["tokens"] == item.inputs.token_texts[:context]
    assert len(view["exact"]) == context and len(view["scores"]["h2o"]) == context
    for name in ("h2o", "knorm"):
        for ratio, kept in zip(study.ratios, view["kept"][name], strict=True):
            assert set(kept) <= {0.0, 1.0} and sum(kept) == round(ratio * context)
        # the kept half is the half the scorer ranks highest
        half = np.array(view["kept"][name][1], dtype=bool)
        scores = np.array(view["scores"][name])
        assert scores[half].min() >= scores[~half].max()
    json.dumps(study.to_dict(), allow_nan=False)
    entries = eviction_study(llama, [item], ["h2o"], ratios=(1.0, 0.5), draws=2)
    shares = np.array(entries.views[0]["kept"]["h2o"][1])
    # per layer and head: each keeps half of its own entries, so half of all entries stay
    assert shares.mean() == pytest.approx(round(0.5 * context) / context)


def test_solved_only_judges_the_items_the_full_cache_answers(llama, item):
    own_inputs, own_target = answer_request(llama, PROMPT)  # the model's own next token: solved
    solved = EvictionItem(own_inputs, own_target, label="own")
    study = eviction_study(
        llama, [item, solved], ["h2o"], ratios=(1.0, 0.5), draws=2, solved_only=True
    )
    assert [v["full"]["exact_match"] for v in study.views] == [False, True]
    assert [v["judged"] for v in study.views] == [False, True] and study.items == 1
    assert study.full["exact_match"] == 1.0 and study.views[1]["label"] == "own"
    with pytest.raises(InvalidInputError, match="none of the items"):
        eviction_study(llama, [item], ["h2o"], ratios=(1.0, 0.5), solved_only=True)


def test_unsolved_items_are_shown_without_scores(llama, item):
    own_inputs, own_target = answer_request(llama, PROMPT)
    study = eviction_study(
        llama,
        [item, EvictionItem(own_inputs, own_target)],
        ["h2o"],
        ratios=(1.0, 0.5),
        draws=2,
        solved_only=True,
    )
    assert study.views[0]["scores"] == {} and study.views[0]["kept"] == {}
    assert set(study.views[1]["scores"]) == {"h2o"}


def test_atp_is_the_derivative_at_each_entry_attention_logit(llama, item):
    """AtP's score is d log p(answer) / d (the entry's attention logit), by central differences."""
    adapter = llama
    cache = prefill(adapter, item.inputs)
    study = eviction_study(adapter, [item], ["atp_kv"], ratios=(1.0, 0.5), draws=2)
    atp = np.array(study.views[0]["scores"]["atp_kv"])  # summed over layers and heads

    def answer_log_prob(bias: torch.Tensor) -> float:
        logits = evicted_logits(adapter, cache, keep_all(cache, 1), bias)
        log_probs = F.log_softmax(logits.double(), -1)[0]
        return float(log_probs[torch.arange(len(cache.answer)), cache.answer].sum())

    step = 2e-2  # the attention's softmax runs in float32: a step it resolves
    for position in range(cache.context):
        bias = torch.zeros(keep_all(cache, 1).shape, dtype=torch.float64)
        bias[..., position] = step  # every layer and head: the sum of their derivatives
        slope = (answer_log_prob(bias) - answer_log_prob(-bias)) / (2 * step)
        assert atp[position] == pytest.approx(slope, rel=2e-2, abs=2e-6)
