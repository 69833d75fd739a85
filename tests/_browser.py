"""
Shared pieces of the browser tests: Debian's Chromium, error capture, tab switching.

The fixtures (``page_url``: the page served in-process, one server for the modules a pytest
process runs; ``browser``; ``page``: a fresh context on it, errors recorded, a screenshot at the
end) are in conftest.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect

__all__ = [
    "ARGS",
    "CHROMIUM",
    "ERRORS",
    "RECORD_ERRORS",
    "SHOTS",
    "errors",
    "exported",
    "no_errors",
    "tab",
]

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
SHOTS = Path(os.environ.get("ATTRLAB_SCREENSHOTS") or tempfile.mkdtemp(prefix="attrlab-shots-"))
#: What Gradio shows for an error: a toast (and the component's error frame).
ERRORS = ".toast-body.error, .error-message"
#: Every error the page shows is recorded as it appears (toasts close by themselves).
RECORD_ERRORS = """
window.__errors = [];
new MutationObserver(() => {
  document.querySelectorAll('SELECTOR').forEach((e) => {
    if (!e.dataset.recorded) { e.dataset.recorded = '1'; window.__errors.push(e.innerText); }
  });
}).observe(document, {childList: true, subtree: true});
""".replace("SELECTOR", ERRORS)


def errors(page: Page) -> list[str]:
    """Every error the page has shown since it opened."""
    return page.evaluate("() => window.__errors")


def no_errors(page: Page) -> None:
    assert errors(page) == []


def tab(page: Page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def exported(page: Page, key: str, folder: Path) -> Path:
    """Click a tab's Export, download the bundle it offers into ``folder``; the zip's path."""
    page.locator(f"#{key}-export").click()
    link = page.locator(f"#{key}-bundle a").first
    expect(link).to_be_visible(timeout=180_000)
    with page.expect_download() as info:
        link.click()
    path = folder / "bundle.zip"
    info.value.save_as(path)
    return path
