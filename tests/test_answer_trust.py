"""
Trust, layers and readouts on a decoder's answers and contrasts (issue 26).

Each measure is compared with a reference written out here: teacher-forced log-probabilities
read by hand from the model's logits, tokens removed by hand, heads zeroed in the weights,
index analyses subtracted, rollout as a product of matrices, and the per-step loop. The model is
a tiny float64 LLaMA (grouped-query attention, biases on), so differences are rounding only.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from _tiny_families import classic_family
from scipy.stats import spearmanr
from test_layers import _zero_head_by_hand
from test_rollout_flow import model_attentions, reference_rollout

from attrlab.attribution import explain, get_method
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.layers import ablate_heads_and_explain, analyze_layers
from attrlab.attribution.layers.analysis import head_projections
from attrlab.attribution.metrics import faithfulness
from attrlab.attribution.metrics.check import check_methods
from attrlab.attribution.metrics.randomisation import cascading_units
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import StepTarget, output_target

PROMPT = "the quick brown fox jumps"
#: Rounding apart: the model's eager attention takes its softmax in float32 (sequences of
#: other lengths or batches round differently).
CLOSE = {"rel": 1e-6, "abs": 1e-9}
#: Perturbation forwards come back in float32 (attribution.inputs.perturb.BatchRunner).
PERTURBED = {"rtol": 1e-5, "atol": 1e-5}
IOI = "when mary and john went to the store john gave a drink to"


@pytest.fixture(scope="module")
def llama(load_model):
    return classic_family(load_model("tiny-random-bert").tokenizer, "llama")


def _log_prob(adapter, prompt: list[int], answer: tuple[int, ...]) -> float:
    """``log p(answer | prompt)``: one forward of both, each answer token read before it."""
    ids = torch.tensor([[*prompt, *answer]])
    with torch.no_grad():
        logp = adapter.model(input_ids=ids).logits[0].double().log_softmax(-1)
    return float(sum(logp[len(prompt) - 1 + k, t] for k, t in enumerate(answer)))


def _score(adapter, prompt: list[int], target) -> float:
    """An answer's log-probability, or a contrast's difference (each in its own sequence)."""
    if target.kind == "answer":
        return _log_prob(adapter, prompt, target.tokens)
    return _log_prob(adapter, prompt, target.answer.tokens) - _log_prob(
        adapter, prompt, target.alternative.tokens
    )


def _curves_by_hand(adapter, inputs, target, values: np.ndarray) -> tuple[list, list]:
    """Deletion and insertion along the map's order, the answer teacher-forced every time."""
    prompt = inputs.input_ids[0, : len(inputs.tokens) - inputs.answer_length].tolist()
    order = list(np.argsort(-values, kind="stable"))
    deletion, insertion = [], []
    for k in range(len(prompt) + 1):
        first = set(order[:k])
        deletion.append(
            _score(adapter, [t for i, t in enumerate(prompt) if i not in first], target)
        )
        insertion.append(_score(adapter, [t for i, t in enumerate(prompt) if i in first], target))
    return deletion, insertion


def _aopc(first: float, curve: list[float], n: int) -> float:
    """ERASER's mean drop over the top 10 … 50 % (``int(k·n)`` tokens, 0 and repeats out)."""
    ks = sorted({int(f * n) for f in (0.1, 0.2, 0.3, 0.4, 0.5)} - {0})
    return first - float(np.mean([curve[k] for k in ks]))


