"""
``attrlab prune`` and ``POST /api/v1/prune``: the library's pruning study, wired.

Each front end's numbers are checked against :func:`attribution.engine.study.
pruning_study` run directly on the same tiny model and prompts; bad input is refused in words
(exit 2, HTTP 4xx), and a study over the server's budget before it starts.
"""

from __future__ import annotations

import base64
import io
import json

import pandas as pd
import pytest

from attrlab.app.cli import main
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.engine.study import pruning_study, ranked_input
from attrlab.attribution.errors import TooSlowError
from attrlab.attribution.request import PatchRequest, PruneRequest
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.viz import pruning_figures

MODEL = "tiny-random-gpt2"
TEXT = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
TEXTS = ("The cat sat on the mat and", "Mary gave John a")
ASKED = {"answer": " Mary", "contrast": " John"}


@pytest.fixture(scope="module")
def expected(load_model):
    adapter = load_model(MODEL)
    inputs, target, problem = ranked_input(adapter, TEXT, corrupted=CORRUPT, **ASKED)
    return pruning_study(adapter, inputs, target, TEXTS, problem=problem, draws=2, head_step=2)


def _same_curves(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got["order"]) == list(expected["order"])
    assert list(got["removed"]) == list(expected["removed"])
    pd.testing.assert_series_equal(
        got["value"].astype(float), expected["value"].astype(float), rtol=1e-6, atol=1e-9
    )


