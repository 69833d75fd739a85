"""
Layer and head analysis on models whose answer is known by construction.

Each test builds the situation it checks (one head carrying all the signal, a block that is
the identity, uniform attention) or recomputes the measure by hand (a head zeroed in the
weights, logit lens against the model's own output).
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from _tiny_families import BIASED, biased_family, classic_family, clip, dinov2
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.engine.recheck import joint_ablation, recheck_heads
from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.explanation import layer_table
from attrlab.attribution.layers import (
    HEAD_ESTIMATORS,
    DatasetItem,
    agreement,
    analyze,
    analyze_dataset,
    analyze_layers,
)
from attrlab.attribution.layers.analysis import _entropy_and_sink
from attrlab.attribution.layers.hooks import ablate_heads, block_io, gate_heads, skip_blocks
from attrlab.attribution.methods import get_method
from attrlab.attribution.models.layouts import find_module, layout_for
from attrlab.attribution.models.text import TextClassifierAdapter
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import output_target

TEXT = "the quick brown fox jumps over the lazy dog"
HEADS, KV_HEADS, LAYERS = 4, 2, 3


@pytest.fixture
def llama(load_model):
    """Tiny float64 LLaMA: 3 layers, 4 query heads over 2 key/value heads, biases on."""
    return classic_family(load_model("tiny-random-bert").tokenizer, "llama")


def _target(adapter, inputs) -> int:
    with torch.no_grad():
        return int(adapter.logits(**inputs.model_kwargs())[0].argmax())


def _blocks(adapter):
    return list(find_module(adapter.model, layout_for(adapter).blocks).children())


def _head_values(table, measure):
    rows = table[table.measure == measure]
    return {(int(r.layer), int(r.head)): r.value for r in rows.itertuples()}


def test_the_one_head_that_carries_the_signal_ranks_first_everywhere(llama):
    """All heads but (layer 1, head 2) write nothing: their output-projection columns are 0."""
    carrier, head_dim = (1, 2), 32 // HEADS
    with torch.no_grad():
        for layer, block in enumerate(_blocks(llama)):
            for head in range(HEADS):
                if (layer, head) != carrier:
                    block.self_attn.o_proj.weight[:, head * head_dim : (head + 1) * head_dim] = 0
    inputs = llama.preprocess(TEXT)
    table = analyze_layers(llama, inputs, output_target(llama, _target(llama, inputs)))
    for measure in HEAD_ESTIMATORS:
        values = _head_values(table, measure)
        ranked = sorted(values, key=lambda key: -abs(values[key]))
        assert ranked[0] == carrier, measure
        others = [abs(v) for key, v in values.items() if key != carrier]
        assert max(others) <= 1e-9 * abs(values[carrier]) + 1e-12, measure


def test_an_identity_block_has_no_influence_and_no_skip_effect(llama):
    block = _blocks(llama)[1]
    with torch.no_grad():  # both branches write zero: the block returns its input
        for linear in (block.self_attn.o_proj, block.mlp.down_proj):
            linear.weight.zero_()
            if linear.bias is not None:
                linear.bias.zero_()
    inputs = llama.preprocess(TEXT)
    table = analyze_layers(
        llama, inputs, output_target(llama, _target(llama, inputs)), ["block_influence", "skip"]
    )
    per_layer = {(r.measure, int(r.layer)): r.value for r in table.itertuples()}
    assert per_layer["block_influence", 1] == pytest.approx(0.0, abs=1e-12)
    assert per_layer["skip_logprob", 1] == pytest.approx(0.0, abs=1e-12)
    assert per_layer["skip_kl", 1] == pytest.approx(0.0, abs=1e-12)
    assert per_layer["block_influence", 0] > 1e-4 and abs(per_layer["skip_kl", 0]) > 1e-8


def test_logit_lens_at_the_last_layer_is_the_model_output(llama):
    inputs = llama.preprocess(TEXT)
    with torch.no_grad():
        probabilities = llama.logits(**inputs.model_kwargs())[0].double().softmax(-1)
    target = int(probabilities.argsort()[-3])  # the third most likely token: rank 3
    table = analyze_layers(llama, inputs, output_target(llama, target), ["logit_lens"])
    last = table[table.layer == LAYERS - 1].set_index("measure").value
    assert last["lens_probability"] == pytest.approx(float(probabilities[target]), rel=1e-9)
    assert last["lens_rank"] == 3


def test_entropy_of_uniform_attention_is_one_also_under_a_causal_mask():
    tokens = 6
    full = torch.full((1, tokens, tokens), 1.0 / tokens, dtype=torch.float64)
    causal = torch.tril(torch.ones(tokens, tokens, dtype=torch.float64))
    causal = (causal / causal.sum(-1, keepdim=True)).unsqueeze(0)
    visible = torch.ones(tokens, dtype=torch.bool)
    for attention in (full, causal):
        entropy, sink = _entropy_and_sink(attention, visible)
        assert float(entropy[0]) == pytest.approx(1.0, abs=1e-12)
    one_hot = torch.zeros(1, tokens, tokens, dtype=torch.float64)
    one_hot[..., 0] = 1.0  # everything on the first token: entropy 0, sink share 1
    entropy, sink = _entropy_and_sink(one_hot, visible)
    assert float(entropy[0]) == 0.0 and float(sink[0]) == 1.0


def test_entropy_counts_keys_any_head_sees_so_underflowed_weights_stay_visible():
    """Head 1 puts half its weight on each of the first two keys; the rest rounded to 0."""
    causal = torch.tril(torch.ones(4, 4, dtype=torch.float64))
    uniform = causal / causal.sum(-1, keepdim=True)
    halves = torch.zeros(4, 4, dtype=torch.float64)
    halves[0, 0] = 1.0
    halves[1:, :2] = 0.5  # in fp16 the small weights of keys 2 and 3 would read exactly 0
    entropy, _ = _entropy_and_sink(torch.stack([uniform, halves]), torch.ones(4, dtype=torch.bool))
    # queries 1..3 see 2, 3, 4 keys (query 0 sees one and is left out)
    expected = np.mean([np.log(2) / np.log(keys) for keys in (2, 3, 4)])
    assert float(entropy[1]) == pytest.approx(expected, abs=1e-12)
    assert float(entropy[0]) == pytest.approx(1.0, abs=1e-12)


def test_a_model_with_constant_scores_attends_uniformly(llama):
    """q and k projections zeroed: every causal query spreads evenly over what it sees."""
    with torch.no_grad():
        for block in _blocks(llama):
            for linear in (block.self_attn.q_proj, block.self_attn.k_proj):
                linear.weight.zero_()
                linear.bias.zero_()
    inputs = llama.preprocess(TEXT)
    table = analyze_layers(llama, inputs, output_target(llama, 0), ["entropy", "sink"])
    entropy = table[table.measure == "entropy"].value
    np.testing.assert_allclose(entropy, 1.0, atol=1e-12)
    tokens = inputs.input_ids.shape[1]  # query q sees q + 1 keys: mean of 1/(q+1)
    expected_sink = np.mean([1 / (q + 1) for q in range(tokens)])
    np.testing.assert_allclose(table[table.measure == "sink_share"].value, expected_sink)


def test_hook_ablation_equals_zeroing_the_heads_weights_by_hand(llama):
    inputs = llama.preprocess(TEXT)
    target = _target(llama, inputs)
    table = analyze_layers(llama, inputs, output_target(llama, target), ["ablation"])
    zeroed = _head_values(table, "ablation_zero")
    with torch.no_grad():
        before = float(llama.logits(**inputs.model_kwargs())[0, target])
    head_dim = 32 // HEADS
    for layer, head in [(0, 1), (2, 3)]:
        edited = copy.deepcopy(llama)
        projection = _blocks(edited)[layer].self_attn.o_proj
        with torch.no_grad():
            projection.weight[:, head * head_dim : (head + 1) * head_dim] = 0
            after = float(edited.logits(**inputs.model_kwargs())[0, target])
        assert zeroed[layer, head] == pytest.approx(after - before, rel=1e-9, abs=1e-12)


def test_mean_ablation_replaces_the_head_by_its_sequence_mean(llama):
    """By hand: the head's slice of the o_proj input set to its mean over positions."""
    inputs = llama.preprocess(TEXT)
    target = _target(llama, inputs)
    means = _head_values(
        analyze_layers(llama, inputs, output_target(llama, target), ["ablation"]), "ablation_mean"
    )
    head_dim, layer, head = 32 // HEADS, 1, 0
    projection = _blocks(llama)[layer].self_attn.o_proj

    def replace(_m, args):
        x = args[0].clone()
        part = x[..., head * head_dim : (head + 1) * head_dim]
        x[..., head * head_dim : (head + 1) * head_dim] = part.mean(dim=1, keepdim=True)
        return (x,)

    with torch.no_grad():
        before = float(llama.logits(**inputs.model_kwargs())[0, target])
        handle = projection.register_forward_pre_hook(replace)
        try:
            after = float(llama.logits(**inputs.model_kwargs())[0, target])
        finally:
            handle.remove()
    assert means[layer, head] == pytest.approx(after - before, rel=1e-9, abs=1e-12)


