"""Shared fixtures: models are built once per session (all offline)."""

from __future__ import annotations

import os
import socket
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Servers the tests start keep their jobs in a throwaway folder, not the user's data folder.
os.environ.setdefault("ATTRLAB_DATA", tempfile.mkdtemp(prefix="attrlab-test-data-"))

import pytest
import torch

from attrlab.attribution.models import Adapter, load

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def load_model():
    """Load an alias once per session on the CPU: ``load_model("tiny-random-bert")``."""
    cache: dict[str, Adapter] = {}

    def _load(spec: str) -> Adapter:
        if spec not in cache:
            cache[spec] = load(spec, device="cpu")
        return cache[spec]

    return _load


@pytest.fixture(scope="session")
def minilm(load_model) -> Adapter:
    return load_model("minilm-zeroshot")


@pytest.fixture(scope="session")
def effnet(load_model) -> Adapter:
    return load_model("efficientnet-lite0")


@pytest.fixture(scope="session")
def smollm2(load_model) -> Adapter:
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def served():
    """The REST API in-process (FastAPI's test client) on its own unrestricted CPU worker."""
    from fastapi.testclient import TestClient

    from attrlab.app.server import create_app
    from attrlab.app.worker import ExplainWorker

    worker = ExplainWorker(device="cpu", max_models=1)
    with TestClient(create_app(worker)) as client:
        yield client
    worker.close()


# Browser tests (marked `browser`): helpers in _browser.py.
@pytest.fixture(scope="module")
def page_url():
    """The page served in-process on a loopback port with its own CPU worker."""
    from attrlab.app.ui import build_ui
    from attrlab.app.worker import ExplainWorker

    worker = ExplainWorker(device="cpu")
    demo = build_ui(worker)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()
    worker.close()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright (no browser download)."""
    from _browser import ARGS, CHROMIUM
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, page_url, request):
    """A fresh browser context on the served page; errors recorded, a screenshot at the end."""
    from _browser import RECORD_ERRORS, SHOTS

    context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    context.add_init_script(RECORD_ERRORS)
    page = context.new_page()
    page.goto(page_url)
    yield page
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()
