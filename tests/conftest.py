"""Shared fixtures: models are built once per session (all offline)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Servers the tests start keep their jobs in a throwaway folder, not the user's data folder.
os.environ.setdefault("ATTRLAB_DATA", tempfile.mkdtemp(prefix="attrlab-test-data-"))
# Waiting OpenMP threads sleep instead of spinning, in this process and those the tests start:
# `make test` runs two pytest workers with two torch threads each on two cores, and spinning
# threads burnt the other worker's time. Four CPU-bound test files (2026-12-03, two workers):
# 126 s spinning, 64 s sleeping. One thread per worker took 53 s there, but the browser files
# a third longer on the whole suite (33 min 6 s): their runs lost the core the page left idle.
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

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
def page_url() -> Iterator[str]:
    """
    The page's address: served in-process with its own CPU worker, a server of the module's own.

    A server shared across modules was tried: a module whose long run outlived its test held
    up the next module's runs.
    """
    from _live_server import launch_blocks

    from attrlab.app.ui import build_ui
    from attrlab.app.worker import ExplainWorker

    worker = ExplainWorker(device="cpu")
    demo = build_ui(worker)
    try:
        yield launch_blocks(demo)
    finally:
        demo.close()
        worker.close()


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium through Playwright (no browser download), one per pytest process."""
    from _browser import ARGS, CHROMIUM
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def blank_page(browser, page_url, request):
    """
    A fresh browser context, nothing opened yet: for a test that opens a link first.

    Errors are recorded; a screenshot of the whole page when the test failed. (Each load of
    the page costs seconds; a whole-page screenshot of the long page costs 6–8 s, so a test
    that passed takes none: 40 browser tests took 4–5 min of them.)
    """
    from _browser import RECORD_ERRORS, SHOTS
    from playwright.sync_api import Error as PlaywrightError

    context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    context.add_init_script(RECORD_ERRORS)
    page = context.new_page()
    yield page
    report = getattr(request.node, "call_report", None)
    if report is not None and report.failed:
        SHOTS.mkdir(parents=True, exist_ok=True)
        try:  # a record for CI's artifacts, not a check: a page too busy to draw one fails nothing
            page.screenshot(path=str(SHOTS / f"{request.node.name}.png"), full_page=True)
        except PlaywrightError as err:
            print(f"no screenshot of {request.node.name}: {err.message.splitlines()[0]}")
    context.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each test's call report on its item: the browser fixtures read whether it failed."""
    report = yield
    if report.when == "call":
        item.call_report = report
    return report


@pytest.fixture
def page(blank_page, page_url):
    """:func:`blank_page` on the served page."""
    blank_page.goto(page_url)
    return blank_page
