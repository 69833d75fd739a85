"""
The patching view's shared link and export, without a browser (tests/test_browser_patching.py
drives the view itself).
"""

from __future__ import annotations

import io
import json
import zipfile
from urllib.parse import parse_qsl

import gradio as gr
import pandas as pd
import pytest

from attrlab.app.ui.link import _read_link, share_query
from attrlab.app.ui.patching import PatchingResult, export_patching, patching_view
from attrlab.app.ui.runner import PageRunner
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.patching import patching_problem, patching_report

MODEL = "tiny-random-gpt2"
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


@pytest.fixture(scope="module")
def views():
    """The view's and its pruning section's linked fields, on a page of their own (no model)."""
    worker = ExplainWorker(device="cpu")
    with gr.Blocks():
        linked = patching_view(PageRunner(worker))
    yield linked
    worker.close()


@pytest.fixture(scope="module")
def view(views):
    return views["patching"]


def _opened(query: str, view, tab: str = "patching") -> tuple[dict, list[str]]:
    link = _read_link(dict(parse_qsl(query.removeprefix("?"))), {tab: view})
    assert link.tab == tab
    return link.fields, link.problems


def test_a_patching_link_carries_every_field_of_the_study(view):
    asked = {
        "model": MODEL,
        "text": CLEAN,
        "corrupted": "",
        "noise_positions": "1,3",
        "noise_seeds": 7,
        "answer": " Mary",
        "contrast": " John",
        "components": ["residual", "head_position"],
        "estimators": ["exact", "atp_star"],
        "directions": ["noising"],
    }
    query = share_query({"tab": "patching", **asked})
    fields, problems = _opened(query, view)
    assert problems == []
    assert fields == {k: v for k, v in asked.items() if v != ""}  # an empty field stays out
    assert set(fields) <= set(view.fields)  # each fills one of the view's inputs


def test_a_patching_links_bad_fields_are_named_and_the_rest_still_fill(view):
    query = (
        "?tab=patching&text=a+b&noise_positions=two&noise_seeds=65"
        "&components=residual,everything&estimators=atp"
    )
    fields, problems = _opened(query, view)
    assert fields == {"text": "a b", "components": ["residual"], "estimators": ["atp"]}
    assert len(problems) == 3
    assert "noise_positions 'two'" in problems[0] and "noise_seeds '65'" in problems[1]
    assert "components 'everything': not on this tab" in problems[2]


def test_a_pruning_links_bad_fields_are_named_and_the_rest_still_fill(views):
    query = (
        "?tab=pruning&text=a+b&texts=one%0A%0A+%0Atwo&units=neuron,wings&draws=0"
        "&sparsity=sideways&allocation=biggest&removal=mean&agreement=yes"
    )
    fields, problems = _opened(query, views["pruning"], "pruning")
    # the blank lines of texts dropped; mean is a removal a neuron has
    assert fields == {"text": "a b", "texts": "one\ntwo", "units": ["neuron"], "removal": "mean"}
    assert len(problems) == 5
    assert problems[0] == "draws '0' is not a whole number from 1 to 100"
    assert problems[1] == "sparsity 'sideways' is not one of global, per_layer"
    assert problems[2].startswith("allocation 'biggest' is not one of owl, dlp")
    assert problems[3] == "agreement 'yes' is not 1 (on) or 0 (off)"
    assert problems[4] == "units 'wings': not on this tab"


def test_a_pruning_links_removal_must_be_one_its_units_share(views):
    from attrlab.attribution.engine.units import unit_kind

    # a layer is not removed by the mean (a neuron is): named, with what the units offer
    assert "mean" not in unit_kind("layer").removals
    fields, problems = _opened("?tab=pruning&units=layer&removal=mean", views["pruning"], "pruning")
    assert fields == {"units": ["layer"]}
    offered = ", ".join(unit_kind("layer").removals)
    assert problems == [f"removal 'mean' is not offered with this link's other fields ({offered})"]
    fields, problems = _opened("?tab=pruning&removal=wipe", views["pruning"], "pruning")
    assert fields == {} and problems[0].startswith("removal 'wipe' is not one of ")
    # more texts than a study takes are cut to the first MAX_TEXTS
    from attrlab.attribution.engine import MAX_TEXTS

    many = "%0A".join(f"t{i}" for i in range(MAX_TEXTS + 5))
    fields, problems = _opened(f"?tab=pruning&texts={many}", views["pruning"], "pruning")
    assert fields["texts"].splitlines() == [f"t{i}" for i in range(MAX_TEXTS)] and not problems


