"""
The CLI on long work: progress on a terminal (and none elsewhere), several methods per call,
figures, the methods list for people, and a reader that goes away.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from attrlab.app.cli import main
from attrlab.attribution import explain, load
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.methods.catalog import catalog_entries
from attrlab.attribution.metrics.faithfulness import RANDOM_ORDERS
from attrlab.attribution.request.run import RunSettings

CLI = [sys.executable, "-m", "attrlab.app.cli"]
TEXT = "a fine day for a walk"
#: RISE on the tiny model with its trust card: a run that reports its passes.
RISE = ["explain", "--model", "tiny-random-bert", "--method", "rise", "--device", "cpu"]
RISE += ["--text", TEXT, "--param", "n_masks=64", "--evaluate"]


def _drain(fd: int, into: list[bytes]) -> None:
    """Read a pseudo-terminal's output until its other end closes (so writers never block)."""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the last writer closed
            return
        if not chunk:
            return
        into.append(chunk)


@pytest.mark.slow  # a fresh interpreter loads torch and the model
def test_progress_shows_on_a_terminal_with_the_runs_passes_and_an_eta():
    master, slave = os.openpty()
    # a terminal of 30 rows × 120 columns (a fresh pseudo-terminal has none)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    seen: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(master, seen))
    reader.start()
    try:
        # tqdm redraws at most every TQDM_MININTERVAL seconds: as on a fast machine, a bar
        # shows only its first and last states, and the last must still say what was done
        done = subprocess.run(
            [*CLI, *RISE, "--format", "json"],
            stdout=subprocess.PIPE,
            stderr=slave,
            timeout=300,
            env={**os.environ, "TQDM_MININTERVAL": "100"},
        )
    finally:
        os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    assert done.returncode == 0
    explained = Explanation.from_json(done.stdout.decode())
    terminal = b"".join(seen).decode(errors="replace")
    assert "\r" in terminal and "Traceback" not in terminal
    counts = [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+) \[\d+:\d+<\d+:\d+", terminal)]
    assert counts, terminal[-2000:]  # done/total with the time spent and left
    passes = [c for c in counts if c[1] > 1]
    # one count over the map and its trust card: every pass but the prediction's, the card's
    # random orders at their most (those not drawn, settled before, end the bar at its total)
    unused = RANDOM_ORDERS - int(explained.metrics["random_orders"])
    free = int((~load("tiny-random-bert", device="cpu").preprocess(TEXT).fixed_tokens).sum())
    planned = explained.timings.forward_passes - 1 + 2 * (free + 1) * unused
    assert {total for _, total in passes} == {planned}
    assert max(passes) == (planned, planned)
    assert (1, 1) in counts  # the methods' bar ended at its one method


@pytest.fixture
def dataset(tmp_path):
    """Two sentences as a JSONL dataset."""
    path = tmp_path / "data.jsonl"
    path.write_text('{"id": "a", "text": "the cat sat"}\n{"id": "b", "text": "a dog ran"}\n')
    return path


#: Each long command on two inputs (or one, with its units), and the units' final count.
TWO_METHODS = ["--model", "tiny-random-bert", "--methods", "gradient_x_input,occlusion"]
LONG_COMMANDS = {
    "layers": (["layers", "--model", "tiny-random-llama", "--measures", "sink", "--input"], "2/2"),
    "evaluate": (
        ["evaluate", "--model", "tiny-random-bert", "--methods", "gradient_x_input", "--input"],
        "2/2",
    ),
    "batch": (["batch", *TWO_METHODS, "--batch-size", "1", "--input"], "2/2"),
    "check": (["check", *TWO_METHODS, "--text", TEXT], "2/2"),
}


def _argv(command: str, dataset, tmp_path) -> list[str]:
    argv, _ = LONG_COMMANDS[command]
    if argv[-1] == "--input":
        argv = [*argv, str(dataset)]
    if command == "batch":
        argv = [*argv, "--output", str(tmp_path / "out.jsonl")]
    return [*argv, "--device", "cpu"]


@contextlib.contextmanager
def _stderr_on_a_terminal() -> Iterator[list[bytes]]:
    """
    ``sys.stderr`` on a pseudo-terminal of 30 × 120 while the block runs.

    Gives the list that holds what was drawn once the block ends. Entered in the test itself:
    pytest puts its own capture back as a test's call starts.
    """
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    seen: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(master, seen))
    reader.start()
    before = sys.stderr
    try:
        with open(slave, "w", encoding="utf-8") as stream:
            sys.stderr = stream
            yield seen
    finally:
        sys.stderr = before
        reader.join(timeout=30)
        os.close(master)


