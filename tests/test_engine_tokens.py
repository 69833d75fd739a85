"""Input tokens as an engine unit kind, and the input-attribution methods as its estimators."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from _model_state import model_state

from attrlab.app import cli
from attrlab.attribution.engine import (
    ESTIMATORS,
    Evidence,
    model_unit_kinds,
    removal_agreement,
    scores_of,
    unit_kind,
)
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.explain import explain
from attrlab.attribution.request.answers import answer_request

PROMPT = "when mary and john went to the store john gave a drink to"


def _logits(adapter, kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return adapter.logits(**kwargs)


def test_the_token_sites_are_the_tokens_a_perturbation_may_hide(load_model):
    gpt2, bert = load_model("tiny-random-gpt2"), load_model("tiny-random-bert")
    inputs, _ = answer_request(gpt2, PROMPT, answer=" mary")
    prompt_length = len(gpt2.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    assert int(inputs.input_ids.shape[1]) > prompt_length  # the answer follows the prompt
    found = [s.name() for s in unit_kind("token").sites(gpt2, inputs)]
    assert found == list(range(prompt_length))  # the answer's tokens stay
    encoded = bert.preprocess("a fine day at the beach")
    length = int(encoded.input_ids.shape[1])
    found = [s.name() for s in unit_kind("token").sites(bert, encoded)]
    assert found == list(range(1, length - 1))  # [CLS] and [SEP] stay
    with pytest.raises(InvalidInputError, match="token of a text input"):
        unit_kind("token").sites(bert)
    assert "token" not in model_unit_kinds()


@pytest.mark.parametrize("alias", ["tiny-random-gpt2", "tiny-random-bert"])
def test_hiding_tokens_is_running_with_their_ids_replaced(load_model, alias):
    adapter = load_model(alias)
    inputs = adapter.preprocess("a fine day at the beach")
    sites = unit_kind("token").sites(adapter, inputs)
    rows = [[sites[0]], [sites[1], sites[3]]]
    kwargs = {k: v.repeat(2, 1) for k, v in inputs.model_kwargs().items()}
    for kind, fill in (("mask", adapter.mask_token_id), ("pad", adapter.pad_token_id)):
        ids = kwargs["input_ids"].clone()
        for r, row in enumerate(rows):
            ids[r, [s.position for s in row]] = fill
        expected = _logits(adapter, {**kwargs, "input_ids": ids})
        with unit_kind("token").removal(kind)(adapter, rows):
            found = _logits(adapter, kwargs)
        assert torch.equal(found, expected)
        assert not torch.equal(found, _logits(adapter, kwargs))


def test_hiding_tokens_leaves_the_model_as_it_was_after_an_error(load_model):
    adapter = load_model("tiny-random-gpt2")
    inputs = adapter.preprocess(PROMPT)
    kwargs = inputs.model_kwargs()
    before, logits = model_state(adapter.model), _logits(adapter, kwargs)
    sites = unit_kind("token").sites(adapter, inputs)[:2]
    last = adapter.model.transformer.h[-1]

    def fail(*_):
        raise RuntimeError("forced mid-forward")

    for kind in ("mask", "pad"):
        handle = last.register_forward_hook(fail)
        try:
            with (
                pytest.raises(RuntimeError, match="forced"),
                unit_kind("token").removal(kind)(adapter, [sites]),
            ):
                _logits(adapter, kwargs)
        finally:
            handle.remove()
        assert model_state(adapter.model) == before
        assert torch.equal(_logits(adapter, kwargs), logits)


def test_the_text_attribution_methods_are_the_token_kinds_estimators(capsys):
    assert cli.main(["units", "--format", "json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    names = {e["name"] for e in listed["token"]["estimators"]}
    assert {"occlusion", "integrated_gradients", "attnlrp", "gradient_x_input"} <= names
    assert "gradcam" not in names and "layers" not in names  # image only; an analysis
    assert listed["token"]["removals"] == ["mask", "pad"]
    assert {e["reads"] for e in listed["token"]["estimators"]} == {"maps"}
    assert ESTIMATORS["integrated_gradients"].source == "https://arxiv.org/abs/1703.01365"


def test_a_maps_token_scores_meet_the_exact_effect_of_hiding_each_token(load_model):
    adapter = load_model("tiny-random-gpt2")
    inputs, target = answer_request(adapter, PROMPT, answer=" mary")
    maps = {m: explain(adapter, m, inputs, target).scores for m in ("gradient_x_input", "rise")}
    evidence = Evidence(adapter, target, pd.DataFrame(), maps=maps, inputs=inputs)
    scores = scores_of(evidence, "token")
    positions = [s.position for s in unit_kind("token").sites(adapter, inputs)]
    assert list(scores) == list(maps)
    for name, values in maps.items():
        assert np.array_equal(scores[name], np.abs(np.asarray(values, dtype=float)[positions]))
    found = removal_agreement(adapter, [(inputs, target)], "token", scores, top_k=3)
    assert list(found.table["estimator"]) == list(maps)
    # the exact effect of hiding token 3: log p(answer) drop with its id the mask token's
    kwargs = inputs.model_kwargs()
    ids = kwargs["input_ids"].clone()
    ids[0, 3] = adapter.mask_token_id
    with torch.no_grad():
        plain = float(target.log_probability(target.outputs(adapter, **kwargs))[0])
        hidden = target.outputs(adapter, **{**kwargs, "input_ids": ids})
    effect = plain - float(target.log_probability(hidden)[0])
    assert found.effects["effect"][positions.index(3)] == pytest.approx(effect, abs=1e-9)
