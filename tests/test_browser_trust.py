"""
The trust cards as a researcher sees them in headless Debian Chromium: a verdict per check.

Fails if the page shows an error it did not expect; the cards' screenshot goes to
``$ATTRLAB_SCREENSHOTS``.
"""

from __future__ import annotations

import pytest
from _browser import SHOTS, no_errors
from playwright.sync_api import expect

pytestmark = pytest.mark.browser  # Debian chromium through Playwright

STATUSES = {"pass", "warn", "fail", "inconclusive"}


def test_trust_cards_give_a_verdict_per_check_and_lrps_balance(page):
    methods = page.locator("#text-methods")
    methods.get_by_label("integrated_gradients", exact=False).first.uncheck()
    methods.get_by_label("gradient_x_input", exact=False).first.check()
    page.get_by_label("Trust cards (faithfulness vs random orders)").check()
    page.get_by_label("Randomisation check (a run per layer)").check()
    page.locator("#text-run").click()  # MiniLM on the default sentence
    cards = page.locator("#text-trust .trust-card")
    expect(cards).to_have_count(2, timeout=300_000)
    lrp = page.locator('#text-trust .trust-card[data-method="attnlrp"]')
    checks = lrp.locator("tr.verdict")
    expect(checks).to_have_count(4)  # relevance accounted, two scores, randomisation
    found = {
        row.get_attribute("data-check"): row.get_attribute("data-status") for row in checks.all()
    }
    assert set(found) == {"lrp_conservation", "comprehensiveness", "sufficiency", "randomisation"}
    assert set(found.values()) <= STATUSES and found["lrp_conservation"] == "pass"
    accounted = lrp.locator('tr.verdict[data-check="lrp_conservation"]')
    expect(accounted).to_contain_text("of the logit")
    expect(accounted).to_contain_text("unaccounted")
    balance = lrp.locator("table.balance")
    expect(balance).to_be_visible()
    expect(balance).to_contain_text("attention's softmax linearisation")
    expect(balance).to_contain_text("target logit")
    plain = page.locator('#text-trust .trust-card[data-method="gradient_x_input"]')
    expect(plain.locator("tr.verdict")).to_have_count(3)  # two scores, randomisation
    expect(plain.locator("table.balance")).to_have_count(0)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#text-trust").screenshot(path=str(SHOTS / "trust_cards.png"))
    no_errors(page)
