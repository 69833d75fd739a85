"""
The Layers & heads tab in headless Debian Chromium, as a researcher uses it.

Each test fails if the page shows an error it did not expect. Expected values come from the
model itself (a head's attention, the probability with a head zeroed, the layer measures run
in the test), never from the page's own numbers. MiniLM (6 layers × 12 heads) unless a defect
needs a deep model: the token-per-layer ticks are checked once on SmolLM2 (30 layers).
"""

from __future__ import annotations

import io
import itertools
import re
import zipfile

import numpy as np
import pandas as pd
import pytest
import torch
from _browser import exported, no_errors, tab
from playwright.sync_api import Page, expect

from attrlab.attribution.engine.recheck import joint_ablation
from attrlab.attribution.layers import analyze_layers
from attrlab.attribution.request.target import output_target

pytestmark = pytest.mark.browser  # Debian chromium through Playwright

TEXT = "I loved this movie, the acting was wonderful."  # the tab's sample text
LABELS = ["positive", "negative"]
LONG = 180_000  # an analysis on a busy 2-core machine


@pytest.fixture(autouse=True)
def patient(blank_page):
    """Clicks and the closing screenshot wait longer: a busy 2-core machine renders slowly."""
    blank_page.set_default_timeout(90_000)


@pytest.fixture(scope="module")
def minilm_labelled(load_model):
    """MiniLM with the tab's sample labels, and the sample text's inputs."""
    adapter = load_model("minilm-zeroshot").with_labels(LABELS)
    return adapter, adapter.preprocess(TEXT)


def _analyse(page: Page, measures: list[str] | None = None) -> None:
    """Open the tab and analyse the sample text (MiniLM), with only ``measures`` if given."""
    tab(page, "Layers & heads")
    if measures is not None:
        for box in page.locator("#layers-measures input[type=checkbox]").all():
            name = box.evaluate("b => b.closest('label').innerText.split(':')[0].trim()")
            box.set_checked(name in measures)
    page.locator("#layers-run").click()
    expect(page.locator("#layers-heatmap .js-plotly-plot")).to_be_visible(timeout=LONG)


def _heads_box(page: Page):
    return page.locator("#layers-heads textarea, #layers-heads input").first


def _click_cell(page: Page, layer: int, head: int) -> None:
    """Click the heatmap's cell of ``(layer, head)``, found through the plot's own axes."""
    page.locator("#layers-heatmap").scroll_into_view_if_needed()
    x, y = page.evaluate(
        """([layer, head]) => {
          const plot = document.querySelector('#layers-heatmap .js-plotly-plot');
          const layout = plot._fullLayout, box = plot.getBoundingClientRect();
          return [box.left + layout._size.l + layout.xaxis.l2p(head),
                  box.top + layout._size.t + layout.yaxis.l2p(layer)];
        }""",
        [layer, head],
    )
    page.mouse.click(x, y)


def _figure(page: Page, elem_id: str) -> dict:
    """The traces (name, axes, x, y, z as plain lists) and layout Plotly drew in ``#elem_id``."""
    return page.evaluate(
        """(id) => {
          const plot = document.querySelector(`#${id} .js-plotly-plot`);
          const plain = (v) => ArrayBuffer.isView(v) ? Array.from(v)
            : Array.isArray(v) ? v.map(plain) : v;
          const data = plot._fullData.map((t) => ({
            name: t.name, xaxis: t.xaxis, yaxis: t.yaxis,
            x: plain(t.x), y: plain(t.y), z: plain(t.z),
          }));
          return {data, layout: plot.layout};
        }""",
        elem_id,
    )


def test_clicking_a_heatmap_cell_ablates_that_head(page, minilm_labelled):
    _analyse(page, ["gradient", "ablation"])
    _click_cell(page, layer=2, head=3)
    expect(_heads_box(page)).to_have_value("L2H3", timeout=30_000)
    change = page.locator("#layers-change")
    expect(change).to_contain_text("L2H3", timeout=LONG)
    adapter, inputs = minilm_labelled
    plain, zeroed = joint_ablation(
        adapter, inputs, output_target(adapter, 0), [{(2, 3)}]
    )  # 'positive' is the top class
    assert f"{plain:.4f} → {zeroed:.4f}" in change.inner_text()
    shown = _figure(page, "layers-attention")
    assert shown["layout"]["title"]["text"] == "layer 2, head 3: attention"
    no_errors(page)


