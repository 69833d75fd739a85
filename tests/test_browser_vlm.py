"""
The Vision-language tab in headless Debian Chromium: uploads, runs, the library's numbers.

Expected numbers come from the library run in the test on the same tiny random LLaVA folder,
image (then two: a second under More images), prompt and answer (:mod:`test_vlm_page`), never
from the page's own output.
"""

from __future__ import annotations

import numpy as np
import pytest
from _browser import no_errors, tab
from _tiny_vlm import saved, tiny_llava
from playwright.sync_api import expect
from test_vlm_page import ANSWER, IMAGE, PROMPT, SECOND, _expected

from attrlab.attribution.models.hub import load_pretrained

pytestmark = pytest.mark.browser

LONG = 120_000


def test_the_tab_draws_the_librarys_map_over_the_image_and_the_studys_verdicts(page, tmp_path):
    folder = saved(tiny_llava(), tmp_path / "llava")
    library = load_pretrained(str(folder), within=[folder])
    expected = _expected(library, "gradient_x_input")
    picture = tmp_path / "picture.png"
    picture.write_bytes(IMAGE)
    page.set_default_timeout(60_000)
    tab(page, "Vision-language")
    model = page.locator("#vlm-model input")
    model.fill(str(folder))
    model.press("Enter")
    page.locator("#vlm-image input[type=file]").set_input_files(str(picture))
    page.locator("#vlm-prompt textarea").fill(PROMPT)
    page.locator("#vlm-answer input, #vlm-answer textarea").first.fill(ANSWER)
    for box in page.locator("#vlm-scorers input[type=checkbox]").all():
        name = box.evaluate("b => b.closest('label').innerText.split(' (')[0].trim()")
        box.set_checked(name == "fastv")
    page.locator("#vlm-ratios input, #vlm-ratios textarea").first.fill("1, 0.5")
    page.locator("#vlm-draws input").fill("2")
    page.locator("#vlm-run").click()
    plot = "#vlm-gradient_x_input-plot .js-plotly-plot"
    expect(page.locator(plot)).to_be_visible(timeout=LONG)
    bars = page.evaluate(
        f"""() => Array.from(document.querySelector('{plot}')._fullData)
                 .filter((t) => t.type === 'bar').map((t) => Array.from(t.y))[0]"""
    )
    text = np.flatnonzero(expected.maps["visual_mask"] == 0)
    np.testing.assert_allclose(bars, expected.scores[text], rtol=1e-4, atol=1e-9)
    expect(page.locator("#visual_tokens_kl-plot .js-plotly-plot")).to_be_visible(timeout=LONG)
    summary = page.locator("#vlm-summary").inner_text()
    assert f"image {expected.metrics['image_share']:.0%}" in summary
    assert "fastv's kl area against random drop orders" in summary
    assert "tab=vlm" in page.locator("#vlm-link textarea").input_value()
    # a second image under More images (no scorer: the study reads one image): a panel each
    both = _expected(library, "gradient_x_input", [IMAGE, SECOND])
    other = tmp_path / "second.png"
    other.write_bytes(SECOND)
    page.locator("#vlm-more-images input[type=file]").set_input_files(str(other))
    for box in page.locator("#vlm-scorers input[type=checkbox]").all():
        box.set_checked(False)
    page.locator("#vlm-run").click()
    expect(page.locator("#vlm-summary")).to_contain_text("images ", timeout=LONG)
    drawn = page.evaluate(
        f"""() => Array.from(document.querySelector('{plot}')._fullData).map((t) => t.type)"""
    )
    assert drawn == ["image", "heatmap", "image", "heatmap", "bar"]
    bars = page.evaluate(
        f"""() => Array.from(document.querySelector('{plot}')._fullData)
                 .filter((t) => t.type === 'bar').map((t) => Array.from(t.y))[0]"""
    )
    text = np.flatnonzero(both.maps["visual_mask"] == 0)
    np.testing.assert_allclose(bars, both.scores[text], rtol=1e-4, atol=1e-9)
    each = ", ".join(f"{n}: {both.metrics[f'image_{n}_share']:.0%}" for n in (1, 2))
    summary = page.locator("#vlm-summary").inner_text()
    assert f"images {both.metrics['image_share']:.0%} ({each})" in summary
    no_errors(page)
