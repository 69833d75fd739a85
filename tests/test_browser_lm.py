"""
The Language model tab in headless Debian Chromium: an answer against a contrast, per step.

A person types a prompt, an answer and a contrast, runs gradient × input, reads the answer as
coloured tokens above the step × source heatmap, clicks an answer token (and a heatmap row) to
see that step over the prompt, and shares a link that reopens the same question.
"""

from __future__ import annotations

import pytest
from _browser import SHOTS, no_errors, tab
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

MODEL = "tiny-random-gpt2"
PROMPT = "the cat sat on the"
ANSWER, CONTRAST = " mat and slept", " floor"
#: The prompt's tokens and the answer's, as the page shows them.
PROMPT_TOKENS = ["the", " cat", " sat", " on", " the"]
ANSWER_TOKENS = [" mat", " and", " slept"]
#: The heatmap's rows: the answer's three steps, then the contrast's one.
ROWS = 4


def _heatmap(page: Page) -> dict:
    """The heatmap's rows, hover texts and values as Plotly drew them (its values decoded)."""
    drawn = "() => document.querySelector('#next-steps .js-plotly-plot')?._fullData?.length"
    page.wait_for_function(drawn, timeout=30_000)
    return page.evaluate(
        """() => {
          const trace = document.querySelector('#next-steps .js-plotly-plot')._fullData[0];
          return {y: Array.from(trace.y), text: trace.text,
                  z: Array.from(trace.z, (row) => Array.from(row))};
        }"""
    )


def _click_cell(page: Page, column: int, row: int) -> None:
    """A person's click on the heatmap's cell (``column``, ``row``), at its place on screen."""
    page.locator("#next-steps").scroll_into_view_if_needed()
    x, y = page.evaluate(
        """([column, row]) => {
          const plot = document.querySelector('#next-steps .js-plotly-plot');
          const {xaxis, yaxis} = plot._fullLayout;
          const box = plot.getBoundingClientRect();
          return [box.left + xaxis._offset + xaxis.l2p(column),
                  box.top + yaxis._offset + yaxis.l2p(row)];
        }""",
        [column, row],
    )
    page.mouse.click(x, y)


def test_an_answer_against_a_contrast_step_by_step_and_its_link(page: Page):
    tab(page, "Language model")
    model = page.locator("#next-model input")
    model.fill(MODEL)
    model.press("Enter")
    page.locator("#next-input textarea").fill(PROMPT)
    page.locator("#next-answer textarea").fill(ANSWER)
    page.locator("#next-contrast textarea").fill(CONTRAST)
    page.locator("#next-methods").get_by_label("attnlrp", exact=False).first.uncheck()
    page.locator("#next-run").click()  # gradient × input, per step (the default)

    answer = page.locator("#next-answer-view .answer-token")
    expect(answer).to_have_count(len(ANSWER_TOKENS), timeout=120_000)
    assert answer.all_text_contents() == ANSWER_TOKENS
    view = page.locator("#next-answer-view")
    assert view.locator("span[data-score]").all_text_contents() == PROMPT_TOKENS + ANSWER_TOKENS
    expect(view.locator(".alternative-token")).to_have_text(CONTRAST)
    expect(view).to_contain_text("log p(answer) − log p(alternative)")
    heatmap = _heatmap(page)
    assert heatmap["y"] == list(range(ROWS))
    # hover: the value, the row's token and the column's
    assert "step 2: +" in heatmap["text"][1][0] and "source 1: the" in heatmap["text"][1][0]
    assert "relevance = " in heatmap["text"][1][0]
    # the whole answer's map stays as the token view below
    column = page.locator("#next-maps .attr-column")
    expect(column).to_have_count(1)
    assert column.locator("span[data-score]").all_text_contents() == PROMPT_TOKENS + ANSWER_TOKENS

    answer.nth(1).click()  # " and": its row over the prompt and " mat"
    row = page.locator("#next-step-row")
    expect(row).to_contain_text("Step 2 of 4", timeout=30_000)
    coloured = row.locator("span[data-score]")
    assert coloured.all_text_contents() == [*PROMPT_TOKENS, " mat"]
    values = [float(v) for v in coloured.evaluate_all("s => s.map(e => e.dataset.score)")]
    assert values == pytest.approx(heatmap["z"][1][:6], rel=1e-4, abs=1e-9)
    expect(view.locator('[data-step="1"]')).to_have_css("outline-style", "solid")
    page.locator("#next-answer-view").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "lm-answer-step.png"), full_page=True)

    _click_cell(page, 2, ROWS - 1)  # the contrast's row, clicked in the heatmap
    expect(row).to_contain_text("Step 4 of 4", timeout=30_000)
    expect(row).to_contain_text("the alternative's token 1")
    assert row.locator("span[data-score]").all_text_contents() == PROMPT_TOKENS
    page.locator("#next-view-sign").get_by_label("absolute").check()  # the views follow
    legend = view.locator(".attr-legend")
    expect(legend).to_have_attribute("data-view", "absolute", timeout=30_000)
    expect(row).to_contain_text("Step 4 of 4")
    no_errors(page)

    link = page.locator("#next-link textarea").input_value()
    assert "answer=" in link and "contrast=" in link and "tab=next" in link
    page.goto(link)  # the shared link reopens the question and runs it
    expect(page.locator("#next-answer textarea")).to_have_value(ANSWER, timeout=30_000)
    expect(page.locator("#next-contrast textarea")).to_have_value(CONTRAST)
    expect(page.locator("#next-answer-view .answer-token")).to_have_count(3, timeout=120_000)
    assert _heatmap(page)["y"] == list(range(ROWS))
    no_errors(page)


def test_a_link_to_a_generated_answer_generates_it_again(blank_page: Page, page_url: str):
    page = blank_page  # the link is its first load
    page.goto(
        page_url + f"?tab=next&model={MODEL}&text=the+cat&methods=occlusion"
        "&generate=1&max_new_tokens=3&per_step=0"
    )
    expect(page.locator("#next-generate input")).to_be_checked(timeout=30_000)
    expect(page.locator("#next-max-new-tokens input")).to_have_value("3")
    expect(page.locator("#next-per-step input")).not_to_be_checked()
    view = page.locator("#next-answer-view")
    expect(view.locator(".answer-token")).to_have_count(3, timeout=120_000)
    expect(view).to_contain_text("the model's own greedy answer")
    expect(view).to_contain_text("run it per step")
    expect(page.locator("#next-steps")).to_be_hidden()  # no per-step matrix was asked for
    link = page.locator("#next-link textarea").input_value()
    assert "generate=1" in link and "max_new_tokens=3" in link and "per_step=0" in link
    page.screenshot(path=str(SHOTS / "lm-generated.png"), full_page=True)
    no_errors(page)