def test_grouped_query_heads_report_their_key_value_head(llama):
    inputs = llama.preprocess(TEXT)
    table = analyze_layers(llama, inputs, output_target(llama, _target(llama, inputs)))
    for measure in (*HEAD_ESTIMATORS, "entropy", "sink_share"):
        rows = table[table.measure == measure]
        assert len(rows) == LAYERS * HEADS
        for layer in range(LAYERS):
            per_layer = rows[rows.layer == layer].sort_values("head")
            assert per_layer["head"].tolist() == [0, 1, 2, 3]
            assert per_layer["kv_head"].tolist() == [0, 0, 1, 1]
    assert table[table["head"].isna()]["kv_head"].isna().all()


def test_head_relevance_adds_up_to_the_attention_branch(llama):
    """The output projection is linear (ε-rule): without its bias, the heads' relevance at its
    input sums to the branch's relevance at its output, measured on the other side of it."""
    with torch.no_grad():
        for block in _blocks(llama):
            block.self_attn.o_proj.bias.zero_()
    inputs = llama.preprocess(TEXT)
    table = analyze_layers(llama, inputs, output_target(llama, _target(llama, inputs)), ["lrp"])
    heads = table[table.measure == "head_lrp"].groupby("layer").value.sum()
    branch = table[table.measure == "lrp_attention"].set_index("layer").value
    assert branch.abs().max() > 1e-6  # the heads carry relevance
    np.testing.assert_allclose(heads.sort_index(), branch.sort_index(), rtol=1e-9, atol=1e-12)


