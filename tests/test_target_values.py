"""
An Explanation's ``target`` names its values for what they hold: a class's logit and
probability, a whole answer's log-probability, a contrast's log-probability difference and
probability ratio; each checked against the model's own logits read here, in the library and
over REST, and named in the REST API's schema. Files of older schemas read under the new names.
"""

from __future__ import annotations

import math

import jsonschema
import pytest
import torch

from attrlab.attribution import explain
from attrlab.attribution.explanation import SCHEMA_VERSION, Explanation
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.target import output_target

LM, CLASSIFIER = "tiny-random-gpt2", "tiny-random-bert"
PROMPT = "The capital of France is"
#: A contrast of several tokens against one (the alternative read from a sequence of its own).
ANSWER, ALTERNATIVE = " Paris, the city of light", " Lyon"
ONE_OUTPUT = {"index", "label", "logit", "probability"}
ANSWER_VALUES = {"index", "label", "log_probability", "probability"}
CONTRAST_VALUES = {"index", "label", "log_probability_difference", "probability_ratio"}


def _log_p(adapter, prompt: list[int], answer: list[int]) -> float:
    """``log p(answer | prompt)`` from one forward of prompt + answer: each token's log-softmax."""
    with torch.no_grad():
        logits = adapter.model(input_ids=torch.tensor([prompt + answer])).logits[0].double()
    steps = logits.log_softmax(-1)[len(prompt) - 1 : -1]  # position t predicts token t + 1
    return float(sum(steps[k, token] for k, token in enumerate(answer)))


