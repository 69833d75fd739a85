"""
The Hugging Face Space: its metadata names an entry that builds the page with ``spaces``
installed (outside ZeroGPU its decorator is a no-op), its Gradio API answers through
``gradio_client``, its GPU slots are sized from the estimates of earlier slots, and a job's
own error crosses the slot boundary with its message.
"""

from __future__ import annotations

import math
import pickle
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gradio
import numpy as np
import pytest
import tomllib
import yaml
from _live_server import launch_blocks

from attrlab.app import space
from attrlab.app.api import ExplainBody
from attrlab.app.settings import ServerSettings
from attrlab.app.ui import PageRunner
from attrlab.app.ui.runner import queued_cost
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import AttrlabError, TooSlowError
from attrlab.attribution.models import load
from attrlab.attribution.request import ExplainRequest
from attrlab.attribution.request.estimate import estimate

ROOT = Path(__file__).resolve().parent.parent
RISE = ExplainRequest(
    model="tiny-random-bert", method="rise", text="a fine day", params={"n_masks": 48}
)


@pytest.fixture
def worker():
    w = ExplainWorker(device="cpu")
    yield w
    w.close()


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


@pytest.mark.slow
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
        ["make", "-s", "space", f"SPACE_DIR={target}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (target / "README.md").read_text() == (ROOT / "assets/space/README.md").read_text()
    assert (target / "app/space.py").is_file() and (target / "pyproject.toml").is_file()
    # A Space installs requirements.txt alone: the dependencies are listed, not ".".
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["app"], *extras["embedded"], "spaces"]
    assert (target / "requirements.txt").read_text().splitlines() == wanted


@pytest.mark.server
def test_space_api_explains_a_batch_and_the_page_through_gradio_client():
    from gradio_client import Client

    demo = space.build_space(ServerSettings.unrestricted())
    url = launch_blocks(demo)
    try:
        client = Client(url, verbose=False)
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
        raw = client.predict(
            "tiny-random-bert", "", "a fine day", "", ["gradient_x_input"], False, False, 0, {},
            api_name="/explain_text",
        )[6]  # fmt: skip
        assert raw["gradient_x_input"]["target"]["index"] == direct.target.index
    finally:
        demo.close()


def _zero_gpu_stand_in(asked: list[int]):
    """
    ``spaces.GPU`` as ZeroGPU runs it, in this process: it asks for ``duration(request)``,
    sends arguments and results across as pickles, and turns any exception but Gradio's into
    a bare ``gr.Error`` naming its class (as ``spaces`` does).
    """

    def gpu(task, duration):
        def in_slot(request):
            asked.append(duration(request))
            try:
                result = task(pickle.loads(pickle.dumps(request)))
            except gradio.Error:
                raise
            except Exception as err:
                raise gradio.Error(type(err).__name__) from None
            return pickle.loads(pickle.dumps(result))

        return in_slot

    return gpu


def test_slots_are_priced_from_the_estimates_of_earlier_slots(worker):
    asked: list[int] = []
    runner = space.SpaceRunner(worker, max_slot_s=120, gpu=_zero_gpu_stand_in(asked))
    assert runner.slot_s(RISE) == space.FIRST_SLOT_S
    assert runner.cost_line(RISE).startswith("known after the first run")
    served = runner.run(RISE)
    adapter = worker.adapter(RISE.model)
    inputs = adapter.preprocess(RISE.text)
    direct = explain(adapter, "rise", inputs, params=RISE.params)
    np.testing.assert_array_equal(served.scores, direct.scores)
    # The slot estimated the job; the next of the same model, method and parameters is priced
    # at that estimate plus the slot's time beyond it (here: the calibration it measured).
    seconds = estimate(adapter, "rise", inputs, RISE.params).seconds
    beyond = runner.book.beyond[-1]
    assert 0 <= beyond < 60
    assert runner.priced_s(RISE) == pytest.approx(seconds + beyond)
    assert runner.slot_s(RISE) == math.ceil(2 * (seconds + beyond) + 10)
    # Page parameters come as text: the same job, the same price.
    assert runner.priced_s(replace(RISE, params={"n_masks": "48"})) == runner.priced_s(RISE)
    longer = replace(RISE, text=RISE.text * 3)  # three times the characters
    assert runner.priced_s(longer) == pytest.approx(3 * seconds + beyond)
    other = replace(RISE, params={"n_masks": 64})
    assert runner.slot_s(other) == space.FIRST_SLOT_S  # other parameters: not priced yet
    runner.run(RISE)
    assert asked[0] == space.FIRST_SLOT_S and asked[1] == math.ceil(2 * (seconds + beyond) + 10)


