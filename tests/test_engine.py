"""The importance engine: a unit kind and an estimator registered here run through the study."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import gradio as gr
import numpy as np
import pytest
import torch
from _model_state import model_state
from fastapi import FastAPI
from fastapi.testclient import TestClient
from scipy.stats import spearmanr

from attrlab.app import cli
from attrlab.app.api import build_router, install_error_handlers
from attrlab.app.ui.patching import patching_view
from attrlab.app.ui.runner import PageRunner
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.engine import (
    ESTIMATORS,
    UNIT_KINDS,
    Estimator,
    Evidence,
    Site,
    UnitKind,
    register_estimator,
    register_unit_kind,
    removal_agreement,
    unit_kind,
)
from attrlab.attribution.engine.study import pruning_study
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.layers import analyze_layers
from attrlab.attribution.layers.analysis import ModelParts
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.request.answers import answer_request

TEXTS = (
    "when mary and john went to the store john gave a drink to",
    "then john and mary went home and john said hi to",
)


@contextmanager
def _zero_mlps(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> Iterator[None]:
    """Each row's blocks run with their MLP branch's output zeroed, in that row only."""
    handles = []
    try:
        for layer, mlp in enumerate(ModelParts.of(adapter).mlps):
            chosen = [r for r, row in enumerate(rows) if any(s.layer == layer for s in row)]
            if chosen:

                def zero(_m, _args, out, chosen=chosen):
                    out = out.clone()
                    out[chosen] = 0
                    return out

                handles.append(mlp.register_forward_hook(zero))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _mlp_sites(adapter: Adapter, _inputs: Inputs | None) -> list[Site]:
    return [Site("mlp", layer=b) for b in range(adapter.num_layers)]


def _mlp_relevance(evidence: Evidence) -> np.ndarray | None:
    rows = evidence.analysis[evidence.analysis["measure"] == "lrp_mlp"]
    return np.abs(rows.sort_values("layer")["value"].to_numpy(dtype=float))


@pytest.fixture
def mlp_kind():
    """A toy unit kind (each block's MLP branch, zeroed) and a toy estimator of it."""
    kind = register_unit_kind(
        UnitKind("mlp", "a block's MLP branch", _mlp_sites, {"zero": _zero_mlps})
    )
    estimator = register_estimator(
        Estimator(
            "mlp_lrp", "mlp", "|LRP relevance| of the MLP", "a test", _mlp_relevance, ("lrp",)
        )
    )
    yield kind, estimator
    del UNIT_KINDS["mlp"], ESTIMATORS["mlp_lrp"]


@pytest.fixture(scope="module")
def gpt2(load_model):
    return load_model("tiny-random-gpt2")


@pytest.fixture(scope="module")
def items(gpt2):
    return [answer_request(gpt2, text, answer=" mary", contrast=" john") for text in TEXTS]


def _log_prob(adapter: DecoderLMAdapter, items) -> float:
    """The mean log p(target) over ``items``, computed by the model as it is."""
    found = []
    for inputs, target in items:
        kwargs = inputs.model_kwargs()
        with torch.no_grad():
            logits = adapter.model(**kwargs).logits
        found.append(float(target.log_probability(target.from_logits(adapter, logits, kwargs))[0]))
    return float(np.mean(found))


def _without_mlp(adapter: DecoderLMAdapter, layer: int) -> DecoderLMAdapter:
    """A copy whose block ``layer`` has an MLP that outputs zeros (its last layer zeroed)."""
    model = copy.deepcopy(adapter.model)
    with torch.no_grad():
        model.transformer.h[layer].mlp.c_proj.weight.zero_()
        model.transformer.h[layer].mlp.c_proj.bias.zero_()
    return DecoderLMAdapter(model, adapter.tokenizer, "pruned", add_special_tokens=False)


def _without_head(adapter: DecoderLMAdapter, layer: int, head: int) -> DecoderLMAdapter:
    """A copy whose output projection ignores one head (its rows of the weight zeroed)."""
    model = copy.deepcopy(adapter.model)
    width = model.config.n_embd // model.config.n_head
    with torch.no_grad():  # GPT-2's Conv1D weight is (input, output)
        model.transformer.h[layer].attn.c_proj.weight[head * width : (head + 1) * width] = 0
    return DecoderLMAdapter(model, adapter.tokenizer, "pruned", add_special_tokens=False)


def test_a_registered_unit_kind_runs_through_the_study_and_the_agreement(gpt2, items, mlp_kind):
    inputs, target = items[0]
    before = model_state(gpt2.model)
    study = pruning_study(gpt2, inputs, target, items=items, units=["mlp"], draws=2)
    assert model_state(gpt2.model) == before
    assert list(study.curves()) == ["mlp"]
    curves = study.curves()["mlp"]
    # its estimator ranks the MLPs by their relevance in the layer analysis, computed alone
    table = analyze_layers(gpt2, inputs, target, ["lrp"])
    relevance = table[table["measure"] == "lrp_mlp"].sort_values("layer")["value"].abs()
    order = list(np.argsort(relevance.to_numpy(), kind="stable"))
    assert curves.orders == {"mlp_lrp": order}
    # removing the least relevant MLP is the model with that MLP's output zeroed by hand
    curve = curves.curves.set_index(["order", "removed", "metric"])["value"]
    plain = _log_prob(gpt2, items)
    assert curve["mlp_lrp", 0, "log_prob"] == pytest.approx(plain, abs=1e-5)
    assert curve["mlp_lrp", 1, "log_prob"] == pytest.approx(
        _log_prob(_without_mlp(gpt2, order[0]), items), abs=1e-5
    )
    # the agreement removes each MLP alone: its effect is the hand-zeroed model's drop
    agreement = removal_agreement(gpt2, items, "mlp", {"mlp_lrp": relevance.to_numpy()})
    drops = [plain - _log_prob(_without_mlp(gpt2, b), items) for b in range(gpt2.num_layers)]
    np.testing.assert_allclose(agreement.effects["effect"], drops, atol=1e-5)
    assert list(agreement.effects["site"]) == list(range(gpt2.num_layers))
    assert model_state(gpt2.model) == before


def test_agreement_with_removing_each_head_alone(gpt2, items):
    heads = gpt2.num_layers * gpt2.num_heads
    scores = np.linspace(1.0, 2.0, heads)[::-1]  # the first head most important
    found = removal_agreement(gpt2, items, "head", {"first_most": scores}, top_k=3)
    plain = _log_prob(gpt2, items)
    drops = np.array(
        [
            plain - _log_prob(_without_head(gpt2, *divmod(u, gpt2.num_heads)), items)
            for u in range(heads)
        ]
    )
    np.testing.assert_allclose(found.effects["effect"], drops, atol=1e-5)
    assert list(found.effects["site"]) == [list(divmod(u, gpt2.num_heads)) for u in range(heads)]
    row = found.table.set_index("estimator").loc["first_most"]
    assert row["spearman"] == pytest.approx(spearmanr(scores, np.abs(drops))[0])
    top = set(np.argsort(-np.abs(drops), kind="stable")[:3])
    assert row["top_k_overlap"] == pytest.approx(len(top & {0, 1, 2}) / 3)
    assert (row["sites"], row["k"]) == (heads, 3)


def test_a_removal_undoes_its_hooks_on_error_and_bad_names_are_refused(gpt2, items):
    before = model_state(gpt2.model)
    for name in ("layer", "head"):
        kind = unit_kind(name)
        sites = kind.sites(gpt2)
        with pytest.raises(RuntimeError, match="inside"), kind.removal()(gpt2, [sites[:1]]):
            assert model_state(gpt2.model) != before
            raise RuntimeError("inside")
        assert model_state(gpt2.model) == before
    with pytest.raises(InvalidParameterError, match="unit is one of layer, head"):
        unit_kind("no_such_unit")
    with pytest.raises(InvalidParameterError, match="a layer is removed by skip"):
        unit_kind("layer").removal("zero")
    with pytest.raises(InvalidParameterError, match="one score per head"):
        removal_agreement(gpt2, items, "head", {"short": [1.0]})
    with pytest.raises(InvalidParameterError, match="top_k is at least 1"):
        removal_agreement(gpt2, items, "head", {}, top_k=0)
    with pytest.raises(InvalidParameterError, match="at least one input"):
        removal_agreement(gpt2, [], "head", {})
    with pytest.raises(ValueError, match="registered already"):
        register_unit_kind(unit_kind("layer"))


def test_a_registered_unit_kind_appears_in_every_front_end(mlp_kind, capsys):
    # the CLI's listing
    assert cli.main(["units", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    mlp = next(entry for entry in listed if entry["name"] == "mlp")
    assert (mlp["removals"], [e["name"] for e in mlp["estimators"]]) == (["zero"], ["mlp_lrp"])
    assert cli.main(["units"]) == 0
    assert "mlp_lrp" in capsys.readouterr().out
    # REST: the listing, and the prune body's unit choices in the schema
    worker = ExplainWorker(device="cpu")
    app = FastAPI()
    app.include_router(build_router(worker))
    install_error_handlers(app)
    with TestClient(app) as client:
        assert "mlp" in [entry["name"] for entry in client.get("/api/v1/units").json()]
        schema = client.get("/openapi.json").json()["components"]["schemas"]["PruneBody"]
        choices = schema["properties"]["units"]["anyOf"][0]["items"]["enum"]
        assert choices == ["layer", "head", "neuron", "channel", "expert", "mlp"]
        body = {"model": "tiny-random-gpt2", "text": TEXTS[0], "next_token": True}
        pruned = client.post("/api/v1/prune", json={**body, "texts": [TEXTS[1]], "units": ["mlp"]})
        assert pruned.status_code == 200, pruned.text
        assert list(pruned.json()["mlp"]["orders"]) == ["mlp_lrp"]
        refused = client.post("/api/v1/prune", json={**body, "units": ["no_such_unit"]})
        assert refused.status_code == 422
        message = refused.json()["error"]["message"]
        assert "units are one or more of layer, head, neuron, channel, expert, mlp" in message
    # the page's unit choices
    with gr.Blocks() as page:
        patching_view(PageRunner(worker))
    units = next(b for b in page.blocks.values() if b.elem_id == "pruning-units")
    assert [value for _, value in units.choices] == [
        "layer",
        "head",
        "neuron",
        "channel",
        "expert",
        "mlp",
    ]
    worker.close()
