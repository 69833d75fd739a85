"""The target record: what each kind scores, its JSON form, and that every method reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from _tiny_families import tiny_relu_cnn
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError, UnsupportedMethodError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.methods import available_methods, get_method
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import (
    AnswerTarget,
    ClassTarget,
    ContrastTarget,
    NextTokenTarget,
    StepRows,
    StepTarget,
    Target,
    explained_target,
    output_target,
    resolve_target,
    target_record,
)

TEXT = "the cat sat on the mat"
#: Small budgets: these tests compare maps, not their quality.
SMALL = {
    "rise": {"n_masks": 64},
    "sobol": {"n_designs": 8},
    "shap": {"max_evals": 64},
    "integrated_gradients": {"n_steps": 8},
    "deeplift_shap": {"n_references": 2},
}


def image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def models(load_model) -> dict[str, Adapter]:
    """A text classifier, a decoder LM and an image CNN."""
    return {
        "classifier": load_model("tiny-random-bert"),
        "decoder": load_model("tiny-random-gpt2"),
        "cnn": tiny_relu_cnn(),
    }


def raw_input(adapter: Adapter) -> Any:
    return TEXT if adapter.modality == "text" else image()


def own_logits(adapter: Adapter, inputs: Inputs) -> torch.Tensor:
    """The model's logits for the explained output, read from the module itself (one row)."""
    with torch.no_grad():
        if adapter.modality == "image":
            return adapter.model(inputs.pixel_values)[0]
        logits = adapter.model(**inputs.model_kwargs()).logits[0]
    # a decoder's next-token logits sit at the last token (the tiny text has no padding)
    return logits[-1] if adapter.family == "decoder-lm" else logits


@dataclass(frozen=True)
class Doubled(ClassTarget):
    """Twice a class's logit: a target only a method reading :meth:`Target.score` can see."""

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        return 2 * outputs[:, self.index]


@dataclass(frozen=True)
class LogitDifference(Target):
    """Output ``a`` rather than ``b``: a target that names no single output."""

    a: int
    b: int
    label: str = "a − b"
    kind: ClassVar[str] = "test_logit_difference"

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs[:, self.a] - outputs[:, self.b]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "b": self.b, "label": self.label}

    @classmethod
    def _from_fields(cls, data: dict[str, Any]) -> Target:
        return cls(data["a"], data["b"], data["label"])


@pytest.mark.parametrize("name", ["classifier", "decoder", "cnn"])
def test_each_kind_scores_the_models_own_logit(models, name):
    adapter = models[name]
    inputs = adapter.preprocess(raw_input(adapter))
    expected = own_logits(adapter, inputs)
    with torch.no_grad():
        outputs = adapter.logits(**inputs.model_kwargs())
    kind = NextTokenTarget if name == "decoder" else ClassTarget
    for index in (0, 1, int(expected.argmax())):
        target = resolve_target(adapter, index, expected)
        assert type(target) is kind and target.label == adapter.label(index)
        assert target.score(outputs).shape == (1,)
        torch.testing.assert_close(target.score(outputs)[0], expected[index])
        torch.testing.assert_close(
            target.probability(outputs)[0], expected.softmax(-1)[index], rtol=1e-5, atol=1e-7
        )
    top = resolve_target(adapter, None, expected)
    assert top == kind(int(expected.argmax()), adapter.label(int(expected.argmax())))
    e = explain(adapter, "gradient_x_input", inputs, target=kind(1))
    assert e.target_record == kind(1, adapter.label(1))  # the model's label filled in
    assert e.target.logit == pytest.approx(float(expected[1]), rel=1e-5, abs=1e-6)


