"""
A refused call to the page or the Space leaves nothing behind, and parameters are bounded alike.

Gradio kept what a call carried: each call's session copied every input's value, and the queue
kept the last event's request and parsed inputs (:mod:`app.ui.gradio_compat`). Each call here
carries a parameter holding a list of a million and a half items (6 MiB of JSON, some 100 MB
once parsed), and is refused; the process's resident memory, read from Linux after a
collection, must come back near where it was. The parameters' bound is the REST schema's:
checked here against REST's own answer.
"""

from __future__ import annotations

import gc
import json
import time
from typing import Any

import gradio
import httpx
import pytest
from _live_server import launch_blocks
from fastapi.testclient import TestClient

from attrlab.app import space
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.ui import build_ui
from attrlab.app.ui.page import SESSIONS_KEPT
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.request.memory import _trim, resident_bytes

MODEL = "tiny-random-bert"
#: Items in the hostile parameter: 4 bytes each as JSON, some 70 bytes each once parsed.
ITEMS = 1_500_000
CALLS = 5
#: How far above its resting size the process may stay once the calls are over.
SLACK = 150 * 2**20
#: What a parameter's value may be, as every front end says it.
BOUND = "a parameter's value is a number, true or false, or a text of at most 200 characters"


def _resting() -> int:
    gc.collect()
    _trim()
    found = resident_bytes()
    assert found is not None
    return found


def _settled(baseline: int) -> int:
    """The resident size once the last call's leftovers could go (up to 10 s)."""
    deadline = time.monotonic() + 10
    while (now := _resting()) > baseline + SLACK and time.monotonic() < deadline:
        time.sleep(0.5)
    return now


def _call(url: str, api: str, data: list[Any]) -> str:
    """``POST /gradio_api/call/<api>``, then its result's stream: the last data line."""
    body = json.dumps({"data": data}).encode()
    with httpx.Client(base_url=url, timeout=120) as http:
        started = http.post(
            f"gradio_api/call/{api}", content=body, headers={"content-type": "application/json"}
        )
        assert started.status_code == 200, started.text
        event = started.json()["event_id"]
        with http.stream("GET", f"gradio_api/call/{api}/{event}") as stream:
            lines = [line for line in stream.iter_lines() if line.startswith(("event:", "data:"))]
    assert lines[-2] == "event: error", lines[-2:]  # refused
    return lines[-1]


@pytest.fixture(scope="module")
def page_url():
    worker = ExplainWorker(device="cpu", max_models=1)
    demo = build_ui(worker).queue()
    url = launch_blocks(demo)
    yield url
    demo.close()
    worker.close()


def _explain_text(url: str, params: Any) -> list[Any]:
    """The inputs of the page's ``explain_text``: its defaults, a text, a method, ``params``."""
    info = httpx.get(f"{url}gradio_api/info", timeout=60).json()
    names = [p["parameter_name"] for p in info["named_endpoints"]["/explain_text"]["parameters"]]
    given = {"model_": MODEL, "source_": "a fine day", "methods": ["gradient_x_input"]}
    given |= {"seed_": 0, "params": params}
    defaults = info["named_endpoints"]["/explain_text"]["parameters"]
    return [given.get(n, p.get("parameter_default")) for n, p in zip(names, defaults, strict=True)]


@pytest.mark.server
def test_refused_page_calls_leave_the_memory_as_it_was(page_url):
    small = _explain_text(page_url, {"gradient_x_input": {"x": [{}]}})
    _call(page_url, "explain_text", small)  # the first call's own costs (imports, a session)
    baseline = _resting()
    hostile = _explain_text(page_url, {"gradient_x_input": {"x": [{}] * ITEMS}})
    answers = [_call(page_url, "explain_text", hostile) for _ in range(CALLS)]
    grown = _settled(baseline) - baseline
    assert grown < SLACK, f"{grown / 2**20:.0f} MB kept after {CALLS} refused calls"
    for answer in answers:  # refused by the parameters' bound, in words, not quoting them
        assert BOUND in answer and "{}" not in answer


@pytest.fixture(scope="module")
def space_url(tmp_path_factory):
    """The Space's Blocks, launched with the options ``app.space.launch`` gives them."""
    settings = ServerSettings.for_server(
        {}, models=frozenset({MODEL}), data_dir=tmp_path_factory.mktemp("jobs")
    )
    launched: dict[str, Any] = {}

    def record(demo: gradio.Blocks, **options: Any) -> None:
        launched.update(demo=demo, options=options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gradio.Blocks, "launch", record)
        space.launch(settings)
    demo = launched["demo"]
    url = launch_blocks(demo, **launched["options"])
    yield url, settings, launched["options"]
    demo.close()


@pytest.mark.server
def test_refused_space_calls_leave_the_memory_as_it_was(space_url):
    url, _, options = space_url
    body = {"model": MODEL, "method": "gradient_x_input", "text": "a fine day"}
    _call(url, "explain_batch", [{**body, "params": {"x": [{}]}}])
    baseline = _resting()
    hostile = [{**body, "params": {"x": [{}] * ITEMS}}]
    answers = [_call(url, "explain_batch", hostile) for _ in range(CALLS)]
    grown = _settled(baseline) - baseline
    assert grown < SLACK, f"{grown / 2**20:.0f} MB kept after {CALLS} refused calls"
    for answer in answers:
        assert BOUND in answer and "{}" not in answer
    # each call through the API is a session of its own: the Space keeps 1,000, not 10,000
    assert options["state_session_capacity"] == SESSIONS_KEPT == 1000


@pytest.mark.server
@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"x": [1, 2]}, BOUND),
        ({"n_steps": "8" * 201}, BOUND),
        ({"n_steps": {"deep": 1}}, BOUND),
        ({f"p{i}": 1 for i in range(51)}, "at most 50"),
    ],
)
def test_page_space_and_rest_bound_parameters_alike(page_url, space_url, params, words):
    url, settings, _ = space_url
    method = "integrated_gradients"
    body = {"model": MODEL, "method": method, "text": "a fine day", "params": params}
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as client:
        rest = client.post("/api/v1/explain", json=body)
    worker.close()
    assert rest.status_code == 422 and words in rest.json()["error"]["message"], rest.text
    page = _call(page_url, "explain_text", _explain_text(page_url, {method: params}))
    space_answer = _call(url, "explain_batch", [body])
    for answer in (page, space_answer):
        assert words in answer, answer
