"""
The page's KV cache tab: its run is the library's study, its link reruns it, its export holds it.

The page's handlers are called as the page calls them (by their API names); each view is checked
against :func:`attribution.eviction.request.run_eviction` run directly on the same tiny model and
tasks, and a study over the server's passes is refused in words before any prefill.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from typing import Any
from urllib.parse import parse_qsl

import gradio as gr
import pandas as pd
import pytest
from test_evict_jobs import ASKED, MODEL, TASKS, direct_study

from attrlab.app.settings import ServerSettings
from attrlab.app.ui import build_ui
from attrlab.app.ui.eviction import EvictionResult, export_eviction
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.methods._routing import _RoutedConfig

#: The run's inputs as the tab's fields hold them, in the order ``evict_run`` takes them.
FIELDS = [MODEL, "needle", 3, 500, 0, "\n".join(json.dumps(t) for t in TASKS)]
FIELDS += [ASKED["scorers"], "kv_entry", "uniform", "1, 0.5, 0.2", 3, True]
#: Those fields' components, in that order.
INPUTS = ("evict-model", "evict-task", "evict-count", "evict-max-tokens", "evict-seed")
INPUTS += ("evict-tasks", "evict-scorers", "evict-unit", "evict-split", "evict-ratios")
INPUTS += ("evict-draws", "evict-all-items")
QUIET = {"progress": lambda *a, **k: None}


@pytest.fixture(scope="module")
def expected(load_model):
    return direct_study(load_model(MODEL))


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
    return page["evict_run"](True, *FIELDS, gr.Request(session_hash="evict-page"), **QUIET)


def _opened(demo, query: str) -> dict[str, Any]:
    """What the page's load sets when ``query`` opens it: by component id, and the flags."""
    (load,) = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "restore"]
    updates = load.fn(gr.Request(query_params=dict(parse_qsl(query.removeprefix("?")))))
    return {c.elem_id or str(c._id): u for c, u in zip(load.outputs, updates, strict=True)}


def test_the_page_runs_the_librarys_study_and_shows_its_tables_figures_and_verdicts(
    shown, expected
):
    summary, agreement, log_prob, exact, kl, rho, item, scorer, ratio, prompt, link, result = shown
    assert "h2o's score per token" in prompt
    study = result.study
    pd.testing.assert_frame_equal(study.curves.curves, expected.curves.curves, rtol=1e-6)
    for verdict in expected.curves.verdicts:
        assert verdict.summary() in summary
    assert f"{expected.full['log_prob']:.4g}" in summary
    assert agreement["spearman"].tolist() == pytest.approx(
        expected.agreement["spearman"].round(4).tolist(), nan_ok=True
    )
    assert all(view["visible"] for view in (log_prob, exact, kl, rho))
    curves = expected.curves.curves
    traces = {t.name: t for t in kl["value"].data}
    for name in ASKED["scorers"]:
        rows = curves[(curves["order"] == name) & (curves["metric"] == "kl")]
        assert list(traces[name].y) == pytest.approx(list(rows["value"]))
    random = curves[(curves["order"] == "random") & (curves["metric"] == "kl")]
    assert list(traces["random lowest draw"].y) == pytest.approx(list(random["low"]))
    assert item["value"] == "0" and scorer["value"] == "h2o" and ratio["value"] == 0.5
    assert link.startswith("?tab=evict&")  # no page address outside a browser


def _spans(markup: str) -> list[tuple[str, str]]:
    """Each coloured token's title and background, in the order drawn."""
    found = re.findall(r'<span title="([^"]*)" style="background:(rgb\([^)]*\))', markup)
    return [(title, colour) for title, colour in found]


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(part) for part in colour.removeprefix("rgb(").removesuffix(")").split(","))


def test_the_prompt_is_coloured_by_the_scorer_and_kept_at_the_slider_ratio(page, shown, expected):
    result: EvictionResult = shown[-1]
    view = expected.views[1]
    markup = page["evict_view"](result, "1", "knorm", 0.2)
    scores, kept = markup.split("Kept at keep ratio 0.2")
    titles = [title for title, _ in _spans(scores)]
    assert titles == [f"knorm: {v:.4g}" for v in view["scores"]["knorm"]]
    shares = view["kept"]["knorm"][2]  # ratios 1, 0.5, 0.2
    assert [t for t, _ in _spans(kept)] == [
        f"{s:.0%} of its entries kept at ratio 0.2" for s in shares
    ]
    colours = [_rgb(colour) for _, colour in _spans(kept)]
    most, least = colours[shares.index(max(shares))], colours[shares.index(min(shares))]
    assert max(shares) > min(shares)
    assert most[0] > least[0] or most[2] < least[2]  # more kept: redder, or less blue
    for share, colour in zip(shares, colours, strict=True):  # one colour per share
        assert colour == colours[shares.index(share)]
    nearest = page["evict_view"](result, "1", "knorm", 0.45)  # the slider snaps to 0.5
    assert "Kept at keep ratio 0.5 " in nearest
    with pytest.raises(gr.Error, match="the study has items 1 to 2"):
        page["evict_view"](result, "5", "knorm", 0.5)