def test_measures_are_checked(llama, load_model):
    inputs = llama.preprocess(TEXT)
    with pytest.raises(InvalidParameterError, match="unknown measure"):
        analyze_layers(llama, inputs, output_target(llama, 0), ["everything"])
    bert = load_model("tiny-random-bert")
    with pytest.raises(InvalidParameterError, match="decoder LMs"):
        analyze_layers(bert, bert.preprocess("a text"), output_target(bert, 0), ["logit_lens"])
    cnn = load_model("efficientnet-lite0")
    with pytest.raises(UnsupportedMethodError):
        analyze_layers(cnn, cnn.preprocess(np.zeros((32, 32, 3), np.uint8)), output_target(cnn, 0))


def _hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )


def test_every_hook_is_removed_when_the_pass_fails(llama):
    blocks = _blocks(llama)
    projections = [b.self_attn.o_proj for b in blocks]
    before = _hook_count(llama.model)
    contexts = [
        lambda: block_io(blocks),
        lambda: skip_blocks(blocks, range(len(blocks))),
        lambda: gate_heads(projections, [torch.ones(HEADS) for _ in blocks]),
        lambda: ablate_heads(projections[0], HEADS, [None, (0, "zero"), (1, "mean")]),
    ]
    for context in contexts:
        with pytest.raises(RuntimeError, match="boom"), context():
            assert _hook_count(llama.model) > before
            raise RuntimeError("boom")
        assert _hook_count(llama.model) == before


