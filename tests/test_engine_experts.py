"""
Experts of mixture-of-experts models: sites, removals and estimators against references.

Tiny random Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE built from their transformers configs
(fused 3-D expert weights, as transformers 5 keeps them; no MoE weights can be fetched here).
Removing an expert must change the output where a token chose it (a fused checkpoint is not
silently untouched); zeroing equals zeroing its weights; rerouting equals a router that never
offers it; the routing frequency and REAP are recomputed here from the router's choices and
the expert's weights written out.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as tf

from attrlab.attribution.engine import (
    Evidence,
    Site,
    check_unit_kinds,
    engine_catalog,
    pruning_study,
    removal_agreement,
    scores_of,
    unit_kind,
)
from attrlab.attribution.engine.experts import expert_statistics, moe_layers
from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.models.builtin import _minilm_tokenizer
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.request.target import resolve_target

TEXTS = ["The cat sat on the mat", "A bird in the hand is worth two"]
EXPERTS, TOP_K = 4, 2


def _config(family: str, **extra: object) -> tf.PretrainedConfig:
    sizes = {
        "vocab_size": _minilm_tokenizer().vocab_size,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts_per_tok": TOP_K,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": 0,
        "attn_implementation": "eager",
    }
    if family == "mixtral":
        return tf.MixtralConfig(**sizes, num_local_experts=EXPERTS, **extra)
    moe = {"num_experts": EXPERTS, "moe_intermediate_size": 24, **extra}
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(**sizes, shared_expert_intermediate_size=24, **moe)
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(**sizes, head_dim=8, **moe)
    return tf.OlmoeConfig(**sizes, **moe)


def _adapter(family: str, **extra: object) -> DecoderLMAdapter:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(_config(family, **extra)).eval()
    return DecoderLMAdapter(model, _minilm_tokenizer(), f"tiny-{family}", add_special_tokens=False)


FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]


@pytest.fixture(scope="module", params=FAMILIES)
def moe(request):
    return _adapter(request.param)


def _items(adapter):
    found = []
    for text in TEXTS:
        inputs = adapter.preprocess(text)
        with torch.no_grad():
            logits = adapter.logits(**inputs.model_kwargs())[0]
        found.append((inputs, resolve_target(adapter, None, logits)))
    return found


def _routing(adapter, inputs) -> list[torch.Tensor]:
    """Each block's top-k experts per token, read from the routers' own outputs."""
    seen: list[torch.Tensor] = []
    handles = [
        r.register_forward_hook(lambda _m, _a, out: seen.append(out[2].detach()))
        for r in moe_layers(adapter).routers
    ]
    try:
        with torch.no_grad():
            adapter.logits(**inputs.model_kwargs())
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_sites_and_listing(moe):
    with pytest.raises(UnsupportedMethodError, match="the expert kind"):
        check_unit_kinds(["neuron"], moe)
    sites = unit_kind("expert").sites(moe)
    assert [s.name() for s in sites] == [[b, e] for b in range(2) for e in range(EXPERTS)]
    kinds = {k["name"]: k for k in engine_catalog()}
    assert kinds["expert"]["removals"] == ["reroute", "zero"]


@pytest.mark.parametrize("how", ["reroute", "zero"])
def test_removing_a_chosen_expert_changes_the_output_and_undoes(moe, how):
    inputs = moe.preprocess(TEXTS[1])
    kwargs = inputs.model_kwargs()
    routing = _routing(moe, inputs)
    chosen = int(routing[1][-1, 0])  # the last token's first choice in block 1
    before = {k: v.clone() for k, v in moe.model.state_dict().items()}
    with torch.no_grad():
        plain = moe.logits(**kwargs)
        with unit_kind("expert").removal(how)(moe, [[Site("expert", layer=1, expert=chosen)]]):
            removed = moe.logits(**kwargs)
        again = moe.logits(**kwargs)
    assert not torch.allclose(plain, removed, atol=1e-6)
    torch.testing.assert_close(plain, again, rtol=0, atol=0)
    site = [[Site("expert", layer=0, expert=0)]]
    with pytest.raises(RuntimeError, match="forced"), unit_kind("expert").removal(how)(moe, site):
        raise RuntimeError("forced")
    after = moe.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_zeroing_equals_zeroing_the_experts_weights(moe):
    inputs = moe.preprocess(TEXTS[0])
    copied = copy.deepcopy(moe)
    with torch.no_grad():
        moe_layers(copied).experts[0].down_proj[2] = 0.0
        reference = copied.logits(**inputs.model_kwargs())
        with unit_kind("expert").removal("zero")(moe, [[Site("expert", layer=0, expert=2)]]):
            removed = moe.logits(**inputs.model_kwargs())
    torch.testing.assert_close(removed, reference, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_rerouting_equals_a_router_that_never_offers_the_expert(family):
    """Where top-k weights are renormalised, a -inf router logit is the same removal."""
    adapter = _adapter(family, **({} if family == "mixtral" else {"norm_topk_prob": True}))
    inputs = adapter.preprocess(TEXTS[1])
    copied = copy.deepcopy(adapter)
    router = moe_layers(copied).routers[1]
    original = router.forward
    pushed_down = torch.zeros(EXPERTS)
    pushed_down[3] = -1e9

    def never_three(hidden: torch.Tensor) -> tuple:
        logits, _, _ = original(hidden)
        probabilities = torch.softmax((logits + pushed_down).float(), -1)
        values, chosen = torch.topk(probabilities, TOP_K, -1)
        return logits, values / values.sum(-1, keepdim=True), chosen

    router.forward = never_three
    with torch.no_grad():
        reference = copied.logits(**inputs.model_kwargs())
        with unit_kind("expert").removal("reroute")(adapter, [[Site("expert", layer=1, expert=3)]]):
            removed = adapter.logits(**inputs.model_kwargs())
    torch.testing.assert_close(removed, reference, rtol=0, atol=1e-5)


def test_frequency_and_reap_against_the_routers_choices_and_the_weights():
    adapter = _adapter("mixtral")
    items = _items(adapter)
    statistics = expert_statistics(adapter, items, ("target",))
    layers = moe_layers(adapter)
    counts = torch.zeros(2, EXPERTS, dtype=torch.float64)
    reap = torch.zeros(2, EXPERTS, dtype=torch.float64)
    tokens = 0
    for inputs, _ in items:
        seen: list[tuple] = []
        handles = [
            e.register_forward_pre_hook(lambda _m, args, seen=seen: seen.append(args))
            for e in layers.experts
        ]
        try:
            with torch.no_grad():
                adapter.logits(**inputs.model_kwargs())
        finally:
            for handle in handles:
                handle.remove()
        for b, (hidden, index, weights) in enumerate(seen):  # the expert written out
            experts = layers.experts[b]
            for token in range(hidden.shape[0]):
                for slot in range(TOP_K):
                    e = int(index[token, slot])
                    gate_up = experts.gate_up_proj[e].detach()
                    gate, up = (hidden[token] @ gate_up.T).chunk(2)
                    out = (torch.nn.functional.silu(gate) * up) @ experts.down_proj[e].detach().T
                    counts[b, e] += 1
                    reap[b, e] += float(weights[token, slot]) * float(out.norm())
        tokens += seen[0][0].shape[0]
    np.testing.assert_allclose(torch.stack(statistics.frequency).numpy(), counts / tokens)
    expected = (reap / counts.clamp_min(1)).numpy()
    np.testing.assert_allclose(torch.stack(statistics.reap).numpy(), expected, rtol=1e-5)


def test_a_study_of_experts_with_agreement(moe):
    items = _items(moe)
    inputs = moe.preprocess("The capital of France is")
    study = pruning_study(moe, inputs, None, texts=TEXTS, units=["expert"], draws=5, agreement=True)
    orders = set(study.score_table()["order"])
    assert {"routing_frequency", "router_weight", "reap", "gate_taylor"} <= orders
    effects = study.agreements["expert"].effects
    assert len(effects) == 2 * EXPERTS
    # an expert no token of the texts chooses cannot matter when zeroed
    statistics = expert_statistics(moe, items)
    evidence = Evidence(moe, items[0][1], None, statistics={"expert": statistics})
    frequency = scores_of(evidence, "expert")["routing_frequency"]
    zeroed = removal_agreement(moe, items, "expert", {"f": frequency}, removal="zero")
    unused = np.flatnonzero(frequency == 0)
    assert np.all(zeroed.effects["effect"].to_numpy()[unused] == 0.0)
    assert np.any(zeroed.effects["effect"].to_numpy() != 0.0)


def test_an_expert_the_model_lacks_is_refused(moe):
    site = [[Site("expert", layer=0, expert=EXPERTS)]]
    with pytest.raises(InvalidParameterError, match="not one of this model's experts"):
        unit_kind("expert").removal()(moe, site).__enter__()


class _Expert(torch.nn.Module):
    """One Mixtral expert as transformers 4 kept it: its own gate, up and down projections."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        super().__init__()
        gate, up = gate_up.chunk(2)
        self.w1 = torch.nn.Linear(gate.shape[1], gate.shape[0], bias=False)
        self.w3 = torch.nn.Linear(up.shape[1], up.shape[0], bias=False)
        self.w2 = torch.nn.Linear(down.shape[1], down.shape[0], bias=False)
        with torch.no_grad():
            self.w1.weight.copy_(gate)
            self.w3.weight.copy_(up)
            self.w2.weight.copy_(down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class _ListMixture(torch.nn.Module):
    """Mixtral's mixture with a linear router and a module list, weights from a fused one."""

    def __init__(self, fused: torch.nn.Module) -> None:
        super().__init__()
        router, experts = fused.gate, fused.experts
        self.top_k = router.top_k
        self.gate = torch.nn.Linear(router.weight.shape[1], router.weight.shape[0], bias=False)
        with torch.no_grad():
            self.gate.weight.copy_(router.weight)
        self.experts = torch.nn.ModuleList(
            _Expert(experts.gate_up_proj[e].detach(), experts.down_proj[e].detach())
            for e in range(router.weight.shape[0])
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.reshape(-1, hidden.shape[-1])
        probabilities = torch.softmax(self.gate(x).float(), -1)
        weights, chosen = torch.topk(probabilities, self.top_k, -1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(hidden.shape)


def test_per_expert_module_lists_score_and_reroute_as_the_fused_weights_do():
    fused = _adapter("mixtral")
    listed = copy.deepcopy(fused)
    for layer in listed.model.model.layers:
        layer.mlp = _ListMixture(layer.mlp)
    items = _items(fused)
    inputs = items[1][0]
    with torch.no_grad():
        torch.testing.assert_close(
            listed.logits(**inputs.model_kwargs()), fused.logits(**inputs.model_kwargs())
        )
    one, other = (expert_statistics(a, items, ("target",)) for a in (fused, listed))
    for name in ("frequency", "weight", "reap"):
        np.testing.assert_allclose(
            torch.stack(getattr(one, name)).numpy(),
            torch.stack(getattr(other, name)).numpy(),
            rtol=1e-5,
            atol=1e-8,
        )
    np.testing.assert_allclose(
        torch.stack(one.first_order["target"]).numpy(),
        torch.stack(other.first_order["target"]).numpy(),
        rtol=1e-4,
        atol=1e-8,
    )
    site = [[Site("expert", layer=1, expert=1)]]
    with torch.no_grad():
        with unit_kind("expert").removal("reroute")(fused, site):
            expected = fused.logits(**inputs.model_kwargs())
        with unit_kind("expert").removal("reroute")(listed, site):
            found = listed.logits(**inputs.model_kwargs())
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(UnsupportedMethodError, match="reroute its tokens instead"):
        unit_kind("expert").removal("zero")(listed, site).__enter__()


def test_a_fresh_process_lists_every_built_in_kind_and_estimator():
    """Listings see every kind whatever was imported before (the registry imports them all)."""
    import subprocess
    import sys

    code = (
        "from attrlab.attribution.engine import ESTIMATORS, model_unit_kinds\n"
        "print(model_unit_kinds(), 'reap' in ESTIMATORS, 'wanda' in ESTIMATORS)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip().splitlines()[-1] == (
        "['layer', 'head', 'neuron', 'channel', 'expert'] True True"
    )
