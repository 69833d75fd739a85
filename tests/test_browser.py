"""A person's path through the page in headless Debian Chromium: type, click, see the heatmap."""

from __future__ import annotations

import shutil
import socket

import pytest
from playwright.sync_api import expect, sync_playwright

from app.ui import build_ui
from app.worker import ExplainWorker

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def page_url():
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
def page(page_url):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.goto(page_url)
        yield page
        browser.close()


def test_text_tab_shows_token_heatmap_and_plot(page):
    page.locator("#text-input textarea").fill("An absolutely dreadful film.")
    page.locator("#text-explain").click()
    tokens = page.locator("#text-tokens span.token")  # HighlightedText renders one per token
    expect(tokens.first).to_be_visible(timeout=60_000)
    assert "dreadful" in " ".join(tokens.all_inner_texts())
    expect(page.locator("#text-plot .js-plotly-plot")).to_be_visible()
    expect(page.get_by_text('"negative"').first).to_be_visible()


def test_text_tab_shows_a_clear_error_for_empty_text(page):
    page.locator("#text-input textarea").fill("   ")
    page.locator("#text-explain").click()
    expect(page.get_by_text("the text is empty").first).to_be_visible(timeout=30_000)


def test_image_tab_shows_heatmap_overlay(page, tmp_path):
    from PIL import Image
    from skimage import data

    path = tmp_path / "cat.png"
    Image.fromarray(data.chelsea()).save(path)
    page.get_by_role("tab", name="Image").click()
    page.locator("#image-input input[type=file]").set_input_files(str(path))
    page.locator("#image-explain").click()
    expect(page.locator("#image-heatmap img")).to_be_visible(timeout=90_000)
    expect(page.get_by_text("Egyptian cat").first).to_be_visible()