@pytest.mark.parametrize("contrast", [None, " under the cat"])
def test_faithfulness_of_an_answer_is_its_log_probability_with_tokens_removed(llama, contrast):
    """The answer, and a contrast whose alternative needs a sequence of its own."""
    inputs, target = answer_request(llama, PROMPT, answer=" over the dog", contrast=contrast)
    assert contrast is None or not target.shares_input
    n = len(inputs.tokens) - inputs.answer_length
    values = np.random.default_rng(0).permutation(n).astype(float)
    scores = np.concatenate([values, np.zeros(inputs.answer_length)])  # answer: never removed
    result = faithfulness(llama, inputs, scores, target, random_orders=0)
    deletion, insertion = _curves_by_hand(llama, inputs, target, values)
    # the curves' ends without a prompt (nothing predicts the first answer token) left out
    np.testing.assert_allclose(result.curves["deletion_morf"][:n], deletion[:n], **PERTURBED)
    np.testing.assert_allclose(result.curves["insertion_morf"][1:], insertion[1:], **PERTURBED)
    comprehensiveness = _aopc(deletion[0], deletion, n)
    assert result.metrics["comprehensiveness"] == pytest.approx(comprehensiveness, abs=1e-5)
    sufficiency = _aopc(deletion[0], insertion, n)
    assert result.metrics["sufficiency"] == pytest.approx(sufficiency, abs=1e-5)


def test_the_trust_card_of_a_contrast_scores_its_map_with_verdicts(llama):
    inputs, target = answer_request(llama, PROMPT, answer=" over", contrast=" under")
    explanation = explain(
        llama, "gradient_x_input", inputs, target, settings=RunSettings(evaluate=True)
    )
    n = len(inputs.tokens) - inputs.answer_length
    deletion, insertion = _curves_by_hand(llama, inputs, target, explanation.scores[:n])
    metrics = explanation.metrics
    assert metrics["comprehensiveness"] == pytest.approx(_aopc(deletion[0], deletion, n), abs=1e-5)
    assert metrics["sufficiency"] == pytest.approx(_aopc(deletion[0], insertion, n), abs=1e-5)
    checks = {v.check for v in explanation.verdicts}
    assert {"comprehensiveness", "sufficiency"} <= checks


def test_a_check_of_several_methods_keeps_the_answer_for_every_map_and_step(llama):
    inputs, target = answer_request(llama, PROMPT, answer=" over the dog")
    check = check_methods(llama, ["gradient", "attnlrp"], inputs, target)
    assert all(e.target_record == target for e in check.explanations.values())
    maps = [np.abs(e.scores) for e in check.explanations.values()]
    assert check.agreement["spearman"][0] == pytest.approx(spearmanr(*maps)[0], rel=1e-12)
    randomised = check_methods(llama, ["gradient"], inputs, target, randomise=True)
    assert len(randomised.randomisation) == len(cascading_units(llama)) + 1
    assert set(randomised.randomisation_verdicts) == {"gradient"}


def test_a_head_ablated_map_explains_the_same_answer(llama):
    inputs, target = answer_request(llama, PROMPT, answer=" over the dog")
    ablation = ablate_heads_and_explain(llama, "gradient_x_input", inputs, target, [(1, 2)])
    assert ablation.ablated.target_record == target
    edited = copy.deepcopy(llama)
    _zero_head_by_hand(edited, 1, 2)
    prompt = inputs.input_ids[0, : -inputs.answer_length].tolist()
    by_hand = _log_prob(edited, prompt, target.tokens)
    assert ablation.ablated.target.log_probability == pytest.approx(by_hand, **CLOSE)
    assert ablation.plain.target.log_probability == pytest.approx(
        _log_prob(llama, prompt, target.tokens), **CLOSE
    )


def _by_row(table, measure: str) -> dict[tuple[int, int | None], float]:
    """``(layer, head or None) -> value`` of one measure."""
    rows = table[table.measure == measure]
    return {
        (int(r.layer), None if pd.isna(r.head) else int(r.head)): float(r.value)
        for r in rows.itertuples()
    }