def test_the_export_holds_the_report_its_tables_and_every_figure(load_model):
    from attrlab.viz.patching import patching_figures

    adapter = load_model(MODEL)
    problem = patching_problem(adapter, CLEAN, CORRUPT, " Mary", " John")
    report = patching_report(adapter, problem, ["exact", "atp"], ["residual", "head"])
    fields = {"tab": "patching", "model": MODEL, "text": CLEAN, "corrupted": CORRUPT}
    archive = zipfile.ZipFile(export_patching(PatchingResult(report, fields), png=False))
    names = archive.namelist()

    def read(name: str) -> bytes:
        return archive.read(next(n for n in names if n.endswith(name)))

    table = pd.read_csv(io.BytesIO(read("data/patching_table.csv")))
    assert len(table) == len(report.table)
    for column in ("effect", "normalised", "patched"):  # the numbers as computed, to the bit
        assert table[column].tolist() == report.table[column].astype(float).tolist()
    agreement = pd.read_csv(io.BytesIO(read("data/patching_agreement.csv")))
    assert agreement["spearman"].tolist() == report.agreement["spearman"].tolist()
    written = json.loads(read("data/patching_report.json"))
    assert written["clean_score"] == report.clean_score
    assert written["tokens"] == list(problem.clean.token_texts)  # the prompt and the answer
    for name in patching_figures(report):
        assert any(n.endswith(f"figures/{name}.html") for n in names), name
    manifest = json.loads(read("manifest.json"))
    assert manifest["extra"]["inputs"] == fields
    index = read("index.html").decode()
    assert MODEL in index and "data/patching_report.json" in index


def test_the_export_carries_the_pruning_study_run_beside_it(load_model):
    from attrlab.attribution.engine.study import pruning_study, ranked_input

    adapter = load_model(MODEL)
    problem = patching_problem(adapter, CLEAN, CORRUPT, " Mary", " John")
    report = patching_report(adapter, problem, ["exact"], ["residual"])
    inputs, target, _ = ranked_input(adapter, CLEAN, None, " Mary", " John")
    pruned = pruning_study(adapter, inputs, target, texts=["a cat sat"], units=("layer",), draws=2)
    fields = {"tab": "patching", "model": MODEL, "text": CLEAN, "corrupted": CORRUPT}
    archive = zipfile.ZipFile(
        export_patching(PatchingResult(report, fields), png=False, pruned=pruned)
    )
    names = archive.namelist()
    scores = pd.read_csv(
        io.BytesIO(archive.read(next(n for n in names if n.endswith("data/pruning_scores.csv"))))
    )
    assert scores["auc"].tolist() == pruned.score_table()["auc"].tolist()
    assert any(n.endswith("figures/pruning_layers.html") for n in names)


def test_the_reading_judges_each_estimator_on_its_weakest_ranking():
    from attrlab.attribution.patching import AGREEMENT_COLUMNS, PatchingReport, agreement_reading

    rows = [  # estimator, direction, component, sites, pearson, spearman, overlap, k
        ("atp", "denoising", "residual", 30, 0.99, 0.95, 1.0, 10),
        ("atp", "noising", "head", 8, 0.2, 0.3, 0.5, 8),
        ("atp_star", "denoising", "residual", 30, 0.7, 0.6, 0.8, 10),
        ("relp", "denoising", "residual", 30, float("nan"), float("nan"), 0.0, 10),
        ("exact_twin", "denoising", "residual", 30, 1.0, 0.8, 1.0, 10),
    ]
    table = pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))
    report = PatchingReport(pd.DataFrame(), table, "' Mary'", 1.0, 0.0, [0.0], [], None)
    assert agreement_reading(report) == [
        "Attribution patching (AtP) does not track exact patching: Spearman ρ 0.30, top-8 "
        "overlap 0.50, Pearson r 0.20 (weakest of 2: head, noising).",
        "AtP* (QK fix, GradDrop) tracks exact patching roughly: Spearman ρ 0.60, top-10 overlap "
        "0.80, Pearson r 0.70.",
        "Relevance patching (RelP): no ranking to compare (the effects are constant).",
        "exact_twin tracks exact patching: Spearman ρ 0.80, top-10 overlap 1.00, Pearson r 1.00.",
    ]
