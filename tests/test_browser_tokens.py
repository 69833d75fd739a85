"""
The page shows tokens as the text they stand for, in headless Debian Chromium.

SmolLM2's byte-level tokens (``ĠMary``, ``Ċ``) must read as text on the Language model tab: the
token columns, the Details bars' axis and the top-5 panel, where a newline is a visible ``↵``.
"""

from __future__ import annotations

import pytest
from _browser import no_errors, tab
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # SmolLM2 loads in the page's worker

PROMPT = "Line one.\nLine two.\n"
#: PROMPT as SmolLM2's tokens read (raw: Line Ġone . Ċ Line Ġtwo . Ċ), leading spaces kept.
SHOWN = ["Line", " one", ".", "↵", "Line", " two", ".", "↵"]


def test_next_token_shows_texts_not_byte_level_tokens(page):
    tab(page, "Language model")
    page.locator("#next-input textarea").fill(PROMPT)
    page.locator("#next-methods").get_by_label("attnlrp", exact=False).first.uncheck()
    page.locator("#next-run").click()  # SmolLM2, gradient × input
    column = page.locator("#next-maps .attr-column")
    expect(column).to_have_count(1, timeout=300_000)
    spans = column.locator("span[data-score]")
    assert spans.all_text_contents() == SHOWN  # the exact text, a word's leading space too
    page_text = page.locator("#next-maps").inner_text()
    assert "Ġ" not in page_text and "Ċ" not in page_text
    # the model's top guess is a newline: shown as ↵, no top-5 entry is blank
    labels = page.locator("#next-prediction dl dt")  # one per top-5 entry
    expect(labels).to_have_count(5, timeout=30_000)
    shown = labels.all_text_contents()
    assert shown[0] == "↵" and all(label.strip() for label in shown), shown
    ticks = page.evaluate(
        "() => document.querySelector('#next-detail .js-plotly-plot').layout.xaxis.ticktext"
    )
    assert ticks[:4] == ["Line", '<span style="color:#a0a0a0">␣</span>one', ".", "↵"]
    no_errors(page)
