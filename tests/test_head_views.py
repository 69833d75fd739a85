"""
Per-token relevance per layer, heads zeroed in every row, one head's attention, and the worker
requests built on them (preview, head ablation, evaluation, checks with trust cards).

Each expectation comes from somewhere else than the code under test: the model's own logits,
a copy of the model with the heads' weights zeroed by hand, :func:`joint_ablation`'s batch,
an unpadded run, or a separate call of the faithfulness metrics.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading

import numpy as np
import pytest
import torch
from _model_state import model_state
from _tiny_families import classic_family

from attrlab import attribution
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.engine.recheck import joint_ablation
from attrlab.attribution.errors import (
    AttrlabError,
    BudgetExceededError,
    InvalidParameterError,
    JobCancelledError,
)
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.layers import (
    ablate_heads_and_explain,
    head_attention,
    zeroed_heads,
)
from attrlab.attribution.layers.hooks import ablate_head_sets
from attrlab.attribution.methods.lrp.relevance import lrp
from attrlab.attribution.metrics import bundled_items, evaluate_methods, faithfulness
from attrlab.attribution.models.layouts import find_module, layout_for
from attrlab.attribution.request import (
    MAX_ABLATED_HEADS,
    AblationRequest,
    AttentionRequest,
    CheckRequest,
    EvaluateRequest,
    PreviewRequest,
)
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import output_target

TEXT = "the quick brown fox jumps over the lazy dog"
LAYERS, HEADS, HIDDEN = 3, 4, 32
HEAD_DIM = HIDDEN // HEADS


@pytest.fixture(scope="module")
def llama(load_model):
    """Tiny float64 LLaMA (3 layers, 4 query heads, biases, random norms); never edited."""
    return classic_family(load_model("tiny-random-bert").tokenizer, "llama")


@pytest.fixture(scope="module")
def worker():
    w = ExplainWorker(device="cpu")
    yield w
    w.close()


def _projections(adapter) -> list[torch.nn.Module]:
    blocks = find_module(adapter.model, layout_for(adapter).blocks).children()
    return [block.self_attn.o_proj for block in blocks]


def _zeroed_by_hand(adapter, heads):
    """A copy of ``adapter`` whose output projections ignore ``heads`` (weights zeroed)."""
    edited = copy.deepcopy(adapter)
    with torch.no_grad():
        for layer, head in heads:
            weight = _projections(edited)[layer].weight
            weight[:, head * HEAD_DIM : (head + 1) * HEAD_DIM] = 0
    return edited


def _logits(adapter, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return adapter.logits(**kwargs).double()


# --- per-token relevance per layer ----------------------------------------------------------


def test_relevance_leaving_the_last_block_sits_on_the_last_position_and_sums_to_the_logit(llama):
    inputs = llama.preprocess(TEXT)
    logits = _logits(llama, **inputs.model_kwargs())[0]
    target = int(logits.argmax())
    result = lrp(llama, inputs, output_target(llama, target), pe_aware=False)
    tokens = len(inputs.tokens)
    assert len(result.residual_tokens) == LAYERS + 1
    assert all(r.shape == (tokens,) and r.dtype == np.float64 for r in result.residual_tokens)
    last = result.residual_tokens[-1]
    # the logit at the last position reads the final residual only there
    assert np.all(last[:-1] == 0.0) and last[-1] != 0.0
    # the final RMSNorm (1/σ constant) and the bias-free unembedding conserve relevance
    assert last.sum() == pytest.approx(float(logits[target]), rel=1e-6)
    # relevance entering block 0 is the token relevance at the embedding, token by token
    np.testing.assert_allclose(result.residual_tokens[0], result.scores, rtol=1e-9, atol=1e-15)
    for per_token, total in zip(result.residual_tokens, result.residual, strict=True):
        assert per_token.sum() == pytest.approx(total, rel=1e-12, abs=1e-15)


def test_the_layers_explanation_carries_token_relevance_per_layer_through_json_and_npz(
    llama, tmp_path
):
    inputs = llama.preprocess(TEXT)
    logits = _logits(llama, **inputs.model_kwargs())[0]
    explanation = attribution.explain(llama, "layers", inputs, params={"measures": "lrp"})
    per_layer = explanation.maps["token_per_layer"]
    assert per_layer.shape == (LAYERS + 1, len(explanation.tokens))
    assert per_layer[-1, -1] == pytest.approx(float(logits.max()), rel=1e-6)
    assert np.all(per_layer[-1, :-1] == 0.0)
    np.testing.assert_allclose(per_layer[0], explanation.scores, rtol=1e-9, atol=1e-15)
    again = Explanation.from_json(explanation.to_json())
    np.testing.assert_array_equal(again.maps["token_per_layer"], per_layer)
    explanation.save_npz(tmp_path / "layers.npz")
    loaded = Explanation.load_npz(tmp_path / "layers.npz")
    np.testing.assert_array_equal(loaded.maps["token_per_layer"], per_layer)


def test_the_layers_method_has_no_token_rows_for_images(load_model):
    vit = load_model("tiny-random-vit")
    image = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    inputs = vit.preprocess(image)
    explanation = attribution.explain(vit, "layers", inputs, params={"measures": "lrp"})
    assert "token_per_layer" not in explanation.maps


# --- heads zeroed in every row ----------------------------------------------------------------


def test_zeroed_heads_equal_zeroed_weights_in_every_row_and_joint_ablation(llama):
    chosen = [(0, 1), (2, 3), (2, 0)]
    rows = torch.randint(1000, 2000, (3, 7), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": rows, "attention_mask": torch.ones_like(rows)}
    expected = _logits(_zeroed_by_hand(llama, chosen), **batch)
    with zeroed_heads(_projections(llama), HEADS, chosen):
        got = _logits(llama, **batch)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(got, _logits(llama, **batch))  # the heads did matter
    inputs = llama.preprocess(TEXT)
    target = int(_logits(llama, **inputs.model_kwargs())[0].argmax())
    with zeroed_heads(_projections(llama), HEADS, chosen):
        alone = _logits(llama, **inputs.model_kwargs())[0].softmax(-1)[target]
    assert float(alone) == pytest.approx(
        joint_ablation(llama, inputs, output_target(llama, target), [chosen])[1]
    )


def test_zeroed_heads_leave_no_hook_when_the_block_fails(llama):
    inputs = llama.preprocess(TEXT)
    before, logits = model_state(llama.model), _logits(llama, **inputs.model_kwargs())
    for context in (
        lambda: zeroed_heads(_projections(llama), HEADS, [(1, 2)]),
        lambda: ablate_head_sets(_projections(llama), HEADS, [(), [(1, 2)]]),
    ):
        with pytest.raises(RuntimeError, match="boom"), context():
            assert model_state(llama.model) != before
            raise RuntimeError("boom")
        assert model_state(llama.model) == before
    assert torch.equal(_logits(llama, **inputs.model_kwargs()), logits)


@pytest.mark.parametrize("bad", [(3, 0), (0, 4), (-1, 0), (0, True), (1,)])
def test_a_head_the_model_lacks_is_refused_by_name(llama, bad):
    for context in (
        lambda: zeroed_heads(_projections(llama), HEADS, [(0, 0), bad]),
        lambda: ablate_head_sets(_projections(llama), HEADS, [[bad]]),
    ):
        with pytest.raises(InvalidParameterError) as refused, context():
            pass
        message = str(refused.value)
        assert repr(bad) in message and "3 layers" in message and "4 heads" in message


# --- one head's attention ---------------------------------------------------------------------


def test_head_attention_is_a_causal_distribution_per_query(llama):
    inputs = llama.preprocess(TEXT)
    attention = head_attention(llama, inputs, 1, 2)
    tokens = len(inputs.tokens)
    assert attention.shape == (tokens, tokens) and attention.dtype == np.float64
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-6)  # eager softmax in float32
    assert np.all(np.triu(attention, k=1) == 0.0)
    assert np.all(attention >= 0.0)


def test_head_attention_keeps_only_visible_positions(llama):
    """Right padding: the causal model's visible part is the unpadded input's, exactly."""
    inputs = llama.preprocess(TEXT)
    pad = torch.zeros(1, 2, dtype=torch.long)
    padded = dataclasses.replace(
        inputs,
        input_ids=torch.cat([inputs.input_ids, pad], 1),
        attention_mask=torch.cat([inputs.attention_mask, pad], 1),
        tokens=[*inputs.tokens, "[PAD]", "[PAD]"],
        special_tokens=torch.cat([inputs.special_tokens, torch.ones(2, dtype=torch.bool)]),
    )
    np.testing.assert_array_equal(
        head_attention(llama, padded, 2, 3), head_attention(llama, inputs, 2, 3)
    )


def test_head_attention_refuses_a_head_the_model_lacks(llama):
    with pytest.raises(InvalidParameterError, match=r"\(0, 9\).*3 layers.*4 heads"):
        head_attention(llama, llama.preprocess(TEXT), 0, 9)


# --- ablate and explain -----------------------------------------------------------------------


def test_ablated_explanation_is_the_model_without_the_heads(llama):
    inputs = llama.preprocess(TEXT)
    heads = [(0, 1), (2, 3)]
    before = model_state(llama.model)
    result = ablate_heads_and_explain(
        llama, "integrated_gradients", inputs, None, heads, {"n_steps": 8}
    )
    assert model_state(llama.model) == before
    target = result.plain.target.index
    assert result.ablated.target.index == target
    assert result.ablated.target.probability == pytest.approx(
        joint_ablation(llama, inputs, output_target(llama, target), [heads])[1], rel=1e-9
    )
    # integrated gradients batches its steps: every row saw the heads zeroed
    by_hand = attribution.explain(
        _zeroed_by_hand(llama, heads),
        "integrated_gradients",
        inputs,
        output_target(llama, target),
        {"n_steps": 8},
    )
    np.testing.assert_allclose(result.ablated.scores, by_hand.scores, rtol=1e-9, atol=1e-12)
    alone = attribution.explain(llama, "integrated_gradients", inputs, None, {"n_steps": 8})
    np.testing.assert_array_equal(result.plain.scores, alone.scores)
    np.testing.assert_array_equal(result.attention, head_attention(llama, inputs, 0, 1))
    assert result.heads == heads and result.tokens == inputs.tokens
    data = json.loads(json.dumps(result.to_dict()))
    assert data["heads"] == [[0, 1], [2, 3]]
    assert Explanation.from_dict(data["ablated"]).scores.tolist() == result.ablated.scores.tolist()


def test_zeroing_a_head_that_writes_nothing_changes_no_map(llama):
    silent = _zeroed_by_hand(llama, [(1, 0)])  # head (1, 0) already contributes nothing
    inputs = silent.preprocess(TEXT)
    result = ablate_heads_and_explain(silent, "gradient_x_input", inputs, None, [(1, 0)])
    np.testing.assert_allclose(result.ablated.scores, result.plain.scores, rtol=1e-12, atol=0)
    assert result.ablated.target.logit == pytest.approx(result.plain.target.logit, rel=1e-12)


def test_ablation_failing_or_cancelled_mid_way_leaves_the_model_as_it_was(llama):
    inputs = llama.preprocess(TEXT)
    before, logits = model_state(llama.model), _logits(llama, **inputs.model_kwargs())
    cancel = threading.Event()
    reported: list[tuple[int, int]] = []

    def cancel_in_second_half(done: int, total: int) -> None:
        reported.append((done, total))
        if done > total // 2:  # the ablated map's half: the heads are zeroed
            cancel.set()

    with pytest.raises(JobCancelledError):
        ablate_heads_and_explain(
            llama,
            "occlusion",
            inputs,
            None,
            [(1, 1)],
            {"batch_size": 2},  # occluded tokens in several batches: a cancel is seen between
            settings=RunSettings(progress=cancel_in_second_half, cancel=cancel),
        )
    assert cancel.is_set() and reported[-1][0] > reported[-1][1] // 2
    assert model_state(llama.model) == before

    def fail_when_zeroed(_module, args, _out):  # a module raising mid-forward of the ablated map
        if torch.all(args[0][..., HEAD_DIM : 2 * HEAD_DIM] == 0):
            raise RuntimeError("boom")

    handle = _projections(llama)[1].register_forward_hook(fail_when_zeroed)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            ablate_heads_and_explain(llama, "gradient_x_input", inputs, None, [(1, 1)])
    finally:
        handle.remove()
    assert model_state(llama.model) == before
    assert torch.equal(_logits(llama, **inputs.model_kwargs()), logits)


def test_the_plain_and_ablated_maps_share_one_forward_pass_budget(llama):
    inputs = llama.preprocess(TEXT)
    both = ablate_heads_and_explain(llama, "occlusion", inputs, None, [(1, 1)])
    plain, ablated = both.plain.timings.forward_passes, both.ablated.timings.forward_passes
    within = RunSettings(max_forward_passes=plain + ablated)
    ablate_heads_and_explain(llama, "occlusion", inputs, None, [(1, 1)], settings=within)
    spent = RunSettings(max_forward_passes=plain)  # the plain map spends it all
    message = f"the plain explanation spent the {plain:,} forward passes"
    with pytest.raises(BudgetExceededError, match=message):
        ablate_heads_and_explain(llama, "occlusion", inputs, None, [(1, 1)], settings=spent)
    short = RunSettings(max_forward_passes=plain + ablated - 1)  # the ablated map runs short
    with pytest.raises(BudgetExceededError):
        ablate_heads_and_explain(llama, "occlusion", inputs, None, [(1, 1)], settings=short)


def test_ablation_refuses_no_heads_and_heads_the_model_lacks(llama):
    inputs = llama.preprocess(TEXT)
    with pytest.raises(InvalidParameterError, match="at least one"):
        ablate_heads_and_explain(llama, "gradient_x_input", inputs, None, [])
    with pytest.raises(InvalidParameterError, match=r"\(5, 0\).*3 layers"):
        ablate_heads_and_explain(llama, "gradient_x_input", inputs, None, [(5, 0)])


# --- checks with trust cards ------------------------------------------------------------------


def test_a_check_with_evaluate_carries_each_maps_faithfulness(worker):
    text = "the cat sat on the mat"
    request = CheckRequest(
        model="tiny-random-bert",
        text=text,
        methods=("gradient_x_input", "attnlrp"),
        evaluate=True,
    )
    check = worker.explain(request)
    adapter = worker.adapter("tiny-random-bert")
    inputs = adapter.preprocess(text)
    for name, explanation in check.explanations.items():
        assert {"comprehensiveness", "comprehensiveness_random"} <= set(explanation.metrics), name
        expected = faithfulness(adapter, inputs, explanation.scores, explanation.target_record)
        for key, value in expected.metrics.items():
            assert explanation.metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    plain = worker.explain(dataclasses.replace(request, evaluate=False))
    assert "comprehensiveness" not in plain.explanations["attnlrp"].metrics


# --- worker requests --------------------------------------------------------------------------


def test_preview_is_the_models_own_top_five_and_what_applies(worker):
    text = "the cat sat on the"
    preview = worker.explain(PreviewRequest(model="tiny-random-llama", text=text))
    adapter = worker.adapter("tiny-random-llama")
    inputs = adapter.preprocess(text)
    with torch.no_grad():  # the language model's own last-position logits, not the adapter's
        logits = adapter.model(input_ids=inputs.input_ids).logits[0, -1].double()
    top = logits.softmax(-1).topk(5)
    assert [p.index for p in preview.predictions] == top.indices.tolist()
    np.testing.assert_allclose(  # float32 logits: the head run on one position rounds apart
        [p.probability for p in preview.predictions], top.values.numpy(), rtol=1e-6
    )
    assert preview.tokens == inputs.tokens and preview.next_token
    assert preview.capabilities["gradient_x_input"] is None
    assert "image" in preview.capabilities["gradcam"]
    assert json.loads(json.dumps(preview.to_dict()))["predictions"][0]["index"] == top.indices[0]
    classifier = worker.explain(PreviewRequest(model="tiny-random-bert", text=text))
    assert not classifier.next_token and len(classifier.predictions) == 2  # two classes


def test_attention_request_is_the_models_own_attention_with_nothing_ablated(worker):
    text = "the cat sat on the mat"
    weights = worker.explain(
        AttentionRequest(model="tiny-random-llama", text=text, layer=1, head=3)
    )
    adapter = worker.adapter("tiny-random-llama")
    inputs = adapter.preprocess(text)
    with torch.no_grad():  # the model's own attention probabilities, asked of transformers
        own = adapter.model(**inputs.model_kwargs(), output_attentions=True).attentions[1][0, 3]
    np.testing.assert_allclose(weights, own.double().numpy(), rtol=1e-6, atol=1e-9)
    assert weights.shape == (len(inputs.tokens),) * 2
    with pytest.raises(AttrlabError, match=r"\(1, 4\).*of 4 heads"):
        worker.explain(AttentionRequest(model="tiny-random-llama", text=text, layer=1, head=4))


def test_ablation_request_runs_through_the_worker_and_refuses_bad_heads(worker):
    text = "the cat sat on the mat"
    request = AblationRequest(
        model="tiny-random-llama", text=text, method="gradient_x_input", heads=((1, 2), (0, 0))
    )
    result = worker.explain(request)
    adapter = worker.adapter("tiny-random-llama")
    inputs = adapter.preprocess(text)
    target = result.plain.target.index
    expected = joint_ablation(adapter, inputs, output_target(adapter, target), [[(1, 2), (0, 0)]])
    assert expected[1] != pytest.approx(expected[0], rel=1e-3)  # the heads matter
    # float32: one row against joint_ablation's batch of three
    assert result.plain.target.probability == pytest.approx(expected[0], rel=1e-5)
    assert result.ablated.target.probability == pytest.approx(expected[1], rel=1e-5)
    assert request.costs()[0].method == "gradient_x_input" and len(request.costs()) == 2
    with pytest.raises(AttrlabError, match=r"\(2, 0\).*2 layers \(0\.\.1\) of 4 heads"):
        worker.explain(dataclasses.replace(request, heads=((2, 0),)))
    for heads in ((), ((0, 0),) * (MAX_ABLATED_HEADS + 1)):
        with pytest.raises(InvalidParameterError, match=f"1 to {MAX_ABLATED_HEADS}"):
            worker.validate(dataclasses.replace(request, heads=heads))


def test_evaluate_request_scores_each_bundled_item_and_method(worker):
    methods = ("gradient_x_input", "attnlrp")
    request = EvaluateRequest(
        model="tiny-random-vit", modality="image", methods=methods, items=2, steps=8
    )
    seen: list[tuple[int, int]] = []
    table = worker.explain(request, progress=lambda done, total: seen.append((done, total)))
    items = bundled_items("image")[:2]
    assert len(table) == len(items) * len(methods)
    assert list(table.item) == [item.name for item in items for _ in methods]
    assert list(table.method) == list(methods) * len(items)
    assert seen[-1] == (2, 2)
    adapter = worker.adapter("tiny-random-vit")
    for row in table.itertuples():  # the curves of the method's own map, scored again
        item = next(i for i in items if i.name == row.item)
        inputs = adapter.preprocess(item.raw)
        explanation = attribution.explain(adapter, row.method, inputs)
        scored = faithfulness(
            adapter, inputs, explanation.scores, explanation.target_record, 8, random_orders=0
        )
        assert row.deletion_morf_auc == pytest.approx(scored.metrics["deletion_morf_auc"])
        assert row.insertion_morf_auc == pytest.approx(scored.metrics["insertion_morf_auc"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"modality": "audio"}, "modality is one of"),
        ({"methods": ()}, "at least one method"),
        ({"items": 0}, "at least 1 item"),
        ({"methods": ("nope",)}, "nope"),
        ({"params": {"rise": {}}}, "not evaluated"),
    ],
)
def test_evaluate_request_refuses_before_loading(worker, fields, message):
    request = EvaluateRequest(
        model="tiny-random-vit", modality="image", methods=("gradient_x_input",)
    )
    loads = dict(worker.model_loads)
    with pytest.raises(AttrlabError, match=message):
        worker.validate(dataclasses.replace(request, **fields))
    assert dict(worker.model_loads) == loads


def test_evaluation_stops_between_items_once_cancelled(load_model):
    vit = load_model("tiny-random-vit")
    cancel = threading.Event()
    done: list[int] = []

    def cancel_after_first(count: int) -> None:
        done.append(count)
        cancel.set()

    with pytest.raises(JobCancelledError):
        evaluate_methods(
            vit,
            bundled_items("image")[:3],
            ["gradient_x_input"],
            steps=4,
            random_orders=0,
            settings=RunSettings(cancel=cancel),
            progress=cancel_after_first,
        )
    assert done == [1]
