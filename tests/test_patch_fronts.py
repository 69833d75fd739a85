"""
``attrlab patch`` and ``POST /api/v1/patch``: the library's patching study, wired.

Each front end's numbers are checked against :func:`attribution.patching.patching_report` run
directly on the same tiny model and prompts; bad input is refused in words (exit 2, HTTP 4xx).
"""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from attrlab.app.cli import main
from attrlab.attribution.patching import patching_problem, patching_report
from attrlab.viz import patching_figures

MODEL = "tiny-random-gpt2"
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
STUDY = {"estimators": ["exact", "atp"], "components": ["residual", "head"]}


@pytest.fixture(scope="module")
def expected(load_model):
    problem = patching_problem(load_model(MODEL), CLEAN, CORRUPT, " Mary", " John")
    return patching_report(load_model(MODEL), problem, **STUDY)


def _same_table(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert len(got) == len(expected)
    for column in ("estimator", "direction", "component"):
        assert list(got[column]) == list(expected[column])
    for column in ("effect", "normalised"):
        pd.testing.assert_series_equal(
            got[column].astype(float), expected[column].astype(float), rtol=1e-6, atol=1e-9
        )


def test_the_cli_writes_the_study_as_json_and_csv(capsys, tmp_path, expected):
    argv = ["patch", "--model", MODEL, "--clean", CLEAN, "--corrupt", CORRUPT]
    argv += ["--answer", " Mary", "--contrast", " John", "--estimators", "exact,atp"]
    argv += ["--components", "residual,head"]
    assert main([*argv, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == "' Mary' rather than ' John'"
    assert report["clean_score"] == pytest.approx(expected.clean_score, rel=1e-6)
    _same_table(pd.DataFrame(report["table"]), expected.table)
    assert {(r["estimator"], r["component"]) for r in report["agreement"]} == {
        ("atp", "residual"),
        ("atp", "head"),
    }
    assert main([*argv, "--format", "csv"]) == 0
    _same_table(pd.read_csv(io.StringIO(capsys.readouterr().out)), expected.table)
    assert main([*argv, "--figures", str(tmp_path / "figures")]) == 0  # and the terminal view
    text = capsys.readouterr().out
    written = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert written == sorted(f"{name}.html" for name in patching_figures(expected))
    assert "top denoising residual:" in text and "estimators against exact patching" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--corrupt", "When Mary went to the store"], "token"),
        (["--noise-positions", "two"], "--noise-positions takes token positions"),
        (["--corrupt", CORRUPT, "--components", "everything"], "everything"),
    ],
)
def test_the_cli_refuses_bad_studies_in_words(capsys, extra, message):
    assert main(["patch", "--model", MODEL, "--clean", CLEAN, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_rest_patch_answers_the_study_and_refuses_bad_bodies(served, expected):
    body = {"model": MODEL, "clean": CLEAN, "corrupted": CORRUPT}
    body |= {"answer": " Mary", "contrast": " John", **STUDY}
    response = served.post("/api/v1/patch", json=body)
    assert response.status_code == 200, response.text
    _same_table(pd.DataFrame(response.json()["table"]), expected.table)
    for bad, named in (
        ({k: v for k, v in body.items() if k != "corrupted"}, "corrupted prompt, or noise"),
        ({**body, "noise_positions": [3]}, "corrupted prompt, or noise"),  # both
        ({**body, "clean": ""}, "clean"),
        ({**body, "components": ["everything"]}, "unknown component(s) 'everything'"),
        ({**body, "corrupted": "When Mary went"}, "token"),  # another token length
        ({**body, "noise_seeds": 0}, "noise_seeds"),
    ):
        response = served.post("/api/v1/patch", json=bad)
        assert 400 <= response.status_code < 500, response.text
        assert named in json.dumps(response.json()["error"]), response.text
    assert "/api/v1/patch" in served.get("/openapi.json").json()["paths"]


def test_a_classifier_is_patched_on_its_class_through_cli_and_rest(served, capsys, load_model):
    """A text classifier's class logit: the CLI and REST give the library's study."""
    bert = load_model("tiny-random-bert")
    problem = patching_problem(bert, "a fine film", "a poor film", target=1)
    expected = patching_report(bert, problem, ["exact"], ["mlp"])
    argv = ["patch", "--model", "tiny-random-bert", "--clean", "a fine film"]
    argv += ["--corrupt", "a poor film", "--target", "1", "--estimators", "exact"]
    assert main([*argv, "--components", "mlp", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == bert.label(1)
    _same_table(pd.DataFrame(report["table"]), expected.table)
    body = {"model": "tiny-random-bert", "clean": "a fine film", "corrupted": "a poor film"}
    body |= {"target": 1, "estimators": ["exact"], "components": ["mlp"]}
    response = served.post("/api/v1/patch", json=body)
    assert response.status_code == 200, response.text
    _same_table(pd.DataFrame(response.json()["table"]), expected.table)
    response = served.post("/api/v1/patch", json={**body, "answer": " yes"})
    assert response.status_code == 400
    assert "is a classifier" in response.json()["error"]["message"]
