"""
``attrlab evict``, ``POST /api/v1/evict`` and ``attrlab.evict``: the library's eviction study wired.

Each front end's numbers are checked against :func:`attribution.eviction.request.run_eviction`
run directly on the same tiny model and tasks (``solved_only`` off: a random model answers
nothing); bad input is refused in words (exit 2, HTTP 4xx); the notebook's HTML and the figures
hold the study's own tables.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from test_bits_fronts import _Tables
from test_evict_jobs import ASKED, BODY, MODEL, TASKS, direct_study

import attrlab
from attrlab.app.cli import main
from attrlab.attribution.engine.verification import RANDOM
from attrlab.viz import eviction_figures


@pytest.fixture(scope="module")
def expected(load_model):
    return direct_study(load_model(MODEL))


def _same(got: pd.DataFrame, expected: pd.DataFrame, column: str) -> None:
    pd.testing.assert_series_equal(
        got[column].astype(float).reset_index(drop=True),
        expected[column].astype(float).reset_index(drop=True),
        rtol=1e-6,
        atol=1e-9,
    )


def _cli_args(tmp_path) -> list[str]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS), encoding="utf-8")
    argv = ["evict", "--model", MODEL, "--input", str(tasks), "--scorers", "h2o,knorm,exact_loo"]
    return [*argv, "--ratios", "1,0.5,0.2", "--draws", "3", "--all-items", "--device", "cpu"]


def test_the_cli_writes_the_study_as_json_table_and_figures(capsys, tmp_path, expected):
    argv = _cli_args(tmp_path)
    assert main([*argv, "--format", "json"]) == 0
    study = json.loads(capsys.readouterr().out)
    _same(pd.DataFrame(study["curves"]["curves"]), expected.curves.curves, "value")
    _same(pd.DataFrame(study["agreement"]), expected.agreement, "top_k_overlap")
    assert study["views"][1]["scores"]["h2o"] == pytest.approx(expected.views[1]["scores"]["h2o"])
    assert main([*argv, "--figures", str(tmp_path / "figures")]) == 0
    text = capsys.readouterr().out
    written = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert written == sorted(f"{name}.html" for name in eviction_figures(expected))
    for verdict in expected.curves.verdicts:
        assert verdict.summary() in text
    areas = expected.curves.scores.set_index(["metric", "order"])["auc"]
    assert f"area      kl: h2o {areas['kl', 'h2o']:.4g}  knorm {areas['kl', 'knorm']:.4g}" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--scorers", "nope"], "unknown"),
        (["--task", "sudoku"], "the task is one of"),
        (["--ratios", "0.5,0.2"], "keep ratios start at 1.0"),
        (["--ratios", "1,half"], "--ratios takes comma-separated numbers"),
        (["--split", "global"], "a budget split is one of"),
    ],
)
def test_the_cli_refuses_bad_studies_in_words(capsys, extra, message):
    assert main(["evict", "--model", MODEL, "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_cli_refuses_a_bad_task_file_by_its_line(capsys, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"context": "a", "question": "b"}) + "\n", encoding="utf-8")
    assert main(["evict", "--model", MODEL, "--input", str(tasks), "--device", "cpu"]) == 2
    assert "tasks.jsonl line 1: no 'answer'" in capsys.readouterr().err


def test_rest_evict_answers_the_study_and_refuses_bad_bodies(served, expected):
    response = served.post("/api/v1/evict", json=BODY)
    assert response.status_code == 200, response.text
    study = response.json()
    _same(pd.DataFrame(study["curves"]["curves"]), expected.curves.curves, "value")
    _same(pd.DataFrame(study["agreement"]), expected.agreement, "spearman")
    assert [v["label"] for v in study["views"]] == [v["label"] for v in expected.views]
    for bad, named in (
        ({**BODY, "scorers": ["nope"]}, "unknown"),
        ({**BODY, "ratios": [1.0, 1.5]}, "keep ratios"),
        ({**BODY, "span": 0}, "exact_loo"),
        ({**BODY, "tasks": [{**TASKS[0], "context": " "}]}, "context"),
    ):
        response = served.post("/api/v1/evict", json=bad)
        assert 400 <= response.status_code < 500, response.text
        assert named in json.dumps(response.json()["error"]), response.text
    assert "/api/v1/evict" in served.get("/openapi.json").json()["paths"]


def test_the_python_call_is_the_librarys_study(load_model, expected, tmp_path):
    study = attrlab.evict(load_model(MODEL), TASKS, solved_only=False, **ASKED)
    _same(study.curves.curves, expected.curves.curves, "value")
    _same(study.agreement, expected.agreement, "spearman")
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS), encoding="utf-8")
    from_file = attrlab.evict(load_model(MODEL), path, solved_only=False, **ASKED)
    _same(from_file.curves.curves, expected.curves.curves, "value")
    with pytest.raises(attrlab.AttrlabError, match="give exactly 'context'"):
        attrlab.evict(load_model(MODEL), [{"context": "a", "question": "b"}])
    with pytest.raises(attrlab.AttrlabError, match="a budget split is one of"):
        attrlab.evict(load_model(MODEL), TASKS, split="global")


def test_a_study_shows_its_areas_agreement_and_verdicts_in_a_notebook(expected):
    markup = expected._repr_html_()
    page = _Tables()
    page.feed(markup)
    assert "script" not in page.tags and "http" not in markup
    (header, *rows) = page.tables["attrlab-eviction-areas"]
    areas = expected.curves.scores
    assert [row[0] for row in rows] == list(areas["order"])
    for row, auc in zip(rows, areas["auc"], strict=True):
        assert float(dict(zip(header, row, strict=True))["auc"]) == pytest.approx(auc, rel=1e-3)
    (header, *rows) = page.tables["attrlab-agreement"]
    rho = dict(zip(expected.agreement["scorer"], expected.agreement["spearman"], strict=True))
    assert [row[0] for row in rows] == list(rho)
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        want = rho[cells["scorer"]]
        if math.isnan(want):
            assert cells["spearman"] == ""
        else:
            assert float(cells["spearman"]) == pytest.approx(want, rel=1e-3, abs=1e-9)
    text = "".join(page.text)
    for verdict in expected.curves.verdicts:
        assert verdict.summary() in text


def test_figures_draw_the_studys_tables(expected):
    assert expected.figures() == [
        "eviction_log_prob",
        "eviction_exact_match",
        "eviction_kl",
        "eviction_agreement",
    ]
    curves = expected.curves.curves
    for metric in ("log_prob", "exact_match", "kl"):
        traces = {t.name: t for t in expected.figure(f"eviction_{metric}").data}
        rows = curves[curves["metric"] == metric]
        random = rows[rows["order"] == RANDOM]
        assert list(traces["random highest draw"].y) == list(random["high"])
        assert list(traces["random lowest draw"].y) == list(random["low"])
        for scorer in ASKED["scorers"]:
            mine = rows[rows["order"] == scorer]
            assert list(traces[scorer].x) == list(mine["removed"])
            assert list(traces[scorer].y) == list(mine["value"])
    bars = {t.name: t for t in expected.figure("eviction_agreement").data}
    assert list(bars["Spearman ρ"].y) == pytest.approx(
        list(expected.agreement["spearman"]), nan_ok=True
    )
    with pytest.raises(ValueError, match="no figure 'nope'"):
        expected.figure("nope")
