"""
The README's and the manual's code runs as written.

Python blocks of README.md and docs/ run in one subprocess with this interpreter (each block in
fresh globals, as a script of its own: one import of torch for all of them); the README's
command lines run through the `attrlab` console script; its set-up lines are listed below with
why they are not run here. The methods table is checked against the method catalog, which is
generated from the method classes.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# README shell lines not run by this test, and why.
SETUP_LINES = {
    ("make", "run"): "serves the page until stopped (the browser and live-server tests serve it)",
    ("make", "test"): "runs this suite itself",
    ("pip", "install", "attrlab"): "installs from the package index (test_packaging builds "
    "the wheel and checks what it holds)",
    ("pip", "install", "attrlab[app]"): "installs from the package index, as above",
}

# Python blocks of docs/ not run, by page and a string only that block holds, and why: the
# suite's time (under 20 minutes on 2 cores) has no room for SmolLM2 runs that other tests make.
DOCS_NOT_RUN = {
    ("answers.md", 'contrast=" Lyon"'): "SmolLM2-135M, about 14 s on 2 busy cores; "
    "test_answers.py and test_smollm2.py make these calls",
    ("answers.md", "context_attribution(adapter"): "SmolLM2-135M, about 14 s on 2 busy cores; "
    "test_context.py makes this call",
    ("patching.md", "patching_report("): "exact patching of SmolLM2-135M takes minutes "
    "(320 s in benchmarks/patching.py); test_patching.py makes these calls on tiny models",
    ("rest-api.md", "httpx.post("): "needs a live server and a reviews.txt; "
    "test_serving.py and test_safety_jobs.py call the job routes",
    ("deployment.md", "gradio_client"): "needs a running page or Space; test_space.py calls "
    "/explain_batch",
    ("large-models.md", 'offload_folder="/scratch/offload"'): "a placeholder model folder and "
    "8-bit loading (CUDA only); test_placement.py loads tiny models with device_map and disk "
    "offload",
    ("vlm.md", "ImagePrompt(image_bytes"): "no vision-language weights can be fetched here; "
    "test_vlm.py makes these calls on tiny random LLaVA and Qwen2-VL models",
    ("vlm_tokens.md", "visual_token_study(adapter, [item]"): "no vision-language weights can "
    "be fetched here; test_vlm_tokens.py makes these calls on tiny random models",
    ("layers.md", 'image=Path("cat.png")'): "no vision-language weights can be fetched here; "
    "test_vlm_layers.py makes these calls on tiny random models",
    ("vlm_patching.md", "ImagePrompt(image_bytes"): "no vision-language weights can be fetched "
    "here; test_vlm_patching.py makes these calls on tiny random models of each family",
    ("large-models.md", "long_text"): "a long text is the point (minutes on a CPU); "
    "test_placement.py checks checkpointed maps on tiny models",
}

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)

# Runs each block as a script of its own; prints one JSON line per block: its error or none.
_DRIVER = """
import json, sys, traceback
for name, source in json.load(sys.stdin):
    try:
        exec(compile(source, name, "exec"), {"__name__": "__main__"})
        error = None
    except BaseException:
        error = traceback.format_exc()
    print("BLOCK " + json.dumps({"name": name, "error": error}), flush=True)
"""


def _blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(path.read_text()) if lang == language]


def _docs_python_blocks() -> tuple[dict[str, str], set[tuple[str, str]]]:
    """The docs' Python blocks to run by name, and the DOCS_NOT_RUN keys that matched one."""
    run, matched = {}, set()
    for page in sorted(DOCS.rglob("*.md")):
        for number, body in enumerate(_blocks(page, "python")):
            left_out = [k for k in DOCS_NOT_RUN if k[0] == page.name and k[1] in body]
            matched.update(left_out)
            if not left_out:
                run[f"{page.relative_to(ROOT)}#{number}"] = body
    return run, matched


@pytest.fixture(scope="module")
def block_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """Every Python block of README and docs run once, in one subprocess."""
    blocks = {f"README.md#{n}": body for n, body in enumerate(_blocks(README, "python"))}
    blocks.update(_docs_python_blocks()[0])
    run = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(list(blocks.items())),
        capture_output=True,
        text=True,
        cwd=tmp_path_factory.mktemp("blocks"),
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads(line[6:]) for line in run.stdout.splitlines() if line[:6] == "BLOCK "]
    assert [r["name"] for r in reports] == list(blocks), run.stderr[-3000:]
    return {r["name"]: r["error"] for r in reports}


@pytest.mark.slow
def test_readme_python_blocks_run(block_errors: dict[str, str | None]) -> None:
    readme = {name: error for name, error in block_errors.items() if name.startswith("README")}
    assert readme, "README has no Python block"
    failed = {name: error for name, error in readme.items() if error}
    assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())


@pytest.mark.slow
def test_docs_python_blocks_run(block_errors: dict[str, str | None]) -> None:
    docs = {name: error for name, error in block_errors.items() if name.startswith("docs")}
    assert len(docs) >= 2
    failed = {name: error for name, error in docs.items() if error}
    assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())


def test_every_docs_block_left_out_is_named() -> None:
    # A stale entry (its block moved or changed) would silently stop leaving anything out.
    assert _docs_python_blocks()[1] == set(DOCS_NOT_RUN)


def _shell_lines() -> list[list[str]]:
    lines = []
    for body in _blocks(README, "bash") + _blocks(README, "console"):
        lines += [shlex.split(line, comments=True) for line in body.splitlines()]
    return [words for words in lines if words]


def test_readme_shell_lines_are_commands_or_named_setup() -> None:
    commands = [words for words in _shell_lines() if words[0] == "attrlab"]
    others = [tuple(words) for words in _shell_lines() if words[0] != "attrlab"]
    assert commands, "README shows no attrlab command"
    assert set(others) <= set(SETUP_LINES), set(others) - set(SETUP_LINES)


_TOKEN_ROW = re.compile(r"^  (.+?) +([+-]\d+\.\d+)(?: |$)")


@pytest.mark.slow
def test_readme_command_lines_run() -> None:
    console_script = Path(sys.executable).with_name("attrlab")
    for words in (w for w in _shell_lines() if w[0] == "attrlab"):
        run = subprocess.run(
            [str(console_script), *words[1:]], capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, (words, run.stderr[-3000:])
        text = words[words.index("--text") + 1]
        rows = [_TOKEN_ROW.match(line) for line in run.stdout.splitlines()]
        tokens = [m.group(1) for m in rows if m]
        scores = [float(m.group(2)) for m in rows if m]
        # The table's tokens are the input's own text, in order (special tokens around it).
        assert text in "".join(tokens), tokens
        if words[words.index("--method") + 1] == "integrated_gradients":
            # Completeness: the scores sum to F(x) − F(baseline), which the CLI reads from
            # two forward passes of the model, not from the scores.
            difference = re.search(r"logit_difference=(\S+)", run.stdout)
            assert difference, run.stdout
            assert math.isclose(sum(scores), float(difference.group(1)), rel_tol=0.01)


def test_readme_methods_table_is_the_catalog() -> None:
    catalog = json.loads((ROOT / "attribution/methods/catalog.json").read_text())
    papers = {entry["name"]: entry["paper"] for entry in catalog}
    rows = re.findall(r"^\| `(\w+)` \|.*\((https://[^)]+)\) \|$", README.read_text(), re.M)
    assert [name for name, _ in rows] == list(dict.fromkeys(name for name, _ in rows))
    assert dict(rows) == papers


def test_readme_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing
