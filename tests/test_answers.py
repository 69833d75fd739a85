"""
Whole answers and contrasts of a decoder LM (issue 26), checked against the model's own outputs.

Every reference here is read from the Hugging Face model directly: an answer's log-probability
from one teacher-forced forward (:func:`teacher_forced`), the greedy continuation from
``model.generate``, a baseline's or an occluded prompt's score from forwards of token ids the
test builds itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from _small_budgets import SMALL_BUDGETS

from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.methods import capabilities
from attrlab.attribution.models.base import Adapter, TextInputs
from attrlab.attribution.request.answers import answer_request, prompt_inputs
from attrlab.attribution.request.target import AnswerTarget, ContrastTarget, StepTarget
from attrlab.attribution.verdicts import THRESHOLDS

PROMPT = "the cat sat on the mat"
FRANCE = "The capital of France is"
TINY = ("tiny-random-gpt2", "tiny-random-llama")
#: Methods whose maps are linear in the explained score, one of each kind.
LINEAR = ("gradient_x_input", "integrated_gradients", "attnlrp", "occlusion")
IG_STEPS = {"n_steps": 16}


@pytest.fixture(scope="module", params=TINY)
def tiny(request, load_model) -> Adapter:
    return load_model(request.param)


@pytest.fixture(scope="module")
def llama(load_model) -> Adapter:
    return load_model("tiny-random-llama")


def teacher_forced(adapter: Adapter, prompt: torch.Tensor, answer: Sequence[int]) -> torch.Tensor:
    """
    ``log p(answer_k | prompt, answer_<k)`` for each k, float64, from one forward of the ids.

    ``prompt`` is ``(1, P)`` token ids (no padding); the logits at position ``P − 1 + k``
    predict the answer's token ``k``.
    """
    ids = torch.cat([prompt, torch.tensor([list(answer)], dtype=prompt.dtype)], dim=1)
    with torch.no_grad():
        logits = adapter.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    start = prompt.shape[1] - 1
    log_probs = logits[start : start + len(answer)].double().log_softmax(-1)
    return log_probs[torch.arange(len(answer)), torch.tensor(list(answer))]


def split(inputs: TextInputs) -> tuple[torch.Tensor, list[int]]:
    """The prompt's ids ``(1, P)`` and the answer's token ids of an answer input."""
    prompt = int(inputs.input_ids.shape[1]) - inputs.answer_length
    return inputs.input_ids[:, :prompt], inputs.input_ids[0, prompt:].tolist()


def occluded(adapter: Adapter, inputs: TextInputs, position: int) -> torch.Tensor:
    """The prompt's ids with the token at ``position`` replaced by the pad token."""
    prompt, _ = split(inputs)
    ids = prompt.clone()
    ids[0, position] = adapter.tokenizer.pad_token_id
    return ids


@contextmanager
def forwarded_rows(adapter: Adapter) -> Iterator[list[torch.Tensor]]:
    """The token ids of every row the model runs while the block runs (the hook removed after)."""
    rows: list[torch.Tensor] = []

    def keep(_module, _args, kwargs, _output) -> None:
        rows.extend(kwargs["input_ids"].clone())

    handle = adapter.model.register_forward_hook(keep, with_kwargs=True)
    try:
        yield rows
    finally:
        handle.remove()