def test_a_label_resolves_as_before_and_a_bad_target_is_refused(models):
    classifier, decoder = models["classifier"], models["decoder"]
    logits = torch.zeros(classifier.num_classes)
    assert resolve_target(classifier, classifier.label(1), logits) == ClassTarget(
        1, classifier.label(1)
    )
    word = decoder.tokenizer.encode(" cat", add_special_tokens=False)[0]
    record = resolve_target(decoder, " cat", torch.zeros(decoder.num_classes))
    assert record == NextTokenTarget(word, decoder.label(word))
    for bad in (ClassTarget(classifier.num_classes), classifier.num_classes, "no such label"):
        with pytest.raises(InvalidInputError):
            resolve_target(classifier, bad, logits)
    inputs = classifier.preprocess(TEXT)
    with pytest.raises(UnsupportedMethodError, match="one output"):
        explain(classifier, "gradient_x_input", inputs, target=LogitDifference(0, 1))


def test_a_front_ends_index_or_label_becomes_the_record_without_a_forward(models, monkeypatch):
    classifier, decoder = models["classifier"], models["decoder"]
    for adapter in (classifier, decoder):

        def no_forward(**_: torch.Tensor) -> torch.Tensor:
            raise AssertionError("a record from an index or a label needs no forward")

        monkeypatch.setattr(adapter, "logits", no_forward)
    assert target_record(classifier, 1) == ClassTarget(1, classifier.label(1))
    assert target_record(classifier, "1") == ClassTarget(1, classifier.label(1))
    assert target_record(classifier, classifier.label(0)) == ClassTarget(0, classifier.label(0))
    word = decoder.tokenizer.encode(" cat", add_special_tokens=False)[0]
    assert target_record(decoder, " cat") == NextTokenTarget(word, decoder.label(word))
    given = LogitDifference(0, 1)
    assert target_record(classifier, given) is given
    assert target_record(classifier, None) is None and target_record(classifier, "  ") is None
    for bad in (classifier.num_classes, -1, "no such label"):
        with pytest.raises(InvalidInputError):
            target_record(classifier, bad)


def test_an_entry_point_reads_the_top_prediction_and_checks_an_output(models):
    classifier = models["classifier"]
    logits = torch.zeros(classifier.num_classes)
    logits[1] = 1.0
    assert explained_target(classifier, None, logits) == ClassTarget(1, classifier.label(1))
    assert explained_target(classifier, ClassTarget(0), logits) == ClassTarget(
        0, classifier.label(0)
    )
    assert explained_target(classifier, ClassTarget(0, "mine"), logits).label == "mine"
    with pytest.raises(InvalidInputError, match="out of range"):
        explained_target(classifier, ClassTarget(classifier.num_classes), logits)
    given = LogitDifference(0, 1)
    assert explained_target(classifier, given, logits) is given


def test_each_kind_says_what_views_and_methods_ask_of_it():
    answer = AnswerTarget((5, 7), ("a", "b"), "ab")
    same_start = AnswerTarget((5, 9), ("a", "c"), "ac")  # read from the answer's sequence
    other_start = AnswerTarget((6, 9), ("d", "c"), "dc")  # needs a sequence of its own
    shared, separate = ContrastTarget(answer, same_start), ContrastTarget(answer, other_start)
    one = NextTokenTarget(3, "x")
    assert (one.named_output, one.recorded_index) == (3, 3)
    assert one.held_answer is None and one.alternative_answer is None and one.apart() is None
    assert answer.named_output is None and answer.recorded_index == 5
    assert answer.held_answer is answer and answer.alternative_answer is None
    assert shared.held_answer is answer and shared.alternative_answer is same_start
    assert shared.named_output is None and shared.recorded_index == 5
    assert shared.shares_input and shared.apart() is None
    assert not separate.shares_input and separate.apart() == (answer, other_start)
    step = StepTarget(shared, 3)
    assert step.whole_and_step == (shared, 3) and step.recorded_index == 5
    assert one.whole_and_step == (one, None) and shared.whole_and_step == (shared, None)
    with pytest.raises(UnsupportedMethodError, match="one output"):
        _ = StepRows(shared, (0, 1)).recorded_index


