"""The attrlab command end to end: both methods, both modalities, errors without tracebacks."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest
from PIL import Image
from skimage import data

from attrlab.app.cli import main
from attrlab.attribution.explanation import Explanation


@pytest.fixture(scope="module")
def cat_png(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "cat.png"
    Image.fromarray(data.chelsea()).save(path)
    return path


@pytest.mark.parametrize("method", ["gradient_x_input", "integrated_gradients"])
def test_explain_text_json(capsys, method):
    code = main(
        [
            "explain",
            "--model",
            "minilm-zeroshot",
            "--method",
            method,
            "--device",
            "cpu",
            "--text",
            "A wonderful, heartwarming story.",
            "--format",
            "json",
        ]
    )
    assert code == 0
    e = Explanation.from_json(capsys.readouterr().out)
    assert e.method == method and e.target.label == "positive"
    assert e.tokens[0] == "[CLS]" and len(e.scores) == len(e.tokens)
    assert ("convergence_delta" in e.metrics) == (method == "integrated_gradients")
    # MiniLM's integral converges well within the default 50 steps (benchmarks/ig_convergence.py)
    judged = [(v.check, v.status) for v in e.verdicts]
    assert judged == (
        [("integral_convergence", "pass")] if method == "integrated_gradients" else []
    )


@pytest.mark.parametrize("method", ["gradient_x_input", "integrated_gradients"])
def test_explain_image_table(capsys, cat_png, method):
    argv = ["explain", "--method", method, "--image", str(cat_png), "--device", "cpu"]
    if method == "integrated_gradients":
        argv += ["--param", "n_steps=8"]
    code = main([*argv, "--format", "table"])
    out = capsys.readouterr().out
    assert code == 0
    assert "efficientnet-lite0 (image)" in out and "cat" in out and "map       224×224" in out
    assert ("verdict   integral convergence: " in out) == (method == "integrated_gradients")


def test_labels_and_target_options(capsys):
    code = main(
        [
            "explain",
            "--method",
            "gradient_x_input",
            "--device",
            "cpu",
            "--format",
            "json",
            "--text",
            "The striker scored twice in the final.",
            "--labels",
            "sports, cooking",
            "--target",
            "cooking",
            "--seed",
            "3",
        ]
    )
    assert code == 0
    e = json.loads(capsys.readouterr().out)
    assert e["target"]["label"] == "cooking" and e["predictions"][0]["label"] == "sports"
    assert e["seed"] == 3


def test_console_script_lists_and_fails_cleanly(tmp_path):
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("just text")
    run = [sys.executable, "-m", "attrlab.app.cli"]
    methods = subprocess.run([*run, "methods", "--format", "json"], capture_output=True, text=True)
    names = {m["name"] for m in json.loads(methods.stdout)}
    assert {"gradient_x_input", "integrated_gradients"} <= names
    models = subprocess.run([*run, "models"], capture_output=True, text=True)
    assert "minilm-zeroshot" in models.stdout and "efficientnet-lite0" in models.stdout
    bad = subprocess.run(
        [
            *run,
            "explain",
            "--method",
            "gradient_x_input",
            "--image",
            str(not_an_image),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "not a readable image" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_next_token_defaults_to_the_embedded_llm(capsys):
    code = main(
        [
            "explain",
            "--method",
            "gradient_x_input",
            "--next-token",
            "--device",
            "cpu",
            "--text",
            "The capital of France is",
            "--format",
            "json",
        ]
    )
    assert code == 0
    e = Explanation.from_json(capsys.readouterr().out)
    assert e.model.id == "smollm2-135m" and e.target.label == " Paris"


def test_layers_one_text_as_json_csv_and_figures(capsys, tmp_path):
    base = ["layers", "--model", "tiny-random-llama", "--device", "cpu", "--text", "the cat sat"]
    assert main([*base, "--measures", "gradient,entropy", "--format", "json"]) == 0
    e = Explanation.from_json(capsys.readouterr().out)
    assert set(e.layers.measure) == {"head_gradient", "entropy"}
    csv = tmp_path / "heads.csv"
    figures = tmp_path / "figures"
    assert (
        main(
            [
                *base,
                "--measures",
                "lrp",
                "--format",
                "csv",
                "--output",
                str(csv),
                "--figures",
                str(figures),
            ]
        )
        == 0
    )
    table = pd.read_csv(csv)
    assert list(table.columns) == ["layer", "head", "kv_head", "component", "measure", "value"]
    assert (table.measure == "head_lrp").sum() == 2 * 4
    assert {p.name for p in figures.iterdir()} >= {"layers.html", "heads_head_lrp.html"}
    assert main([*base, "--measures", "skip"]) == 0  # the terminal table
    assert "skip_kl" in capsys.readouterr().out


def test_layers_over_a_jsonl_dataset_to_parquet(tmp_path, capsys):
    data_file = tmp_path / "data.jsonl"
    data_file.write_text('{"text": "the cat sat"}\n\n{"text": "a dog ran", "target": 3}\n')
    out = tmp_path / "summary.parquet"
    args = [
        "layers",
        "--model",
        "tiny-random-llama",
        "--input",
        str(data_file),
        "--measures",
        "sink",
        "--format",
        "parquet",
        "--output",
        str(out),
    ]
    assert main(args) == 0
    table = pd.read_parquet(out)
    assert (table["count"] == 2).all() and set(table.measure) == {"sink_share"}
    assert len(table) == 2 * 4


@pytest.mark.parametrize(
    ("lines", "extra", "words"),
    [
        ("oops\n", [], "line 1: not JSON"),
        ('{"id": "a", "target": 1}\n', [], "line 1: give an object"),  # neither input
        ('{"image": "missing.png"}\n', [], "does not exist"),
        ('{"text": "a"}\n', ["--format", "parquet"], "give --output"),
        ('{"text": "a"}\n', ["--measures", "nope"], "unknown measure"),
        ('{"text": "a", "target": [1]}\n', [], "target must be a label or an index"),
        ('{"text": "a"}\n', ["--format", "csv", "--output", "/nonexistent/x.csv"], "does not"),
        ("\udcff\n", [], "cannot be read as UTF-8"),
    ],
)
def test_layers_dataset_errors_exit_2(tmp_path, capsys, lines, extra, words):
    data_file = tmp_path / "data.jsonl"
    data_file.write_bytes(lines.encode("utf-8", "surrogateescape"))
    code = main(["layers", "--model", "tiny-random-llama", "--input", str(data_file), *extra])
    assert code == 2
    assert words in capsys.readouterr().err


def test_check_agreement_and_randomisation(capsys, tmp_path):
    args = [
        "check",
        "--model",
        "tiny-random-llama",
        "--text",
        "the cat sat on the mat",
        "--methods",
        "gradient_x_input,attnlrp",
        "--randomise",
        "--format",
        "json",
        "--figures",
        str(tmp_path),
    ]
    assert main(args) == 0
    rows = pd.read_json(io.StringIO(capsys.readouterr().out))
    agreement = rows[rows.check == "agreement"]
    assert len(agreement) == 1 and -1 <= agreement.spearman.iloc[0] <= 1
    randomised = rows[rows.check == "randomisation"]
    assert len(randomised) == 2 * 5  # none + output + 2 blocks + embeddings, per method
    assert (randomised[randomised.step == 0].spearman == 1.0).all()
    verdicts = rows[rows.check == "randomisation_verdict"]
    assert sorted(verdicts.method) == ["attnlrp", "gradient_x_input"]
    assert set(verdicts.status) <= {"pass", "warn", "fail", "inconclusive"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agreement.html", "randomisation.html"]
    assert main(["check", "--model", "tiny-random-llama", "--text", "a", "--methods", "rise"]) == 2
    assert "nothing to check" in capsys.readouterr().err
