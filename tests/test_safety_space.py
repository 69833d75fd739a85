"""
The Space is as safe as REST: its Gradio API refuses an over-limit body before Gradio reads it
and gives REST's words for every limit; integer fields take what their schema promises; a
server with a token bounds a request's seconds by default.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import socket
from typing import Any
from urllib.parse import urlsplit

import gradio
import httpx
import jsonschema
import numpy as np
import pytest
from _live_server import launch_blocks
from fastapi.testclient import TestClient
from gradio_client import Client
from gradio_client.exceptions import AppError
from PIL import Image

from attrlab.app import space
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.models import load
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import output_target

TEXT_MODEL, IMAGE_MODEL = "tiny-random-bert", "tiny-random-vit"
LIMIT = 200_000
BODY_LIMIT_WORDS = f"the request body is larger than this server's limit of {LIMIT} bytes"
CALL = "/gradio_api/call/explain_batch"


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return ServerSettings.for_server(
        {},
        models=frozenset({TEXT_MODEL}),
        max_body_bytes=LIMIT,
        max_text_chars=1000,
        max_batch=3,
        data_dir=tmp_path_factory.mktemp("jobs"),
    )


@pytest.fixture(scope="module")
def space_port(settings):
    """The Space's Blocks, launched with the options ``app.space.launch`` gives them."""
    launched: dict[str, Any] = {}

    def record(demo: gradio.Blocks, **options: Any) -> None:
        launched.update(demo=demo, options=options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gradio.Blocks, "launch", record)
        patch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # launch bounds it
        space.launch(settings)
    demo = launched["demo"]
    url = launch_blocks(demo, **launched["options"])
    yield urlsplit(url).port
    demo.close()


@pytest.fixture(scope="module")
def space_client(space_port):
    return Client(f"http://127.0.0.1:{space_port}/", verbose=False)


@pytest.fixture(scope="module")
def rest(settings):
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as client:
        yield client
    worker.close()