def test_over_the_longest_slot_a_job_is_refused_and_an_unanswered_slot_asks_the_longest(worker):
    asked: list[int] = []
    runner = space.SpaceRunner(worker, max_slot_s=10, gpu=_zero_gpu_stand_in(asked))
    runner.run(RISE)  # not priced yet: asks for the first-job slot (capped) and is priced
    with pytest.raises(TooSlowError, match="lower n_masks"):
        runner.run(RISE)  # seen at this size: 2 x its price + 10 s is over 10 s
    # A longer text than any seen is not refused on an extrapolated price: it gets a slot.
    runner.run(replace(RISE, text=RISE.text * 2))
    assert len(asked) == 2
    # Out of bounds: refused before a slot is asked for.
    with pytest.raises(AttrlabError, match="n_masks"):
        runner.run(replace(RISE, params={"n_masks": 0}))
    assert len(asked) == 2

    def stopped(task, duration):
        def in_slot(request):
            asked.append(duration(request))
            raise gradio.Error("ZeroGPU worker error", title="GPU task aborted")

        return in_slot

    cut = space.SpaceRunner(worker, max_slot_s=100, gpu=stopped)
    cut.book.seen.update(runner.book.seen)
    with pytest.raises(gradio.Error):
        cut.run(RISE)
    assert cut.slot_s(RISE) == 100  # the slot ended without an answer: ask for the longest


def test_a_jobs_own_error_comes_back_from_the_slot_with_its_message(worker):
    runner = space.SpaceRunner(worker, max_slot_s=120, gpu=_zero_gpu_stand_in([]))
    wrong = ExplainRequest(model="tiny-random-bert", method="gradient_x_input", text="a", target=99)
    with pytest.raises(AttrlabError) as caught:
        worker.explain(wrong)
    with pytest.raises(AttrlabError) as from_slot:
        runner.run(wrong)
    assert str(from_slot.value) == str(caught.value)
    batch = ExplainBody.model_validate(
        {"model": "tiny-random-bert", "method": "gradient_x_input",
         "instances": [{"text": "a fine day"}, {"text": "  "}]}
    ).to_batch()  # fmt: skip
    first, empty = runner.run(batch)
    assert first["gradient_x_input"].method == "gradient_x_input"
    assert isinstance(empty["gradient_x_input"], AttrlabError)


def test_page_shows_the_estimate_before_run_and_an_eta_while_running(worker):
    shown = queued_cost(worker, RISE)  # the first estimate on a model measures its costs
    adapter = worker.adapter(RISE.model)
    expected = estimate(adapter, "rise", adapter.preprocess(RISE.text), RISE.params)
    assert shown == expected.summary()
    assert f"{expected.forward_passes:,} forward passes" in shown
    bad = replace(RISE, params={"n_masks": 0})
    assert queued_cost(worker, bad).startswith("cannot estimate (parameter 'n_masks'")

    seen = []

    def progress(fraction, desc=""):
        seen.append(desc)

    request = ExplainRequest(
        model="tiny-random-bert", method="rise", text="a fine day",
        params={"n_masks": 8192, "batch_size": 8, "every_pattern": False},  # drawn: long
    )  # fmt: skip
    PageRunner(worker)(request, progress, "a session")  # polled every 0.25 s: long enough
    assert re.fullmatch(r"([\d,]+)/\1 steps", seen[-1])
    assert any(re.search(r"steps, (≈ [\d,]+ s|< 1 s) left$", d) for d in seen)


def test_a_bad_slot_limit_is_a_clear_settings_error(worker, monkeypatch):
    from attrlab.app.settings import SettingsError

    with pytest.raises(SettingsError, match="ATTRLAB_SPACE_MAX_SLOT must be at least 1 s"):
        space.SpaceRunner(worker, max_slot_s=0)
    monkeypatch.setenv("ATTRLAB_SPACE_MAX_SLOT", "two minutes")
    with pytest.raises(SettingsError, match="must be a whole number of seconds"):
        space.build_space(ServerSettings.unrestricted())