@pytest.mark.parametrize("command", list(LONG_COMMANDS))
def test_each_long_command_draws_a_bar_with_an_eta_on_a_terminal(command, dataset, tmp_path):
    with _stderr_on_a_terminal() as seen:
        assert main(_argv(command, dataset, tmp_path)) == 0
    drawn = b"".join(seen).decode(errors="replace")
    _, units = LONG_COMMANDS[command]
    assert re.search(units + r" \[\d+:\d+<\d+:\d+", drawn), drawn[-1500:]


@pytest.mark.parametrize("command", ["explain", *LONG_COMMANDS])
def test_no_progress_is_drawn_where_stderr_is_not_a_terminal(command, dataset, tmp_path, capsys):
    argv = (
        [*RISE, "--format", "json"] if command == "explain" else _argv(command, dataset, tmp_path)
    )
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and not re.search(r"\d+/\d+ \[", err), err  # a log or a pipe


def test_the_trust_card_counts_after_the_map_in_one_progress(load_model):
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess(TEXT)
    for method, params in (("rise", {"n_masks": 64}), ("gradient_x_input", {})):
        reports: list[tuple[int, int]] = []
        settings = RunSettings(
            progress=lambda d, t, seen=reports: seen.append((d, t)), evaluate=True
        )
        explained = explain(adapter, method, inputs, params=params, settings=settings)
        totals = {total for _, total in reports}
        assert len(totals) == 1, (method, reports)  # never starts again at the scoring
        (total,) = totals
        done = [d for d, _ in reports]
        assert done == sorted(done) and done[-1] == total
        # the card's passes: 2 curves × (n + 1) points × (the map's 2 orders + at most
        # RANDOM_ORDERS random ones: drawn while unsettled, the count ends at its total)
        tokens = len(inputs.tokens) - 2
        card = 2 * (tokens + 1) * (2 + RANDOM_ORDERS)
        method_passes = params.get("n_masks", 0)
        assert total == method_passes + card
        drawn = int(explained.metrics["random_orders"])
        unused = 2 * (tokens + 1) * (RANDOM_ORDERS - drawn)
        assert explained.timings.forward_passes >= total - unused + 1  # and the prediction's


def test_several_methods_run_on_one_model_load_and_write_their_figures(
    tmp_path, capsys, monkeypatch
):
    import attrlab.app.worker as worker_module

    loads = []

    def counted(*args, **kwargs):
        loads.append(args[0])
        return load(*args, **kwargs)

    monkeypatch.setattr(worker_module, "load", counted)
    figures = tmp_path / "figures"
    argv = ["explain", "--model", "tiny-random-bert", "--device", "cpu", "--text", TEXT]
    argv += ["--methods", "gradient_x_input,integrated_gradients"]
    argv += ["--param", "integrated_gradients.n_steps=4", "--figures", str(figures)]
    assert main([*argv, "--format", "json"]) == 0
    assert loads == ["tiny-random-bert"]
    shown = json.loads(capsys.readouterr().out)
    assert [e["method"] for e in shown] == ["gradient_x_input", "integrated_gradients"]
    adapter = load("tiny-random-bert", device="cpu")
    inputs = adapter.preprocess(TEXT)
    for e in shown:
        params = {"n_steps": 4} if e["method"] == "integrated_gradients" else None
        alone = explain(adapter, e["method"], inputs, params=params)
        np.testing.assert_allclose(e["scores"], alone.scores, rtol=1e-6, atol=1e-9)
    assert shown[1]["params"]["n_steps"] == 4
    # the figures the library's rule gives a text: each method's token scores
    names = sorted(p.name for p in figures.iterdir())
    assert names == ["gradient_x_input_scores.html", "integrated_gradients_scores.html"]
    assert "plotly" in (figures / names[0]).read_text()[:20000].lower()
    assert main(argv[:-2]) == 0  # the terminal table: one block per method
    out = capsys.readouterr().out
    assert out.count("method    ") == 2 and "integrated_gradients" in out


