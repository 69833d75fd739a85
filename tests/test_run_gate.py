"""
The run gate: every front end refuses what the library's gate refuses, with the same words.

One table of refusals (an unknown method, a method that does not apply to the model, a bad
parameter, a run over the forward-pass budget, a run over the seconds budget), each checked
through the CLI (exit status and message), REST (status and error code), the page and the
Space's runner (the message the page shows, the error the Space maps), and the library itself
(the error class the front ends map). The CLI trusts its user and has no budgets, so the
budget rows are not asked of it. Then: no method changes the params dict it is given.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import _perturbation_toys as toys
import gradio
import numpy as np
import pytest
import torch
from _small_budgets import SMALL_BUDGETS
from fastapi.testclient import TestClient
from torch import nn

from attrlab.app import space
from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.ui import PageRunner
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import (
    AttrlabError,
    BudgetExceededError,
    InvalidParameterError,
    UnknownMethodError,
    UnsupportedMethodError,
)
from attrlab.attribution.methods import available_methods
from attrlab.attribution.request import ExplainRequest
from attrlab.attribution.request.target import output_target

MODEL = "tiny-random-bert"
TEXT = "a fine day"
#: The servers' budgets: passes for the "passes" rows, seconds (far below any run) for "seconds".
PASSES, SECONDS = 1000, 0.001

#: name, method, params, which budget the server has, error class, REST status and code, words.
CASES = [
    (
        "unknown method",
        "nope",
        {},
        "passes",
        UnknownMethodError,
        404,
        "unknown_method",
        "unknown method 'nope'",
    ),
    (
        "not applicable",
        "gradcam",
        {},
        "passes",
        UnsupportedMethodError,
        400,
        "method_not_applicable",
        "gradcam works on image models, not text",
    ),
    (
        "invalid parameter",
        "integrated_gradients",
        {"n_steps": 0},
        "passes",
        InvalidParameterError,
        422,
        "invalid_parameter",
        "parameter 'n_steps' must be between 2",
    ),
    (
        "over the pass budget",
        "rise",
        {"n_masks": 2 * PASSES, "every_pattern": False},  # drawn masks, not the few patterns
        "passes",
        BudgetExceededError,
        422,
        "over_budget",
        f"this server allows at most {PASSES:,} per request",
    ),
    (
        "over the seconds budget",
        "rise",
        {"n_masks": 100, "every_pattern": False},
        "seconds",
        None,  # TooSlowError, imported from its new home in the library test below
        422,
        "too_slow",
        f"this server allows {SECONDS:g} s per request: lower n_masks",
    ),
]
IDS = [case[0] for case in CASES]
#: The rows a caller without budgets (the CLI) meets.
POLICY_CASES = [
    case for case in CASES if case[3] == "passes" and case[4] is not BudgetExceededError
]


@pytest.fixture(scope="module")
def workers():
    """A served worker per budget: one bounds forward passes, the other seconds."""
    base = ServerSettings.for_server({}, models=frozenset({MODEL}))
    made = {
        "passes": ExplainWorker(device="cpu", settings=replace(base, max_forward_passes=PASSES)),
        "seconds": ExplainWorker(device="cpu", settings=replace(base, max_seconds=SECONDS)),
    }
    yield made
    for worker in made.values():
        worker.close()


def _request(method: str, params: dict[str, Any]) -> ExplainRequest:
    return ExplainRequest(model=MODEL, method=method, text=TEXT, params=params)


@pytest.mark.parametrize(
    ("name", "method", "params", "budget", "error", "status", "code", "words"), CASES, ids=IDS
)
def test_rest_refuses_with_its_status_and_code(
    workers, name, method, params, budget, error, status, code, words
):
    body = {"model": MODEL, "method": method, "text": TEXT, "params": params}
    with TestClient(create_app(workers[budget])) as client:
        response = client.post("/api/v1/explain", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert words in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("name", "method", "params", "budget", "error", "status", "code", "words"),
    POLICY_CASES,
    ids=[case[0] for case in POLICY_CASES],
)
def test_the_cli_refuses_with_exit_status_2_and_one_line(
    capsys, name, method, params, budget, error, status, code, words
):
    pairs = [f"--param={key}={value}" for key, value in params.items()]
    argv = ["explain", "--model", MODEL, "--method", method, "--text", TEXT, "--device", "cpu"]
    assert main([*argv, *pairs]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("name", "method", "params", "budget", "error", "status", "code", "words"), CASES, ids=IDS
)
def test_the_page_shows_the_refusal(
    workers, name, method, params, budget, error, status, code, words
):
    page = PageRunner(workers[budget])
    with pytest.raises(gradio.Error) as refused:
        page(_request(method, params), progress=lambda *args, **kwargs: None)
    assert words in refused.value.message


def _slot(task: Any, duration: Any) -> Any:
    """A GPU slot that runs its task in place (ZeroGPU's ``spaces.GPU`` stands in the Space)."""
    return task


@pytest.mark.parametrize(
    ("name", "method", "params", "budget", "error", "status", "code", "words"), CASES, ids=IDS
)
def test_the_space_refuses_with_the_same_error(
    workers, name, method, params, budget, error, status, code, words
):
    from attrlab.app.errors import error_status

    runner = space.SpaceRunner(workers[budget], max_slot_s=120, gpu=_slot)
    with pytest.raises(AttrlabError) as refused:
        runner.run(_request(method, params))
    assert error_status(refused.value) == (status, code)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("name", "method", "params", "budget", "error", "status", "code", "words"), CASES, ids=IDS
)
def test_the_library_gate_raises_the_class_the_front_ends_map(
    load_model, name, method, params, budget, error, status, code, words
):
    from attrlab.app.errors import ERROR_STATUS
    from attrlab.attribution import explain
    from attrlab.attribution.errors import TooSlowError
    from attrlab.attribution.request.gate import clear
    from attrlab.attribution.request.run import RunSettings

    error = error or TooSlowError
    assert ERROR_STATUS[error] == (status, code)
    adapter = load_model(MODEL)
    inputs = adapter.preprocess(TEXT)
    if budget == "passes":
        settings = RunSettings(max_forward_passes=PASSES)
    else:
        settings = RunSettings(max_seconds=SECONDS)
    if error is BudgetExceededError:  # the passes are held while the run goes, as before
        clear(adapter, method, inputs, params, settings)
        with pytest.raises(error) as refused:
            explain(adapter, method, inputs, params=params, settings=settings)
    else:
        with pytest.raises(error) as refused:
            clear(adapter, method, inputs, params, settings)
    assert type(refused.value) is error and words in str(refused.value)


