"""
The page's export bundle, before and after issue 25 (item 5): seconds and bytes (zip).

Run: ``.venv/bin/python benchmarks/export.py [--before REF] [--repeats 3]``

Two results as the page keeps them are exported, as the Export button does: MiniLM zero-shot
on an 8-token sentence with integrated gradients and AttnLRP (trust cards on, their agreement:
the issue's case) and EfficientNet-Lite0 on the bundled cat with gradient × input and Grad-CAM.
Each code version (``--before``: a git revision, by default the tree before issue 25; after:
this working tree) runs in its own process on the same inputs; the time is the best of
``--repeats`` exports, PNGs included. The floor is kaleido's own cost of one small figure's
PNG (one browser started). Last, each bundle's larger files, deflated and as stored.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from _tables import print_table

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "assets", "attribution", "viz")
#: The tree before issue 25's export work.
BEFORE = "4267c77"
TEXT = "The film was wonderful and moving"  # 8 tokens for MiniLM, [CLS] and [SEP] included
TITLES = (("text", "MiniLM, 8 tokens, IG + AttnLRP, trust"), ("image", "cat, ×I + Grad-CAM"))
#: The smallest file listed in a bundle's breakdown (deflated bytes).
LISTED = 10_000


def measure(repeats: int) -> dict[str, Any]:
    """Seconds (best of ``repeats``), zip bytes and each file's of each case's bundle; the floor."""
    import plotly.graph_objects as go
    from PIL import Image
    from skimage import data

    from attrlab.app.ui.results import Result, export_bundle
    from attrlab.attribution import RunSettings, explain, load
    from attrlab.attribution.agreement import map_agreement
    from attrlab.viz.image import display_copy

    out: dict[str, Any] = {}
    cases = {
        "text": ("minilm-zeroshot", TEXT, ["integrated_gradients", "attnlrp"], True),
        "image": (
            "efficientnet-lite0",
            Image.fromarray(data.chelsea()),
            ["gradient_x_input", "gradcam"],
            False,
        ),
    }
    for case, (model, raw, methods, trust) in cases.items():
        adapter = load(model, device="cpu")
        inputs = adapter.preprocess(raw)
        settings = RunSettings(evaluate=trust)
        explanations = {m: explain(adapter, m, inputs, settings=settings) for m in methods}
        result = Result(
            explanations,
            agreement=map_agreement({m: e.scores for m, e in explanations.items()}),
            fields={"tab": case, "model": model, "methods": methods},
        )
        if case == "image":
            result.image = display_copy(raw)
            result.image_size = (raw.height, raw.width)
        else:
            result.fields["text"] = raw
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            archive = export_bundle(result)
            seconds.append(time.perf_counter() - start)
        out[f"{case} seconds"] = min(seconds)
        out[f"{case} bytes"] = archive.stat().st_size
        # The floor of a bundle's size: one copy of Plotly's script (the dependency's own) and
        # the maps kept losslessly (.npz), as the zip holds them (compressed).
        with zipfile.ZipFile(archive) as bundle:
            entries = bundle.infolist()
        out[f"{case} floor bytes"] = sum(
            entry.compress_size for entry in entries if entry.filename.endswith((".js", ".npz"))
        )
        out[f"{case} files"] = {e.filename: [e.compress_size, e.file_size] for e in entries}
    figure = go.Figure(go.Bar(x=[0, 1, 2], y=[1.0, -0.5, 0.25]))
    floor = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(repeats):
            start = time.perf_counter()
            figure.write_image(Path(folder) / "one.png")
            floor.append(time.perf_counter() - start)
    out["floor seconds"] = min(floor)
    return out


def _tree(folder: Path, revision: str | None) -> Path:
    """A folder holding ``attrlab/<folder>`` of ``revision`` (None: this working tree)."""
    package = folder / "attrlab"
    package.mkdir(parents=True)
    if revision is None:
        for name in FOLDERS:
            (package / name).symlink_to(ROOT / name)
        return folder
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, *FOLDERS],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(package)], input=archive, check=True)
    return folder


def _run(tree: Path, repeats: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    env["TRANSFORMERS_OFFLINE"] = "1"
    done = subprocess.run(
        [sys.executable, __file__, "--measure", "--repeats", str(repeats)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="git revision of the code before")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.repeats)))
        return
    with tempfile.TemporaryDirectory() as folder:
        before = _run(_tree(Path(folder) / "before", args.before), args.repeats)
        after = _run(_tree(Path(folder) / "after", None), args.repeats)
    rows = []
    for case, title in TITLES:
        seconds = (before[f"{case} seconds"], after[f"{case} seconds"])
        size = (before[f"{case} bytes"], after[f"{case} bytes"])
        floor = after[f"{case} floor bytes"]
        rows.append(
            [
                title,
                f"{seconds[0]:.1f}",
                f"{seconds[1]:.1f}",
                f"{size[0] / 1e6:.2f}",
                f"{size[1] / 1e6:.2f}",
                f"{size[0] / size[1]:.1f}×",
                f"{floor / 1e6:.2f}",
                f"{size[0] / floor:.1f}×",
            ]
        )
    header = [
        "bundle",
        "s before",
        "s after",
        "MB before",
        "MB after",
        "smaller by",
        "floor MB (Plotly + lossless maps)",
        "before / floor",
    ]
    print_table(header, rows)
    floors = before["floor seconds"], after["floor seconds"]
    print(f"\nfloor, kaleido's PNG of one small figure: {min(floors):.1f} s")
    for case, title in TITLES:
        print(f"\n{title}: the bundle's files over {LISTED / 1e6} MB deflated\n")
        files = _files("before", before[f"{case} files"]) + _files("after", after[f"{case} files"])
        print_table(("version", "file", "MB deflated", "MB"), files)


def _files(version: str, sizes: dict[str, list[int]]) -> list[tuple[str, str, str, str]]:
    """The files of one bundle over :data:`LISTED` bytes deflated, largest first."""
    kept = sorted(((s, name) for name, s in sizes.items() if s[0] >= LISTED), reverse=True)
    return [(version, name, f"{s[0] / 1e6:.2f}", f"{s[1] / 1e6:.2f}") for s, name in kept]


if __name__ == "__main__":
    main()
