"""
Tables for people and for programs: labelled, rounded leaderboards, and batch rows whose
Parquet holds lists (not JSON strings) under the documented key ``id``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _figures import drawn_picture
from PIL import Image

from attrlab.app.cli import main
from attrlab.attribution import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.metrics import SCORES, summarise
from attrlab.viz.evaluate import readable_table

TEXTS = {"cat": "the cat sat on the mat", "day": "a fine day for a walk"}


def _jsonl_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _timeless(row: dict) -> dict:
    """A row without its run's timings (two runs of the same work take different seconds)."""
    if row["explanation_json"] is None:
        return row
    whole = json.loads(row["explanation_json"])
    del whole["timings"]
    return {**row, "explanation_json": whole}


def _by_key(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (str(r["id"]), r["method"]))


def test_batch_parquet_holds_lists_under_id_equal_to_the_json_lines(tmp_path, load_model):
    data = tmp_path / "data.jsonl"
    lines = [json.dumps({"id": key, "text": text}) for key, text in TEXTS.items()]
    data.write_text("\n".join([*lines, "not json"]) + "\n", encoding="utf-8")
    methods = ["gradient_x_input", "occlusion"]
    argv = ["batch", "--model", "tiny-random-bert", "--methods", ",".join(methods)]
    argv += ["--input", str(data), "--param", "occlusion.window=2"]
    for name in ("out.jsonl", "out.parquet"):
        assert main([*argv, "--output", str(tmp_path / name)]) == 0
    schema = pq.read_schema(tmp_path / "out.parquet")
    prediction = pa.struct(
        [("index", pa.int64()), ("label", pa.string()), ("probability", pa.float64())]
    )
    assert schema.field("id").type == pa.string()
    assert schema.field("scores").type == pa.list_(pa.float64())
    assert schema.field("scores_shape").type == pa.list_(pa.int64())
    assert schema.field("tokens").type == pa.list_(pa.string())
    assert schema.field("predictions").type == pa.list_(prediction)
    assert schema.field("explanation_json").type == pa.string()
    parquet = _by_key(pq.read_table(tmp_path / "out.parquet").to_pylist())
    jsonl = _by_key(_jsonl_rows(tmp_path / "out.jsonl"))
    assert [_timeless(row) for row in parquet] == [_timeless(row) for row in jsonl]  # one format
    adapter = load_model("tiny-random-bert")
    for row in parquet:
        if row["id"] == "line-3":  # the line that is not JSON: its error, nothing else
            assert "not JSON" in row["error"] and row["scores"] is None
            continue
        params = {"window": 2} if row["method"] == "occlusion" else None
        alone = explain(adapter, row["method"], adapter.preprocess(TEXTS[row["id"]]), params=params)
        assert row["scores_shape"] == [len(alone.tokens)] and row["tokens"] == alone.tokens
        np.testing.assert_allclose(row["scores"], alone.scores, rtol=1e-5, atol=1e-9)
        assert [p["label"] for p in row["predictions"]] == [p.label for p in alone.predictions]
        np.testing.assert_allclose(
            [p["probability"] for p in row["predictions"]],
            [p.probability for p in alone.predictions],
            rtol=1e-6,
        )
        assert row["probability"] == pytest.approx(alone.target.probability, rel=1e-6)
        whole = Explanation.from_json(row["explanation_json"])
        np.testing.assert_array_equal(whole.scores.ravel(), row["scores"])


def test_an_image_rows_map_is_flattened_with_its_shape(tmp_path, load_model):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 255, (20, 28, 3), dtype=np.uint8)).save(folder / name)
    out = tmp_path / "out.parquet"
    argv = ["batch", "--model", "tiny-random-vit", "--methods", "gradient_x_input"]
    assert main([*argv, "--input", str(folder), "--output", str(out)]) == 0
    adapter = load_model("tiny-random-vit")
    for row in pq.read_table(out).to_pylist():
        image = adapter.preprocess((folder / row["id"]).read_bytes())
        alone = explain(adapter, "gradient_x_input", image)
        assert row["tokens"] is None and row["scores_shape"] == list(alone.scores.shape)
        restored = np.reshape(row["scores"], row["scores_shape"])  # row-major
        np.testing.assert_allclose(restored, alone.scores, rtol=1e-5, atol=1e-9)


def test_an_output_of_the_former_row_format_is_not_resumed(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "text": "a walk"}) + "\n")
    out = tmp_path / "out.jsonl"
    former = {"id": "a", "method": "gradient_x_input", "target": 0, "label": "x"}
    former |= {"probability": 0.5, "scores": "[0.1, 0.2]", "error": None, "explanation": "{}"}
    out.write_text(json.dumps(former) + "\n")
    argv = ["batch", "--model", "tiny-random-bert", "--methods", "attnlrp", "--input", str(data)]
    assert main([*argv, "--output", str(out)]) == 2
    assert "written by another version of attrlab batch" in capsys.readouterr().err
    assert json.loads(out.read_text()) == former  # untouched