def test_json_round_trip_of_each_kind_and_of_the_explanation(models, tmp_path):
    for target in (ClassTarget(3, "cat"), NextTokenTarget(464, " Paris"), LogitDifference(2, 5)):
        text = json.dumps(target.to_json())
        assert Target.from_json(json.loads(text)) == target
    assert ClassTarget(3, "cat").to_json() == {"kind": "class", "index": 3, "label": "cat"}
    for bad in ([1], {"index": 1}, {"kind": "class", "index": "1"}, {"kind": [1]}):
        with pytest.raises(InvalidInputError):
            Target.from_json(bad)
    adapter = models["decoder"]
    e = explain(
        adapter, "gradient_x_input", adapter.preprocess(TEXT), target=output_target(adapter, 1)
    )
    data = json.loads(e.to_json())
    assert data["target_record"] == {"kind": "next_token", "index": 1, "label": adapter.label(1)}
    assert data["target"]["index"] == 1  # the record's values keep their fields
    assert Explanation.from_json(e.to_json()).target_record == e.target_record
    e.save_npz(tmp_path / "e.npz")
    assert Explanation.load_npz(tmp_path / "e.npz").target_record == e.target_record
    del data["target_record"]  # a file written before the record existed
    assert Explanation.from_dict(data).target_record is None


def applicable(models: dict[str, Adapter]) -> list[tuple[str, str]]:
    return [
        (name, method.name)
        for name, adapter in models.items()
        for method in available_methods()
        if method.unsupported_reason(adapter) is None
    ]


def test_every_registered_method_applies_to_one_of_the_models(models):
    covered = {method for _, method in applicable(models)}
    assert covered == {method.name for method in available_methods()}


@pytest.mark.parametrize("name", ["classifier", "decoder", "cnn"])
def test_every_method_gives_the_same_explanation_for_an_index_and_its_record(models, name):
    adapter = models[name]
    inputs = adapter.preprocess(raw_input(adapter))
    record = output_target(adapter, 1)
    for method in (m for m in available_methods() if m.unsupported_reason(adapter) is None):
        params = SMALL.get(method.name)
        by_index = explain(
            adapter, method.name, inputs, target=output_target(adapter, 1), params=params
        )
        by_record = explain(adapter, method.name, inputs, target=record, params=params)
        np.testing.assert_array_equal(by_record.scores, by_index.scores, err_msg=method.name)
        assert by_record.maps.keys() == by_index.maps.keys()
        for key, values in by_index.maps.items():
            np.testing.assert_array_equal(by_record.maps[key], values, err_msg=method.name)
        assert by_record.metrics == pytest.approx(by_index.metrics, nan_ok=True)
        assert by_record.target == by_index.target and by_index.target_record == record


def test_gradient_x_input_is_the_embedding_times_the_gradient_of_the_target_logit(models):
    adapter = models["decoder"]
    inputs = adapter.preprocess(TEXT)
    embedding = adapter.model.get_input_embeddings()
    seen: list[torch.Tensor] = []

    def keep(_module: nn.Module, _args: Any, output: torch.Tensor) -> None:
        output.retain_grad()
        seen.append(output)

    handle = embedding.register_forward_hook(keep)
    try:
        logits = adapter.model(**inputs.model_kwargs()).logits[0, -1]
        logits[3].backward()
    finally:
        handle.remove()
    expected = (seen[0] * seen[0].grad)[0].sum(-1).detach().double().numpy()
    e = explain(adapter, "gradient_x_input", inputs, target=NextTokenTarget(3))
    np.testing.assert_allclose(e.scores, expected, rtol=1e-5, atol=1e-7)


def test_occlusion_is_the_drop_of_the_target_logit_with_each_token_hidden(models):
    adapter = models["classifier"]
    inputs = adapter.preprocess(TEXT)
    clean = own_logits(adapter, inputs)[1]
    expected = np.zeros(len(inputs.tokens))
    for i in range(len(inputs.tokens)):
        if inputs.special_tokens[i]:
            continue  # kept by the baseline: no drop
        ids = inputs.input_ids.clone()
        ids[0, i] = adapter.pad_token_id
        with torch.no_grad():
            hidden = adapter.model(input_ids=ids, attention_mask=inputs.attention_mask).logits
        expected[i] = float(clean - hidden[0, 1])
    e = explain(adapter, "occlusion", inputs, target=ClassTarget(1))
    np.testing.assert_allclose(e.scores, expected, rtol=1e-5, atol=1e-6)


