"""REST API, Gradio page and worker, all in-process on loopback."""

from __future__ import annotations

import base64
import io
import threading

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from skimage import data

from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import JobCancelledError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.request import ExplainRequest


@pytest.fixture(scope="module")
def worker():
    w = ExplainWorker(device="cpu", max_models=2)
    yield w
    w.close()


@pytest.fixture(scope="module")
def client(worker):
    with TestClient(create_app(worker)) as c:
        yield c


def _png(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_rest_lists_models_and_methods(client):
    models = {m["id"] for m in client.get("/api/v1/models").json()}
    assert {"minilm-zeroshot", "efficientnet-lite0"} <= models
    methods = {m["name"]: m for m in client.get("/api/v1/methods").json()}
    assert methods["integrated_gradients"]["params"]["n_steps"]["default"] == 50


def test_rest_explains_text_and_image(client):
    text = client.post(
        "/api/v1/explain",
        json={
            "model": "minilm-zeroshot",
            "method": "integrated_gradients",
            "text": "An awful, boring mess.",
            "params": {"n_steps": 16},
        },
    )
    assert text.status_code == 200, text.text
    e = Explanation.from_dict(text.json())
    assert e.target.label == "negative" and e.params["n_steps"] == 16
    image = client.post(
        "/api/v1/explain",
        json={
            "model": "efficientnet-lite0",
            "method": "gradient_x_input",
            "image_base64": _png(data.chelsea()),
        },
    )
    assert image.status_code == 200, image.text
    assert image.json()["image_size"] == [224, 224]
    assert 281 <= image.json()["target"]["index"] <= 285


def test_rest_explain_with_the_trust_card(client):
    response = client.post(
        "/api/v1/explain",
        json={
            "model": "minilm-zeroshot",
            "method": "gradient_x_input",
            "text": "A lovely, charming film.",
            "evaluate": True,
        },
    )
    assert response.status_code == 200, response.text
    metrics = response.json()["metrics"]
    assert {"comprehensiveness", "comprehensiveness_random", "sufficiency"} <= set(metrics)


def test_rest_layers_returns_the_table_and_the_agreement(client):
    response = client.post(
        "/api/v1/layers",
        json={
            "model": "tiny-random-llama",
            "text": "the cat sat on the",
            "next_token": True,
            "measures": ["gradient", "ablation", "logit_lens"],
            "top_k": 3,
            "recheck_draws": 2,
        },
    )
    assert response.status_code == 200, response.text
    e = Explanation.from_dict(response.json())
    assert e.method == "layers" and e.params == {
        "measures": "gradient,ablation,logit_lens",
        "top_k": 3,
        "recheck_draws": 2,
    }
    assert [v.check for v in e.verdicts] == [
        "recheck:head_gradient",
        "recheck:ablation_zero",
        "recheck:ablation_mean",
    ]  # each estimator's top heads re-checked against random head sets
    heads = e.layers[e.layers.measure == "head_gradient"]
    assert len(heads) == 2 * 4 and heads["kv_head"].notna().all()  # 2 layers x 4 query heads
    assert set(e.layers.measure) >= {"ablation_zero", "ablation_mean", "lens_rank"}
    assert "top_k_overlap:head_gradient:ablation_zero" in e.metrics
    assert any("scores are zero" in w for w in e.warnings)  # no lrp measure: no token map


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model": "tiny-random-llama", "text": "a", "measures": ["everything"]}, 422, "unknown"),
        ({"model": "tiny-random-bert", "text": "a", "measures": ["logit_lens"]}, 422, "decoder"),
        ({"model": "efficientnet-lite0", "image_base64": _png(data.chelsea())}, 400, "attention"),
        ({"model": "tiny-random-llama", "text": "a", "top_k": 0}, 422, "top_k"),
    ],
)
def test_rest_layers_refuses_what_it_cannot_do(client, body, status, words):
    response = client.post("/api/v1/layers", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_rest_check_compares_maps_and_randomises_each_then_leaves_the_model_intact(client):
    from scipy.stats import spearmanr

    body = {
        "model": "tiny-random-llama",
        "text": "the cat sat on the mat",
        "methods": ["gradient_x_input", "attnlrp"],
        "randomise": True,
        "top_fraction": 0.5,
    }
    plain = {"model": "tiny-random-llama", "method": "attnlrp", "text": body["text"]}
    before = client.post("/api/v1/explain", json=plain).json()
    response = client.post("/api/v1/check", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    maps = {m: Explanation.from_dict(e) for m, e in result["explanations"].items()}
    assert list(maps) == ["gradient_x_input", "attnlrp"]
    assert maps["attnlrp"].target.index == maps["gradient_x_input"].target.index
    (pair,) = result["agreement"]
    importance = [np.abs(maps[m].scores) for m in maps]  # agreement ranks magnitudes
    rho = spearmanr(*importance).statistic
    assert pair["spearman"] == pytest.approx(rho)
    assert pair["k"] == round(len(importance[0]) / 2)  # top_fraction 0.5 of the tokens
    steps = result["randomisation"]
    assert len(steps) == 2 * 5  # per method: none, output, 2 blocks, embeddings
    assert all(row["spearman"] == 1.0 for row in steps if row["step"] == 0)
    assert any(abs(row["spearman"]) < 0.9 for row in steps if row["method"] == "attnlrp")
    # a verdict per method, on the correlation left once every layer is randomised
    verdicts = result["randomisation_verdicts"]
    assert set(verdicts) == {"gradient_x_input", "attnlrp"}
    for method, verdict in verdicts.items():
        last = max((r for r in steps if r["method"] == method), key=lambda r: r["step"])
        rho = max(abs(last["spearman"]), abs(last["spearman_abs"]))
        assert verdict["value"] == pytest.approx(rho)
        assert verdict["status"] == ("pass" if rho <= 0.3 else "warn" if rho <= 0.7 else "fail")
    assert [v.check for v in maps["attnlrp"].verdicts] == ["lrp_conservation"]
    after = client.post("/api/v1/explain", json=plain).json()
    assert after["scores"] == before["scores"]  # the weights were restored


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"methods": []}, 422, "methods"),
        ({"methods": ["attnlrp"]}, 422, "nothing to check"),
        ({"methods": ["attnlrp", "attnlrp"]}, 422, "named twice"),
        ({"methods": ["attnlrp", "rise"], "params": {"ig": {}}}, 422, "which is not checked"),
        ({"methods": ["attnlrp", "rise"], "params": {"rise": {"n_masks": -1}}}, 422, "n_masks"),
        ({"methods": ["attnlrp", "nope"]}, 404, "nope"),
        ({"methods": ["attnlrp", "rise"], "top_fraction": 0}, 422, "top_fraction"),
    ],
)
def test_rest_check_refuses_what_it_cannot_do(client, body, status, words):
    body = {"model": "tiny-random-llama", "text": "a cat", **body}
    response = client.post("/api/v1/check", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_worker_reports_progress_and_cancels(worker):
    seen = []
    cancelled = threading.Event()

    def progress(done, total):
        seen.append((done, total))

    from attrlab.attribution.request.run import RunContext

    run = RunContext(progress=progress, cancel=cancelled)
    run.step(1, 4)
    cancelled.set()
    with pytest.raises(JobCancelledError):
        run.step(2, 4)
    assert seen == [(1, 4)]
    # A job cancelled before it starts never runs; the worker stays usable.
    blocker = threading.Event()
    worker._lanes[0].executor.submit(blocker.wait)
    job = worker.submit(
        ExplainRequest(model="tiny-random-bert", method="gradient_x_input", text="queued")
    )
    job.cancel()
    blocker.set()
    assert job.future.cancelled()
    done = worker.explain(
        ExplainRequest(model="tiny-random-bert", method="gradient_x_input", text="next")
    )
    assert done.model.id == "tiny-random-bert"


def test_worker_model_cache_is_lru(worker):
    for spec in ("tiny-random-bert", "tiny-random-gpt2", "tiny-random-bert", "tiny-random-vit"):
        worker.adapter(spec)
    assert worker.status()["models_loaded"] == ["tiny-random-bert", "tiny-random-vit"]
