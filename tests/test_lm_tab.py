"""The Language model tab's fields: what a run asks the worker, what its link carries."""

from __future__ import annotations

from urllib.parse import parse_qs

import numpy as np
import pytest

from attrlab.app.ui.answers import AskedAnswer
from attrlab.app.ui.link import _link_field, share_query
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.request import CheckRequest
from attrlab.attribution.request.answers import AnswerSpec, answer_request


def _asked(**given) -> AskedAnswer:
    fields = {"answer": "", "contrast": "", "generate": False, "max_new_tokens": 16.0}
    fields |= {"stop": "", "chat": False, "per_step": True}
    return AskedAnswer(**(fields | given))


def test_the_fields_become_the_librarys_answer_spec():
    assert _asked().spec() is None  # nothing asked: the target menu's next token
    assert _asked(answer=" Paris", contrast=" Lyon").spec() == AnswerSpec(
        answer=" Paris", contrast=" Lyon", per_step=True
    )
    # generating leaves the typed answer (and reads the number of tokens as a whole number)
    assert _asked(answer=" Paris", generate=True, stop=".").spec() == AnswerSpec(
        generate=16, stop=".", per_step=True
    )
    # the chat template alone explains the next token in it: nothing to split per step
    assert _asked(chat=True).spec() == AnswerSpec(chat=True)
    assert _asked(answer=" Paris").request_fields() == {
        "answer": AnswerSpec(answer=" Paris", per_step=True),
        "target": None,
    }
    with pytest.raises(InvalidParameterError, match="1 to 256 new tokens"):
        _asked(generate=True, max_new_tokens=None).spec()


def test_a_link_carries_the_question_and_per_step_only_when_off():
    fields = {"tab": "next", "text": "The capital of France is"}
    typed = share_query(fields | _asked(answer=" Paris", contrast=" Lyon").link_fields())
    assert parse_qs(typed[1:]) == {
        "tab": ["next"],
        "text": ["The capital of France is"],
        "answer": [" Paris"],
        "contrast": [" Lyon"],
    }
    generated = _asked(answer=" Paris", generate=True, stop=".", per_step=False)
    query = parse_qs(share_query(fields | generated.link_fields())[1:])
    assert query["generate"] == ["1"] and query["max_new_tokens"] == ["16"]
    assert query["stop"] == ["."] and query["per_step"] == ["0"] and "answer" not in query


@pytest.mark.parametrize("value", ["0", "257", "16.5", "-3", "00000016", "١٦"])
def test_a_links_number_of_new_tokens_is_named_when_out_of_range(value):
    with pytest.raises(ValueError, match=r"max_new_tokens .* whole number from 1 to 256"):
        _link_field("max_new_tokens", value)


def test_a_links_answer_fields_read_back():
    assert _link_field("max_new_tokens", "16") == 16
    assert _link_field("per_step", "0") is False and _link_field("generate", "1") is True
    assert _link_field("answer", " Paris") == " Paris"


def test_several_methods_on_an_answer_compare_maps_of_the_same_contrast(load_model):
    # the page's Run with two methods: one check through the worker, per step
    prompt, answer, contrast = "the cat sat on the", " mat and slept", " floor"
    spec = AnswerSpec(answer=answer, contrast=contrast, per_step=True)
    methods = ("gradient_x_input", "occlusion")
    worker = ExplainWorker(device="cpu")
    try:
        check = worker.explain(
            CheckRequest(model="tiny-random-llama", text=prompt, answer=spec, methods=methods)
        )
    finally:
        worker.close()
    adapter = load_model("tiny-random-llama")
    inputs, target = answer_request(adapter, prompt, answer=answer, contrast=contrast)
    for method in methods:
        alone = explain(adapter, method, inputs, target, per_step=True)
        shown = check.explanations[method]
        assert shown.target_record == target
        np.testing.assert_allclose(shown.scores, alone.scores, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(shown.maps["steps"], alone.maps["steps"], rtol=1e-5, atol=1e-7)
    assert len(check.agreement) == 1