def test_the_cli_writes_the_study_as_json_csv_table_and_figures(capsys, tmp_path, expected):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    argv = ["prune", "--model", MODEL, "--text", TEXT, "--corrupt", CORRUPT]
    argv += ["--answer", " Mary", "--contrast", " John", "--input", str(texts)]
    argv += ["--draws", "2", "--head-step", "2"]
    assert main([*argv, "--format", "json"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert study["target"] == "' Mary' rather than ' John'"
    for unit in ("layer", "head"):
        _same_curves(pd.DataFrame(study[unit]["curves"]), expected.curves()[unit].curves)
    assert main([*argv, "--format", "csv"]) == 0
    _same_curves(pd.read_csv(io.StringIO(capsys.readouterr().out)), expected.curve_table())
    assert main([*argv, "--figures", str(tmp_path / "figures")]) == 0  # and the terminal view
    text = capsys.readouterr().out
    written = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert written == sorted(f"{name}.html" for name in pruning_figures(expected))
    assert "layers removed 0 … 1" in text and "residual_patching" in text
    assert main([*argv, "--units", "layer", "--agreement"]) == 0
    text = capsys.readouterr().out
    assert "each layer removed alone" in text and "top_k_overlap" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--units", "neurons"], "units are one or more of layer, head"),
        (["--corrupt", "When Mary went to the store"], "token"),
        (["--target", "3", "--answer", " Mary"], "give a target, or an answer"),
    ],
)
def test_the_cli_refuses_bad_studies_in_words(capsys, extra, message):
    assert main(["prune", "--model", MODEL, "--text", TEXT, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_rest_prune_answers_the_study_and_refuses_bad_bodies(served, expected):
    body = {"model": MODEL, "text": TEXT, "corrupted": CORRUPT, **ASKED}
    body |= {"texts": list(TEXTS), "draws": 2, "head_step": 2}
    response = served.post("/api/v1/prune", json=body)
    assert response.status_code == 200, response.text
    assert "agreements" not in response.json()  # only when asked
    for unit in ("layer", "head"):
        _same_curves(pd.DataFrame(response.json()[unit]["curves"]), expected.curves()[unit].curves)
    for bad, named in (
        ({**body, "units": ["neurons"]}, "units are one or more"),
        ({**body, "texts": []}, "texts"),
        ({**body, "draws": 0}, "draws"),
        ({**body, "corrupted": "When Mary went"}, "token"),
        ({**body, "target": 2}, "give a target, or an answer"),
    ):
        response = served.post("/api/v1/prune", json=bad)
        assert 400 <= response.status_code < 500, response.text
        assert named in json.dumps(response.json()["error"]), response.text
    assert "/api/v1/prune" in served.get("/openapi.json").json()["paths"]
    asked = served.post("/api/v1/prune", json={**body, "units": ["layer"], "agreement": True})
    assert asked.status_code == 200, asked.text
    table = asked.json()["agreements"]["layer"]["table"]
    assert [row["estimator"] for row in table] == list(expected.curves()["layer"].orders)


def test_the_servers_seconds_refuse_a_prune_and_a_patch_before_they_run():
    worker = ExplainWorker(device="cpu", max_models=1, settings=ServerSettings(max_seconds=1e-6))
    try:
        asked = AnswerSpec(**ASKED)
        prune = PruneRequest(model=MODEL, text=TEXT, texts=TEXTS, draws=2, answer=asked)
        with pytest.raises(TooSlowError, match="this pruning study would take"):
            worker.explain(prune)
        patch = PatchRequest(model=MODEL, clean=TEXT, corrupted=CORRUPT, answer=asked)
        with pytest.raises(TooSlowError, match="this patching study would take"):
            worker.explain(patch)
    finally:
        worker.close()


def test_neurons_per_layer_with_an_allocation_through_cli_and_rest(
    capsys, served, load_model, tmp_path
):
    """The channel kinds and their options need no front-end code of their own."""
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess(TEXTS[1])
    options = {"sparsity": "per_layer", "allocation": "owl", "removal": "mean"}
    expected = pruning_study(adapter, inputs, None, TEXTS[:1], units=["neuron"], draws=2, **options)
    argv = ["prune", "--model", "tiny-random-llama", "--next-token", "--text", TEXTS[1]]
    argv += ["--units", "neuron", "--draws", "2", "--sparsity", "per_layer"]
    argv += ["--allocation", "owl", "--removal", "mean", "--format", "json"]
    texts = [TEXTS[0]]
    dataset = tmp_path / "texts.jsonl"
    dataset.write_text(json.dumps({"text": texts[0]}) + "\n", encoding="utf-8")
    assert main([*argv, "--input", str(dataset)]) == 0
    study = json.loads(capsys.readouterr().out)
    assert (study["sparsity"], study["allocation"], study["removal"]) == tuple(options.values())
    _same_curves(pd.DataFrame(study["neuron"]["curves"]), expected.by_unit["neuron"].curves)
    _same_curves(
        pd.DataFrame(study["allocated"]["neuron"]["curves"]), expected.allocated["neuron"].curves
    )
    body = {"model": "tiny-random-llama", "text": TEXTS[1], "next_token": True, "texts": texts}
    answer = served.post("/api/v1/prune", json={**body, "units": ["neuron"], "draws": 2, **options})
    assert answer.status_code == 200, answer.text
    _same_curves(
        pd.DataFrame(answer.json()["allocated"]["neuron"]["curves"]),
        expected.allocated["neuron"].curves,
    )
    refused = served.post(
        "/api/v1/prune",
        json={**body, "units": ["head"], "sparsity": "per_layer", "allocation": "owl"},
    )
    assert refused.status_code == 422
    assert "allocates neurons" in refused.json()["error"]["message"]
    assert main([*argv[:-8], "--allocation", "owl"]) == 2
    assert "use per_layer" in capsys.readouterr().err


def test_an_image_model_is_ranked_on_an_image_and_pruned_over_the_bundled_images(
    capsys, load_model, tmp_path, served
):
    from PIL import Image

    from attrlab.attribution.models.images import load_image

    picture = tmp_path / "grey.png"
    Image.new("RGB", (32, 32), (120, 130, 140)).save(picture)
    adapter = load_model("tiny-random-vit")
    inputs = adapter.preprocess(load_image(picture.read_bytes()))
    expected = pruning_study(adapter, inputs, None, units=["layer"], draws=2)
    argv = ["prune", "--model", "tiny-random-vit", "--image", str(picture), "--units", "layer"]
    assert main([*argv, "--draws", "2", "--format", "json"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert study["texts"] == expected.texts  # the bundled images
    _same_curves(pd.DataFrame(study["layer"]["curves"]), expected.by_unit["layer"].curves)
    assert main([*argv, "--corrupt", "a prompt"]) == 2
    assert "give no answer, corrupted prompt or texts" in capsys.readouterr().err
    encoded = base64.b64encode(picture.read_bytes()).decode()
    body = {"model": "tiny-random-vit", "image_base64": encoded, "units": ["layer"], "draws": 2}
    answer = served.post("/api/v1/prune", json=body)
    assert answer.status_code == 200, answer.text
    _same_curves(pd.DataFrame(answer.json()["layer"]["curves"]), expected.by_unit["layer"].curves)
    neither = served.post("/api/v1/prune", json={"model": "tiny-random-vit", "units": ["layer"]})
    assert neither.status_code == 400
    assert "give exactly one input" in neither.json()["error"]["message"]