@pytest.fixture
def parsed_bodies(monkeypatch):
    """The bodies the Space's ``explain_batch`` was handed, in order."""
    handed: list[dict[str, Any]] = []
    real = space.ExplainBody

    class Recorded:
        @staticmethod
        def model_validate(body: dict[str, Any]) -> Any:
            handed.append(body)
            return real.model_validate(body)

    monkeypatch.setattr(space, "ExplainBody", Recorded)
    return handed


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """Read one HTTP response (status line, headers, a Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), json.loads(body)


def _head(port: int, framing: str, path: str = CALL) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def _big_text_body(size: int) -> bytes:
    payload = {"model": TEXT_MODEL, "method": "gradient_x_input", "text": "a " * (size // 2)}
    return json.dumps({"data": [payload]}).encode()


@pytest.mark.server
def test_an_over_limit_body_is_refused_before_the_space_reads_it(space_port, parsed_bodies):
    refusal = {"error": {"code": "request_too_large", "message": BODY_LIMIT_WORDS}}
    body = _big_text_body(1_000_000)
    # A Content-Length over the limit: answered with only the first kilobyte sent, so nothing
    # waited for (or parsed) the rest; on every path Gradio serves.
    for path in (CALL, "/gradio_api/queue/join", "/gradio_api/upload", "/"):
        with socket.create_connection(("127.0.0.1", space_port), timeout=30) as sock:
            sock.sendall(_head(space_port, f"Content-Length: {len(body)}", path) + body[:1000])
            assert _answer(sock) == (413, refusal), path
    # No Content-Length: chunks past the limit, the body never ended, and still answered. The
    # server answers and closes as soon as the limit is passed, so a send may find the connection
    # closed; a client then stops sending and reads the answer, as HTTP clients do.
    with socket.create_connection(("127.0.0.1", space_port), timeout=30) as sock:
        sock.sendall(_head(space_port, "Transfer-Encoding: chunked"))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for start in range(0, 250_000, 10_000):
                piece = body[start : start + 10_000]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        assert _answer(sock) == (413, refusal)
    # The whole body sent, with its length: the same answer, and the handler never ran.
    whole = httpx.post(
        f"http://127.0.0.1:{space_port}{CALL}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert (whole.status_code, whole.json()) == (413, refusal)
    assert parsed_bodies == []
    # Under the limit the same route reaches the handler (the record above could see a call).
    small = {"model": TEXT_MODEL, "method": "gradient_x_input", "text": "a fine day"}
    started = httpx.post(f"http://127.0.0.1:{space_port}{CALL}", json={"data": [small]})
    event = started.json()["event_id"]
    with httpx.stream("GET", f"http://127.0.0.1:{space_port}{CALL}/{event}", timeout=120) as s:
        events = [line for line in s.iter_lines() if line.startswith("event:")]
    assert events[-1] == "event: complete"
    assert parsed_bodies == [small]


def _space_refusal(client: Client, body: dict[str, Any]) -> tuple[int | None, str]:
    """The Space's refusal of ``body``: an HTTP status and REST's error body, or a Gradio error."""
    try:
        client.predict(body, api_name="/explain_batch")
    except AppError as err:
        return None, str(err)
    except httpx.HTTPStatusError as err:
        return err.response.status_code, err.response.json()["error"]["message"]
    raise AssertionError(f"the Space explained {str(body)[:80]}")


@pytest.mark.server
def test_the_space_refuses_what_rest_refuses_with_the_same_words(rest, space_client):
    one = {"model": TEXT_MODEL, "method": "gradient_x_input"}
    instances = [{"text": "a fine day"}] * 5
    over_body = [{"text": "a fine day"}] * 20_000  # ~480 kB: the body limit comes first
    cases = [
        ({**one, "instances": instances}, 422, None, "a batch holds at most 3 instances"),
        ({**one, "text": "a" * 2000}, 413, None, "the text has 2000 characters"),
        ({**one, "text": "a " * 150_000}, 413, 413, BODY_LIMIT_WORDS),
        ({**one, "instances": over_body}, 413, 413, BODY_LIMIT_WORDS),
    ]
    for body, rest_status, space_status, words in cases:
        answer = rest.post("/api/v1/explain", json=body)
        assert answer.status_code == rest_status, answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith(words)
        assert _space_refusal(space_client, body) == (space_status, message)


@pytest.mark.server
def test_whole_numbers_are_integers_as_the_schema_says(rest, space_client):
    body = {
        "model": TEXT_MODEL,
        "method": "rise",
        "text": "a fine day",
        "target": 1.0,
        "seed": 632.0,
        "params": {"n_masks": 8.0},
    }
    schema = rest.get("/openapi.json").json()
    body_schema = {"$ref": "#/components/schemas/ExplainBody", **schema}
    jsonschema.validate(body, body_schema)  # what a schema-driven client may send
    assert schema["components"]["schemas"]["ExplainBody"]["properties"]["seed"]["type"] == (
        "integer"
    )
    adapter = load(TEXT_MODEL, device="cpu")
    expected = explain(
        adapter,
        "rise",
        adapter.preprocess("a fine day"),
        target=output_target(adapter, 1),
        params={"n_masks": 8},
        settings=RunSettings(seed=632),
    )
    served = rest.post("/api/v1/explain", json=body)
    assert served.status_code == 200, served.text
    from_space = space_client.predict(body, api_name="/explain_batch")
    for answer in (served.json(), from_space):
        assert answer["target"]["index"] == 1
        np.testing.assert_allclose(answer["scores"], expected.scores, rtol=1e-6, atol=1e-9)
    # Not whole, or not a number: refused as before, with the same words on both.
    for params, words in (
        ({"n_masks": 8.5}, "parameter 'n_masks' must be of type int; got 8.5"),
        ({"n_masks": "8"}, "parameter 'n_masks' must be of type int; got '8'"),
        ({"n_masks": True}, "parameter 'n_masks' must be of type int; got True"),
    ):
        refused = rest.post("/api/v1/explain", json={**body, "params": params})
        assert refused.status_code == 422
        assert refused.json()["error"] == {"code": "invalid_parameter", "message": words}
        assert _space_refusal(space_client, {**body, "params": params}) == (None, words)
    for field, value in (("seed", 632.5), ("seed", "632"), ("target", 1.5)):
        refused = rest.post("/api/v1/explain", json={**body, field: value})
        assert refused.status_code == 422
        assert refused.json()["error"]["message"].startswith(f"body.{field}"), refused.json()


def _noise_png_base64() -> str:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


SOBOL = {
    "model": IMAGE_MODEL,
    "method": "sobol",
    "image_base64": _noise_png_base64(),
    # 4096·(32² + 2) Sobol passes and the prediction's own, one at a time: at well under a
    # millisecond a pass (the fastest a CPU runs this ViT), still far over 120 s.
    "params": {"grid": 32, "n_designs": 4096, "batch_size": 1},
}


def _answer_to_sobol(env: dict[str, str], **overrides: Any) -> dict[str, str]:
    settings = ServerSettings.for_server(
        env,
        models=frozenset({IMAGE_MODEL}),
        max_forward_passes=1000,
        param_limits={"n_designs": 4096},
        **overrides,
    )
    worker = ExplainWorker(device="cpu", settings=settings)
    try:
        with TestClient(create_app(worker)) as client:
            answer = client.post(
                "/api/v1/explain", json=SOBOL, headers={"Authorization": "Bearer s3cret"}
            )
    finally:
        worker.close()
    assert answer.status_code == 422, answer.text
    return answer.json()["error"]


def test_a_server_with_a_token_bounds_a_requests_seconds_by_default(tmp_path):
    data = {"data_dir": tmp_path}
    with_token = _answer_to_sobol({"ATTRLAB_API_TOKEN": "s3cret"}, **data)
    assert with_token["code"] == "too_slow", with_token
    assert "≈ 4,202,497 forward passes" in with_token["message"]
    assert "this server allows 120 s per request: lower n_designs" in with_token["message"]
    # The same request on a server without a token has no seconds limit: the forward-pass
    # budget, checked next, refuses it instead.
    without = _answer_to_sobol({}, **data)
    assert without["code"] == "over_budget" and "4,202,497 forward passes" in without["message"]
    # ATTRLAB_MAX_SECONDS still sets the limit with a token.
    generous = {"ATTRLAB_API_TOKEN": "s3cret", "ATTRLAB_MAX_SECONDS": "1e9"}
    assert _answer_to_sobol(generous, **data)["code"] == "over_budget"
    assert _answer_to_sobol({}, api_token="s3cret", **data)["code"] == "too_slow"
