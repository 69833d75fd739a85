"""Cost estimates: pass counts against the passes explain() really spends."""

from __future__ import annotations

import pytest
import torch

from attrlab.attribution import explain
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.methods import available_methods, get_method
from attrlab.attribution.metrics.faithfulness import RANDOM_ORDERS
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.estimate import estimate
from attrlab.attribution.request.run import RunSettings

#: Small settings so that every method runs in moments on the tiny models.
SMALL = {
    "rise": {"n_masks": 40},
    "sobol": {"n_designs": 4, "grid": 2},
    "shap": {"max_evals": 40},
    "integrated_gradients": {"n_steps": 8},
    "deeplift_shap": {"n_references": 3},
    "occlusion": {"window": 4},
    "layers": {"measures": "all"},
}
MODELS = {"text": "tiny-random-llama", "image": "tiny-random-vit"}


@pytest.mark.parametrize("method", [m.name for m in available_methods()])
@pytest.mark.parametrize("modality", ["text", "image"])
def test_pass_counts_match_the_passes_explain_spends(load_model, method, modality):
    adapter = load_model(MODELS[modality])
    raw = "the cat sat on the mat" if modality == "text" else _image()
    inputs = adapter.preprocess(raw)
    if get_method(method).unsupported_reason(adapter) is not None:
        with pytest.raises(UnsupportedMethodError):  # refused as explain() refuses it
            estimate(adapter, method, inputs)
        return
    params = SMALL.get(method, {})
    if method == "occlusion" and modality == "text":
        params = {"window": 2}
    cost = estimate(adapter, method, inputs, params)
    spent = explain(adapter, method, inputs, params=params).timings
    if cost.exact:
        assert (spent.forward_passes, spent.backward_passes) == (
            cost.forward_passes,
            cost.backward_passes,
        )
    else:  # an upper bound: the method may stop sooner
        assert spent.forward_passes <= cost.forward_passes
        assert spent.backward_passes <= cost.backward_passes
    assert cost.seconds > 0


def _image():
    import numpy as np

    return np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)


def test_an_upper_bound_with_a_tolerance_and_the_trust_cards_passes(load_model):
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("a long and winding road through the hills")
    params = {"n_masks": 2000, "tolerance": 0.5}
    cost = estimate(adapter, "rise", inputs, params)
    spent = explain(adapter, "rise", inputs, params=params).timings.forward_passes
    assert not cost.exact and spent < cost.forward_passes == 2001  # masks + the prediction
    # 3 tokens: their 8 keep patterns, each taken once (fewer than a tolerance's first 128
    # masks), priced exactly
    short = estimate(adapter, "rise", adapter.preprocess("a fine day"), params)
    assert short.exact and short.forward_passes == 2**3 + 1
    carded = estimate(adapter, "gradient_x_input", inputs, settings=RunSettings(evaluate=True))
    explained = explain(adapter, "gradient_x_input", inputs, settings=RunSettings(evaluate=True))
    spent = explained.timings
    # the card's random orders stop once settled: priced at the most, each unused order's two
    # curves of (free tokens + 1) points left over
    assert not carded.exact and spent.backward_passes == carded.backward_passes
    unused = RANDOM_ORDERS - int(explained.metrics["random_orders"])
    points = int((~inputs.fixed_tokens).sum()) + 1
    assert carded.forward_passes - spent.forward_passes == 2 * points * unused
    assert "forward and 1 backward passes" in carded.summary()


