"""
The activation patching view (Layers & heads tab) in headless Debian Chromium.

Expected numbers come from :func:`attribution.patching.patching_report` run in the test on the
same tiny model, never from the page's own output.
"""

from __future__ import annotations

import numpy as np
import pytest
from _browser import errors, no_errors, tab
from playwright.sync_api import Page, expect

from attrlab.attribution.patching import patching_problem, patching_report

pytestmark = pytest.mark.browser

MODEL = "tiny-random-gpt2"
CLEAN = "When Mary and John went to the store, John gave a drink to"  # the view's example
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
COMPONENTS = ["residual", "head"]
LONG = 120_000


@pytest.fixture(autouse=True)
def patient(page):
    page.set_default_timeout(60_000)


@pytest.fixture(scope="module")
def expected(load_model):
    adapter = load_model(MODEL)
    problem = patching_problem(adapter, CLEAN, CORRUPT, " Mary", " John")
    return patching_report(adapter, problem, components=COMPONENTS)


def _open(page: Page, components: bool = True) -> None:
    """Open the view on the tiny model; ``components``: only :data:`COMPONENTS` ticked."""
    tab(page, "Layers & heads")
    tab(page, "Activation patching")
    model = page.locator("#patching-model input")
    model.fill(MODEL)
    model.press("Enter")
    if not components:
        return
    for box in page.locator("#patching-components input[type=checkbox]").all():
        name = box.evaluate("b => b.closest('label').innerText.split(':')[0].trim()")
        box.set_checked(name in COMPONENTS)


def _figure(page: Page, elem_id: str) -> dict:
    return page.evaluate(
        """(id) => {
          const plot = document.querySelector(`#${id} .js-plotly-plot`);
          const plain = (v) => ArrayBuffer.isView(v) ? Array.from(v)
            : Array.isArray(v) ? v.map(plain) : v;
          return {data: plot._fullData.map((t) => ({z: plain(t.z), name: t.name})),
                  ticks: plot._fullLayout.xaxis.ticktext,
                  titles: (plot.layout.annotations || []).map((a) => a.text)};
        }""",
        elem_id,
    )


def test_a_study_shows_its_figures_reading_and_link_and_the_link_reruns_it(
    page, page_url, expected
):
    _open(page)
    page.locator("#patching-run").click()
    heatmap = "patching-patching-residual"
    expect(page.locator(f"#{heatmap} .js-plotly-plot")).to_be_visible(timeout=LONG)
    shown = _figure(page, heatmap)
    table = expected.table
    for trace, direction in zip(shown["data"], ("denoising", "noising"), strict=True):
        rows = table[
            (table.estimator == "exact")
            & (table.component == "residual")
            & (table.direction == direction)
        ]
        grid = rows.pivot_table(index="layer", columns="position", values="normalised")
        np.testing.assert_allclose(np.array(trace["z"], dtype=float), grid.to_numpy(), rtol=1e-6)
    assert any("John→" in tick and "Mary" in tick for tick in shown["ticks"])  # the swap
    for hidden in ("patching-patching-attention", "patching-patching-mlp"):
        expect(page.locator(f"#{hidden}")).to_be_hidden()  # not asked for
    expect(page.locator("#patching-patching-heads .js-plotly-plot")).to_be_visible()
    scatter = _figure(page, "patching-estimators-denoising")
    agreement = expected.agreement.set_index(["estimator", "direction", "component"])
    rho = agreement.loc[("atp", "denoising", "residual"), "spearman"]
    assert any(f"ρ = {rho:.3f}" in title for title in scatter["titles"])
    reading = page.locator("#patching-reading")
    expect(reading).to_contain_text("Attribution patching (AtP)")
    expect(reading).to_contain_text("exact patching")
    expect(page.locator("#patching-summary")).to_contain_text(f"{expected.clean_score:.4g}")
    link = page.locator("#patching-link textarea").input_value()
    for part in ("tab=patching", f"model={MODEL}", "components=residual%2Chead"):
        assert part in link
    no_errors(page)
    page.screenshot(path=_shot("patching-study"), full_page=True)

    page.goto(link)  # a fresh page: the link refills the view and runs it
    expect(page.locator("#patching-corrupted textarea")).to_have_value(CORRUPT, timeout=30_000)
    expect(page.locator(f"#{heatmap} .js-plotly-plot")).to_be_visible(timeout=LONG)
    assert _figure(page, heatmap)["data"][0]["z"] == shown["data"][0]["z"]
    no_errors(page)


