"""
Granularity on the Language model tab in headless Debian Chromium.

A person explains a prompt by its words, reads a box per word whose score is the sum of its
tokens' (the token-level run of the same prompt, read from the page), then by spans typed one a
line, and shares a link that reopens both the granularity and the spans.
"""

from __future__ import annotations

import pytest
from _browser import SHOTS, errors, no_errors, tab
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

MODEL = "tiny-random-gpt2"
PROMPT = "the unbelievably sweet marmalade sat"


def _run(page: Page) -> None:
    page.locator("#next-run").click()


def _prompt(page: Page, prompt: str) -> None:
    """The Language model tab on the tiny model, with ``prompt``, gradient × input alone."""
    tab(page, "Language model")
    model = page.locator("#next-model input")
    model.fill(MODEL)
    model.press("Enter")
    page.locator("#next-input textarea").fill(prompt)
    page.locator("#next-methods").get_by_label("attnlrp", exact=False).first.uncheck()


def test_a_prompt_by_words_then_by_typed_spans_and_its_link(page: Page):
    _prompt(page, PROMPT)
    _run(page)  # by tokens first: gradient × input
    column = page.locator("#next-maps .attr-column")
    expect(column).to_have_attribute("data-granularity", "token", timeout=120_000)
    tokens = column.locator("span[data-score]")
    texts = tokens.all_text_contents()
    scores = [float(v) for v in tokens.evaluate_all("s => s.map(e => e.dataset.score)")]

    page.locator("#next-granularity").get_by_label("word").check()
    _run(page)
    expect(column).to_have_attribute("data-granularity", "word", timeout=120_000)
    words = column.locator("span[data-feature]")
    expect(words).to_have_count(len(PROMPT.split()))
    assert [w.strip() for w in words.all_text_contents()] == PROMPT.split()
    # each word's score: its tokens' scores summed, grouped here by where a word starts
    sums: list[float] = []
    for text, score in zip(texts, scores, strict=True):
        if not sums or text.startswith(" "):
            sums.append(0.0)
        sums[-1] += score
    shown = [float(v) for v in words.evaluate_all("s => s.map(e => e.dataset.score)")]
    assert shown == pytest.approx(sums, rel=1e-4, abs=1e-9)
    assert words.nth(1).get_attribute("title").startswith("unbelievably (")
    page.screenshot(path=str(SHOTS / "granularity-words.png"), full_page=True)

    page.locator("#next-granularity").get_by_label("span").check()
    spans = page.locator("#next-spans textarea")
    spans.fill("4-16\nten")
    _run(page)
    page.wait_for_function("() => window.__errors.length > 0", timeout=30_000)
    assert "spans line 2 'ten' is not start-end" in errors(page)[0]  # refused in words
    spans.fill("4-16\n33-36")
    _run(page)
    expect(column).to_have_attribute("data-granularity", "span", timeout=120_000)
    boxes = column.locator("span[data-feature]")
    expect(boxes).to_have_count(2)
    assert [b.strip() for b in boxes.all_text_contents()] == ["unbelievably", "sat"]
    assert column.locator(".kept-out").count() >= 2  # the tokens in no span: greyed, shown
    link = page.locator("#next-link textarea").input_value()
    assert "granularity=span" in link and "spans=4-16" in link
    page.screenshot(path=str(SHOTS / "granularity-spans.png"), full_page=True)

    page.goto(link)  # the link reopens the granularity and the spans, and runs them
    expect(page.locator("#next-spans textarea")).to_have_value("4-16\n33-36", timeout=30_000)
    expect(page.locator("#next-granularity input[value='span']")).to_be_checked()
    expect(page.locator("#next-maps span[data-feature]")).to_have_count(2, timeout=120_000)
    no_errors(page)


def test_a_contrast_takes_the_picked_token_and_predict_follows_the_chat_box(page: Page):
    _prompt(page, "the cat sat on the")
    page.locator("#next-predict").click()
    menu = page.locator("#next-target input")
    page.wait_for_function(  # the predictions fill the menu
        "() => document.querySelector('#next-prediction')?.innerText.includes('%')",
        timeout=60_000,
    )
    menu.click()
    options = page.get_by_role("option")
    expect(options).to_have_count(6)  # the top prediction, then the five
    picked = options.nth(2).inner_text()  # the second prediction: not the greedy token
    options.nth(2).click()
    page.locator("#next-contrast textarea").fill(" floor")
    _run(page)
    answer = page.locator("#next-answer-view .answer-token")
    expect(answer).to_have_count(1, timeout=120_000)
    assert picked.startswith(f"'{answer.inner_text()}' (")  # the menu's label of that token
    expect(page.locator("#next-answer-view .alternative-token")).to_have_text(" floor")
    no_errors(page)

    # Predict asks for the tokens after the chat template: this model has none, and says so
    page.locator("#next-chat input").check()
    page.locator("#next-predict").click()
    page.wait_for_function("() => window.__errors.length > 0", timeout=30_000)
    assert "has no chat template" in errors(page)[0]