def test_estimates_over_rest_and_the_cli_and_a_too_slow_request_is_refused(tmp_path, capsys):
    from fastapi.testclient import TestClient

    from attrlab.app.cli import main
    from attrlab.app.server import create_app
    from attrlab.app.settings import ServerSettings
    from attrlab.app.worker import ExplainWorker

    env = {"ATTRLAB_MODELS": "tiny-random-bert", "ATTRLAB_DATA": str(tmp_path)}
    worker = ExplainWorker(device="cpu", settings=ServerSettings.for_server(env, max_seconds=1))
    body = {"model": "tiny-random-bert", "method": "rise", "text": "a fine day"}
    with TestClient(create_app(worker)) as client:
        cost = client.post(
            "/api/v1/estimate", json={**body, "params": {"n_masks": 100, "every_pattern": False}}
        ).json()
        assert cost["forward_passes"] == 101 and cost["exact"] and cost["device"] == "cpu"
        too_long = {**body, "params": {"n_masks": 8000, "batch_size": 1, "every_pattern": False}}
        seconds = client.post("/api/v1/estimate", json=too_long).json()["seconds"]
        refused = client.post("/api/v1/explain", json=too_long)
        assert seconds > 1  # 8,000 forwards one at a time
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_slow" and "8,001 forward passes" in error["message"]
        assert "lower n_masks" in error["message"] and "set a tolerance" in error["message"]
        fine = client.post("/api/v1/explain", json={**body, "params": {"n_masks": 50}})
        assert fine.status_code == 200
        # the limit holds for every instance of a batch and for every method of a check
        batch = {k: v for k, v in too_long.items() if k != "text"}
        batch["instances"] = [{"text": "a fine day"}]
        (answer,) = client.post("/api/v1/explain", json=batch).json()["explanations"]
        assert answer["rise"]["error"]["code"] == "too_slow"
        check = {**body, "methods": ["rise", "attnlrp"], "params": {"rise": too_long["params"]}}
        del check["method"]
        refused = client.post("/api/v1/check", json=check)
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "too_slow"
    worker.close()
    args = ["explain", "--model", "tiny-random-bert", "--method", "integrated_gradients"]
    assert main([*args, "--text", "a fine day", "--estimate", "--param", "n_steps=10"]) == 0
    assert capsys.readouterr().out.startswith("≈ 12 forward and 10 backward passes")  # x, path, x0


def test_a_gpu_calibration_prices_between_widths_and_skips_widths_that_do_not_fit(monkeypatch):
    """Per-row costs written out: linear in log width between timed widths; OOM widths skipped."""
    from types import SimpleNamespace

    from attrlab.attribution.errors import DeviceMemoryError
    from attrlab.attribution.request.calibration import Calibration

    adapter = SimpleNamespace(device=torch.device("cuda"), model_id="gpu-stand-in")
    inputs = SimpleNamespace(map_shape=(10,), modality="text")
    per_row = {1: 8.0, 16: 4.0, 64: 2.0, 256: 1.0, 1024: 0.5}

    def calibration(fits_below: int) -> Calibration:
        made = Calibration(adapter, inputs)  # type: ignore[arg-type]

        def measure(kind: str, width: int) -> float:
            if width >= fits_below:
                raise DeviceMemoryError(f"{width} rows do not fit")
            return per_row[width]

        monkeypatch.setattr(made, "_measure", measure)
        return made

    wide = calibration(fits_below=4096)
    assert wide.seconds("forward", 64) == 2.0
    assert wide.seconds("forward", 32) == pytest.approx(3.0)  # halfway from 16 to 64 in log
    assert wide.seconds("forward", 2048) == 0.5  # beyond the widest: its cost
    narrow = calibration(fits_below=1024)
    assert narrow.seconds("forward", 512) == 1.0  # 1024 rows do not fit: flat at 256
    tight = calibration(fits_below=256)
    assert tight.seconds("forward", 300) == 2.0  # 256 does not fit either: down to 64


@pytest.mark.parametrize(
    "method", ["gradient_x_input", "integrated_gradients", "attnlrp", "occlusion"]
)
def test_a_per_step_matrix_is_priced_as_explain_spends_it(load_model, method):
    # a gradient method spends one run's passes per answer token (gradient × input and AttnLRP
    # in one batch of steps; integrated gradients a run each, reading the whole target's F(x));
    # occlusion scores every step from the whole map's forwards
    adapter = load_model("tiny-random-llama")
    inputs, target = answer_request(adapter, "the cat sat on the", answer=" mat and slept")
    assert target.steps > 1
    params = {"n_steps": 2} if method == "integrated_gradients" else SMALL.get(method, {})
    whole = estimate(adapter, method, inputs, params, target=target)
    cost = estimate(adapter, method, inputs, params, target=target, per_step=True)
    spent = explain(adapter, method, inputs, target, params, per_step=True).timings
    assert (spent.forward_passes, spent.backward_passes) == (
        cost.forward_passes,
        cost.backward_passes,
    )
    if method == "occlusion":
        assert (cost.forward_passes, cost.seconds) == (whole.forward_passes, whole.seconds)
    else:
        assert cost.backward_passes == whole.backward_passes * (1 + target.steps)
