"""20 concurrent clients against a live ``attrlab serve`` process on loopback."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from _live_server import running_server

pytestmark = pytest.mark.server  # attrlab serve in its own process

TOKEN = "live-test-token"
BODY = {
    "model": "minilm-zeroshot",
    "method": "integrated_gradients",
    "text": "A warm, funny and moving film.",
    "params": {"n_steps": 16},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {
        **os.environ,
        "ATTRLAB_API_TOKEN": TOKEN,
        "ATTRLAB_MODELS": "minilm-zeroshot,tiny-random-bert",
        # a token server refuses work priced over 120 s by default; the job that a client
        # leaves below must start, to be cancelled
        "ATTRLAB_MAX_SECONDS": "100000",
        "HF_HUB_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    log = tmp_path_factory.mktemp("log") / "server.log"
    with running_server(env, log) as (port, _):
        yield f"http://127.0.0.1:{port}"
    assert "Traceback" not in log.read_text()


def test_twenty_concurrent_clients(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def client(_: int) -> httpx.Response:
        with httpx.Client(base_url=server, timeout=300) as http:
            return http.post("/api/v1/explain", json=BODY, headers=headers)

    with ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(client, range(20)))
    assert [r.status_code for r in responses] == [200] * 20
    first = responses[0].json()
    for r in responses[1:]:
        e = r.json()
        assert e["scores"] == first["scores"] and e["target"] == first["target"]
    assert first["target"]["label"] == "positive"
    status = httpx.get(f"{server}/api/v1/status", headers=headers).json()
    assert status["model_loads"] == {"minilm-zeroshot": 1} and status["queued"] == 0


def test_a_client_that_goes_away_cancels_its_job(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    long_job = {
        **BODY,
        "method": "rise",
        "params": {"n_masks": 8000, "batch_size": 8, "every_pattern": False},
    }
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server}/api/v1/explain", json=long_job, headers=headers, timeout=2)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # 8000 masks take minutes; cancelled, they stop now
        if httpx.get(f"{server}/api/v1/status", headers=headers).json()["queued"] == 0:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the job went on after its client had gone")


def test_live_server_refuses_without_the_token(server):
    denied = httpx.post(f"{server}/api/v1/explain", json=BODY)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
    assert httpx.get(f"{server}/api/v1/status").status_code == 401
    assert httpx.get(f"{server}/api/v1/health").json() == {"status": "ok"}
    # The page's own API asks for the same token (as the login password), so it is no way round.
    ui_call = httpx.post(
        f"{server}/gradio_api/call/explain_text",
        json={"data": ["minilm-zeroshot", "", "good", "", ["gradient_x_input"], 0, 0, 0, {}]},
    )
    assert ui_call.status_code == 401
