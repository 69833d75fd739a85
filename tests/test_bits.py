"""Bits: the quantiser against a plain reference, the undo, the table, proxies and allocation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

import attrlab.attribution.bits.parts as parts_module
from attrlab.attribution.bits import (
    QuantCache,
    Scheme,
    fake_quantised,
    quantisable_parts,
    quantised,
)
from attrlab.attribution.bits.proxies import OUTLIER_K, proxy_scores
from attrlab.attribution.bits.sensitivity import (
    bundled_lm_texts,
    measure,
    read_texts,
    sensitivity_table,
    text_set,
)
from attrlab.attribution.bits.study import allocate, bits_parts, bits_study
from attrlab.attribution.errors import BudgetExceededError, InvalidInputError
from attrlab.attribution.request.run import RunContext, RunSettings

TEXTS = [
    "The river rose after the snow melted in the hills.",
    "She played the violin every evening for an hour.",
    "Bread, coffee and a short walk make a good morning.",
]


def rtn(weight: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Plain round-to-nearest, asymmetric, per group of ``group`` inputs (range holds zero)."""
    groups = weight.double().reshape(weight.shape[0], -1, group)
    low = groups.amin(-1, keepdim=True).clamp(max=0)
    high = groups.amax(-1, keepdim=True).clamp(min=0)
    top = 2**bits - 1
    scale = (high - low) / top
    zero = (-torch.round(low / scale)).clamp(0, top)
    codes = (torch.round(groups / scale) + zero).clamp(0, top)
    return ((codes - zero) * scale).reshape(weight.shape)


@pytest.fixture(scope="module")
def llama(load_model):
    return load_model("tiny-random-llama")


@pytest.fixture(scope="module")
def texts(llama):
    return text_set(llama, TEXTS)


def test_library_quantiser_equals_plain_round_to_nearest():
    weight = torch.randn(16, 96, generator=torch.Generator().manual_seed(0))
    for bits in (8, 4, 3, 2):
        found = fake_quantised(weight, Scheme(bits, 32)).double()
        expected = rtn(weight, bits, 32)
        assert torch.allclose(found, expected, atol=1e-6, rtol=0), bits
    # per channel: one group the width of the row
    assert torch.allclose(
        fake_quantised(weight, Scheme(8, None)).double(), rtn(weight, 8, 96), atol=1e-6, rtol=0
    )
    # 2 bits keep at most 4 values per group
    two = fake_quantised(weight, Scheme(2, 32)).reshape(16, 3, 32)
    assert max(len(torch.unique(g)) for g in two.reshape(-1, 32)) <= 4
    assert two.shape == (16, 3, 32)


def test_short_last_group_is_padded_with_zeros():
    weight = torch.randn(4, 40, generator=torch.Generator().manual_seed(1))
    found = fake_quantised(weight, Scheme(4, 32)).double()
    padded = torch.cat([weight, torch.zeros(4, 24)], 1)
    assert torch.allclose(found, rtn(padded, 4, 32)[:, :40], atol=1e-6, rtol=0)


def test_parts_cover_every_block_matrix(llama):
    parts = quantisable_parts(llama)
    layers = llama.model.config.num_hidden_layers
    kinds = [p.kind for p in parts]
    assert kinds.count("attention") == kinds.count("mlp") == layers
    assert kinds.count("projection") == 7 * layers  # q, k, v, o, gate, up, down
    for layer in range(layers):
        branches = [p for p in parts if p.layer == layer and p.kind in ("attention", "mlp")]
        projections = [p for p in parts if p.layer == layer and p.kind == "projection"]
        assert sorted(m for p in branches for m in p.modules) == sorted(
            m for p in projections for m in p.modules
        )
    head = next(p for p in parts if p.kind == "head")
    assert head.modules == ("lm_head",)
    assert head.parameters == llama.model.lm_head.weight.numel()


def test_sixteen_bits_leave_the_loss(llama, texts):
    everything = {p: Scheme(16, None) for p in quantisable_parts(llama, ["attention", "mlp"])}
    cache = QuantCache(llama.model)
    with quantised(llama.model, everything, cache):
        found = measure(llama, texts, RunContext())
        held = [
            torch.equal(llama.model.get_submodule(m).weight, cache.weight(m, Scheme(16, None)))
            for p in everything
            for m in p.modules
        ]
    assert all(held)  # inside, the weights are the quantised copies
    assert abs(found.loss - texts.base.loss) < 1e-5


