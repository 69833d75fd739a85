"""
An image's export bundle in headless Debian Chromium, opened from the unzipped folder.

The maps figure draws the photograph from its JPEG and each map from its model-resolution cells
(no network), and its hover reads each cell's value to three decimals, as the page's did.
"""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from _toy_explanations import cnn_maps
from playwright.sync_api import expect

from attrlab.viz import image_grid_figure, write_bundle

pytestmark = pytest.mark.browser  # Debian chromium through Playwright


def test_the_maps_page_draws_offline_and_hovers_each_cells_value(browser, tmp_path):
    from skimage import data

    explanations = cnn_maps()
    cat = data.chelsea()
    figure = image_grid_figure(explanations, cat)
    archive = write_bundle(explanations, {"maps": figure}, tmp_path / "out", png=False)
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(tmp_path / "unzipped")
    page_file = tmp_path / "unzipped" / "out" / "figures" / "maps.html"
    context = browser.new_context(viewport={"width": 1200, "height": 700})
    fetched: list[str] = []
    context.on("request", lambda request: fetched.append(request.url))
    failures: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda error: failures.append(str(error)))
        page.goto(page_file.as_uri())
        plot = page.locator(".js-plotly-plot")
        expect(plot.locator(".main-svg").first).to_be_visible(timeout=30_000)
        # the photograph, once a panel, from its JPEG, as wide as the panel's axis
        pictures = plot.locator(".imagelayer image")
        expect(pictures).to_have_count(2)
        href = pictures.first.get_attribute("href") or ""
        assert href.startswith("data:image/jpeg;base64,")
        # each map: its 224² cells smoothed over the photograph's 451 × 300 pixels
        heatmaps = plot.locator(".hm image")
        expect(heatmaps).to_have_count(2)
        picture_box = pictures.first.bounding_box()
        map_box = heatmaps.first.bounding_box()
        assert picture_box and map_box
        for key in ("x", "y", "width", "height"):
            assert map_box[key] == pytest.approx(picture_box[key], abs=1.5), key
        assert picture_box["width"] / picture_box["height"] == pytest.approx(451 / 300, rel=0.02)
        # hovering the centre of cell (row 50, column 120) of the first map, in the photograph's
        # pixels, shows that cell's value in the default view (over the 99th percentile of
        # |score|, clipped), to 3 decimals
        scores = explanations["gradient_x_input"].scores
        expected = np.clip(scores / np.percentile(np.abs(scores), 99), -1, 1)[50, 120]
        centre = {"xval": 120.5 * 451 / 224 - 0.5, "yval": 50.5 * 300 / 224 - 0.5}
        page.evaluate(
            "(centre) => Plotly.Fx.hover(document.querySelector('.js-plotly-plot'), centre, 'xy')",
            centre,
        )
        label = plot.locator(".hoverlayer .hovertext")
        expect(label).to_contain_text(f"(242, 67): {expected:.3f}", timeout=10_000)
        expect(label).to_contain_text("gradient_x_input")
    finally:
        context.close()
    assert failures == []
    assert fetched and all(url.startswith(("file://", "data:")) for url in fetched), fetched