@pytest.mark.parametrize("model", [*TINY, pytest.param("smollm2-135m", marks=pytest.mark.slow)])
def test_teacher_forcing_equals_the_models_own_generation(load_model, model):
    adapter = load_model(model)
    prompt = prompt_inputs(adapter, FRANCE)
    generated = adapter.model.generate(
        prompt.input_ids,
        attention_mask=prompt.attention_mask,
        max_new_tokens=6,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = generated.sequences[0, prompt.input_ids.shape[1] :].tolist()
    # the log-softmax of each step's logits, at the token generate chose
    expected = torch.stack(
        [
            step[0].double().log_softmax(-1)[token]
            for step, token in zip(generated.logits, tokens, strict=True)
        ]
    )
    inputs, target = answer_request(adapter, FRANCE, generate=6)
    assert isinstance(target, AnswerTarget) and target.generated
    assert list(target.tokens) == tokens and len(tokens) == 6
    if model == "smollm2-135m":
        assert target.label.startswith(" Paris")
    steps = target.step_scores(target.outputs(adapter, **inputs.model_kwargs()))[0]
    torch.testing.assert_close(steps.double(), expected, rtol=0, atol=1e-4)
    e = explain(adapter, "gradient_x_input", inputs, target)
    assert e.target.log_probability == pytest.approx(float(expected.sum()), abs=1e-4)
    assert e.target.probability == pytest.approx(float(expected.sum().exp()), rel=1e-4)
    step = explain(adapter, "gradient_x_input", inputs, StepTarget(target, 2))
    assert step.target.log_probability == pytest.approx(float(expected[2]), abs=1e-4)
    assert step.target.probability == pytest.approx(float(expected[2].exp()), rel=1e-4)


def test_integrated_gradients_sum_to_the_answers_difference_from_the_baseline(llama):
    inputs, target = answer_request(llama, PROMPT, answer=" on the rug")
    e = explain(llama, "integrated_gradients", inputs, target, {"n_steps": 64}, per_step=True)
    prompt, answer = split(inputs)
    # the default baseline: every prompt token (special ones aside) the pad token
    special = inputs.special_tokens[: prompt.shape[1]]
    baseline = torch.where(special, prompt, llama.tokenizer.pad_token_id)
    expected = teacher_forced(llama, prompt, answer) - teacher_forced(llama, baseline, answer)
    tolerance = THRESHOLDS["integral_convergence"].passing
    assert abs(e.scores.sum() - float(expected.sum())) <= tolerance * abs(float(expected.sum()))
    assert np.all(e.scores[-len(answer) :] == 0)  # the answer is kept on the whole path
    rows = e.maps["steps"].sum(axis=1)
    assert rows.shape == (len(answer),)
    np.testing.assert_allclose(rows, expected.numpy(), rtol=tolerance, atol=1e-6)


def test_occlusions_per_step_matrix_is_a_loop_over_tokens(tiny):
    inputs, target = answer_request(tiny, PROMPT, answer=" on the rug")
    e = explain(tiny, "occlusion", inputs, target, per_step=True)
    prompt, answer = split(inputs)
    clean = teacher_forced(tiny, prompt, answer)
    expected = np.zeros((len(answer), inputs.input_ids.shape[1]))
    for position in range(prompt.shape[1]):  # the answer's tokens are never occluded
        drop = clean - teacher_forced(tiny, occluded(tiny, inputs, position), answer)
        expected[:, position] = drop.numpy()
    np.testing.assert_allclose(e.maps["steps"], expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(e.scores, expected.sum(axis=0), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        *((method, IG_STEPS if method == "integrated_gradients" else {}) for method in LINEAR),
        # RISE weighs masks by the score itself (its default, the probability, is e^0 = 1 here)
        ("rise", {**SMALL_BUDGETS["rise"], "output": "logit"}),
    ],
)
def test_a_contrast_of_an_answer_with_itself_explains_nothing(llama, method, params):
    inputs, answer = answer_request(llama, PROMPT, answer=" the dog")
    assert isinstance(answer, AnswerTarget)
    itself = ContrastTarget(answer, answer)  # answer_request refuses it: built directly
    e = explain(llama, method, inputs, itself, params)
    assert e.target.log_probability_difference == pytest.approx(0, abs=1e-6)
    # float32 sums of a, b, −a, −b leave rounding, nothing more
    np.testing.assert_allclose(e.scores, 0, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("method", "answer", "alternative"),
    [
        *((method, " the dog", " the cat") for method in LINEAR),  # the first token shared
        ("attnlrp", " dog", " bird"),  # one token each: LRP's logit difference
    ],
)
def test_swapping_a_shared_input_contrast_negates_it(llama, method, answer, alternative):
    params = IG_STEPS if method == "integrated_gradients" else {}
    forward, target = answer_request(llama, PROMPT, answer=answer, contrast=alternative)
    backward, swapped = answer_request(llama, PROMPT, answer=alternative, contrast=answer)
    assert isinstance(target, ContrastTarget) and target.shares_input
    one = explain(llama, method, forward, target, params)
    other = explain(llama, method, backward, swapped, params)
    prompt, ours = split(forward)
    theirs = split(backward)[1]
    difference = float(
        teacher_forced(llama, prompt, ours).sum() - teacher_forced(llama, prompt, theirs).sum()
    )
    assert one.target.log_probability_difference == pytest.approx(difference, abs=1e-5)
    assert other.target.log_probability_difference == pytest.approx(-difference, abs=1e-5)
    np.testing.assert_allclose(other.scores, -one.scores, rtol=1e-4, atol=1e-5)
    assert np.abs(one.scores).max() > 1e-3  # not a map of zeros negating itself


@pytest.mark.parametrize("method", ["gradient_x_input", "integrated_gradients", "occlusion"])
def test_swapping_a_contrast_of_two_sequences_negates_it(llama, method):
    """
    " the dog" against " big cat": the first tokens differ, so each answer needs a sequence.

    Gradient methods go by parts (each answer's map in its own sequence), perturbation methods
    score the alternative by a second forward of each perturbed prompt.
    """
    params = IG_STEPS if method == "integrated_gradients" else {}
    forward, target = answer_request(llama, PROMPT, answer=" the dog", contrast=" big cat")
    backward, swapped = answer_request(llama, PROMPT, answer=" big cat", contrast=" the dog")
    assert isinstance(target, ContrastTarget) and isinstance(swapped, ContrastTarget)
    assert not target.shares_input and not swapped.shares_input
    one = explain(llama, method, forward, target, params)
    other = explain(llama, method, backward, swapped, params)
    prompt, dog = split(forward)
    cat = split(backward)[1]
    difference = float(
        teacher_forced(llama, prompt, dog).sum() - teacher_forced(llama, prompt, cat).sum()
    )
    assert one.target.log_probability_difference == pytest.approx(difference, abs=1e-5)
    assert other.target.log_probability_difference == pytest.approx(-difference, abs=1e-5)
    width = prompt.shape[1]
    np.testing.assert_allclose(other.scores[:width], -one.scores[:width], rtol=1e-4, atol=1e-5)
    assert np.abs(one.scores[:width]).max() > 1e-3
    if method == "occlusion":  # answers are never occluded
        assert np.all(one.scores[width:] == 0) and np.all(other.scores[width:] == 0)
    else:  # each answer's own tokens: in the map where the input holds them, else beside it
        np.testing.assert_allclose(one.maps["alternative_answer"], -other.scores[width:])
        np.testing.assert_allclose(other.maps["alternative_answer"], -one.scores[width:])


@pytest.mark.parametrize("method", ["occlusion", "rise", "sobol", "shap"])
def test_perturbation_keeps_the_answer_and_its_per_step_matrix_costs_no_forward(llama, method):
    inputs, target = answer_request(llama, PROMPT, answer=" on the rug")
    params = SMALL_BUDGETS.get(method, {})
    with forwarded_rows(llama) as whole:
        plain = explain(llama, method, inputs, target, params)
    with forwarded_rows(llama) as per_step:
        stepped = explain(llama, method, inputs, target, params, per_step=True)
    # no row perturbs the answer: it is what each row is scored on
    answer = inputs.input_ids[0, -3:]
    assert all(torch.equal(row[-3:], answer) for row in [*whole, *per_step])
    # the rows add no forward: each input they score was scored for the whole map (the
    # target's own score on the clean input may come from the map's forwards too)
    assert len(whole) > 8 and len(per_step) <= len(whole)
    seen = {tuple(row.tolist()) for row in whole}
    assert all(tuple(row.tolist()) in seen for row in per_step)
    assert stepped.timings.forward_passes <= plain.timings.forward_passes
    np.testing.assert_allclose(stepped.scores, plain.scores, rtol=0, atol=1e-12)
    assert stepped.maps["steps"].shape == (3, len(inputs.tokens))
    if method in ("occlusion", "shap"):  # linear in the score: the rows add up to the map
        np.testing.assert_allclose(stepped.maps["steps"].sum(axis=0), stepped.scores, atol=1e-5)


def test_answer_targets_survive_json_and_npz(llama, tmp_path):
    inputs, answer = answer_request(llama, PROMPT, answer=" the dog")
    contrast = answer_request(llama, PROMPT, answer=" the dog", contrast=" the cat")[1]
    for target in (answer, contrast, StepTarget(contrast, 3)):
        e = explain(llama, "occlusion", inputs, target, per_step=True)
        rows = target.steps  # a step target is one step: no matrix
        assert e.target_record == target and ("steps" in e.maps) == (rows > 1)
        path = tmp_path / f"{target.kind}.npz"
        e.save_npz(path)
        for again in (Explanation.from_json(e.to_json()), Explanation.load_npz(path)):
            assert again.target_record == target and again.target.label == target.label
            assert again.maps.keys() == e.maps.keys()
            for name, values in e.maps.items():
                np.testing.assert_array_equal(again.maps[name], values)
    assert contrast.steps == 4


@pytest.mark.parametrize(
    ("model", "request_", "error", "named"),
    [
        ("tiny-random-bert", {"answer": " dog"}, InvalidInputError, "decoder LM"),
        ("tiny-random-gpt2", {"answer": ""}, InvalidInputError, "answer is empty"),
        ("tiny-random-gpt2", {"generate": 0}, InvalidParameterError, "1 to 256 new tokens"),
        ("tiny-random-gpt2", {"generate": 10_000}, InvalidParameterError, "1 to 256 new tokens"),
        ("tiny-random-gpt2", {"generate": True}, InvalidParameterError, "1 to 256 new tokens"),
        ("tiny-random-gpt2", {"answer": " dog", "generate": 3}, InvalidInputError, "not both"),
        ("tiny-random-gpt2", {"answer": " dog", "contrast": " dog"}, InvalidInputError, "itself"),
        ("tiny-random-gpt2", {"answer": " dog", "contrast": ""}, InvalidInputError, "empty"),
    ],
    ids=[
        "classifier",
        "empty-answer",
        "generate-0",
        "generate-too-many",
        "generate-bool",
        "answer-and-generate",
        "contrast-is-answer",
        "empty-contrast",
    ],
)
def test_bad_answer_requests_are_refused_by_name(load_model, model, request_, error, named):
    with pytest.raises(error, match=named):
        answer_request(load_model(model), PROMPT, **request_)


def test_an_answer_target_needs_its_answer_in_the_input(load_model):
    adapter = load_model("tiny-random-gpt2")
    target = answer_request(adapter, PROMPT, answer=" the dog")[1]
    with pytest.raises(InvalidInputError, match="holds an answer of 0 tokens"):
        explain(adapter, "occlusion", adapter.preprocess(PROMPT), target)


@pytest.mark.slow
def test_smollm2_paris_rather_than_lyon(smollm2):
    """
    Every method a decoder LM takes explains " Paris" rather than " Lyon" (what each gives:
    ``benchmarks/generation.py``); occlusion's map is also written out here.

    The layer and head analysis is left out: it has no token map.
    """
    inputs, target = answer_request(smollm2, FRANCE, answer=" Paris", contrast=" Lyon")
    prompt, paris = split(inputs)
    lyon = smollm2.tokenizer.encode(" Lyon", add_special_tokens=False)

    def log_ratio(ids: torch.Tensor) -> float:
        """log p(Paris) − log p(Lyon) after the prompt ``ids``."""
        ours, theirs = teacher_forced(smollm2, ids, paris), teacher_forced(smollm2, ids, lyon)
        return float(ours.sum() - theirs.sum())

    methods = [m for m, why in capabilities(smollm2).items() if why is None and m != "layers"]
    assert {"attnlrp", "integrated_gradients", "occlusion", "rise", "shap", "sobol"} <= {*methods}
    maps = {}
    for method in methods:
        e = explain(smollm2, method, inputs, target, SMALL_BUDGETS.get(method, {}))
        difference = e.target.log_probability_difference
        assert difference == pytest.approx(log_ratio(prompt), abs=1e-4), method
        assert e.scores.shape == (len(inputs.tokens),) and np.all(np.isfinite(e.scores)), method
        maps[method] = e.scores
    drops = [
        log_ratio(prompt) - log_ratio(occluded(smollm2, inputs, j)) for j in range(prompt.shape[1])
    ]
    np.testing.assert_allclose(maps["occlusion"], [*drops, 0.0], rtol=0, atol=1e-4)