def test_skip_and_ablation_batches_halve_on_out_of_memory_with_the_same_values(llama):
    """Every attention output projection refuses more than 2 rows, as a full GPU would."""
    inputs = llama.preprocess(TEXT)
    target = _target(llama, inputs)
    measures = ["skip", "ablation"]
    plain_run = RunContext()
    plain = analyze(llama, inputs, output_target(llama, target), measures, plain_run).table

    def refuse(_module, args):
        if args[0].shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    projections = [block.self_attn.o_proj for block in _blocks(llama)]
    handles = [p.register_forward_pre_hook(refuse) for p in projections]
    try:
        tight_run = RunContext()
        tight = analyze(llama, inputs, output_target(llama, target), measures, tight_run).table
    finally:
        for handle in handles:
            handle.remove()
    pd.testing.assert_frame_equal(tight, plain, rtol=1e-9)
    # one unchanged row per batch: the 3 skipped blocks and each layer's 8 ablated heads go
    # one per batch (3 → 1 and 8 → 4 → 2 → 1 rows besides the unchanged one)
    skip_extra = 2
    ablation_extra = 3 * (8 - 1)
    assert tight_run.forward_passes == plain_run.forward_passes + skip_extra + ablation_extra


def test_dataset_mode_over_ten_inputs_is_the_mean_of_ten_runs(llama):
    texts = [f"{word} sat on the mat number {i}" for i, word in enumerate("abcdefghij")]
    measures = ["block_influence", "sink"]  # a layer and a head measure
    seen: list[int] = []
    summary = analyze_dataset(llama, map(DatasetItem, texts), measures, progress=seen.append)
    assert seen == list(range(1, 11))  # streamed: one report per input
    singles = []
    for text in texts:
        inputs = llama.preprocess(text)
        singles.append(
            analyze_layers(llama, inputs, output_target(llama, _target(llama, inputs)), measures)
        )
    grouped = pd.concat(singles).groupby(["layer", "head", "measure"], dropna=False).value
    expected = grouped.agg(["mean", "std", "count"]).sort_index()
    got = summary.set_index(["layer", "head", "measure"])[["mean", "std", "count"]].sort_index()
    pd.testing.assert_frame_equal(
        got, expected, check_dtype=False, check_index_type=False, rtol=1e-12
    )


def test_agreement_of_identical_and_reversed_rankings():
    rows = []
    for head in range(6):
        rows.append((0, head, head, "head", "head_gradient", float(head)))
        rows.append((0, head, head, "head", "head_lrp", float(-head)))  # same magnitudes
        rows.append((0, head, head, "head", "ablation_zero", float(5 - head)))  # reversed
    pairs = agreement(layer_table(rows), HEAD_ESTIMATORS, k=2).set_index(["first", "second"])
    assert pairs.loc[("head_gradient", "head_lrp"), "spearman"] == pytest.approx(1.0)
    assert pairs.loc[("head_gradient", "head_lrp"), "top_k_overlap"] == 1.0
    assert pairs.loc[("head_gradient", "ablation_zero"), "spearman"] == pytest.approx(-1.0)
    assert pairs.loc[("head_gradient", "ablation_zero"), "top_k_overlap"] == 0.0


def _probability_with_heads_zeroed(adapter, inputs, target: int, chosen) -> float:
    """The target's probability in a copy of ``adapter`` with ``chosen`` heads zeroed by hand."""
    head_dim = 32 // HEADS
    edited = copy.deepcopy(adapter)
    with torch.no_grad():
        for layer, head in chosen:
            projection = _blocks(edited)[layer].self_attn.o_proj
            projection.weight[:, head * head_dim : (head + 1) * head_dim] = 0
        return float(edited.logits(**inputs.model_kwargs())[0].double().softmax(-1)[target])


