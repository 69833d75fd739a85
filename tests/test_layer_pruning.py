"""Layer pruning curves, checked against models with the blocks taken out by hand."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _model_state import model_state
from torch import nn

from attrlab.attribution.answers import answer_request
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.layers import analyze_layers
from attrlab.attribution.layers.pruning import (
    layer_rankings,
    pruning_curves,
    residual_patching_ranking,
)
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.patching import patched_score, patching_problem, patching_report
from attrlab.attribution.run import RunSettings

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
    rankings = layer_rankings(table, gpt2, target)
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