#: A bad study's fields (corrupted, noise positions, clean) and the words refusing it.
#: One refusal the model makes (token lengths) and one the page's reader makes (positions);
#: the library's others (neither or both corruptions, an empty prompt) are refused in the same
#: words over REST and the CLI (test_patch_fronts.py), through the same PatchRequest.check.
BAD = [
    ("When Mary went to the store", "", CLEAN, "15 tokens and the corrupted one 7"),
    ("", "two", CLEAN, "noise positions are token positions"),
]


def test_bad_studies_are_refused_in_words(page):
    _open(page, components=False)  # refused before any patching
    for corrupted, noise, clean, words in BAD:
        page.locator("#patching-corrupted textarea").fill(corrupted)
        page.locator("#patching-noise textarea").fill(noise)
        page.locator("#patching-clean textarea").fill(clean)
        seen = len(errors(page))
        page.locator("#patching-run").click()
        page.wait_for_function(f"() => window.__errors.length > {seen}", timeout=LONG)
        message = errors(page)[-1]
        assert words in message and "Traceback" not in message, message
        # the next refusal gets its own toast. Closed in the page: a toast closing animates
        # the others out of the pointer's way (Playwright's clicks then wait on inert buttons).
        page.evaluate("() => document.querySelectorAll('.toast-close').forEach((b) => b.click())")
        expect(page.locator(".toast-body")).to_have_count(0)


def _shot(name: str) -> str:
    from _browser import SHOTS

    SHOTS.mkdir(parents=True, exist_ok=True)
    return str(SHOTS / f"{name}.png")


def test_pruning_curves_show_beside_the_study_with_the_librarys_areas(page, load_model):
    """Prune layers over two texts: the page's areas are the library's study's, to the digit."""
    from attrlab.attribution.engine.study import pruning_study, ranked_input
    from attrlab.attribution.request.run import RunSettings
    from attrlab.viz.table import pruning_text

    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    adapter = load_model(MODEL)
    inputs, target, problem = ranked_input(adapter, CLEAN, None, " Mary", " John", CORRUPT)
    expected = pruning_study(
        adapter,
        inputs,
        target,
        texts=texts,
        problem=problem,
        units=("layer",),
        draws=2,
        settings=RunSettings(seed=0),
    )
    _open(page, components=False)
    page.locator("#pruning-texts textarea").fill("\n".join(texts))
    page.locator("#pruning-draws input").fill("2")
    page.locator("#pruning-run").click()
    expect(page.locator("#pruning-layers .js-plotly-plot")).to_be_visible(timeout=LONG)
    shown = page.locator("#pruning-scores code").inner_text()
    assert shown.strip() == pruning_text(expected).strip()
    expect(page.locator("#pruning-heads .js-plotly-plot")).to_have_count(0)  # not asked for
    no_errors(page)

    link = page.locator("#pruning-link textarea").input_value()
    for part in ("tab=pruning", "units=layer", "draws=2", "texts=The+cat"):
        assert part in link
    page.goto(link)  # a fresh page: the link refills the section and runs it
    expect(page.locator("#pruning-draws input")).to_have_value("2", timeout=30_000)
    expect(page.locator("#pruning-texts textarea")).to_have_value("\n".join(texts))
    expect(page.locator("#pruning-layers .js-plotly-plot")).to_be_visible(timeout=LONG)
    rerun = page.locator("#pruning-scores code").inner_text()
    assert rerun.strip() == pruning_text(expected).strip()
    expect(page.locator("#link-problems")).to_be_hidden()
    no_errors(page)


def test_bits_show_the_librarys_sensitivity_heatmap_and_verdicts(page, load_model):
    """Quantise over two texts with the section's defaults: the heatmap is the library's table."""
    from attrlab.attribution.bits import bits_study

    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    expected = bits_study(load_model(MODEL), texts, group_sizes=(32,), draws=3)
    _open(page, components=False)
    page.locator("#bits-texts textarea").fill("\n".join(texts))
    page.locator("#bits-draws input").fill("3")
    page.locator("#bits-run").click()
    expect(page.locator("#bits-sensitivity-plot .js-plotly-plot")).to_be_visible(timeout=LONG)
    (heatmap,) = _figure(page, "bits-sensitivity-plot")["data"]
    grid = expected.table.pivot(index="part", columns="bits", values="loss_change")
    parts = list(dict.fromkeys(expected.table["part"]))
    np.testing.assert_allclose(heatmap["z"], grid.loc[parts, [8, 4, 3, 2]], rtol=1e-5)
    summary = page.locator("#bits-summary").inner_text()
    for verdict in expected.verdicts.values():
        assert verdict.summary() in summary
    assert "tab=bits" in page.locator("#bits-link textarea").input_value()
    no_errors(page)
