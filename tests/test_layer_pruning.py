"""Layer pruning curves, checked against models with the blocks taken out by hand."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from _model_state import model_state
from torch import nn

from attrlab.attribution.engine import (
    Evidence,
    pruning_curves,
    residual_patching_ranking,
    scores_of,
)
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.layers import analyze_layers
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.patching import patched_score, patching_problem, patching_report
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.verdicts import against_random

TEXTS = (
    "when mary and john went to the store john gave a drink to",
    "then john and mary went home and john said hi to",
)


@pytest.fixture(scope="module")
def gpt2(load_model):
    return load_model("tiny-random-gpt2")


@pytest.fixture(scope="module")
def items(gpt2):
    return [answer_request(gpt2, text, answer=" mary", contrast=" john") for text in TEXTS]


def _without(adapter: DecoderLMAdapter, removed: list[int]) -> DecoderLMAdapter:
    """A copy of the model with the ``removed`` blocks deleted from its list of blocks."""
    model = copy.deepcopy(adapter.model)
    blocks = model.transformer.h
    model.transformer.h = nn.ModuleList([b for i, b in enumerate(blocks) if i not in removed])
    return DecoderLMAdapter(model, adapter.tokenizer, "pruned", add_special_tokens=False)


def _measured(adapter: DecoderLMAdapter, items) -> tuple[float, list[int], float]:
    """Mean log p(target), each item's top-1 token where it is read, mean next-token loss."""
    log_probs, tops, losses = [], [], []
    for inputs, target in items:
        kwargs = inputs.model_kwargs()
        with torch.no_grad():
            logits = adapter.model(**kwargs).logits
        outputs = target.from_logits(adapter, logits, kwargs)
        log_probs.append(float(target.log_probability(outputs)[0]))
        read = logits.shape[1] - 1 - inputs.answer_length
        tops.append(int(logits[0, read].argmax()))
        ids = kwargs["input_ids"][0]
        losses.append(float(F.cross_entropy(logits[0, :-1].double(), ids[1:])))
    return float(np.mean(log_probs)), tops, float(np.mean(losses))


def test_curves_match_the_model_with_those_layers_removed(gpt2, items):
    rankings = {"first_least": [0.0, 1.0], "last_least": [1.0, 0.0]}
    before = model_state(gpt2.model)
    found = pruning_curves(gpt2, items, rankings, draws=2, max_removed=1)
    assert model_state(gpt2.model) == before
    curve = found.curves.set_index(["order", "removed", "metric"])["value"]
    plain_log_prob, plain_tops, plain_loss = _measured(gpt2, items)
    for order, removed in (("first_least", [0]), ("last_least", [1])):
        assert found.orders[order][0] == removed[0]
        assert curve[order, 0, "log_prob"] == pytest.approx(plain_log_prob, abs=1e-5)
        assert curve[order, 0, "top1_agreement"] == 1.0
        assert curve[order, 0, "next_token_loss"] == pytest.approx(plain_loss, abs=1e-5)
        log_prob, tops, loss = _measured(_without(gpt2, removed), items)
        assert curve[order, 1, "log_prob"] == pytest.approx(log_prob, abs=1e-5)
        agreement = np.mean([a == b for a, b in zip(tops, plain_tops, strict=True)])
        assert curve[order, 1, "top1_agreement"] == pytest.approx(agreement)
        assert curve[order, 1, "next_token_loss"] == pytest.approx(loss, abs=1e-5)
        area = found.scores.set_index(["order", "metric"])["auc"][order, "log_prob"]
        assert area == pytest.approx((plain_log_prob + log_prob) / 2, abs=1e-5)
    assert set(found.scores["order"]) == {"first_least", "last_least", "random"}


def test_random_orders_follow_the_seed_and_bad_rankings_are_refused(gpt2, items):
    def random_curve(seed: int):
        found = pruning_curves(gpt2, items[:1], {}, draws=3, settings=RunSettings(seed=seed))
        return found.curves

    assert random_curve(3).equals(random_curve(3))
    for bad in ({"short": [1.0]}, {"gap": [1.0, float("nan")]}, {"random": [0.0, 1.0]}):
        with pytest.raises(InvalidParameterError, match="one number per layer"):
            pruning_curves(gpt2, items, bad)
    with pytest.raises(InvalidParameterError, match="max_removed"):
        pruning_curves(gpt2, items, {}, max_removed=2)


def test_rankings_from_the_layer_table_and_from_residual_patching(gpt2, items):
    inputs, target = items[0]
    table = analyze_layers(gpt2, inputs, target, ["block_influence", "skip", "lrp", "logit_lens"])
    rankings = scores_of(Evidence(gpt2, target, table), "layer")
    assert set(rankings) == {"block_influence", "skip", "lrp", "logit_lens"}
    skip = table[table["measure"] == "skip_logprob"].sort_values("layer")["value"].abs()
    np.testing.assert_allclose(rankings["skip"], skip.to_numpy())
    problem = patching_problem(
        gpt2,
        TEXTS[0],
        TEXTS[0].replace("store john", "store mary"),
        answer=" mary",
        contrast=" john",
    )
    report = patching_report(gpt2, problem, ["exact"], ["residual"], ["denoising"])
    read_at = len(problem.clean.token_texts) - 2
    ranking = residual_patching_ranking(report.table, gpt2.num_layers, read_at)
    at_read = [patched_score(gpt2, problem, "residual", layer, (read_at,)) for layer in (0, 1)]
    np.testing.assert_allclose(ranking, np.abs(np.diff([*at_read, 1.0])), atol=1e-9)


