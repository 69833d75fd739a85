"""The patching sites as engine unit kinds, their removals, and the patching estimators."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
import torch
from _model_state import model_state
from scipy.stats import spearmanr

from attrlab.app import cli
from attrlab.attribution import patching
from attrlab.attribution.engine import (
    COMPONENT_KINDS,
    ESTIMATORS,
    Evidence,
    Site,
    engine_catalog,
    model_unit_kinds,
    removal_agreement,
    scores_of,
    shared_sites,
    unit_kind,
)
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.layers.analysis import ModelParts
from attrlab.attribution.patching import patching_problem, patching_report
from attrlab.attribution.patching.hooks import recorded
from attrlab.attribution.request.run import RunSettings

CLEAN = "when mary and john went to the store john gave a drink to"
CORRUPTED = "when mary and john went to the store mary gave a drink to"
POSITIONAL = ("residual_position", "attention_position", "mlp_position", "head_position")
PATCHING = ("exact", "atp", "atp_star", "relp")
MODELS = ("tiny-random-gpt2", "tiny-random-llama")


def _modules(adapter, layer: int):
    """``(block, MLP, attention output projection)`` of ``layer``, found by hand per family."""
    model = adapter.model
    if hasattr(model, "transformer"):  # GPT-2
        block = model.transformer.h[layer]
        return block, block.mlp, block.attn.c_proj
    block = model.model.layers[layer]  # LLaMA
    return block, block.mlp, block.self_attn.o_proj


def _logits(adapter, text: str, rows: int = 1) -> torch.Tensor:
    kwargs = adapter.preprocess(text).model_kwargs()
    kwargs = {k: v.repeat(rows, *[1] * (v.dim() - 1)) for k, v in kwargs.items()}
    with torch.no_grad():
        return adapter.model(**kwargs).logits


@contextmanager
def _hooked(module, hook, pre: bool = False) -> Iterator[None]:
    handle = (
        module.register_forward_pre_hook(hook, with_kwargs=True)
        if pre
        else module.register_forward_hook(hook)
    )
    try:
        yield
    finally:
        handle.remove()


def _block_input_replaced(position: int, values: torch.Tensor):
    """A block pre-hook writing ``values`` ``(1, D)`` into the hidden state at ``position``."""

    def hook(_m, args, kwargs):
        if args:
            hidden = args[0].clone()
            hidden[:, position] = values
            return (hidden, *args[1:]), kwargs
        hidden = kwargs["hidden_states"].clone()
        hidden[:, position] = values
        return args, {**kwargs, "hidden_states": hidden}

    return hook


@pytest.mark.parametrize("alias", MODELS)
def test_the_patching_sites_are_unit_kinds_listed_from_the_input(load_model, alias):
    adapter = load_model(alias)
    inputs = adapter.preprocess(CLEAN)
    length, layers = int(inputs.input_ids.shape[1]), adapter.num_layers
    heads = adapter.model.config.num_attention_heads
    for name in ("residual_position", "attention_position", "mlp_position"):
        found = [s.name() for s in unit_kind(name).sites(adapter, inputs)]
        assert found == [[b, p] for b in range(layers) for p in range(length)]
    found = [s.name() for s in unit_kind("head_position").sites(adapter, inputs)]
    assert found == [[b, h, p] for b in range(layers) for h in range(heads) for p in range(length)]
    # the model's own kinds keep their forms, input or not
    assert [s.name() for s in unit_kind("layer").sites(adapter, inputs)] == list(range(layers))
    assert [s.name() for s in unit_kind("head").sites(adapter)] == [
        [b, h] for b in range(layers) for h in range(heads)
    ]
    assert model_unit_kinds() == ["layer", "head", "neuron", "channel", "expert"]
    with pytest.raises(InvalidInputError, match="token position of a text input"):
        unit_kind("residual_position").sites(adapter)
    shorter = adapter.preprocess("mary gave john a")
    with pytest.raises(InvalidInputError, match="same token length"):
        shared_sites(adapter, "mlp_position", [inputs, shorter])
    assert shared_sites(adapter, "head", [inputs, shorter]) == unit_kind("head").sites(adapter)


@pytest.mark.parametrize("alias", MODELS)
def test_patching_a_residual_site_is_the_hidden_state_replaced_by_hand(load_model, alias):
    adapter = load_model(alias)
    layer, position = 1, 10  # where the two prompts differ
    corrupted = adapter.preprocess(CORRUPTED).model_kwargs()
    with torch.no_grad():
        source = adapter.model(**corrupted, output_hidden_states=True).hidden_states[layer]
    block, _, _ = _modules(adapter, layer)
    with _hooked(block, _block_input_replaced(position, source[:, position]), pre=True):
        expected = _logits(adapter, CLEAN)
    site = Site("residual_position", layer=layer, position=position)
    patch = unit_kind("residual_position").patched({("residual", layer): source})
    with patch(adapter, [[site]]):
        found = _logits(adapter, CLEAN)
    assert torch.equal(found, expected)
    assert not torch.equal(found, _logits(adapter, CLEAN))  # the patch changed something


@pytest.mark.parametrize("alias", MODELS)
def test_patching_a_head_writes_the_other_runs_head_output_by_hand(load_model, alias):
    adapter = load_model(alias)
    heads = adapter.model.config.num_attention_heads
    _, _, projection = _modules(adapter, 0)
    seen = []

    def keep(_m, args, kwargs):
        seen.append(args[0].detach().clone())

    with _hooked(projection, keep, pre=True):
        _logits(adapter, CORRUPTED)
    (source,) = seen
    width = source.shape[-1] // heads
    part = slice(width, 2 * width)  # head 1, every position

    def write(_m, args, kwargs):
        x = args[0].clone()
        x[..., part] = source[..., part]
        return (x, *args[1:]), kwargs

    with _hooked(projection, write, pre=True):
        expected = _logits(adapter, CLEAN)
    patch = unit_kind("head").patched({("head", 0): source})
    with patch(adapter, [[Site("head", layer=0, head=1)]]):
        found = _logits(adapter, CLEAN)
    assert torch.equal(found, expected)
    assert not torch.equal(found, _logits(adapter, CLEAN))


def test_exact_patching_matches_a_residual_patched_by_hand(load_model):
    adapter = load_model("tiny-random-gpt2")
    problem = patching_problem(adapter, CLEAN, CORRUPTED, answer=" mary", contrast=" john")
    report = patching_report(adapter, problem, ["exact"], ["residual"], ["denoising"])
    clean = problem.clean.model_kwargs()
    with torch.no_grad():
        hidden = adapter.model(**clean, output_hidden_states=True).hidden_states
    target = problem.target
    for layer, position in ((0, 10), (1, 10), (1, 3)):
        block, _, _ = _modules(adapter, layer)
        hook = _block_input_replaced(position, hidden[layer][:, position])
        with _hooked(block, hook, pre=True), torch.no_grad():
            corrupted = problem.corrupted.model_kwargs()
            expected = float(target.score(target.outputs(adapter, **corrupted))[0])
        table = report.table
        row = table[(table["layer"] == layer) & (table["position"] == position)]
        assert float(row["patched"].iloc[0]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("alias", MODELS)
def test_zero_and_mean_removals_match_hooks_written_by_hand(load_model, alias):
    adapter = load_model(alias)
    inputs = adapter.preprocess(CLEAN)
    heads = adapter.model.config.num_attention_heads
    # an MLP output zeroed at one position
    _, mlp, _ = _modules(adapter, 0)

    def zero_at_4(_m, _a, out):
        out = out.clone()
        out[:, 4] = 0
        return out

    with _hooked(mlp, zero_at_4):
        expected = _logits(adapter, CLEAN)
    site = Site("mlp_position", layer=0, position=4)
    with unit_kind("mlp_position").removal("zero")(adapter, [[site]]):
        assert torch.equal(_logits(adapter, CLEAN), expected)
    # a head's output at one position set to its mean over the positions
    _, _, projection = _modules(adapter, 1)
    width = projection.weight.shape[1 if alias.endswith("llama") else 0] // heads

    def mean_of_head_1_at_2(_m, args, kwargs):
        x = args[0].clone()
        part = x[..., width : 2 * width]
        x[:, 2, width : 2 * width] = part.mean(1)
        return (x, *args[1:]), kwargs

    with _hooked(projection, mean_of_head_1_at_2, pre=True):
        expected = _logits(adapter, CLEAN)
    site = Site("head_position", layer=1, head=1, position=2)
    with unit_kind("head_position").removal("mean")(adapter, [[site]]):
        found = _logits(adapter, CLEAN)
    torch.testing.assert_close(found, expected)  # the same mean, summed in another order
    assert not torch.allclose(found, _logits(adapter, CLEAN))
    # two batch rows, each without its own attention output site, as each run alone
    sites = unit_kind("attention_position").sites(adapter, inputs)
    first, second = sites[3], sites[-2]
    alone = []
    for site in (first, second):
        with unit_kind("attention_position").removal("zero")(adapter, [[site]]):
            alone.append(_logits(adapter, CLEAN)[0])
    with unit_kind("attention_position").removal("zero")(adapter, [[first], [second]]):
        both = _logits(adapter, CLEAN, rows=2)
    torch.testing.assert_close(both, torch.stack(alone), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("alias", MODELS)
def test_every_removal_leaves_the_model_as_it_was_after_an_error(load_model, alias):
    adapter = load_model(alias)
    inputs = adapter.preprocess(CLEAN)
    before, logits = model_state(adapter.model), _logits(adapter, CLEAN)
    parts = ModelParts.of(adapter)
    with recorded(parts, list(COMPONENT_KINDS)) as source, torch.no_grad():
        adapter.model(**adapter.preprocess(CORRUPTED).model_kwargs())
    last, _, _ = _modules(adapter, adapter.num_layers - 1)

    def fail(*_):
        raise RuntimeError("forced mid-forward")

    for name in ("head", *POSITIONAL):
        kind = unit_kind(name)
        sites = kind.sites(adapter, inputs)[:3]
        removals = [kind.removal(r) for r in kind.removals] + [kind.patched(source)]
        assert len(removals) == len(kind.describe()["removals"])
        for remove in removals:
            with (
                pytest.raises(RuntimeError, match="forced"),
                remove(adapter, [sites]),
                _hooked(last, fail),
            ):
                _logits(adapter, CLEAN)
            assert model_state(adapter.model) == before
            assert torch.equal(_logits(adapter, CLEAN), logits)
    with pytest.raises(InvalidParameterError, match=r"UnitKind\.patched"):
        unit_kind("residual_position").removal("patch")
    with pytest.raises(InvalidParameterError, match="cannot be patched"):
        unit_kind("layer").patched(source)


def test_the_patching_estimators_are_the_engines(capsys):
    catalog = {entry["name"]: entry for entry in engine_catalog()}
    for name in ("head", *POSITIONAL):
        listed = {e["name"]: e for e in catalog[name]["estimators"]}
        assert set(PATCHING) <= set(listed)
        assert [listed[e]["exact"] for e in PATCHING] == [True, False, False, False]
        assert {listed[e]["removal"] for e in PATCHING} == {"patch"}
        assert [listed[e]["magnitude"] for e in PATCHING] == [False, False, True, False]
    for name in POSITIONAL:
        assert catalog[name]["removals"] == ["zero", "mean", "patch"]
        assert catalog[name]["positional"]
    assert catalog["head"]["removals"] == ["zero", "patch"]
    for name, author in zip(PATCHING, ("Meng", "Nanda", "Kramár", "Jafari"), strict=True):
        assert author in ESTIMATORS[name].source
    # patching's list is the registry's, not a second one
    assert list(patching.ESTIMATORS) == list(PATCHING)
    assert all(patching.ESTIMATORS[name] is ESTIMATORS[name] for name in PATCHING)
    assert cli.main(["units", "--format", "json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert [e["name"] for e in listed["residual_position"]["estimators"]] == list(PATCHING)
    assert cli.main(["units"]) == 0
    text = capsys.readouterr().out
    assert "residual_position: estimators" in text and "Jafari et al. 2025" in text


def test_a_reports_estimates_score_the_sites_and_meet_the_engines_agreement(load_model):
    adapter = load_model("tiny-random-gpt2")
    problem = patching_problem(adapter, CLEAN, CORRUPTED, answer=" mary", contrast=" john")
    report = patching_report(adapter, problem, settings=RunSettings(seed=0))
    evidence = Evidence(adapter, problem.target, pd.DataFrame(), report=report.table)
    scores = scores_of(evidence, "residual_position")
    assert list(scores) == list(PATCHING)
    table = report.table
    for name in PATCHING:
        rows = table[
            (table["estimator"] == name)
            & (table["direction"] == "denoising")
            & (table["component"] == "residual")
        ].sort_values(["layer", "position"])
        assert np.array_equal(scores[name], np.abs(rows["effect"].to_numpy(dtype=float)))
    # each residual site zeroed alone: the engine's agreement over a positional kind
    items = [(problem.clean, problem.target)]
    found = removal_agreement(adapter, items, "residual_position", scores, top_k=3)
    inputs, target = items[0]
    with torch.no_grad():
        outputs = target.outputs(adapter, **inputs.model_kwargs())
    plain = float(target.log_probability(outputs)[0])
    block, _, _ = _modules(adapter, 1)
    hidden = adapter.model.config.n_embd
    with _hooked(block, _block_input_replaced(10, torch.zeros(1, hidden)), pre=True):
        with torch.no_grad():
            outputs = target.outputs(adapter, **inputs.model_kwargs())
        zeroed = float(target.log_probability(outputs)[0])
    effects = found.effects.set_index(found.effects["site"].map(tuple))["effect"]
    assert effects[(1, 10)] == pytest.approx(plain - zeroed, abs=1e-9)
    rho = found.table.set_index("estimator")["spearman"]
    expected = spearmanr(scores["exact"], found.effects["effect"].abs())[0]
    assert rho["exact"] == pytest.approx(expected)
