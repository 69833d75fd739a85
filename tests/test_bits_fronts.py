"""
``attrlab bits``, ``POST /api/v1/bits`` and ``attrlab.bits``: the library's bits study, wired.

Each front end's numbers are checked against :func:`attribution.bits.bits_study` run directly
on the same tiny model and texts; bad input is refused in words (exit 2, HTTP 4xx), and a study
over the server's seconds before it starts.
"""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import pandas as pd
import pytest

import attrlab
from attrlab.app.cli import main
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.bits import bits_study
from attrlab.attribution.errors import TooSlowError
from attrlab.attribution.request import BitsRequest
from attrlab.viz import bits_figures

MODEL = "tiny-random-llama"
TEXTS = ("The cat sat on the mat and looked at the rain.", "Mary gave John a book about rivers.")
ASKED = {"kinds": ["mlp"], "bits": [4, 2], "group_sizes": [16], "budgets": [3.0], "draws": 3}


@pytest.fixture(scope="module")
def expected(load_model):
    return bits_study(load_model(MODEL), TEXTS, **ASKED)


def _same(got: pd.DataFrame, expected: pd.DataFrame, column: str) -> None:
    pd.testing.assert_series_equal(
        got[column].astype(float), expected[column].astype(float), rtol=1e-6, atol=1e-9
    )


def test_the_cli_writes_the_study_as_json_csv_table_and_figures(capsys, tmp_path, expected):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    argv = ["bits", "--model", MODEL, "--input", str(texts), "--kinds", "mlp", "--bits", "4,2"]
    argv += ["--group-sizes", "16", "--budgets", "3", "--draws", "3", "--device", "cpu"]
    assert main([*argv, "--format", "json"]) == 0
    study = json.loads(capsys.readouterr().out)
    _same(pd.DataFrame(study["table"]), expected.table, "loss")
    _same(pd.DataFrame(study["curves"]), expected.curves, "value")
    assert main([*argv, "--figures", str(tmp_path / "figures")]) == 0
    text = capsys.readouterr().out
    written = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert written == sorted(f"{name}.html" for name in bits_figures(expected))
    assert "loss_change with each part quantised alone (group16" in text
    assert "layers.1.mlp" in text and "allocations" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kinds", "heads"], "unknown part kind"),
        (["--budgets", "9"], "a bit budget lies between"),
        (["--bits", "four"], "--bits takes comma-separated numbers"),
    ],
)
def test_the_cli_refuses_bad_studies_in_words(capsys, extra, message):
    assert main(["bits", "--model", MODEL, "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_rest_bits_answers_the_study_and_refuses_bad_bodies(served, expected):
    body = {"model": MODEL, "texts": list(TEXTS), **ASKED}
    response = served.post("/api/v1/bits", json=body)
    assert response.status_code == 200, response.text
    _same(pd.DataFrame(response.json()["table"]), expected.table, "kl")
    _same(pd.DataFrame(response.json()["curves"]), expected.curves, "value")
    for bad, named in (
        ({**body, "kinds": ["heads"]}, "unknown part kind"),
        ({**body, "budgets": [1.5]}, "a bit budget lies between"),
        ({**body, "draws": 1}, "draws"),
        ({**body, "bits": [1]}, "bit widths are 2 to 16"),
    ):
        response = served.post("/api/v1/bits", json=bad)
        assert 400 <= response.status_code < 500, response.text
        assert named in json.dumps(response.json()["error"]), response.text
    assert "/api/v1/bits" in served.get("/openapi.json").json()["paths"]


def test_the_python_call_and_the_servers_seconds(load_model, expected):
    study = attrlab.bits(load_model(MODEL), list(TEXTS), **ASKED)
    _same(study.table, expected.table, "log_prob_change")
    assert study.verdicts.keys() == expected.verdicts.keys()
    worker = ExplainWorker(device="cpu", max_models=1, settings=ServerSettings(max_seconds=1e-6))
    try:
        request = BitsRequest(model=MODEL, texts=TEXTS, draws=3)
        with pytest.raises(TooSlowError, match="this bits study would take"):
            worker.explain(request)
    finally:
        worker.close()


class _Tables(HTMLParser):
    """Each ``<table>``'s rows of cell texts, by the table's class; all text besides."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self.tags: list[str] = []
        self.text: list[str] = []
        self._rows: list[list[str]] | None = None

    def handle_starttag(self, tag: str, attrs) -> None:
        self.tags.append(tag)
        if tag == "table":
            self._rows = self.tables.setdefault(dict(attrs).get("class") or "", [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._rows = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._rows and self._rows[-1]:
            self._rows[-1][-1] += data


def test_a_study_shows_its_tables_and_verdicts_in_a_notebook(expected):
    markup = expected._repr_html_()
    page = _Tables()
    page.feed(markup)
    assert "script" not in page.tags and "http" not in markup
    (header, *rows) = page.tables["attrlab-bits-sensitivity"]
    assert header == ["part", "4 bits", "2 bits"]
    shown = {row[0]: [float(v) for v in row[1:]] for row in rows}
    measured: dict[str, dict[int, float]] = {}
    for row in expected.table.itertuples():  # the table's own rows, laid out here
        measured.setdefault(row.part, {})[row.bits] = row.loss_change
    assert list(shown) == list(measured)
    for part, values in shown.items():
        assert values == pytest.approx([measured[part][4], measured[part][2]], rel=1e-3)
    (header, *rows) = page.tables["attrlab-agreement"]
    rho = {(r.proxy, r.bits): r.spearman for r in expected.agreement.itertuples()}
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        want = rho[(cells["proxy"], int(cells["bits"]))]
        assert (
            (cells["spearman"] == "")
            if math.isnan(want)
            else float(cells["spearman"]) == (pytest.approx(want, rel=1e-3, abs=1e-9))
        )
    curves = page.tables["attrlab-bits-curves"]
    assert [row[0] for row in curves[1:]] == list(expected.curves["allocation"])
    text = "".join(page.text)
    for verdict in expected.verdicts.values():
        assert verdict.summary() in text


def test_figure_draws_the_studys_tables(expected):
    names = expected.figures()
    assert names == ["bits_sensitivity_group16", "bits_agreement", "bits_allocation"]
    (heatmap,) = expected.figure().data  # the first: the sensitivity heatmap
    parts = list(dict.fromkeys(expected.table["part"]))
    assert list(heatmap.y) == parts and list(heatmap.x) == ["4 bits", "2 bits"]
    for i, part in enumerate(parts):
        for j, width in enumerate((4, 2)):
            table = expected.table
            rows = table[(table["part"] == part) & (table["bits"] == width)]
            assert heatmap.z[i][j] == rows["loss_change"].item()
    (rho,) = expected.figure("bits_agreement").data
    for i, proxy in enumerate(rho.y):
        for j, label in enumerate(rho.x):
            width = int(label.split(" ")[0])
            rows = expected.agreement
            want = rows[(rows["proxy"] == proxy) & (rows["bits"] == width)]["spearman"].item()
            assert rho.z[i][j] == pytest.approx(want, nan_ok=True)
    traces = {t.name: t for t in expected.figure("bits_allocation").data}
    curves = expected.curves.set_index("allocation")
    random = curves.loc["random"]
    assert list(traces["random highest draw"].y) == [random["high"]]
    assert list(traces["random lowest draw"].y) == [random["low"]]
    for name in ("uniform", *(k.split("@")[0] for k in expected.verdicts)):
        assert list(traces[name].y) == [curves.loc[name, "value"]]
        assert list(traces[name].x) == [curves.loc[name, "average_bits"]]
    with pytest.raises(ValueError, match="no figure 'nope'"):
        expected.figure("nope")