def _without_heads(adapter: DecoderLMAdapter, heads: list[tuple[int, int]]) -> DecoderLMAdapter:
    """A copy of the model whose output projections ignore the ``heads`` (their rows zeroed)."""
    model = copy.deepcopy(adapter.model)
    width = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        for layer, head in heads:  # GPT-2's Conv1D weight is (input, output)
            model.transformer.h[layer].attn.c_proj.weight[head * width : (head + 1) * width] = 0
    return DecoderLMAdapter(model, adapter.tokenizer, "pruned", add_special_tokens=False)


def test_head_curves_match_the_model_with_those_heads_taken_out(gpt2, items):
    units = gpt2.num_layers * gpt2.num_heads
    ranking = np.arange(units, dtype=float)[::-1]  # the last head is the least important
    before = model_state(gpt2.model)
    found = pruning_curves(gpt2, items, {"last_least": ranking}, draws=2, unit="head", step=3)
    assert model_state(gpt2.model) == before
    curve = found.curves.set_index(["order", "removed", "metric"])["value"]
    # k = 0, then every 3rd count up to half the heads, which is always measured
    half = units // 2
    assert sorted(set(found.curves["removed"])) == sorted({*range(0, half + 1, 3), half})
    plain = _measured(gpt2, items)
    for k in sorted(set(found.curves["removed"])):
        order = [divmod(u, gpt2.num_heads) for u in range(units - 1, units - 1 - k, -1)]
        assert found.orders["last_least"][:k] == [list(pair) for pair in order]
        log_prob, tops, loss = _measured(_without_heads(gpt2, order), items)
        assert curve["last_least", k, "log_prob"] == pytest.approx(log_prob, abs=1e-5)
        agreement = np.mean([a == b for a, b in zip(tops, plain[1], strict=True)])
        assert curve["last_least", k, "top1_agreement"] == pytest.approx(agreement)
        assert curve["last_least", k, "next_token_loss"] == pytest.approx(loss, abs=1e-5)
    assert curve["random", 0, "log_prob"] == pytest.approx(plain[0], abs=1e-5)


@pytest.mark.parametrize("unit", ["layer", "head"])
def test_curves_over_ten_inputs_are_the_mean_of_ten_single_runs(gpt2, unit):
    words = ("mary", "john", "the", "store", "gave", "a", "drink", "to", "went", "and")
    texts = [" ".join(words[i:] + words[:i]) for i in range(10)]
    ten = [answer_request(gpt2, text, answer=" mary") for text in texts]
    rankings = {
        "first_least": np.arange(gpt2.num_layers * (gpt2.num_heads if unit == "head" else 1))
    }
    settings = RunSettings(seed=5)
    shape = {"draws": 2, "settings": settings, "unit": unit, "step": 2 if unit == "head" else 1}
    together = pruning_curves(gpt2, ten, rankings, **shape).curves
    singles = [pruning_curves(gpt2, [item], rankings, **shape) for item in ten]
    mean = np.mean([single.curves["value"].to_numpy() for single in singles], axis=0)
    np.testing.assert_allclose(together["value"].to_numpy(), mean, atol=1e-9)


def test_the_random_band_is_the_draws_spread_and_rankings_are_judged_against_their_areas(
    gpt2, items
):
    units = gpt2.num_layers * gpt2.num_heads
    found = pruning_curves(
        gpt2, items, {"ours": np.arange(units)}, 3, None, RunSettings(seed=7), "head"
    )
    # the same draws as rankings of their own: a permutation p ranks unit p[i] i-th
    rng = np.random.default_rng(7)
    drawn = {}
    for d in range(3):
        importance = np.empty(units)
        importance[rng.permutation(units)] = np.arange(units)
        drawn[f"draw{d}"] = importance
    alone = pruning_curves(gpt2, items, drawn, draws=2, unit="head")
    curves = alone.curves.set_index(["order", "metric", "removed"])["value"]
    band = found.curves[found.curves["order"] == "random"].set_index(["metric", "removed"])
    for (metric, k), row in band.iterrows():
        values = np.array([curves[f"draw{d}", metric, k] for d in range(3)])
        assert row["value"] == pytest.approx(values.mean(), abs=1e-9)
        assert row["std"] == pytest.approx(values.std(ddof=1), abs=1e-9)
        assert (row["low"], row["high"]) == pytest.approx((values.min(), values.max()), abs=1e-9)
    scores = found.scores.set_index(["order", "metric"])
    verdicts = {v.check: v for v in found.verdicts}
    for metric in ("log_prob", "top1_agreement", "next_token_loss"):
        ks = np.array(sorted(set(band.loc[metric].index)), dtype=float)

        def area(
            order: str, table: pd.Series = curves, metric: str = metric, ks: np.ndarray = ks
        ) -> float:
            ys = np.array([table[order, metric, int(k)] for k in ks])
            return float(np.sum((ys[1:] + ys[:-1]) / 2 * np.diff(ks)) / ks[-1])

        areas = np.array([area(f"draw{d}") for d in range(3)])
        random = scores.loc["random", metric]
        assert random["auc"] == pytest.approx(areas.mean(), abs=1e-9)
        assert random["std"] == pytest.approx(areas.std(ddof=1), abs=1e-9)
        assert (random["low"], random["high"]) == pytest.approx((areas.min(), areas.max()))
        ours = found.curves.set_index(["order", "metric", "removed"])["value"]
        assert scores.loc["ours", metric]["auc"] == pytest.approx(area("ours", ours), abs=1e-9)
        higher = metric != "next_token_loss"
        expected, _, _ = against_random("x", area("ours", ours), areas, higher)
        assert scores.loc["ours", metric]["status"] == expected.status
        assert verdicts[f"head_pruning:ours:{metric}"].status == expected.status