def test_the_link_fills_the_same_inputs_and_reruns_the_same_study(demo, page, shown):
    link = shown[-2]
    opened = _opened(demo, link)
    assert opened["link-problems"]["visible"] is False
    assert "value" not in opened["evict-seed"]  # seed 0 is the field's own: left out
    filled = [opened[name].get("value", 0) for name in INPUTS]
    assert filled == FIELDS
    flags = [u for u in opened.values() if isinstance(u, bool)]
    assert flags.count(True) == 1  # only the KV cache tab runs
    again = page["evict_run"](True, *FIELDS, gr.Request(session_hash="evict-page"), **QUIET)
    assert again[-2] == link
    pd.testing.assert_frame_equal(
        again[-1].study.curves.curves, shown[-1].study.curves.curves, rtol=1e-9
    )
    opened = _opened(demo, "?tab=evict&ratios=half&unit=layer&scorers=h2o,nope&count=99")
    problems = opened["link-problems"]["value"].replace("\\", "")  # as markdown escapes it
    assert "ratios 'half' are not keep ratios" in problems
    assert "unit 'layer' is not one of kv_entry, kv_position" in problems
    assert "scorers 'nope': not on this tab" in problems
    assert "count '99' is not a whole number from 1 to 20" in problems


def test_the_page_refuses_bad_studies_in_words_and_over_the_servers_passes(page):
    request = gr.Request(session_hash="evict-bad")
    for fields, named in (
        ([*FIELDS[:9], "1, half", *FIELDS[10:]], "keep ratios are shares"),
        ([*FIELDS[:9], "0.5, 0.2", *FIELDS[10:]], "keep ratios start at 1.0"),
        ([*FIELDS[:6], ["nope"], *FIELDS[7:]], "unknown"),
        ([*FIELDS[:5], '{"context": "a"}', *FIELDS[6:]], "the tasks line 1: no 'question'"),
        ([MODEL, "sudoku", *FIELDS[2:5], "", *FIELDS[6:]], "the task is one of"),
    ):
        with pytest.raises(gr.Error, match=named):
            page["evict_run"](True, *fields, request, **QUIET)
    tight = ExplainWorker(device="cpu", max_models=1, settings=ServerSettings(max_forward_passes=5))
    try:
        adapter = tight.adapter(MODEL)
        handlers = {f.api_name: f.fn for f in build_ui(tight).fns.values() if f.api_name}
        with pytest.raises(gr.Error, match="forward passes"):  # REST's words
            handlers["evict_run"](True, *FIELDS, request, **QUIET)
        assert not any(isinstance(m.config, _RoutedConfig) for m in adapter.attention_modules())
    finally:
        tight.close()


def test_the_export_holds_the_study_its_tables_and_every_figure(shown, expected):
    result: EvictionResult = shown[-1]
    archive = zipfile.ZipFile(export_eviction(result, png=False))
    names = archive.namelist()

    def read(name: str) -> bytes:
        return archive.read(next(n for n in names if n.endswith(name)))

    curves = pd.read_csv(io.BytesIO(read("data/eviction_curves.csv")))
    assert curves["value"].tolist() == pytest.approx(expected.curves.curves["value"].tolist())
    assert curves["order"].tolist() == expected.curves.curves["order"].tolist()
    agreement = pd.read_csv(io.BytesIO(read("data/eviction_agreement.csv")))
    assert agreement["scorer"].tolist() == expected.agreement["scorer"].tolist()
    verdicts = pd.read_csv(io.BytesIO(read("data/eviction_verdicts.csv")))
    assert verdicts["status"].tolist() == [v.status for v in expected.curves.verdicts]
    written = json.loads(read("data/eviction_study.json"))
    assert written["views"][0]["tokens"] == expected.views[0]["tokens"]
    for name in ("eviction_log_prob", "eviction_exact_match", "eviction_kl", "eviction_agreement"):
        assert any(n.endswith(f"figures/{name}.html") for n in names), name
    assert json.loads(read("manifest.json"))["extra"]["inputs"] == result.fields