@pytest.mark.parametrize("width", [1440, 1280])
def test_the_head_table_fits_without_scrolling_sideways(page, width):
    page.set_viewport_size({"width": width, "height": 900 if width == 1440 else 800})
    _analyse(page, ["gradient"])
    grid = page.locator("#layers-grid")
    expect(grid.get_by_test_id("cell-0-0")).to_be_visible(timeout=30_000)
    overflowing = grid.evaluate(
        """(grid) => [grid, ...grid.querySelectorAll('*')]
          .filter((e) => e.scrollWidth > e.clientWidth + 1
                         && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
          .map((e) => `${e.className}: ${e.scrollWidth} > ${e.clientWidth}`)"""
    )
    assert overflowing == []
    expect(grid.get_by_test_id("cell-0-0")).to_have_text(re.compile(r"L\dH\d+"))  # a head
    no_errors(page)


def test_the_per_layer_figure_draws_each_measure_in_its_own_panel(page, minilm_labelled):
    _analyse(page, ["block_influence", "skip", "lrp"])
    lines = page.locator("#layers-lines .js-plotly-plot")
    expect(lines).to_be_visible(timeout=30_000)
    shown = _figure(page, "layers-lines")
    adapter, inputs = minilm_labelled
    table = analyze_layers(
        adapter, inputs, output_target(adapter, 0), ["block_influence", "skip", "lrp"]
    )
    expected = table[table["head"].isna()]
    assert {t["name"] for t in shown["data"]} == set(expected["measure"])
    axes = [t["yaxis"] for t in shown["data"]]
    assert len(set(axes)) == len(axes)  # one y axis, so one scale, per measure
    for trace in shown["data"]:
        rows = expected[expected["measure"] == trace["name"]].sort_values("layer")
        np.testing.assert_allclose(trace["y"], rows["value"], rtol=1e-5, atol=1e-6)
    title = page.locator("#layers-lines .gtitle")
    assert title.bounding_box()["x"] + title.bounding_box()["width"] <= (
        lines.bounding_box()["x"] + lines.bounding_box()["width"]
    )  # the title is not cut
    page.locator("#layers-tokens").get_by_text("wonderful", exact=True).click()
    expect(page.locator("#layers-token-layers .js-plotly-plot")).to_be_visible(timeout=30_000)
    through = _figure(page, "layers-token-layers")["data"][1]
    assert len(through["y"]) == adapter.num_layers + 1  # entering each block, then leaving
    no_errors(page)


def test_the_sign_of_a_head_measure_is_explained_with_the_target_named(page):
    _analyse(page, ["ablation"])
    top = page.locator("#layers-before h2").inner_text()
    note = page.locator("#layers-measure-note")
    expect(note).to_contain_text("ablation_zero", timeout=30_000)
    text = note.inner_text()
    assert f"Negative (blue): the head supported '{top}'" in text
    assert f"positive (red): the head worked against '{top}'" in text
    page.locator("#layers-grid").get_by_test_id("cell-0-0").click()  # the largest |value|
    change = page.locator("#layers-change")
    expect(change).to_contain_text("ablated", timeout=LONG)
    before, after = (float(v) for v in re.findall(r"(\d\.\d{4})", change.inner_text())[:2])
    meaning = "supported" if after < before else "worked against" if after > before else "no"
    assert meaning in change.inner_text() and f"'{top}'" in change.inner_text()
    no_errors(page)


def test_a_heads_attention_shows_without_ablating_it(page, minilm_labelled):
    _analyse(page, ["gradient"])
    page.locator("#layers-ablate-click input").uncheck()
    _click_cell(page, layer=4, head=7)
    attention = page.locator("#layers-attention .js-plotly-plot")
    expect(attention).to_be_visible(timeout=LONG)
    shown = _figure(page, "layers-attention")
    assert shown["layout"]["title"]["text"] == "layer 4, head 7: attention"
    adapter, inputs = minilm_labelled
    with torch.no_grad():
        expected = adapter.attentions(**inputs.model_kwargs())[4][0, 7].double().numpy()
    np.testing.assert_allclose(np.asarray(shown["data"][0]["z"]), expected, atol=1e-6)
    expect(_heads_box(page)).to_have_value("")  # nothing was ablated
    expect(page.locator("#layers-change")).to_have_text("")
    no_errors(page)