def _prompt_and_tokens(adapter, *texts: str) -> tuple[list[int], list[list[int]]]:
    """The prompt's token ids as the library feeds them, and each text's own token ids."""
    inputs = adapter.preprocess(PROMPT)
    prompt = inputs.input_ids[0, : int(inputs.attention_mask[0].sum())].tolist()
    encode = adapter.tokenizer
    return prompt, [encode(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_a_contrasts_target_holds_its_log_probability_difference_and_ratio(load_model):
    adapter = load_model(LM)
    prompt, (answer, alternative) = _prompt_and_tokens(adapter, ANSWER, ALTERNATIVE)
    assert len(answer) > 1 and answer[0] != alternative[0]
    difference = _log_p(adapter, prompt, answer) - _log_p(adapter, prompt, alternative)
    inputs, target = answer_request(adapter, PROMPT, answer=ANSWER, contrast=ALTERNATIVE)
    e = explain(adapter, "gradient_x_input", inputs, target)
    assert set(e.to_dict()["target"]) == CONTRAST_VALUES
    assert e.target.log_probability_difference == pytest.approx(difference, abs=1e-4)
    assert e.target.probability_ratio == pytest.approx(math.exp(difference), rel=1e-4)
    assert e.target.logit is None and e.target.probability is None


def test_a_whole_answers_target_holds_its_log_probability(load_model):
    adapter = load_model(LM)
    prompt, (answer,) = _prompt_and_tokens(adapter, ANSWER)
    log_p = _log_p(adapter, prompt, answer)
    inputs, target = answer_request(adapter, PROMPT, answer=ANSWER)
    e = explain(adapter, "gradient_x_input", inputs, target)
    assert set(e.to_dict()["target"]) == ANSWER_VALUES
    assert e.target.log_probability == pytest.approx(log_p, abs=1e-4)
    assert e.target.probability == pytest.approx(math.exp(log_p), rel=1e-4)
    assert e.target.index == answer[0]


def test_a_class_target_keeps_its_logit_and_probability(load_model):
    adapter = load_model(CLASSIFIER)
    inputs = adapter.preprocess("a fine day")
    with torch.no_grad():
        logits = adapter.model(**inputs.model_kwargs()).logits[0].double()
    e = explain(adapter, "gradient_x_input", inputs, target=output_target(adapter, 1))
    assert set(e.to_dict()["target"]) == ONE_OUTPUT
    assert e.target.logit == pytest.approx(float(logits[1]), abs=1e-5)
    assert e.target.probability == pytest.approx(float(logits.softmax(-1)[1]), abs=1e-6)


def _schema_of(client, route: str) -> dict:
    """The OpenAPI schema of ``route``'s 200 answer, its components alongside."""
    spec = client.get("/openapi.json").json()
    ok = spec["paths"][route]["post"]["responses"]["200"]["content"]["application/json"]
    return {**ok["schema"], "components": spec["components"]}


def test_rest_answers_name_the_values_and_the_schema_says_what_each_holds(served, load_model):
    adapter = load_model(LM)
    prompt, (answer, alternative) = _prompt_and_tokens(adapter, ANSWER, ALTERNATIVE)
    ours, theirs = _log_p(adapter, prompt, answer), _log_p(adapter, prompt, alternative)
    body = {"model": LM, "method": "gradient_x_input", "text": PROMPT, "answer": ANSWER}
    contrast = served.post("/api/v1/explain", json={**body, "contrast": ALTERNATIVE}).json()
    whole = served.post("/api/v1/explain", json=body).json()
    batch = served.post(
        "/api/v1/explain",
        json={**{k: body[k] for k in ("model", "method")}, "instances": [{"text": PROMPT}]},
    ).json()
    assert contrast["schema_version"] == whole["schema_version"] == SCHEMA_VERSION == 5
    assert set(contrast["target"]) == CONTRAST_VALUES and set(whole["target"]) == ANSWER_VALUES
    assert contrast["target"]["log_probability_difference"] == pytest.approx(
        ours - theirs, abs=1e-4
    )
    assert contrast["target"]["probability_ratio"] == pytest.approx(math.exp(ours - theirs), 1e-4)
    assert whole["target"]["log_probability"] == pytest.approx(ours, abs=1e-4)
    (row,) = batch["explanations"]
    assert set(row["gradient_x_input"]["target"]) == ONE_OUTPUT  # the next token
    schema = _schema_of(served, "/api/v1/explain")
    for answered in (contrast, whole, batch):
        jsonschema.validate(answered, schema)
    values = schema["components"]["schemas"]["TargetValuesBody"]["properties"]
    described = {name: field.get("description", "") for name, field in values.items()}
    assert "log p(answer) − log p(alternative)" in described["log_probability_difference"]
    assert "p(answer) / p(alternative)" in described["probability_ratio"]
    assert "log p(answer | prompt)" in described["log_probability"]
    assert "A contrast" not in described["probability"] + described["logit"]
    explanation = schema["components"]["schemas"]["ExplanationBody"]["properties"]
    assert explanation["schema_version"]["const"] == SCHEMA_VERSION
    misnamed = {**contrast, "target": {**contrast["target"], "ratio": 1.0}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misnamed, schema)


def test_a_schema_4_file_reads_its_values_under_the_names_of_what_they_hold(load_model):
    """Up to 4 every kind stored its score as ``logit`` and its exp as ``probability``."""
    adapter = load_model(LM)
    contrast = answer_request(adapter, PROMPT, answer=ANSWER, contrast=ALTERNATIVE)
    answer = answer_request(adapter, PROMPT, answer=ANSWER)
    next_token = (adapter.preprocess(PROMPT), None)  # the model's own next token
    for (inputs, target), score_name, second in (
        (contrast, "log_probability_difference", "probability_ratio"),
        (answer, "log_probability", "probability"),
        (next_token, "logit", "probability"),  # one output: as it was
    ):
        current = explain(adapter, "gradient", inputs, target).to_dict()
        older = {**current, "schema_version": 4}
        older["target"] = {"index": 7, "label": "written by schema 4", "logit": -2.5}
        older["target"]["probability"] = 0.0820849986238988  # e ** -2.5, as 4 stored it
        values = Explanation.from_dict(older).target
        assert (values.index, values.label) == (7, "written by schema 4")
        assert getattr(values, score_name) == -2.5
        assert getattr(values, second) == 0.0820849986238988
        named = {k for k, v in vars(values).items() if v is not None}
        assert named == {"index", "label", score_name, second}