def test_an_image_gets_its_map_figure_drawn_on_the_image(tmp_path, capsys):
    from PIL import Image

    picture = tmp_path / "square.png"
    Image.fromarray(np.full((32, 48, 3), 120, dtype=np.uint8)).save(picture)
    figures = tmp_path / "figures"
    argv = ["explain", "--model", "tiny-random-vit", "--method", "gradient_x_input"]
    argv += ["--device", "cpu", "--image", str(picture), "--figures", str(figures)]
    assert main(argv) == 0
    assert sorted(p.name for p in figures.iterdir()) == ["gradient_x_input_map.html"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--methods", "gradient_x_input,rise", "--param", "n_masks=8"], "METHOD.n_masks=8"),
        (["--method", "rise", "--param", "occlusion.window=2"], "'occlusion', which does not"),
        (["--methods", " , "], "names at least one method"),
        (["--method", "rise", "--estimate", "--figures", "x"], "draws no figures"),
        (["--methods", "gradient_x_input,nope"], "nope"),
    ],
)
def test_bad_method_choices_exit_2_before_any_work(capsys, extra, words):
    argv = ["explain", "--model", "tiny-random-bert", "--device", "cpu", "--text", TEXT]
    assert main([*argv, *extra]) == 2
    assert words in capsys.readouterr().err


def test_several_estimates_print_a_list_in_json(capsys):
    argv = ["explain", "--model", "tiny-random-bert", "--device", "cpu", "--text", TEXT]
    argv += ["--methods", "gradient_x_input,rise", "--param", "rise.n_masks=100", "--estimate"]
    assert main([*argv, "--format", "json"]) == 0
    estimates = json.loads(capsys.readouterr().out)
    assert [e["method"] for e in estimates] == ["gradient_x_input", "rise"]
    # six tokens: RISE takes their 64 keep patterns (under its 100 masks) and the prediction
    assert estimates[1]["forward_passes"] == 2**6 + 1 > estimates[0]["forward_passes"]


def test_methods_are_listed_for_people_with_each_parameters_default_and_range(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "{" not in out  # no Python dicts
    header, *rows = out.split("\n\n")[0].splitlines()
    assert header.split() == ["METHOD", "TITLE", "KIND", "APPLIES", "TO", "NEEDS", "PARAMETERS"]
    entries = catalog_entries()
    assert [row.split()[0] for row in rows] == [e["name"] for e in entries]
    rise = next(e for e in entries if e["name"] == "rise")
    block = out.split("\nrise: ")[1].split("\n\n")[0]
    for name, schema in rise["params"].items():
        (line,) = [ln for ln in block.splitlines() if ln.split()[:1] == [name]]
        default = schema["default"]
        assert f"default {'automatic' if default is None else default}" in line
        if "enum" in schema:
            assert line.endswith("one of " + ", ".join(schema["enum"]))
        elif "maximum" in schema:
            assert f"{schema['maximum']:g}]" in line
    assert main(["methods", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == [{k: v for k, v in e.items() if k != "module"} for e in entries]


@pytest.mark.parametrize("form", ["table", "json"])
def test_a_reader_that_went_away_ends_the_listing_without_a_traceback(form):
    read, write = os.pipe()
    os.close(read)  # gone before the first line: every write meets a broken pipe
    try:
        done = subprocess.run(
            [*CLI, "methods", "--format", form], stdout=write, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(write)
    assert done.stderr == b"" and done.returncode == 1


def test_methods_into_head_prints_its_first_line_only():
    command = f"{sys.executable} -m attrlab.app.cli methods | head -1"
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == [
        "METHOD",
        "TITLE",
        "KIND",
        "APPLIES",
        "TO",
        "NEEDS",
        "PARAMETERS",
    ]
    assert done.stderr == ""
