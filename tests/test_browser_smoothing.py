"""The smoothing parameters on the page: widgets from the schema, a smoothed run, its cost."""

from __future__ import annotations

import pytest
from _browser import no_errors
from playwright.sync_api import expect

pytestmark = pytest.mark.browser  # Debian chromium through Playwright


def test_smoothgrad_from_the_method_parameters_runs_n_copies(page):
    methods = page.locator("#text-methods")
    methods.get_by_label("integrated_gradients", exact=True).uncheck()
    methods.get_by_label("attnlrp", exact=True).uncheck()
    methods.get_by_label("gradient", exact=True).check()
    # one accordion per chosen method: its parameters are one click away
    page.get_by_text("Parameters: Gradient (saliency) (gradient)", exact=True).click()
    mode = page.locator("#text-param-gradient-smoothing input")
    expect(mode).to_be_visible()
    mode.click()
    page.get_by_role("option", name="smoothgrad", exact=True).click()
    samples = page.locator("#text-param-gradient-smoothing_samples input")
    samples.fill("3")
    samples.press("Tab")
    page.locator("#text-run").click()
    column = page.locator('#text-maps .attr-column[data-method="gradient"]')
    expect(column).to_be_visible(timeout=120_000)
    assert "wonderful" in column.inner_text()
    page.get_by_text("Raw results (JSON)", exact=True).click()
    raw = page.locator("#text-raw")
    expect(raw).to_contain_text("smoothgrad", timeout=30_000)
    flat = raw.inner_text().replace("\n", "")
    assert '"params":{"smoothing":"smoothgrad","smoothing_samples":3,' in flat
    assert '"forward_passes":4,"backward_passes":3' in flat  # the prediction, then 3 copies
    expect(page.locator("#text-cost")).to_contain_text("4 forward and 3 backward passes")
    no_errors(page)