def own_baseline_logit(adapter: Adapter, inputs: Inputs, index: int) -> float:
    """The module's logit ``index`` at the default baseline: pad tokens (special kept), or 0."""
    with torch.no_grad():
        if adapter.modality == "image":
            return float(adapter.model(torch.zeros_like(inputs.pixel_values))[0, index])
        ids = torch.where(inputs.special_tokens, inputs.input_ids, adapter.pad_token_id)
        logits = adapter.model(input_ids=ids, attention_mask=inputs.attention_mask).logits[0]
    return float((logits[-1] if adapter.family == "decoder-lm" else logits)[index])


@pytest.mark.parametrize("name", ["classifier", "decoder", "cnn"])
def test_conserving_methods_explain_the_models_own_logit(models, name):
    """IG and DeepLIFT split the module's own logit difference; AttnLRP starts from the logit."""
    adapter = models[name]
    inputs = adapter.preprocess(raw_input(adapter))
    logit = float(own_logits(adapter, inputs)[1])
    difference = logit - own_baseline_logit(adapter, inputs, 1)
    record = output_target(adapter, 1)
    for method, params in (("integrated_gradients", {"n_steps": 64}), ("deeplift", {})):
        e = explain(adapter, method, inputs, target=record, params=params)
        assert e.metrics["logit_difference"] == pytest.approx(difference, rel=1e-5, abs=1e-6)
        assert float(e.scores.sum()) == pytest.approx(difference, rel=0.02, abs=1e-4)
    if get_method("attnlrp").unsupported_reason(adapter) is None:
        e = explain(adapter, "attnlrp", inputs, target=record)
        assert e.metrics["target_logit"] == pytest.approx(logit, rel=1e-5, abs=1e-6)


#: Methods whose map is linear in the score attributed (RISE on logits, not probabilities).
LINEAR = {
    "gradient_x_input": {},
    "integrated_gradients": {"n_steps": 8},
    "deeplift": {},
    "deeplift_shap": {"n_references": 2},
    "occlusion": {},
    "shap": {"max_evals": 64},
    "rise": {"n_masks": 64, "output": "logit"},
    "attnlrp": {},
}


@pytest.mark.parametrize("name", ["classifier", "cnn"])
def test_a_target_scoring_twice_the_logit_doubles_the_map_of_linear_methods(models, name):
    adapter = models[name]
    inputs = adapter.preprocess(raw_input(adapter))
    for method, params in LINEAR.items():
        if get_method(method).unsupported_reason(adapter) is not None:
            continue
        plain = explain(adapter, method, inputs, target=ClassTarget(1), params=params)
        doubled = explain(adapter, method, inputs, target=Doubled(1), params=params)
        np.testing.assert_allclose(doubled.scores, 2 * plain.scores, rtol=1e-5, atol=1e-6)
        assert doubled.target.logit == pytest.approx(2 * plain.target.logit)


@pytest.mark.parametrize("method", ["gradient_x_input", "occlusion", "attnlrp"])
def test_a_target_naming_no_single_output_needs_no_change_to_the_methods(models, method):
    """The map of ``a − b`` is the map of ``a`` minus the map of ``b`` (linear methods)."""
    adapter = models["classifier"]
    inputs = adapter.preprocess(TEXT)
    cls = get_method(method)
    params = cls.resolve(adapter, {})  # as the gate hands them: validated, family defaults in

    def scores(target: Target) -> np.ndarray:
        return cls.attribute(adapter, inputs, target, dict(params), RunContext()).scores

    difference = scores(LogitDifference(1, 0))
    expected = scores(ClassTarget(1)) - scores(ClassTarget(0))
    np.testing.assert_allclose(difference, expected, rtol=1e-5, atol=1e-6)