def test_weights_bit_identical_after_an_error(llama, texts):
    model = llama.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    parts = quantisable_parts(llama)
    block = llama.blocks()[1]
    hooks = dict(block._forward_hooks)  # transformers' own, where an earlier run installed them

    def fail(*_args):
        raise RuntimeError("forced")

    handle = block.register_forward_hook(fail)
    try:
        with (
            pytest.raises(RuntimeError, match="forced"),
            quantised(model, {p: Scheme(2) for p in parts}, QuantCache(model)),
        ):
            assert not torch.equal(model.lm_head.weight, before["lm_head.weight"])
            model(**texts.inputs[0].model_kwargs())
    finally:
        handle.remove()
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name]), name
        assert parameter.data_ptr() == pointers[name], name
    assert dict(block._forward_hooks) == hooks


def test_table_entries_against_hand_quantisation(llama, texts):
    part = next(p for p in quantisable_parts(llama, ["mlp"]) if p.layer == 1)
    scheme = Scheme(3, 16)
    table = sensitivity_table(llama, texts, [part], [scheme], QuantCache(llama.model), RunContext())
    row = table.iloc[0]
    model = llama.model
    originals = {m: model.get_submodule(m).weight.detach().clone() for m in part.modules}

    def losses() -> tuple[list[torch.Tensor], float]:
        log_probs, total, count = [], 0.0, 0
        with torch.no_grad():
            for text in TEXTS:
                ids = llama.preprocess(text).model_kwargs()["input_ids"]
                logits = model(input_ids=ids).logits[0].float()
                log_probs.append(torch.log_softmax(logits, -1))
                total += float(F.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum"))
                count += ids.shape[1] - 1
        return log_probs, total / count

    plain, plain_loss = losses()
    try:
        with torch.no_grad():
            for m, weight in originals.items():
                model.get_submodule(m).weight.copy_(rtn(weight, 3, 16).float())
        rounded, rounded_loss = losses()
    finally:
        with torch.no_grad():
            for m, weight in originals.items():
                model.get_submodule(m).weight.copy_(weight)
    targets = [int(p[-1].argmax()) for p in plain]
    log_prob = np.mean(
        [float(r[-1, t] - p[-1, t]) for r, p, t in zip(rounded, plain, targets, strict=True)]
    )
    kl = sum(float((p.exp() * (p - r)).sum()) for p, r in zip(plain, rounded, strict=True))
    kl /= sum(len(p) for p in plain)
    assert row["loss"] == pytest.approx(rounded_loss, abs=1e-5)
    assert row["loss_change"] == pytest.approx(rounded_loss - plain_loss, abs=1e-5)
    assert row["log_prob_change"] == pytest.approx(log_prob, abs=1e-5)
    assert row["kl"] == pytest.approx(kl, abs=1e-6)
    assert row["kl"] > 0


def test_proxies_against_their_formulas(llama, texts):
    parts = quantisable_parts(llama, ["attention", "mlp"])
    table = proxy_scores(llama, texts, parts, RunContext())
    score = table.set_index(["part", "proxy"])["score"]
    mlp = parts[1]
    weights = np.concatenate(
        [llama.model.get_submodule(m).weight.detach().numpy().ravel() for m in mlp.modules]
    ).astype(np.float64)
    assert score[mlp.name, "kurtosis"] == pytest.approx(stats.kurtosis(weights, fisher=False))
    std = weights.std()
    outliers = int((np.abs(weights - weights.mean()) > OUTLIER_K * std).sum())
    assert score[mlp.name, "outliers"] == outliers
    # Block Influence of block 0: from the model's own hidden states
    influence = []
    with torch.no_grad():
        for item in texts.inputs:
            hidden = llama.model(**item.model_kwargs(), output_hidden_states=True).hidden_states
            influence.append(1 - F.cosine_similarity(hidden[0][0], hidden[1][0], dim=-1))
    assert score[parts[0].name, "block_influence"] == pytest.approx(
        float(torch.cat(influence).mean()), rel=1e-5
    )
    # Fisher: the mean squared gradient of each text's loss, summed over the MLP's weights
    fisher = 0.0
    for item in texts.inputs:
        llama.model.zero_grad()
        ids = item.model_kwargs()["input_ids"]
        logits = llama.model(input_ids=ids).logits[0]
        F.cross_entropy(logits[:-1], ids[0, 1:]).backward()
        fisher += sum(
            float((llama.model.get_submodule(m).weight.grad ** 2).sum()) for m in mlp.modules
        )
    llama.model.zero_grad()
    assert score[mlp.name, "fisher"] == pytest.approx(fisher / len(texts.inputs), rel=1e-4)


def test_allocation_gives_more_bits_to_higher_scores_within_budget():
    sizes = np.array([10, 10, 10, 10])
    bits = allocate(np.array([0.1, 0.9, 0.5, np.nan]), sizes, 3.0)
    assert bits.tolist() == [2, 4, 4, 2]  # between 2 and 4: half the weights at 4, by rank
    bits = allocate(np.array([0.1, 0.9, 0.5, 0.2]), np.array([50, 10, 10, 30]), 4.0)
    # between 3 and 4.0 < 8: 100 weight-bits spare, 50 for each small part raised to 8
    assert bits.tolist() == [3, 8, 8, 3]
    assert (bits * [50, 10, 10, 30]).sum() / 100 <= 4.0


def test_text_sets(tmp_path):
    bundled = bundled_lm_texts()
    assert len(bundled) >= 20
    assert sum(len(t.split()) for t in bundled) > 2000
    path = tmp_path / "texts.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS) + "\n")
    assert read_texts(path) == TEXTS
    path.write_text('{"words": "no text"}\n')
    with pytest.raises(InvalidInputError, match="line 1"):
        read_texts(path)


def test_study_is_priced_and_refused_before_it_runs(llama):
    dataset = [llama.preprocess(t) for t in TEXTS]
    parts = len(quantisable_parts(llama, ["attention", "mlp"]))
    planned = sum(rows for _, rows, _, _ in bits_parts(llama, dataset, parts, 4, 2, 5))
    with pytest.raises(BudgetExceededError):
        bits_study(
            llama,
            TEXTS,
            kinds=["attention", "mlp"],
            group_sizes=[16],
            draws=5,
            settings=RunSettings(max_forward_passes=planned - 1),
        )
    study = bits_study(llama, TEXTS, kinds=["attention", "mlp"], group_sizes=[16], draws=5)
    assert study.forward_passes <= planned
    assert study.entries == parts * 4
    assert len(study.table) == study.entries
    assert set(study.curves["allocation"]) >= {"uniform", "random", "fisher", "kurtosis"}
    random = study.curves[study.curves["allocation"] == "random"]
    assert (random["low"] <= random["value"]).all() and (random["value"] <= random["high"]).all()
    assert all(v.status in ("pass", "fail", "inconclusive") for v in study.verdicts.values())
    json.dumps(study.to_dict())
    assert math.isfinite(study.base_loss)


def test_a_classifier_is_measured_by_kl_on_its_classes(load_model):
    bert = load_model("tiny-random-bert")
    parts = quantisable_parts(bert)
    head = next(p for p in parts if p.kind == "head")
    assert any(m.endswith("classifier") for m in head.modules)
    study = bits_study(bert, TEXTS[:2], kinds=["mlp", "head"], bits=[8, 2], group_sizes=[16])
    assert study.measure == "kl" and math.isnan(study.base_loss)
    assert study.table["loss"].isna().all()
    assert (study.table["kl"] > -1e-7).all()  # a divergence: not below 0 but for rounding
    rounded_head = study.table[(study.table["part"] == "head") & (study.table["bits"] == 2)]
    assert float(rounded_head["kl"].iloc[0]) > 1e-6  # the classifier's own weights move its classes
    # one forward a text per entry, one prediction (a class) a text
    assert study.tokens == 2


def test_each_weight_is_quantised_once_per_scheme_and_each_entry_is_one_forward_a_text(
    llama, texts, monkeypatch
):
    calls: list[tuple[int, ...]] = []
    plain = parts_module.fake_quantised

    def counted(weight: torch.Tensor, scheme: Scheme) -> torch.Tensor:
        calls.append(tuple(weight.shape))
        return plain(weight, scheme)

    monkeypatch.setattr(parts_module, "fake_quantised", counted)
    parts = quantisable_parts(llama, ["attention", "projection"])  # a projection is in both
    schemes = [Scheme(4), Scheme(2)]
    forwards: list[int] = []
    handle = llama.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        table = sensitivity_table(
            llama, texts, parts, schemes, QuantCache(llama.model), RunContext()
        )
    finally:
        handle.remove()
    modules = {m for p in parts for m in p.modules}
    assert len(calls) == len(modules) * len(schemes)
    assert len(table) == len(parts) * len(schemes)
    assert len(forwards) == len(table) * len(texts.inputs)