def test_layers_of_a_logit_difference_are_the_differences_of_its_two_tokens(llama):
    """IOI's " mary" − " john": each measure linear in the score, against two index analyses."""
    inputs, target = answer_request(llama, IOI, answer=" mary", contrast=" john")
    assert target.shares_input and inputs.answer_length == 1
    measures = ["ablation", "lrp", "logit_lens"]
    contrast = analyze_layers(llama, inputs, target, measures)
    prompt = llama.preprocess(IOI)  # causal attention: the answer changes nothing before it
    mary = analyze_layers(llama, prompt, output_target(llama, target.answer.tokens[0]), measures)
    john = analyze_layers(
        llama, prompt, output_target(llama, target.alternative.tokens[0]), measures
    )
    for measure in ("ablation_zero", "head_lrp", "lrp_block", "lrp_attention"):
        ours, a, b = _by_row(contrast, measure), _by_row(mary, measure), _by_row(john, measure)
        assert ours.keys() == a.keys() and ours
        for key, value in ours.items():
            assert value == pytest.approx(a[key] - b[key], rel=1e-7, abs=1e-10), (measure, key)
    lens = _by_row(contrast, "lens_score")
    p_mary, p_john = _by_row(mary, "lens_probability"), _by_row(john, "lens_probability")
    for key, value in lens.items():
        assert value == pytest.approx(np.log(p_mary[key]) - np.log(p_john[key]), **CLOSE)


def test_head_gradient_of_a_contrast_is_the_derivative_of_its_log_odds(llama):
    """Against autograd through a scale ξ on one head's slice of the o_proj input, by hand."""
    inputs, target = answer_request(llama, IOI, answer=" mary", contrast=" john")
    gradients = _by_row(analyze_layers(llama, inputs, target, ["gradient"]), "head_gradient")
    ours, theirs = target.answer.tokens[0], target.alternative.tokens[0]
    for layer, head in [(0, 1), (2, 3)]:
        projection = head_projections(llama)[0][layer]
        size = projection.in_features // llama.num_heads
        scale = torch.ones((), dtype=torch.float64, requires_grad=True)

        def scaled(_module, args, head=head, size=size, scale=scale):
            x = args[0]
            ones = torch.ones(x.shape[-1], dtype=x.dtype)
            return (
                x * torch.cat([ones[: head * size], scale.expand(size), ones[(head + 1) * size :]]),
            )

        handle = projection.register_forward_pre_hook(scaled)
        try:
            logp = llama.model(input_ids=inputs.input_ids[:, :-1]).logits[0, -1].log_softmax(-1)
            (grad,) = torch.autograd.grad(logp[ours] - logp[theirs], scale)
        finally:
            handle.remove()
        assert gradients[layer, head] == pytest.approx(abs(float(grad)), **CLOSE)


def _skipped(adapter, layer: int):
    """A copy whose block ``layer`` adds nothing to the residual stream (its outputs zeroed)."""
    edited = copy.deepcopy(adapter)
    block = edited.model.model.layers[layer]
    with torch.no_grad():
        for linear in (block.self_attn.o_proj, block.mlp.down_proj):
            linear.weight.zero_()
            linear.bias.zero_()
    return edited


def test_skip_and_lens_of_an_answer_read_its_steps(llama):
    inputs, target = answer_request(llama, PROMPT, answer=" over the dog")
    table = analyze_layers(llama, inputs, target, ["skip", "logit_lens"])
    prompt = inputs.input_ids[0, : -inputs.answer_length].tolist()
    plain = _log_prob(llama, prompt, target.tokens)
    last = llama.num_layers - 1
    assert _by_row(table, "lens_score")[last, None] == pytest.approx(plain, **CLOSE)
    ids = inputs.input_ids
    steps = slice(len(prompt) - 1, ids.shape[1] - 1)  # the positions predicting the answer
    with torch.no_grad():
        logp = llama.model(input_ids=ids).logits[0, steps].double().log_softmax(-1)
    for layer in (0, last):
        edited = _skipped(llama, layer)
        with torch.no_grad():
            skipped = edited.model(input_ids=ids).logits[0, steps].double().log_softmax(-1)
        kl = float((logp.exp() * (logp - skipped)).sum())
        change = _log_prob(edited, prompt, target.tokens) - plain
        assert _by_row(table, "skip_logprob")[layer, None] == pytest.approx(change, **CLOSE)
        assert _by_row(table, "skip_kl")[layer, None] == pytest.approx(kl, rel=1e-9)