@pytest.mark.slow  # kaleido draws each figure's PNG
def test_export_downloads_a_bundle_with_the_layer_table(page, tmp_path, minilm_labelled):
    _analyse(page, ["gradient"])  # two figures: the heatmap and the top heads
    with zipfile.ZipFile(exported(page, "layers", tmp_path)) as archive:
        names = archive.namelist()
        csv = next(n for n in names if n.endswith("layers_layers.csv"))
        table = pd.read_csv(io.BytesIO(archive.read(csv)))
        parquet = next(n for n in names if n.endswith("layers_layers.parquet"))
        pd.testing.assert_frame_equal(
            pd.read_parquet(io.BytesIO(archive.read(parquet))), table, check_dtype=False
        )
    for figure in ("heads_head_gradient", "top_heads"):
        assert any(n.endswith(f"figures/layers_{figure}.html") for n in names), figure
        assert any(n.endswith(f"figures/layers_{figure}.png") for n in names), figure
    adapter, inputs = minilm_labelled
    expected = analyze_layers(
        adapter, inputs, output_target(adapter, 0), ["gradient"]
    )  # the gates' gradients, here
    assert len(table) == len(expected) == adapter.num_layers * adapter.num_heads
    merged = table.merge(expected, on=["layer", "head", "measure"], suffixes=("", "_here"))
    np.testing.assert_allclose(merged["value"], merged["value_here"], rtol=1e-4, atol=1e-9)
    no_errors(page)


def test_a_layers_link_reopens_the_view_and_runs_it(blank_page, page_url, load_model):
    page = blank_page  # the link is its first load
    page.goto(
        page_url + "?tab=layers&model=tiny-random-bert&text=the+film+was+good"
        "&measures=gradient,ablation&measure=ablation_zero&heads=L1H0"
    )
    expect(page.locator("#layers-input textarea")).to_have_value(
        "the film was good", timeout=30_000
    )
    expect(page.locator("#layers-model input")).to_have_value("tiny-random-bert")
    expect(page.locator("#layers-heatmap .js-plotly-plot")).to_be_visible(timeout=LONG)
    expect(page.locator("#layers-head-measure input")).to_have_value("ablation_zero")
    change = page.locator("#layers-change")
    expect(change).to_contain_text("L1H0 ablated", timeout=LONG)
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("the film was good")
    top = page.locator("#layers-before h2").inner_text()
    target = next(i for i in range(adapter.num_classes) if adapter.label(i) == top)
    plain, zeroed = joint_ablation(adapter, inputs, output_target(adapter, target), [{(1, 0)}])
    assert f"{plain:.4f} → {zeroed:.4f}" in change.inner_text()
    link = page.locator("#layers-link textarea").input_value()
    for part in ("tab=layers", "model=tiny-random-bert", "measure=ablation_zero", "heads=L1H0"):
        assert part in link
    no_errors(page)


@pytest.mark.slow
def test_the_token_per_layer_ticks_do_not_overlap_on_a_30_layer_model(blank_page, page_url):
    page = blank_page  # the link is its first load
    page.goto(page_url + "?tab=layers&model=smollm2-135m&text=The+capital+of+France+is"
              "&next_token=1&measures=lrp")  # fmt: skip
    expect(page.locator("#layers-heatmap .js-plotly-plot")).to_be_visible(timeout=600_000)
    page.locator("#layers-tokens").get_by_text("France", exact=False).first.click()
    expect(page.locator("#layers-token-layers .js-plotly-plot")).to_be_visible(timeout=60_000)
    shown = _figure(page, "layers-token-layers")
    assert len(shown["data"][1]["y"]) == 31  # entering each of the 30 blocks, and leaving
    ticks = page.locator("#layers-token-layers .xtick text").all()
    boxes = sorted((b["x"], b["x"] + b["width"]) for b in (t.bounding_box() for t in ticks))
    assert len(boxes) >= 4
    assert all(left[1] < right[0] for left, right in itertools.pairwise(boxes))
    no_errors(page)
