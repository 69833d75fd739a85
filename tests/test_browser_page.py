"""
The first screen at 1280 × 800, as a new user meets it, and light requests during a long run.

Each test opens the page at 1280 × 800 without scrolling: results (or the run's progress) must
show near Run, a method's parameters one click away, the "not for this model" line one row,
figures in the page's theme; while a long run goes, Predict and the cost line still answer and
the last predictions stay on screen.
"""

from __future__ import annotations

import pytest
import torch
from _browser import errors, no_errors, tab
from playwright.sync_api import Page, expect

from attrlab.app.ui.shared import method_entries
from attrlab.attribution.methods import capabilities

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1280, 800
#: A row of text on the page, with its padding: the "not for this model" line's height bound.
ONE_ROW_PX = 40


#: The luminance (0 black .. 1 white) of a figure's paper, as the browser reads its colour.
_PAPER_LUMINANCE = """
(selector) => {
  const plot = document.querySelector(selector + ' .js-plotly-plot');
  if (!plot || !plot._fullLayout) return null;
  const probe = document.createElement('div');
  probe.style.color = plot._fullLayout.paper_bgcolor;
  document.body.appendChild(probe);
  const [r, g, b] = getComputedStyle(probe).color.match(/[\\d.]+/g).map(Number);
  probe.remove();
  return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}
"""


#: The run's progress ("1,234/200,000 steps") shown within the first screen.
_PROGRESS_IN_VIEW = f"""
[...document.querySelectorAll('.progress-level-inner, .progress-text, .meta-text')].some(
  (e) => /[\\d,]+\\/[\\d,]+ steps/.test(e.textContent) &&
    e.getBoundingClientRect().top < {HEIGHT})
"""


@pytest.fixture
def page(blank_page):
    """Each test opens the page itself, at the first screen's size (:func:`_open`)."""
    return blank_page


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Runs take one core and leave the browser the other (two cores: it starves otherwise)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _open(page: Page, url: str, query: str = "") -> None:
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    page.set_default_timeout(60_000)  # two cores: a run beside the browser slows every step
    page.goto(url + query)
    expect(page.locator("#text-run")).to_be_visible(timeout=60_000)


def _top(page: Page, selector: str) -> float:
    box = page.locator(selector).bounding_box()
    assert box is not None, f"{selector} is not laid out"
    return box["y"]


def test_the_results_start_near_run_and_figures_follow_a_dark_theme(page, page_url):
    _open(page, page_url, "?__theme=dark")
    page.locator("#text-run").click()
    # progress shows on the maps at once, then the first result: both within the first screen
    assert _top(page, "#text-run") < _top(page, "#text-maps") < HEIGHT - 100
    expect(page.locator("#text-maps")).to_contain_text("integrated_gradients", timeout=120_000)
    assert page.evaluate("() => window.scrollY") == 0
    assert _top(page, "#text-maps") < HEIGHT - 100  # room for the first rows of the maps
    # the page redraws each figure in the dark template as it appears (exports stay light)
    expect(page.locator("#text-agreement .js-plotly-plot")).to_be_visible()
    page.wait_for_function(f"() => ({_PAPER_LUMINANCE})('#text-agreement') < 0.3", timeout=10_000)
    no_errors(page)


def test_a_methods_parameters_are_one_click_away(page, page_url):
    _open(page, page_url)
    entry = next(e for e in method_entries("text") if e["name"] == "attnlrp")
    widget = page.locator(f"#text-param-attnlrp-{next(iter(entry['params']))}")
    expect(widget).to_be_hidden()
    page.locator("#text-params-attnlrp").get_by_text("Parameters", exact=False).first.click()
    expect(widget).to_be_visible()
    no_errors(page)


def test_methods_not_for_the_model_take_one_row_and_open_to_their_reasons(page, page_url, effnet):
    reasons = {m: why for m, why in capabilities(effnet).items() if why}
    blocked = [e["name"] for e in method_entries("image") if e["name"] in reasons]
    assert len(blocked) >= 3  # a CNN: no attention, no tokens
    _open(page, page_url)
    tab(page, "Image")
    page.locator("#image-examples .gallery-item").nth(2).click()
    page.locator("#image-predict").click()
    note = page.locator("#image-unavailable")
    expect(note).to_contain_text("Not for this model", timeout=120_000)
    for method in blocked:
        expect(note).to_contain_text(method)
    box = note.bounding_box()
    assert box is not None and box["height"] <= ONE_ROW_PX, box
    expect(note.get_by_text(reasons["rollout"], exact=False)).to_be_hidden()
    note.get_by_text("Not for this model").click()
    expect(note.get_by_text(reasons["rollout"], exact=False)).to_be_visible()
    no_errors(page)


def test_predict_and_the_cost_answer_while_a_long_run_goes(page, page_url):
    _open(page, page_url)
    page.locator("#text-predict").click()
    prediction = page.locator("#text-prediction h2")  # the top class
    expect(prediction).to_have_text("positive", timeout=120_000)
    methods = page.locator("#text-methods")
    methods.get_by_label("integrated_gradients", exact=True).uncheck()
    methods.get_by_label("attnlrp", exact=True).uncheck()
    methods.get_by_label("rise", exact=True).check()
    page.locator("#text-params-rise").get_by_text("Parameters", exact=False).first.click()
    masks = page.locator("#text-param-rise-n_masks input")
    masks.click(click_count=3)
    masks.type("200000")  # typed over the selection: never an empty field
    masks.press("Tab")
    cost = page.locator("#text-cost")
    # the first estimate calibrates the model (a job of its own); then Run
    expect(cost).to_contain_text("200,001 forward", timeout=300_000)
    page.locator("#text-run").click()
    running = f"() => {_PROGRESS_IN_VIEW}"
    page.wait_for_function(running, timeout=120_000)  # it runs, its progress in view
    expect(prediction).to_have_text("positive")  # the last predictions stay on screen
    page.locator("#text-input textarea").fill("I hated this movie, the acting was dreadful.")
    page.locator("#text-predict").click()
    # the light path answers beside the run (a model already loaded: one forward)
    expect(prediction).to_have_text("negative", timeout=15_000)
    before = cost.inner_text()
    page.locator("#text-trust-option input").check(timeout=60_000)  # priced in: the trust card
    expect(cost).not_to_have_text(before, timeout=15_000)
    expect(cost).to_contain_text("rise: ")
    page.wait_for_function(running)  # the run still goes
    page.locator("#text-cancel").click()
    page.wait_for_function(f"() => !({_PROGRESS_IN_VIEW})")  # the run stops
    shown = errors(page)  # at most Cancel's own words, nothing else
    assert all("the job was cancelled" in e for e in shown), shown
