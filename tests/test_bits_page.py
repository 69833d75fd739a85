"""
The page's bits section: its run is the library's study, its link reruns it, its export holds it.

The page's handlers are called as the page calls them (by their API names); each view is checked
against :func:`attribution.bits.bits_study` run directly on the same tiny model and texts, and a
study over the server's seconds is refused in words before any weight is quantised.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any
from urllib.parse import parse_qsl

import gradio as gr
import pandas as pd
import pytest

from attrlab.app.settings import ServerSettings
from attrlab.app.ui import build_ui
from attrlab.app.ui.bits import BitsResult, export_bits
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.bits import bits_study

MODEL = "tiny-random-llama"
TEXTS = ("The cat sat on the mat and looked at the rain.", "Mary gave John a book about rivers.")
ASKED = {"kinds": ["mlp"], "bits": [4, 2], "group_sizes": [16], "budgets": [3.0], "draws": 3}
#: The run's inputs as the page's fields hold them, in the order ``bits_run`` takes them.
FIELDS = [MODEL, "\n".join(TEXTS), ["mlp"], ["4", "2"], "16", "3", 3]
#: Those fields' components, in that order.
INPUTS = ("patching-model", "bits-texts", "bits-kinds", "bits-widths", "bits-group-size")
INPUTS += ("bits-budgets", "bits-draws")
QUIET = {"progress": lambda *a, **k: None}


@pytest.fixture(scope="module")
def expected(load_model):
    return bits_study(load_model(MODEL), TEXTS, **ASKED)


@pytest.fixture(scope="module")
def demo():
    worker = ExplainWorker(device="cpu", max_models=1)
    yield build_ui(worker)
    worker.close()


@pytest.fixture(scope="module")
def page(demo):
    return {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}


@pytest.fixture(scope="module")
def shown(page):
    return page["bits_run"](True, *FIELDS, gr.Request(session_hash="bits-page"), **QUIET)


def _opened(demo, query: str) -> dict[str, Any]:
    """What the page's load sets when ``query`` opens it: by component id, and the flags."""
    (load,) = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "restore"]
    updates = load.fn(gr.Request(query_params=dict(parse_qsl(query.removeprefix("?")))))
    return {c.elem_id or str(c._id): u for c, u in zip(load.outputs, updates, strict=True)}


def test_the_page_runs_the_librarys_study_and_shows_its_tables_figures_and_verdicts(
    shown, expected
):
    summary, agreement, sensitivity, rho, allocation, link, result = shown
    study = result.study
    pd.testing.assert_frame_equal(study.table, expected.table, rtol=1e-6)
    pd.testing.assert_frame_equal(study.curves, expected.curves, rtol=1e-6)
    for verdict in expected.verdicts.values():
        assert verdict.summary() in summary
    assert f"{expected.base_loss:.4g}" in summary
    assert agreement["spearman"].tolist() == pytest.approx(
        expected.agreement["spearman"].round(4).tolist(), nan_ok=True
    )
    assert all(view["visible"] for view in (sensitivity, rho, allocation))
    (heatmap,) = sensitivity["value"].data
    parts = list(dict.fromkeys(expected.table["part"]))
    assert list(heatmap.y) == parts
    for i, part in enumerate(parts):
        rows = expected.table[expected.table["part"] == part].set_index("bits")
        assert heatmap.z[i] == pytest.approx(
            [rows.loc[4, "loss_change"], rows.loc[2, "loss_change"]]
        )
    traces = {t.name: t for t in allocation["value"].data}
    band = expected.curves.set_index("allocation").loc["random"]
    assert traces["random lowest draw"].y[0] == pytest.approx(band["low"])
    assert traces["random highest draw"].y[0] == pytest.approx(band["high"])
    assert link.startswith("?tab=bits&")  # no page address outside a browser


def test_the_link_fills_the_same_inputs_and_reruns_the_same_study(demo, page, shown):
    link = shown[-2]
    opened = _opened(demo, link)
    assert opened["link-problems"]["visible"] is False
    assert [opened[name]["value"] for name in INPUTS] == FIELDS
    flags = [u for u in opened.values() if isinstance(u, bool)]
    assert flags.count(True) == 1  # the bits section runs: not the patching view, not pruning
    again = page["bits_run"](True, *FIELDS, gr.Request(session_hash="bits-page"), **QUIET)
    assert again[-2] == link
    pd.testing.assert_frame_equal(again[-1].study.table, shown[-1].study.table)
    # a link's bad fields are named and left out; the others still fill the section
    opened = _opened(demo, "?tab=bits&budgets=four&group_size=7&bits=4,1&kinds=mlp")
    problems = opened["link-problems"]["value"].replace("\\", "")  # as markdown escapes it
    assert "budgets 'four' are not average bits per weight" in problems
    assert "group_size '7' is not one of channel, 16" in problems
    assert "bits '1': not on this tab" in problems


def test_the_page_refuses_bad_studies_in_words_and_over_the_servers_seconds(page):
    request = gr.Request(session_hash="bits-bad")
    for fields, named in (
        ([*FIELDS[:5], "4, many", 3], "bit budgets are average bits per weight"),
        ([*FIELDS[:5], "9", 3], "a bit budget lies between"),
        ([*FIELDS[:3], [], *FIELDS[4:]], "give at least one bit width"),
        ([*FIELDS[:2], ["heads"], *FIELDS[3:]], "unknown part kind"),
    ):
        with pytest.raises(gr.Error, match=named):
            page["bits_run"](True, *fields, request, **QUIET)
    slow = ExplainWorker(device="cpu", max_models=1, settings=ServerSettings(max_seconds=1e-6))
    try:
        model = slow.adapter(MODEL).model
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        handlers = {f.api_name: f.fn for f in build_ui(slow).fns.values() if f.api_name}
        with pytest.raises(gr.Error, match="this bits study would take"):  # REST's words
            handlers["bits_run"](True, *FIELDS, request, **QUIET)
        assert all(p.equal(before[n]) for n, p in model.named_parameters())
    finally:
        slow.close()


def test_the_export_holds_the_study_its_tables_and_every_figure(shown, expected):
    result: BitsResult = shown[-1]
    archive = zipfile.ZipFile(export_bits(result, png=False))
    names = archive.namelist()

    def read(name: str) -> bytes:
        return archive.read(next(n for n in names if n.endswith(name)))

    table = pd.read_csv(io.BytesIO(read("data/bits_table.csv")))
    assert table["loss_change"].tolist() == result.study.table["loss_change"].tolist()
    assert table["part"].tolist() == expected.table["part"].tolist()
    curves = pd.read_csv(io.BytesIO(read("data/bits_curves.csv")))
    assert curves["value"].tolist() == result.study.curves["value"].tolist()
    verdicts = pd.read_csv(io.BytesIO(read("data/bits_verdicts.csv")))
    assert verdicts["allocation"].tolist() == list(expected.verdicts)
    assert verdicts["status"].tolist() == [v.status for v in expected.verdicts.values()]
    written = json.loads(read("data/bits_study.json"))
    assert written["base_loss"] == result.study.base_loss
    for name in ("bits_sensitivity_group16", "bits_agreement", "bits_allocation"):
        assert any(n.endswith(f"figures/{name}.html") for n in names), name
    assert json.loads(read("manifest.json"))["extra"]["inputs"] == result.fields
