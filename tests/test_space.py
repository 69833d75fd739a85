"""
The Hugging Face Space: its metadata names an entry that builds the page with ``spaces``
installed (outside ZeroGPU its decorator is a no-op), its Gradio API answers through
``gradio_client``, and its GPU slots are sized from cost estimates measured in earlier slots,
also when those were measured in another process.
"""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import gradio
import numpy as np
import pytest
import yaml

import attribution.estimate as estimate_module
from app import space
from app.settings import ServerSettings
from app.ui import _cost, _run
from app.worker import ExplainRequest, ExplainWorker
from attribution import explain
from attribution.errors import NotCalibratedError
from attribution.estimate import adopt_calibrations, estimate
from attribution.models import load

ROOT = Path(__file__).resolve().parent.parent
RISE = ExplainRequest(
    model="tiny-random-bert", method="rise", text="a fine day", params={"n_masks": 48}
)


@pytest.fixture
def fresh_costs(monkeypatch):
    """No model's costs measured yet in this process."""
    monkeypatch.setattr(estimate_module, "_CALIBRATIONS", {})
    monkeypatch.setattr(estimate_module, "_ADOPTED", {})


@pytest.fixture
def worker():
    w = ExplainWorker(device="cpu")
    yield w
    w.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_space_metadata_names_the_entry_and_the_pinned_gradio():
    text = (ROOT / "assets/space/README.md").read_text()
    meta = yaml.safe_load(re.match(r"^---\n(.*?)\n---\n", text, re.S).group(1))
    assert meta["sdk"] == "gradio"
    pinned = re.search(r"^gradio==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert meta["sdk_version"] == pinned.group(1) == gradio.__version__
    assert (ROOT / meta["app_file"]).is_file()
    assert meta["app_file"] == "app/space.py"
    assert str(meta["python_version"]) == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert meta["suggested_hardware"].startswith("zero-")
    requirements = (ROOT / "assets/space/requirements.txt").read_text().split()
    assert ".[embedded]" in requirements and "spaces" in requirements


def test_space_entry_run_as_a_file_builds_the_page_with_spaces_installed(tmp_path):
    """As a Space runs its app_file: from another folder, by path, `spaces` importable."""
    script = (
        "import runpy, spaces\n"
        f"entry = runpy.run_path({str(ROOT / 'app/space.py')!r}, run_name='space')\n"
        "demo = entry['build_space']()\n"
        "names = sorted(d['api_name'] for d in demo.config['dependencies'] if d.get('api_name'))\n"
        "print(entry['ZERO_GPU'], names)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    zero_gpu, names = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert zero_gpu == "False"  # outside a ZeroGPU Space
    for name in ("explain_batch", "explain_image", "explain_next_token", "explain_text"):
        assert f"'{name}'" in names


def test_make_space_assembles_the_spaces_files(tmp_path):
    target = tmp_path / "space"
    done = subprocess.run(
        ["make", "-s", "space", f"SPACE_DIR={target}"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (target / "README.md").read_text() == (ROOT / "assets/space/README.md").read_text()
    assert (target / "requirements.txt").is_file()
    assert (target / "app/space.py").is_file() and (target / "pyproject.toml").is_file()


def test_space_api_explains_a_batch_and_the_page_through_gradio_client():
    from gradio_client import Client

    demo = space.build_space(ServerSettings.unrestricted())
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        body = {
            "model": "tiny-random-bert",
            "methods": ["gradient_x_input", "integrated_gradients"],
            "params": {"integrated_gradients": {"n_steps": 8}},
            "instances": [{"text": "a fine day"}, {"text": "   "}, {"text": "rain again"}],
        }
        answer = client.predict(body, api_name="/explain_batch")
        first, empty, last = answer["explanations"]
        assert empty["gradient_x_input"]["error"]["code"] == "invalid_input"
        adapter = load("tiny-random-bert", device="cpu")
        for text, result in (("a fine day", first), ("rain again", last)):
            inputs = adapter.preprocess(text)
            expected = explain(adapter, "integrated_gradients", inputs, params={"n_steps": 8})
            served = result["integrated_gradients"]
            np.testing.assert_allclose(served["scores"], expected.scores, rtol=1e-5, atol=1e-7)
            assert served["tokens"] == expected.tokens
            assert result["gradient_x_input"]["method"] == "gradient_x_input"
        one = client.predict(
            {"model": "tiny-random-bert", "method": "gradient_x_input", "text": "a fine day"},
            api_name="/explain_batch",
        )
        direct = explain(adapter, "gradient_x_input", adapter.preprocess("a fine day"))
        np.testing.assert_allclose(one["scores"], direct.scores, rtol=1e-5, atol=1e-7)
        with pytest.raises(Exception, match="invalid request"):
            client.predict({"model": "tiny-random-bert"}, api_name="/explain_batch")
        _tokens, _plot, summary = client.predict(
            "tiny-random-bert", "gradient_x_input", "a fine day", "", "", "", 0,
            api_name="/explain_text",
        )  # fmt: skip
        assert summary["target"]["index"] == direct.target.index
    finally:
        demo.close()


def test_a_models_first_slot_is_the_default_and_later_ones_come_from_its_estimate(
    worker, fresh_costs
):
    asked = []

    def gpu(task, duration):
        """ZeroGPU's decorator, in this process: asks for a slot of ``duration(request)``."""

        def in_slot(request):
            asked.append(duration(request))
            return task(request)

        return in_slot

    runner = space.SpaceRunner(worker, max_slot_s=120, gpu=gpu)
    assert runner.slot_s(RISE) == space.FIRST_SLOT_S
    runner.run(RISE)  # the slot measures the costs its estimate needs and hands them back
    adapter = worker.adapter(RISE.model)
    expected = estimate(adapter, "rise", adapter.preprocess(RISE.text), RISE.params)
    assert runner.slot_s(RISE) == math.ceil(2 * expected.seconds + 10)
    runner.run(RISE)
    assert asked == [space.FIRST_SLOT_S, math.ceil(2 * expected.seconds + 10)]
    assert space.SpaceRunner(worker, max_slot_s=11).slot_s(RISE) == 11
    bad = ExplainRequest(model="tiny-random-bert", method="rise", text="a", params={"p": 7})
    assert runner.slot_s(bad) == space.SLOT_EXTRA_S  # refused at once in its slot


def test_costs_measured_in_another_process_price_a_run_here(fresh_costs):
    """A ZeroGPU slot is another process: its measured costs price the main process's runs."""
    child = (
        "import json\n"
        "from attribution.models import load\n"
        "from attribution.estimate import estimate, calibration_snapshots\n"
        "a = load('tiny-random-bert', device='cpu')\n"
        "e = estimate(a, 'rise', a.preprocess('the weather was fine all week'), {'n_masks': 500})\n"
        "print(json.dumps({'seconds': e.seconds, 'costs': calibration_snapshots()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=300, check=True
    )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    adapter = load("tiny-random-bert", device="cpu")
    inputs = adapter.preprocess("the weather was fine all week")
    with pytest.raises(NotCalibratedError):
        estimate(adapter, "rise", inputs, {"n_masks": 500}, measure=False)
    # This process first saw a shorter input: adopted costs are rescaled to its reference size.
    estimate_module.calibrate(adapter, adapter.preprocess("fine"))
    adopt_calibrations(measured["costs"])
    priced = estimate(adapter, "rise", inputs, {"n_masks": 500}, measure=False)
    assert priced.seconds == pytest.approx(measured["seconds"], rel=1e-9)


def test_page_shows_the_estimate_before_run_and_an_eta_while_running(worker, fresh_costs):
    assert _cost(worker, RISE, measure=False) == "Cost: known after the first run on this model."
    shown = _cost(worker, RISE, measure=True)  # measures the model's costs through the queue
    adapter = worker.adapter(RISE.model)
    expected = estimate(adapter, "rise", adapter.preprocess(RISE.text), RISE.params)
    assert shown == f"Cost: {expected.summary()}"
    assert f"{expected.forward_passes:,} forward passes" in shown
    assert _cost(worker, RISE, measure=False) == shown  # now priced without measuring

    seen = []

    def progress(fraction, desc=""):
        seen.append(desc)

    request = ExplainRequest(
        model="tiny-random-bert", method="rise", text="a fine day",
        params={"n_masks": 64, "batch_size": 8},
    )  # fmt: skip
    _run(lambda r, report: worker.explain(r, progress=report), request, progress)
    assert re.fullmatch(r"([\d,]+)/\1 forward passes", seen[-1])
    assert any(re.search(r"forward passes, (≈ [\d,]+ s|< 1 s) left$", d) for d in seen)
