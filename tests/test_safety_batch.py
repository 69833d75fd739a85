"""
Dataset lines that cannot be read, through every reader of them (``attrlab batch``, ``layers``,
``evaluate``, the page's upload), and the counts a finished batch output reports.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from attrlab.app.cli import main
from attrlab.app.ui.files import uploaded_rows
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.request import ExplainRequest

TEXT_MODEL = "tiny-random-bert"
#: A JSON array nested 100,000 deep: Python's parser gives up (RecursionError) long before.
DEEP = "[" * 100_000 + "]" * 100_000
GOOD = [
    json.dumps({"id": "cat", "text": "the cat sat on the mat"}),
    json.dumps({"id": "day", "text": "a fine day for a walk"}),
]
#: Lines that cannot be a row, and the words their row's error must hold (line 1 is GOOD[0]).
BAD = [
    (DEEP, "line 2: not JSON (nested too deeply to read)"),
    ("{not json", "line 3: not JSON (Expecting property name"),
    ("[1, 2]", 'line 4: give an object with "text" or "image"'),
    ('{"text": 5}', "line 5: text must be a string"),
    ('{"image": ["a.png"]}', "line 6: image must be a string"),
    ('{"id": {"a": 1}, "text": "a"}', "line 7: id must be a string or a number"),
    ('{"text": "a", "target": true}', "line 8: target must be a label or an index"),
]


def _write(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _file_rows(path) -> list[dict]:
    """The output's rows read straight from the file (Arrow for Parquet, json for JSON Lines)."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_line_that_cannot_be_read_is_its_rows_error_and_the_run_goes_on(tmp_path, capsys):
    data = _write(tmp_path / "data.jsonl", [GOOD[0], *(line for line, _ in BAD), GOOD[1]])
    out = tmp_path / "out.jsonl"
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "gradient_x_input", "--input", str(data)]
    assert main([*argv, "--output", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    rows = {row["id"]: row for row in _file_rows(out)}
    assert len(rows) == len(BAD) + 2
    errors = sorted(row["error"] for row in rows.values() if row["error"] is not None)
    assert len(errors) == len(BAD)
    for (_, words), error in zip(BAD, errors, strict=True):  # "line 2" .. "line 8" sort in order
        assert error.startswith(words)
    worker = ExplainWorker(device="cpu")
    try:
        for key, text in (("cat", "the cat sat on the mat"), ("day", "a fine day for a walk")):
            assert rows[key]["error"] is None
            alone = worker.explain(
                ExplainRequest(model=TEXT_MODEL, method="gradient_x_input", text=text)
            )
            np.testing.assert_allclose(rows[key]["scores"], alone.scores, rtol=1e-5)
    finally:
        worker.close()


def test_a_rerun_over_a_finished_output_reports_the_files_own_counts(tmp_path, capsys):
    data = _write(tmp_path / "data.jsonl", [GOOD[0], DEEP, GOOD[1], "oops"])
    for name in ("out.jsonl", "out.parquet"):
        out = tmp_path / name
        argv = ["batch", "--model", TEXT_MODEL, "--methods", "gradient_x_input,attnlrp"]
        argv += ["--input", str(data), "--output", str(out)]
        assert main(argv) == 0
        capsys.readouterr()
        assert main(argv) == 0  # nothing left to do: the counts come from the file read back
        said = capsys.readouterr().err
        rows = _file_rows(out)
        errors = sum(1 for row in rows if row["error"] is not None)
        assert (len(rows), errors) == (8, 4)  # 4 inputs × 2 methods; the 2 bad lines fail
        assert "4 inputs already done, 0 to go" in said
        assert f"holds {len(rows)} rows ({errors} with an error)" in said


def test_the_pages_upload_records_a_line_that_cannot_be_read(tmp_path):
    data = _write(tmp_path / "upload.jsonl", [GOOD[0], DEEP, GOOD[1]])
    rows = uploaded_rows(str(data), max_bytes=10**6, max_rows=None)
    assert [(row.id, row.text) for row in rows] == [
        ("cat", "the cat sat on the mat"),
        ("line-2", None),
        ("day", "a fine day for a walk"),
    ]
    assert rows[1].problem == "line 2: not JSON (nested too deeply to read)"
    assert rows[0].problem is None and rows[2].problem is None


@pytest.mark.parametrize(
    "command",
    [
        ["layers", "--model", "tiny-random-llama"],
        ["evaluate", "--model", TEXT_MODEL, "--methods", "gradient_x_input", "--steps", "2"],
    ],
)
def test_layers_and_evaluate_refuse_a_line_that_cannot_be_read_by_its_number(
    tmp_path, capsys, command
):
    data = _write(tmp_path / "data.jsonl", [GOOD[0], DEEP, GOOD[1]])
    assert main([*command, "--input", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"{data} line 2: not JSON (nested too deeply to read)" in err
    assert "Traceback" not in err


def test_an_output_or_settings_file_nested_too_deeply_is_refused_by_name(tmp_path, capsys):
    data = _write(tmp_path / "data.jsonl", GOOD)
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "attnlrp", "--input", str(data)]
    foreign = _write(tmp_path / "foreign.jsonl", [DEEP, DEEP])
    assert main([*argv, "--output", str(foreign)]) == 2
    assert "is not the output of attrlab batch" in capsys.readouterr().err
    assert foreign.read_text(encoding="utf-8") == DEEP + "\n" + DEEP + "\n"  # untouched
    out = tmp_path / "out.jsonl"
    assert main([*argv, "--output", str(out)]) == 0
    settings = tmp_path / "out.jsonl.settings.json"
    settings.write_text(DEEP, encoding="utf-8")
    written = out.read_text(encoding="utf-8")
    assert main([*argv, "--output", str(out)]) == 2
    assert f"cannot read '{settings}'" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == written


#: A JSON Lines file as editors and ``json.dumps(..., ensure_ascii=False)`` write them: a byte
#: order mark, Windows line ends, and texts holding U+2028, U+2029 and U+0085 raw (legal in a
#: JSON string, and line breaks to ``str.splitlines``).
ODD_BUT_VALID = (
    "\ufeff"
    + json.dumps({"text": "first line"})
    + "\r\n"
    + json.dumps({"text": "a\u2028b\u2029c\u0085d"}, ensure_ascii=False)
    + "\r\n\r\n"
    + json.dumps({"text": "after a blank line"})
    + "\n"
).encode("utf-8")
#: Each line's id: its number as a text editor counts them (line 3 is blank).
ODD_BUT_VALID_ROWS = [
    ("line-1", "first line"),
    ("line-2", "a\u2028b\u2029c\u0085d"),
    ("line-4", "after a blank line"),
]


def test_a_bom_crlf_and_raw_unicode_line_breaks_are_read_as_the_lines_they_are(tmp_path):
    (tmp_path / "data.jsonl").write_bytes(ODD_BUT_VALID)
    out = tmp_path / "out.jsonl"
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "gradient_x_input"]
    assert main([*argv, "--input", str(tmp_path / "data.jsonl"), "--output", str(out)]) == 0
    rows = _file_rows(out)
    assert sorted((row["id"], row["error"]) for row in rows) == [
        (key, None) for key, _ in ODD_BUT_VALID_ROWS
    ]
    page = uploaded_rows(str(tmp_path / "data.jsonl"), max_bytes=10**6, max_rows=None)
    assert [(row.id, row.text, row.problem) for row in page] == [
        (key, text, None) for key, text in ODD_BUT_VALID_ROWS
    ]


#: Lines whose strings hold a lone surrogate (JSON may escape one; no UTF-8 file can hold it).
SURROGATES = [
    ('{"id": "\\ud800", "text": "fine words"}', "line 2: the id is not valid Unicode"),
    ('{"image": "cat\\udc00.png"}', "line 3: the image is not valid Unicode"),
    ('{"text": "fine words", "target": "\\udbff"}', "line 4: the target is not valid Unicode"),
]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_lone_surrogate_in_any_field_is_its_rows_error_naming_the_line(tmp_path, suffix, capsys):
    data = _write(tmp_path / "data.jsonl", [GOOD[0], *(line for line, _ in SURROGATES)])
    out = tmp_path / f"out{suffix}"
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "gradient_x_input", "--input", str(data)]
    assert main([*argv, "--output", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    rows = {row["id"]: row for row in _file_rows(out)}
    assert rows["cat"]["error"] is None
    for number, (_, words) in enumerate(SURROGATES, start=2):
        assert rows[f"line-{number}"]["error"].startswith(words)
    page = uploaded_rows(str(data), max_bytes=10**6, max_rows=None)
    assert page[0].problem is None
    for row, (_, words) in zip(page[1:], SURROGATES, strict=True):  # the page's one reader
        assert row.problem.startswith(words)