def test_layers_refuse_a_contrast_whose_alternative_needs_its_own_sequence(llama):
    inputs, target = answer_request(
        llama, PROMPT, answer=" over the dog", contrast=" under the cat"
    )
    with pytest.raises(UnsupportedMethodError, match="sequence of its own"):
        explain(llama, "layers", inputs, target, {"measures": "ablation"})


def test_rollout_of_an_answer_reads_the_rows_predicting_its_tokens(llama):
    inputs, target = answer_request(llama, PROMPT, answer=" over the dog")
    explanation = explain(llama, "rollout", inputs, target, per_step=True)
    rolled = reference_rollout(model_attentions(llama.model, inputs))
    n, length = len(inputs.tokens), inputs.answer_length
    rows = rolled[n - 1 - length : n - 1]  # step k is predicted at last − length + k
    np.testing.assert_allclose(explanation.maps["steps"], rows, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(explanation.scores, rows.mean(axis=0), rtol=1e-9, atol=1e-12)


def test_attention_flow_of_an_answer_step_is_the_flow_of_the_text_up_to_its_position(llama):
    """Causal attention: nothing after a position reaches its node, so the text can end there."""
    inputs, target = answer_request(llama, PROMPT, answer=" over the dog")
    steps = explain(llama, "attention_flow", inputs, target, per_step=True).maps["steps"]
    n, length = len(inputs.tokens), inputs.answer_length
    for k in range(length):
        end = n - length + k
        prefix = replace(
            inputs,
            input_ids=inputs.input_ids[:, :end],
            attention_mask=inputs.attention_mask[:, :end],
            tokens=inputs.tokens[:end],
            token_texts=inputs.token_texts[:end],
            special_tokens=inputs.special_tokens[:end],
            offsets=None,
            answer_length=0,
        )
        alone = explain(llama, "attention_flow", prefix).scores
        np.testing.assert_allclose(steps[k, :end], alone, rtol=1e-9, atol=1e-12)
        assert not steps[k, end:].any()


@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("tiny-random-gpt2", "gradient_x_input"),
        ("tiny-random-gpt2", "attnlrp"),
        ("tiny-random-llama", "gradient_x_input"),
        ("tiny-random-llama", "attnlrp"),
        ("tiny-random-llama", "pa_lrp"),  # rotary positions
    ],
)
def test_batched_per_step_maps_equal_one_run_per_step(load_model, monkeypatch, name, method):
    """A contrast's steps: the answer's two, then the alternative's (read from one sequence)."""
    pricing = importlib.import_module("attrlab.attribution.request.estimate")
    adapter = load_model(name)
    cls = get_method(method)
    params = cls.resolve(adapter, {})
    inputs, target = answer_request(
        adapter, "the quick brown fox", answer=" jumps over", contrast=" sleeps"
    )
    assert target.shares_input and target.steps == 3
    steps = range(target.steps)
    batched = cls.attribute_steps(adapter, inputs, target, steps, params, RunContext())
    loop = [
        cls.compute(adapter, inputs, StepTarget(target, k), params, RunContext()) for k in steps
    ]
    np.testing.assert_allclose(batched, np.stack([r.scores for r in loop]), rtol=1e-5, atol=1e-7)
    monkeypatch.setattr(pricing, "STEPS_PER_PASS", 2)  # in batches of two steps and one
    whole = explain(adapter, method, inputs, target, per_step=True)
    np.testing.assert_allclose(whole.maps["steps"], batched, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(whole.maps["steps"].sum(0), whole.scores, rtol=1e-5, atol=1e-6)