#: What people read for each column, written out (text and image leaderboards).
LABELS = {
    "text": [
        "method",
        "items",
        "comprehensiveness (higher is better)",
        "comprehensiveness: against random orders",
        "sufficiency (lower is better)",
        "sufficiency: against random orders",
        "forward passes per item",
        "seconds per item",
    ],
    "image": [
        "method",
        "items",
        "deletion AUC (lower is better)",
        "deletion AUC: against random orders",
        "insertion AUC (higher is better)",
        "insertion AUC: against random orders",
        "forward passes per item",
        "seconds per item",
    ],
}


def _per_item(modality: str) -> pd.DataFrame:
    """A per-item table of two methods over five items, its scores drawn at random."""
    rng = np.random.default_rng(1)
    rows = []
    for method in ("gradient_x_input", "rise"):
        for item in range(5):
            row = {"item": str(item), "method": method}
            for score, random, _ in SCORES[modality]:
                row |= {score: rng.random(), random: rng.random()}
            rows.append(row | {"forward_passes": 2.0, "seconds": rng.random() / 7})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("modality", ["text", "image"])
def test_leaderboard_columns_are_labelled_and_rounded(modality):
    per_item = _per_item(modality)
    summary = summarise(per_item, modality)
    shown = readable_table(summary, modality)
    assert list(shown.columns) == LABELS[modality]
    means = per_item.groupby("method", sort=False).mean(numeric_only=True)
    for (score, _, _), label in zip(SCORES[modality], LABELS[modality][2:6:2], strict=True):
        # the mean to three decimals, then its interval: "0.164 [-0.010, 0.493]"
        cells = shown[label].str.fullmatch(r"(-?\d\.\d{3}) \[-?\d\.\d{3}, -?\d\.\d{3}\]")
        assert cells.all(), shown[label]
        written = shown[label].str.split(" ").str[0].astype(float)
        np.testing.assert_allclose(written, means[score], atol=5e-4)
    seconds = shown["seconds per item"]
    np.testing.assert_allclose(seconds, means["seconds"], atol=5e-3)
    assert (seconds == seconds.round(2)).all()
    for (score, random, higher), label in zip(
        SCORES[modality], LABELS[modality][3:7:2], strict=True
    ):  # "pass: 80 % of items, p 0.031": the verdict, the share beating random, the sign test
        for method, cell in zip(shown["method"], shown[label], strict=True):
            rows = per_item[per_item["method"] == method]
            # rows without a standard error: a margin under 0.01 over the mean is a tie
            margin = (rows[score] - rows[random]) * (1 if higher else -1)
            wins, losses = int((margin >= 0.01).sum()), int((margin <= -0.01).sum())
            n = wins + losses
            # two-sided sign test over the untied items, written out: 2·P(X ≤ min) for Bin(n, ½)
            p = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n)
            # under 6 untied items no sign test can pass: said so, whatever p
            verdict = "inconclusive" if p >= 0.05 else "pass" if wins > losses else "fail"
            verdict = "too few items to decide (need ≥ 6)" if n < 6 else verdict
            assert cell == f"{verdict}: {wins / 5:.0%} of items, p {p:.2g}", cell


def test_attrlab_evaluate_prints_the_labels_with_a_column_per_method(tmp_path, capsys):
    data = tmp_path / "set.jsonl"
    data.write_text('{"text": "a fine film"}\n{"text": "a dull walk"}\n')
    argv = ["evaluate", "--model", "tiny-random-bert", "--input", str(data)]
    argv += ["--methods", "gradient_x_input,occlusion", "--random-orders", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["method", "gradient_x_input", "occlusion"]
    for label in LABELS["text"][1:]:
        assert any(line.startswith(label) for line in lines), label
    assert "comprehensiveness_wins" not in out
    assert main([*argv, "--format", "csv"]) == 0  # files keep the short names
    assert "comprehensiveness_wins" in capsys.readouterr().out.splitlines()[0]


def test_a_batch_tab_rows_map_is_drawn_over_its_own_image():
    import io

    from attrlab.app.batch import BatchConfig, DatasetRow, explain_rows
    from attrlab.app.ui.batch import row_figure
    from attrlab.app.worker import ExplainWorker

    pictures = {}
    for key, shade in (("dark", 40), ("light", 220)):
        buffer = io.BytesIO()
        Image.fromarray(np.full((20, 28, 3), shade, dtype=np.uint8)).save(buffer, "PNG")
        pictures[key] = buffer.getvalue()
    worker = ExplainWorker(device="cpu", max_models=1)
    try:
        config = BatchConfig(model="tiny-random-vit", methods=("gradient_x_input",))
        rows = explain_rows(
            worker, config, [DatasetRow(id=k, image=v) for k, v in pictures.items()]
        )
    finally:
        worker.close()
    for row in rows:
        figure = row_figure(row, pictures[row["id"]])
        (picture,) = [t for t in figure.data if t.type == "image"]
        (heatmap,) = [t for t in figure.data if t.type == "heatmap"]
        shade = 40 if row["id"] == "dark" else 220
        assert (drawn_picture(picture) == shade).all()  # the row's own image, under its map
        assert np.asarray(heatmap.z).shape == (20, 28)  # the map fitted to it