# --- no caller's params are changed ----------------------------------------------------------

IMAGE = np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def tiny_models(load_model):
    """A text and a vision transformer, a decoder LM and a CNN: every method applies to one."""
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    )
    specs = ["tiny-random-bert", "tiny-random-llama", "tiny-random-vit"]
    return [load_model(spec) for spec in specs] + [toys.image_adapter(cnn)]


@pytest.mark.parametrize("method", [m.name for m in available_methods()])
def test_no_method_changes_the_params_it_is_given(tiny_models, method):
    """
    Neither the caller's dict (resolve, explain) nor the resolved one (the method's hooks).

    The hooks get the resolved parameters read-only: any write to them raises, even one that
    writes back the value already there (AttnLRP recorded its family defaults that way).
    """
    from attrlab.attribution import explain
    from attrlab.attribution.methods import get_method
    from attrlab.attribution.request.run import RunContext

    cls = get_method(method)
    adapter = next(a for a in tiny_models if cls.unsupported_reason(a) is None)
    inputs = adapter.preprocess(IMAGE if adapter.modality == "image" else TEXT)
    given = {p.name: p.default for p in cls.params} | SMALL_BUDGETS.get(method, {})
    if method == "occlusion" and adapter.modality == "image":
        given["window"] = 8
    kept = copy.deepcopy(given)
    resolved = cls.resolve(adapter, MappingProxyType(given))
    assert given == kept and resolved is not given
    handed = copy.deepcopy(resolved)
    read_only = MappingProxyType(resolved)
    cls.passes(adapter, inputs, read_only)  # type: ignore[arg-type]
    cls.attribute(adapter, inputs, output_target(adapter, 0), read_only, RunContext())  # type: ignore[arg-type]
    assert resolved == handed
    explanation = explain(adapter, method, inputs, target=output_target(adapter, 0), params=given)
    assert given == kept and explanation.params == handed


def test_the_advice_names_only_parameters_that_set_work_in_this_run():
    from attrlab.attribution.request.gate import lighter

    # Smoothing's copies cost nothing while smoothing is off (its default), so they are not
    # advised then; a run that smooths is told to lower them too.
    assert lighter("integrated_gradients", {}) == "lower n_steps, or give a smaller input"
    smoothed = lighter("integrated_gradients", {"smoothing": "smoothgrad"})
    assert smoothed == "lower n_steps, lower smoothing_samples, or give a smaller input"
    # Without the run's parameters every workload parameter is named.
    assert "lower smoothing_samples" in lighter("integrated_gradients")
