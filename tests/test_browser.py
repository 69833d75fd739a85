"""
A researcher's path through the page in headless Debian Chromium.

Each test fails if the page shows an error it did not expect. Screenshots go to
``$ATTRLAB_SCREENSHOTS`` (default: a temporary folder), as CI artifacts.
"""

from __future__ import annotations

import zipfile

import pytest
from _browser import exported, no_errors, tab
from playwright.sync_api import expect

from attrlab.attribution.methods import capabilities

pytestmark = pytest.mark.browser  # Debian chromium through Playwright


def test_two_methods_side_by_side_with_their_agreement(page):
    page.locator("#text-run").click()  # the defaults: MiniLM, IG and AttnLRP
    columns = page.locator("#text-maps .attr-column")
    expect(columns).to_have_count(2, timeout=120_000)
    assert columns.nth(0).get_attribute("data-method") == "integrated_gradients"
    assert columns.nth(1).get_attribute("data-method") == "attnlrp"
    assert "wonderful" in columns.nth(0).inner_text()
    expect(page.locator("#text-agreement .js-plotly-plot")).to_be_visible()
    expect(page.locator("#text-maps .attr-legend")).to_be_visible()
    no_errors(page)


def test_image_opacity_slider_redraws_the_maps(page):
    tab(page, "Image")
    page.locator("#image-examples .gallery-item").nth(1).click()  # the cat
    expect(page.locator("#image-input img").first).to_be_visible(timeout=30_000)
    page.locator("#image-run").click()  # EfficientNet-Lite0: gradient × input and Grad-CAM
    plot = page.locator("#image-maps .js-plotly-plot")
    expect(plot).to_be_visible(timeout=120_000)

    def opacities() -> set[float]:
        return set(
            page.evaluate(
                "() => document.querySelector('#image-maps .js-plotly-plot').data"
                ".filter(t => t.type === 'heatmap').map(t => t.opacity)"
            )
        )

    assert opacities() == {0.55}
    slider = page.locator("#image-opacity input[type=range]")
    slider.fill("0.2")
    slider.dispatch_event("pointerup")
    slider.dispatch_event("change")
    page.wait_for_function(
        "() => document.querySelector('#image-maps .js-plotly-plot').data"
        ".filter(t => t.type === 'heatmap').every(t => Math.abs(t.opacity - 0.2) < 1e-9)",
        timeout=30_000,
    )
    no_errors(page)


def test_occluding_a_region_compares_the_maps(page):
    tab(page, "Image")
    page.locator("#image-examples .gallery-item").nth(1).click()  # the cat
    picture = page.locator("#image-input img").first
    expect(picture).to_be_visible(timeout=30_000)
    page.locator("#image-methods").get_by_label("gradcam", exact=False).uncheck()
    page.locator("#image-run").click()
    expect(page.locator("#image-maps .js-plotly-plot")).to_be_visible(timeout=120_000)
    before = picture.get_attribute("src")
    page.locator("#image-compare input").check()
    box = picture.bounding_box()
    picture.click(position={"x": box["width"] * 0.5, "y": box["height"] * 0.45})  # the face
    expect(picture).not_to_have_attribute("src", before, timeout=30_000)
    page.locator("#image-run").click()
    change = page.locator("#image-comparison .js-plotly-plot")
    expect(change).to_be_visible(timeout=120_000)
    expect(change).to_contain_text("p(Egyptian cat)")
    no_errors(page)


def test_export_downloads_a_bundle_that_opens(page, tmp_path):
    page.locator("#text-methods").get_by_label("attnlrp", exact=False).first.uncheck()
    page.locator("#text-run").click()
    expect(page.locator("#text-maps .attr-column")).to_have_count(1, timeout=120_000)
    path = exported(page, "text", tmp_path)
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    assert any(n.endswith("integrated_gradients.json") for n in names)
    assert any(n.endswith("manifest.json") for n in names)
    assert any(n.endswith(".png") for n in names)
    no_errors(page)


def test_a_method_that_cannot_apply_shows_its_reason(page, effnet):
    reason = capabilities(effnet)["rollout"]
    assert reason  # a CNN has no attention to roll out
    tab(page, "Image")
    page.locator("#image-examples .gallery-item").nth(2).click()
    page.locator("#image-methods").get_by_label("rollout", exact=False).check()  # before Predict
    page.locator("#image-predict").click()
    expect(page.locator("#image-prediction")).to_contain_text("espresso", timeout=60_000)
    listed = page.locator("#image-unavailable")
    expect(listed).to_contain_text("rollout")
    listed.get_by_text("Not for this model").click()  # opens to the reasons
    expect(listed.get_by_text(f"rollout: {reason}")).to_be_visible()
    expect(page.locator("#image-methods").get_by_label("rollout", exact=False)).to_have_count(0)
    expect(page.locator("#image-method-notes")).to_contain_text(
        f"rollout cannot run on this model: {reason}"
    )
    no_errors(page)


def test_a_shared_link_reopens_the_view_and_runs_it(blank_page, page_url):
    page = blank_page  # the link is its first load
    page.goto(
        page_url + "?tab=next&model=tiny-random-llama&text=the+cat+sat&methods=rise"
        '&params={"rise":{"n_masks":64,"every_pattern":false}}'
    )
    expect(page.locator("#next-input textarea")).to_have_value("the cat sat", timeout=30_000)
    expect(page.locator("#next-model input")).to_have_value("tiny-random-llama")
    columns = page.locator("#next-maps .attr-column")
    expect(columns).to_have_count(1, timeout=120_000)  # it ran, with the link's parameters
    assert columns.first.get_attribute("data-method") == "rise"
    expect(page.locator("#next-trust")).to_contain_text("masks used 64")  # the link's n_masks
    link = page.locator("#next-link textarea").input_value()
    assert "n_masks" in link and "tab=next" in link
    no_errors(page)


def test_a_hand_made_link_with_broken_parameters_still_opens(blank_page, page_url):
    page = blank_page  # the link is its first load
    page.goto(page_url + "?tab=image&model=tiny-random-vit&params=" + "[" * 5000)
    expect(page.locator("#image-model input")).to_have_value("tiny-random-vit", timeout=30_000)
    no_errors(page)  # the parameters are dropped; an image tab waits for its image
