"""
The KV cache tab in headless Debian Chromium.

Expected numbers come from :func:`attribution.eviction.request.run_eviction` run in the test on
the same tiny model and tasks, never from the page's own output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _browser import no_errors, tab
from playwright.sync_api import expect
from test_evict_jobs import ASKED, MODEL, TASKS, direct_study

pytestmark = pytest.mark.browser

LONG = 120_000


def test_the_tab_shows_the_librarys_curves_verdicts_and_coloured_prompt(page, load_model):
    expected = direct_study(load_model(MODEL))
    page.set_default_timeout(60_000)
    tab(page, "KV cache")
    model = page.locator("#evict-model input")
    model.fill(MODEL)
    model.press("Enter")
    page.locator("#evict-tasks textarea").fill("\n".join(json.dumps(t) for t in TASKS))
    for box in page.locator("#evict-scorers input[type=checkbox]").all():
        name = box.evaluate("b => b.closest('label').innerText.split(' (')[0].trim()")
        box.set_checked(name in ASKED["scorers"])
    page.locator("#evict-ratios input, #evict-ratios textarea").first.fill("1, 0.5, 0.2")
    page.locator("#evict-draws input").fill("3")
    page.locator("#evict-all-items input").check()
    page.locator("#evict-run").click()
    expect(page.locator("#eviction_kl-plot .js-plotly-plot")).to_be_visible(timeout=LONG)
    traces = page.evaluate(
        """() => Array.from(document.querySelector('#eviction_kl-plot .js-plotly-plot')._fullData,
                 (t) => ({name: t.name, y: Array.from(t.y)}))"""
    )
    curves = expected.curves.curves
    shown = {t["name"]: t["y"] for t in traces}
    for scorer in ASKED["scorers"]:
        rows = curves[(curves["order"] == scorer) & (curves["metric"] == "kl")]
        np.testing.assert_allclose(shown[scorer], rows["value"], rtol=1e-5, atol=1e-12)
    summary = page.locator("#evict-summary").inner_text()
    for verdict in expected.curves.verdicts:
        assert verdict.summary() in summary
    titles = page.locator("#evict-prompt .attrlab-eviction-scores span").evaluate_all(
        "spans => spans.map((s) => s.title)"
    )
    assert titles == [f"h2o: {v:.4g}" for v in expected.views[0]["scores"]["h2o"]]
    assert "tab=evict" in page.locator("#evict-link textarea").input_value()
    no_errors(page)
