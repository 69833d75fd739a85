"""
Tables for people in headless Debian Chromium: the Batch tab's rounded rows open their maps,
and the Evaluate tab's leaderboard is labelled and fits the page.

Each test fails if the page shows an error it did not expect. Screenshots go to
``$ATTRLAB_SCREENSHOTS`` (default: a temporary folder).
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from _browser import no_errors, tab
from playwright.sync_api import Page, expect
from test_tables import LABELS

from attrlab.viz.tokens import token_ticks

pytestmark = pytest.mark.browser  # Debian chromium through Playwright

#: Whether the selected row's map draws bars for the tokens given (its bars' hover texts).
SHOWS_TOKENS = (
    "(tokens) => { const plot = document.querySelector('#batch-map .js-plotly-plot');"
    " return !!plot && !!plot.data"
    " && JSON.stringify(plot.data[0].hovertext) === JSON.stringify(tokens); }"
)


def _cells(page: Page, table: str) -> tuple[list[str], list[list[str]]]:
    """A Gradio table's headers and the text of its cells, row by row."""
    headers = page.locator(f"{table} th[role=columnheader]").all_inner_texts()
    rows = page.locator(f"{table} .virtual-row")
    return (
        [h.strip() for h in headers],
        [
            [c.strip() for c in rows.nth(i).locator("[role=gridcell]").all_inner_texts()]
            for i in range(rows.count())
        ],
    )


def test_batch_rows_are_rounded_and_each_opens_its_map(page, minilm):
    tab(page, "Batch")
    page.get_by_role("button", name="reviews.jsonl", exact=True).click()  # the example
    uploaded = re.compile(r"reviews\s*\.jsonl")  # the page sets the extension apart
    expect(page.locator("#batch-upload")).to_contain_text(uploaded, timeout=60_000)
    page.locator("#batch-run").click()  # MiniLM, gradient × input
    expect(page.locator("#batch-status")).to_contain_text("explained", timeout=120_000)
    headers, rows = _cells(page, "#batch-table")
    assert headers[:5] == ["id", "method", "target", "label", "probability"]
    lines = resources.files("attrlab.assets").joinpath("examples", "reviews.jsonl")
    texts = {r["id"]: r["text"] for r in map(json.loads, lines.read_text().splitlines())}
    assert [row[0] for row in rows] == list(texts)
    for row in rows:  # probabilities to four decimals at most
        assert re.fullmatch(r"0(\.\d{1,4})?|1(\.0+)?", row[4]), row
    for number in (0, 2):  # a row opens its own map: the bars of its text's tokens
        page.locator(f"#batch-table [data-testid=cell-{number}-1]").click()
        key = rows[number][0]
        expect(page.locator("#batch-row")).to_contain_text(key, timeout=30_000)
        # the bars' hover texts are the row's tokens as shown (their text, not WordPiece's)
        expected = token_ticks(minilm.preprocess(texts[key]).token_texts)
        page.wait_for_function(SHOWS_TOKENS, arg=expected)
    no_errors(page)


def test_the_leaderboard_is_labelled_and_fits_the_page(page):
    tab(page, "Evaluate")
    for method in ("attnlrp", "integrated_gradients", "occlusion"):  # two quick methods
        page.locator("#evaluate-methods label", has_text=method).click()
    page.locator("#evaluate-run").click()  # MiniLM, 4 sentences, gradient × input, occlusion
    expect(page.locator("#evaluate-table .virtual-row")).to_have_count(2, timeout=300_000)
    expect(page.locator("#evaluate-plot .js-plotly-plot")).to_be_visible(timeout=60_000)
    headers, rows = _cells(page, "#evaluate-table")
    assert headers == LABELS["text"]  # the labels written out in test_tables
    assert sorted(row[0] for row in rows) == ["gradient_x_input", "occlusion"]
    for row in rows:  # a score to three decimals, then its 95 % interval
        assert re.fullmatch(r"-?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]", row[2]), row
    overflow = page.evaluate(  # what a reader would have to scroll sideways to see
        "() => { const v = document.querySelector('#evaluate-table .virtual-table-viewport');"
        " return v.scrollWidth - v.clientWidth; }"
    )
    assert overflow <= 1, f"the leaderboard runs {overflow}px past the page"
    no_errors(page)