def test_joint_ablation_equals_zeroing_the_weights_of_the_set_by_hand(llama):
    inputs = llama.preprocess(TEXT)
    target = _target(llama, inputs)
    sets = [[(0, 1)], [(0, 1), (2, 3)], [(1, 0), (1, 2), (2, 0)]]
    probabilities = joint_ablation(llama, inputs, output_target(llama, target), sets)
    plain = _probability_with_heads_zeroed(llama, inputs, target, [])
    assert probabilities[0] == pytest.approx(plain, rel=1e-12)
    for row, chosen in enumerate(sets, start=1):
        expected = _probability_with_heads_zeroed(llama, inputs, target, chosen)
        assert probabilities[row] == pytest.approx(expected, rel=1e-9)


def test_the_recheck_zeroes_each_estimators_top_heads_and_judges_them_against_random(llama):
    """
    (1, 2) writes 1,000 times stronger, every other head at 1 %: its sets move the logit most.

    The output layer is scaled up too, so that the probability's changes clear the verdicts'
    absolute margin.
    """
    carrier, head_dim = (1, 2), 32 // HEADS
    with torch.no_grad():
        for layer, block in enumerate(_blocks(llama)):
            for head in range(HEADS):
                columns = slice(head * head_dim, (head + 1) * head_dim)
                scale = 1000.0 if (layer, head) == carrier else 0.01
                block.self_attn.o_proj.weight[:, columns] *= scale
        llama.model.lm_head.weight *= 1000.0
    inputs = llama.preprocess(TEXT)
    target = _target(llama, inputs)
    table = analyze_layers(llama, inputs, output_target(llama, target))
    rechecked = recheck_heads(
        llama, inputs, output_target(llama, target), table, k=2, draws=5, seed=0
    )
    plain = _probability_with_heads_zeroed(llama, inputs, target, [])
    assert rechecked.score == pytest.approx(plain, rel=1e-9)
    sets = rechecked.sets
    assert list(sets.chosen_by) == [
        *HEAD_ESTIMATORS,
        *["random"] * 5,
    ]  # the carrier settles every margin at the first 5
    for row in sets.itertuples():
        chosen = [tuple(int(x) for x in head.split(".")) for head in row.heads.split(", ")]
        assert len(set(chosen)) == 2
        expected = _probability_with_heads_zeroed(llama, inputs, target, chosen)
        assert row.score == pytest.approx(expected, rel=1e-9)
        assert row.change == pytest.approx(expected - plain, rel=1e-9, abs=1e-12)
        if row.chosen_by == "random":
            assert carrier not in chosen  # (these seeded draws miss it: the test's premise)
        else:
            values = _head_values(table, row.chosen_by)
            ranked = sorted(values, key=lambda key: -abs(values[key]))
            assert set(chosen) == set(ranked[:2]) and carrier in chosen
    assert [v.check for v in rechecked.verdicts] == [f"recheck:{m}" for m in HEAD_ESTIMATORS]
    assert {v.status for v in rechecked.verdicts} == {"pass"}
    again = recheck_heads(llama, inputs, output_target(llama, target), table, k=2, draws=5, seed=0)
    pd.testing.assert_frame_equal(again.sets, sets)  # seeded draws


def test_the_layer_analysis_carries_the_recheck_and_counts_its_forwards(llama):
    inputs = llama.preprocess(TEXT)
    e = explain(llama, "layers", inputs, params={"top_k": 3, "recheck_draws": 4})
    rechecked = recheck_heads(llama, inputs, e.target_record, e.layers, k=3, draws=4)
    assert e.metrics["recheck_score"] == pytest.approx(rechecked.score, rel=1e-9)
    for chosen_by, rows in rechecked.sets.groupby("chosen_by"):
        assert e.metrics[f"recheck:{chosen_by}"] == pytest.approx(rows.change.mean(), rel=1e-9)
    assert [v.check for v in e.verdicts] == [f"recheck:{m}" for m in HEAD_ESTIMATORS]
    planned = get_method("layers").planned_passes(
        llama, inputs, {"measures": "all", "top_k": 3, "recheck_draws": 4}
    )
    assert e.timings.forward_passes == 1 + planned.forward  # and the prediction's
    off = explain(llama, "layers", inputs, params={"recheck_draws": 0})
    assert not off.verdicts and not any(k.startswith("recheck") for k in off.metrics)


def _every_family(tokenizer):
    yield from (classic_family(tokenizer, name) for name in ("bert", "gpt2", "llama", "vit"))
    yield from (biased_family(tokenizer, name) for name in sorted(BIASED))
    yield dinov2(registers=2)
    yield clip(tokenizer)
    torch.manual_seed(0)
    config = tf.DistilBertConfig(
        vocab_size=tokenizer.vocab_size, dim=32, n_layers=2, n_heads=4, hidden_dim=48
    )
    config._attn_implementation = "eager"
    model = tf.DistilBertForSequenceClassification(config).double().eval()
    yield TextClassifierAdapter(model, tokenizer, "tiny-distilbert")


def test_every_family_gets_every_measure(load_model):
    """Each layout names real modules: all measures run, with one row per query head."""
    tokenizer = load_model("tiny-random-bert").tokenizer
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    for adapter in _every_family(tokenizer):
        inputs = adapter.preprocess(image if adapter.modality == "image" else TEXT)
        table = analyze_layers(adapter, inputs, output_target(adapter, _target(adapter, inputs)))
        assert np.isfinite(table.value).all(), adapter.model_id
        for measure in (*HEAD_ESTIMATORS, "entropy", "sink_share"):
            rows = table[table.measure == measure]
            assert len(rows) == adapter.num_layers * adapter.num_heads, (adapter.model_id, measure)
        decoder = adapter.family == "decoder-lm"
        assert ("lens_rank" in set(table.measure)) == decoder, adapter.model_id


def _zero_head_by_hand(adapter, layer: int, head: int) -> None:
    """Zero head ``head``'s columns of layer ``layer``'s output projection (any layout)."""
    layout = layout_for(adapter)
    block = list(find_module(adapter.model, layout.blocks).children())[layer]
    projection = block.get_submodule(layout.attention_output)
    width = adapter.num_heads
    with torch.no_grad():
        if isinstance(projection, nn.Linear):
            size = projection.in_features // width
            projection.weight[:, head * size : (head + 1) * size] = 0
        else:  # GPT-2's Conv1D keeps its weight as (in, out)
            size = projection.weight.shape[0] // width
            projection.weight[head * size : (head + 1) * size, :] = 0


def test_ablation_matches_the_weights_zeroed_by_hand_in_every_family(load_model):
    """The hooks (and the rows widened from the ablated block on) against edited weights."""
    tokenizer = load_model("tiny-random-bert").tokenizer
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    for adapter in _every_family(tokenizer):
        inputs = adapter.preprocess(image if adapter.modality == "image" else TEXT)
        target = _target(adapter, inputs)
        zeroed = _head_values(
            analyze_layers(adapter, inputs, output_target(adapter, target), ["ablation"]),
            "ablation_zero",
        )
        with torch.no_grad():
            before = float(adapter.logits(**inputs.model_kwargs())[0, target])
        for layer, head in [(0, 0), (adapter.num_layers - 1, adapter.num_heads - 1)]:
            edited = copy.deepcopy(adapter)
            _zero_head_by_hand(edited, layer, head)
            with torch.no_grad():
                after = float(edited.logits(**inputs.model_kwargs())[0, target])
            assert zeroed[layer, head] == pytest.approx(after - before, rel=1e-7, abs=1e-10), (
                adapter.model_id,
                layer,
                head,
            )
