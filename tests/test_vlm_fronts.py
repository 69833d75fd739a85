"""An image and a prompt explained through REST, batches and jobs, the CLI and the Python API."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _jobs import job_settings, wait_for_job
from _tiny_vlm import saved, tiny_llava
from fastapi.testclient import TestClient
from PIL import Image

import attrlab
from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import InvalidInputError, TooSlowError
from attrlab.attribution.explain import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.metrics.faithfulness import RANDOM_ORDERS, faithfulness
from attrlab.attribution.models.hub import load_pretrained
from attrlab.attribution.models.vlm import (
    ImagePrompt,
    ImageTextInputs,
    VisionLanguageAdapter,
    with_answer,
)
from attrlab.attribution.patching import (
    Blurred,
    Masked,
    Noised,
    OtherImage,
    PatchingReport,
    image_patching_report,
)
from attrlab.attribution.request import (
    EstimateRequest,
    ExplainRequest,
    PatchRequest,
    RequestBounds,
    run_request,
)
from attrlab.attribution.request.answers import Answer, answer_target, given_answer

PROMPT = "what is in the picture"
ANSWER = " a cat sits"
HEIGHT, WIDTH = 32, 48  # LLaVA's processor crops the centre square: the sides stay blank


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LLaVA saved as a model folder, as a server serves one."""
    root = tmp_path_factory.mktemp("models").resolve()
    saved(tiny_llava(), root / "llava")
    return root / "llava"


@pytest.fixture(scope="module")
def library(folder: Path) -> VisionLanguageAdapter:
    """The same folder loaded in the test, to compute the expected maps with the library."""
    loaded = load_pretrained(str(folder), model_id="library", within=[folder])
    assert isinstance(loaded, VisionLanguageAdapter)
    return loaded


@pytest.fixture(scope="module")
def png() -> bytes:
    return _random_png(0)


def _random_png(seed: int, height: int = HEIGHT, width: int = WIDTH) -> bytes:
    """A PNG file of random pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def served(folder: Path, tmp_path_factory: pytest.TempPathFactory):
    settings = job_settings(
        tmp_path_factory.mktemp("data"), "tiny-random-gpt2", model_roots=(folder.parent,)
    )
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as client:
        yield client
    worker.close()


def _expected(adapter: VisionLanguageAdapter, png: bytes, method: str) -> Explanation:
    """The library's own explanation of ``ANSWER`` after the image and the prompt."""
    answer = given_answer(adapter, ANSWER)
    inputs = with_answer(adapter, adapter.preprocess(ImagePrompt(png, PROMPT)), answer)
    return explain(adapter, method, inputs, answer_target(adapter, inputs, answer))


def _body(folder: Path, png: bytes, **fields: object) -> dict:
    image = base64.b64encode(png).decode()
    return {"model": str(folder), "method": "gradient_x_input", "image_base64": image, **fields}


def _assert_same_map(found: dict, expected: Explanation) -> None:
    np.testing.assert_allclose(found["scores"], expected.scores, rtol=1e-5, atol=1e-9)
    heat = np.array(found["maps"]["image_heatmap"], dtype=float)  # null -> NaN
    np.testing.assert_allclose(heat, expected.maps["image_heatmap"], rtol=1e-5, atol=1e-9)


def test_rest_explains_an_image_and_a_prompt_as_the_library_does(served, folder, library, png):
    response = served.post(
        "/api/v1/explain", json=_body(folder, png, text=PROMPT, answer=ANSWER, per_step=True)
    )
    assert response.status_code == 200, response.text
    found = response.json()
    expected = _expected(library, png, "gradient_x_input")
    _assert_same_map(found, expected)
    heat = np.array(found["maps"]["image_heatmap"], dtype=float)
    assert heat.shape == (HEIGHT, WIDTH)
    assert np.isnan(heat[:, :8]).all() and np.isfinite(heat[:, 8:40]).all()  # the crop's sides
    visual = np.array(found["maps"]["visual_mask"]) == 1
    scores = np.abs(np.array(found["scores"]))
    metrics = found["metrics"]
    assert metrics["image_share"] == pytest.approx(scores[visual].sum() / scores.sum())
    assert metrics["image_share"] + metrics["text_share"] == pytest.approx(1.0)
    assert len(found["maps"]["step_image_share"]) == len(given_answer(library, ANSWER).ids)
    assert found["target_record"]["kind"] == "answer"


def test_rest_without_an_answer_explains_the_models_own_next_token(served, folder, library, png):
    response = served.post("/api/v1/explain", json=_body(folder, png, text=PROMPT))
    assert response.status_code == 200, response.text
    prompt: ImageTextInputs = library.preprocess(ImagePrompt(png, PROMPT))
    with torch.no_grad():  # the next-token logits read in the test, from the model itself
        logits = library.model(**prompt.model_kwargs()).logits[0, -1]
    assert response.json()["target"]["index"] == int(logits.argmax())


def test_rest_explains_the_models_own_generated_answer(served, folder, library, png):
    response = served.post("/api/v1/explain", json=_body(folder, png, text=PROMPT, generate=3))
    assert response.status_code == 200, response.text
    found = response.json()
    # greedy, token by token, from plain forwards of the image, prompt and answer so far
    prompt: ImageTextInputs = library.preprocess(ImagePrompt(png, PROMPT))
    ids: list[int] = []
    for _ in range(3):
        sequence = with_answer(library, prompt, Answer(tuple(ids), "")) if ids else prompt
        with torch.no_grad():
            ids.append(int(library.model(**sequence.model_kwargs()).logits[0, -1].argmax()))
    assert found["target_record"]["kind"] == "answer"
    assert found["target_record"]["generated"] is True
    assert found["target_record"]["tokens"] == ids
    answer = Answer(tuple(ids), "", generated=True)
    inputs = with_answer(library, prompt, answer)
    expected = explain(library, "gradient_x_input", inputs, answer_target(library, inputs, answer))
    _assert_same_map(found, expected)


def test_rest_explains_a_contrast_whose_alternative_has_a_sequence_of_its_own(
    served, folder, library, png
):
    contrast = " the big dog"  # differs from the answer before its last token
    response = served.post(
        "/api/v1/explain", json=_body(folder, png, text=PROMPT, answer=ANSWER, contrast=contrast)
    )
    assert response.status_code == 200, response.text
    found = response.json()
    # each answer explained on its own, after the same image and prompt, then subtracted
    prompt = library.preprocess(ImagePrompt(png, PROMPT))
    maps = []
    for text in (ANSWER, contrast):
        answer = given_answer(library, text)
        inputs = with_answer(library, prompt, answer)
        maps.append(
            explain(library, "gradient_x_input", inputs, answer_target(library, inputs, answer))
        )
    kept = len(prompt.tokens)
    expected = np.array(maps[0].scores)
    expected[:kept] -= maps[1].scores[:kept]
    assert found["target_record"]["kind"] == "contrast"
    np.testing.assert_allclose(found["scores"], expected, rtol=1e-5, atol=1e-9)
    alternative = np.array(found["maps"]["alternative_answer"])
    np.testing.assert_allclose(alternative, -maps[1].scores[kept:], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({}, "invalid_input", "takes an image and a prompt as input, but the request gives an"),
        ({"text": PROMPT, "chat": True}, "invalid_input", "leave out chat"),
        ({"text": PROMPT, "model": "tiny-random-gpt2"}, "invalid_input", "takes text (an image"),
        ({"text": PROMPT, "model": None}, "invalid_input", "name one"),
    ],
)
def test_rest_refuses_in_words(served, folder, png, fields, code, words):
    response = served.post("/api/v1/explain", json={**_body(folder, png), **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code
    assert words in response.json()["error"]["message"]


def test_rest_refuses_a_prompt_alone_and_an_undecodable_image(served, folder):
    alone = served.post(
        "/api/v1/explain", json={"model": str(folder), "method": "occlusion", "text": PROMPT}
    )
    assert "takes an image and a prompt as input, but the request gives text" in alone.text
    broken = _body(folder, b"not an image", text=PROMPT)
    response = served.post("/api/v1/explain", json=broken)
    assert response.status_code == 400
    assert "not a readable image" in response.json()["error"]["message"]


def test_a_batch_and_a_job_take_instances_of_both_fields(served, folder, library, png):
    image = base64.b64encode(png).decode()
    body = {
        "model": str(folder),
        "method": "gradient_x_input",
        "instances": [
            {"text": PROMPT, "image_base64": image, "answer": ANSWER},
            {"image_base64": image},
        ],
    }
    batch = served.post("/api/v1/explain", json=body)
    assert batch.status_code == 200, batch.text
    first, bad = (row["gradient_x_input"] for row in batch.json()["explanations"])
    _assert_same_map(first, _expected(library, png, "gradient_x_input"))
    assert "takes an image and a prompt" in bad["error"]["message"]
    submitted = served.post("/api/v1/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    status = wait_for_job(served, submitted.json()["job_id"])
    assert status["status"] == "done" and status["instance_errors"] == 1
    results = served.get(f"/api/v1/jobs/{submitted.json()['job_id']}/results").text
    row = json.loads(results.splitlines()[0])
    assert row["explanations"]["gradient_x_input"]["scores"] == first["scores"]


def test_the_cli_explains_an_image_and_a_prompt(capsys, folder, library, png, tmp_path):
    image = tmp_path / "picture.png"
    image.write_bytes(png)
    common = ["explain", "--model", str(folder), "--method", "gradient_x_input", "--device", "cpu"]
    asked = [*common, "--image", str(image), "--text", PROMPT, "--answer", ANSWER]
    assert main([*asked, "--format", "json", "--figures", str(tmp_path / "figures")]) == 0
    found = json.loads(capsys.readouterr().out)
    _assert_same_map(found, _expected(library, png, "gradient_x_input"))
    assert (tmp_path / "figures" / "gradient_x_input_image_and_text.html").is_file()
    assert main(asked) == 0
    assert "image_share=" in capsys.readouterr().out
    assert main([*common, "--text", PROMPT]) == 2
    assert "takes an image and a prompt as input" in capsys.readouterr().err


def test_the_python_api_takes_an_image_and_a_prompt(library, png, tmp_path):
    expected = _expected(library, png, "occlusion")
    path = tmp_path / "picture.png"
    path.write_bytes(png)
    for image in (png, path, Image.open(io.BytesIO(png))):
        found = attrlab.explain(
            library, image=image, text=PROMPT, method="occlusion", answer=ANSWER
        )
        assert isinstance(found, Explanation)
        np.testing.assert_allclose(found.scores, expected.scores, rtol=1e-5, atol=1e-9)
    shown = found._repr_html_()
    assert shown is not None and 'class="attrlab-image-part"' in shown
    assert f"image: {expected.metrics['image_share']:.0%}" in shown


def test_an_image_and_a_prompt_is_priced_and_refused_over_budget(library, png):
    fields = {"model": "library", "text": PROMPT, "image": png, "method": "occlusion"}
    estimate = run_request(EstimateRequest(**fields), library)
    inputs: ImageTextInputs = library.preprocess(ImagePrompt(png, PROMPT))
    hidden = int((~inputs.fixed_tokens).sum())  # each hideable position, one forward each
    assert estimate.forward_passes >= hidden and estimate.seconds > 0
    with pytest.raises(TooSlowError, match="this server allows"):
        run_request(ExplainRequest(**fields), library, RequestBounds(max_seconds=1e-6))


def test_pricing_runs_the_vision_tower_once_per_pass_as_the_methods_do(folder, png):
    adapter = load_pretrained(str(folder), model_id="priced", within=[folder])  # uncalibrated
    modules = dict(adapter.model.named_modules())
    tower = next(m for name, m in modules.items() if name.endswith("vision_tower"))
    # the second block: the first one's input is replaced by the rows in its own pre-hook
    block = next(m for name, m in modules.items() if name.endswith("language_model.layers.1"))
    rows: dict[str, list[int]] = {"tower": [], "block": []}
    handles = [
        tower.register_forward_pre_hook(
            lambda _m, args, kwargs: rows["tower"].append(
                (args[0] if args else kwargs["pixel_values"]).shape[0]
            ),
            with_kwargs=True,
        ),
        block.register_forward_pre_hook(
            lambda _m, args, kwargs: rows["block"].append(
                (args[0] if args else kwargs["hidden_states"]).shape[0]
            ),
            with_kwargs=True,
        ),
    ]
    try:
        estimate = run_request(
            EstimateRequest(model="priced", text=PROMPT, image=png, method="rise"), adapter
        )
    finally:
        for handle in handles:
            handle.remove()
    assert estimate.seconds > 0
    assert max(rows["block"]) > 1  # passes of many rows were timed...
    assert set(rows["tower"]) == {1}  # ...each with one image through the vision tower


def _halves_png() -> bytes:
    """
    A 32 × 64 PNG of two flat colours meeting at column 29.

    LLaVA keeps its middle 32 columns as 4 × 4 tokens: two superpixels, each over half of them.
    """
    pixels = np.empty((32, 64, 3), dtype=np.uint8)
    pixels[:, :29] = (220, 40, 40)
    pixels[:, 29:] = (40, 60, 220)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


#: The trust card's scores that rank the map's own units (no random order in them).
_OWN_SCORES = ("comprehensiveness", "sufficiency", "deletion_morf_auc", "insertion_morf_auc")


def test_the_trust_card_over_superpixels_through_rest_and_the_python_api(served, folder, library):
    png = _halves_png()
    answer = given_answer(library, ANSWER)
    inputs = with_answer(library, library.preprocess(ImagePrompt(png, PROMPT)), answer)
    target = answer_target(library, inputs, answer)
    scores = explain(library, "gradient_x_input", inputs, target).scores
    # the library's scores over the two halves and the text tokens
    expected = faithfulness(library, inputs, scores, target, random_orders=0, superpixels=2)
    per_token = faithfulness(library, inputs, scores, target, random_orders=0)
    assert expected.metrics["comprehensiveness"] != per_token.metrics["comprehensiveness"]
    asked = {"text": PROMPT, "answer": ANSWER, "evaluate": True, "evaluate_superpixels": 2}
    response = served.post("/api/v1/explain", json=_body(folder, png, **asked))
    assert response.status_code == 200, response.text
    found = attrlab.explain(
        library,
        image=png,
        text=PROMPT,
        method="gradient_x_input",
        answer=ANSWER,
        evaluate=True,
        evaluate_superpixels=2,
    )
    assert isinstance(found, Explanation)
    for metrics in (response.json()["metrics"], found.metrics):
        for name in _OWN_SCORES:
            assert metrics[name] == pytest.approx(expected.metrics[name], rel=1e-5), name
    # several methods (a check) without the trust card: refused, not silently dropped
    with pytest.raises(attrlab.AttrlabError, match=r"ask for the trust card \(evaluate\) too"):
        attrlab.explain(
            library,
            image=png,
            text=PROMPT,
            methods=["gradient_x_input", "gradient"],
            answer=ANSWER,
            evaluate_superpixels=2,
        )


def test_the_trust_cards_superpixels_are_priced(library):
    png = _halves_png()
    fields = {"model": "library", "text": PROMPT, "image": png, "method": "gradient_x_input"}
    by_token = run_request(EstimateRequest(**fields, evaluate=True), library)
    by_region = run_request(
        EstimateRequest(**fields, evaluate=True, evaluate_superpixels=2), library
    )
    inputs: ImageTextInputs = library.preprocess(ImagePrompt(png, PROMPT))
    visual = int(inputs.visual_tokens.sum())
    assert visual == 16
    # two curves per order (the map's two and the random ones), one point fewer per unit
    # fewer: the 16 visual tokens become two halves
    fewer = 2 * (2 + RANDOM_ORDERS) * (visual - 2)
    assert by_token.forward_passes - by_region.forward_passes == fewer


def test_the_cli_prices_the_trust_cards_superpixels_and_refuses_them_alone(
    capsys, folder, tmp_path
):
    image = tmp_path / "halves.png"
    image.write_bytes(_halves_png())
    asked = ["explain", "--model", str(folder), "--method", "gradient_x_input", "--device", "cpu"]
    asked += ["--image", str(image), "--text", PROMPT, "--estimate", "--format", "json"]
    passes = []
    for regions in ([], ["--evaluate-superpixels", "2"]):
        assert main([*asked, "--evaluate", *regions]) == 0
        passes.append(json.loads(capsys.readouterr().out)["forward_passes"])
    assert passes[0] - passes[1] == 2 * (2 + RANDOM_ORDERS) * (16 - 2)  # as the estimate's
    assert main([*asked, "--evaluate-superpixels", "2"]) == 2
    assert "ask for the trust card (evaluate) too" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"evaluate_superpixels": 2}, "ask for the trust card (evaluate) too"),
        ({"evaluate": True, "evaluate_superpixels": 1}, "superpixels must be 2 to 5000"),
        (
            {"evaluate": True, "evaluate_superpixels": 2, "model": "tiny-random-gpt2"},
            "superpixels group the visual tokens of an image and a prompt",
        ),
    ],
)
def test_rest_refuses_the_trust_cards_superpixels_in_words(served, folder, png, fields, words):
    body = _body(folder, png, text=PROMPT, **fields)
    if fields.get("model") == "tiny-random-gpt2":
        del body["image_base64"]
    for route in ("/api/v1/explain", "/api/v1/estimate"):
        response = served.post(route, json=body)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_parameter" and words in error["message"], route


def _batch_lines(tmp_path: Path, png: bytes, lines: list[dict]) -> Path:
    """A JSONL dataset beside ``picture.png`` (its lines name the image by that file name)."""
    (tmp_path / "picture.png").write_bytes(png)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return data


def test_batch_lines_of_an_image_and_a_prompt_equal_the_single_explain_call(
    capsys, folder, library, png, tmp_path
):
    lines = [
        {"id": "given", "image": "picture.png", "text": PROMPT, "answer": ANSWER},
        {"id": "next", "image": "picture.png", "text": PROMPT},
    ]
    data, out = _batch_lines(tmp_path, png, lines), tmp_path / "out.jsonl"
    argv = ["batch", "--model", str(folder), "--methods", "gradient_x_input", "--device", "cpu"]
    assert main([*argv, "--input", str(data), "--output", str(out)]) == 0
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["given"]["error"] is None and rows["next"]["error"] is None
    single = ["explain", "--model", str(folder), "--method", "gradient_x_input", "--device", "cpu"]
    picture = str(tmp_path / "picture.png")
    for key, answer in (("given", ["--answer", ANSWER]), ("next", [])):
        capsys.readouterr()
        assert (
            main([*single, "--image", picture, "--text", PROMPT, *answer, "--format", "json"]) == 0
        )
        alone = json.loads(capsys.readouterr().out)
        found = json.loads(rows[key]["explanation_json"])
        np.testing.assert_allclose(found["scores"], alone["scores"], rtol=1e-6, atol=1e-12)
        heat, alone_heat = (np.array(f["maps"]["image_heatmap"], float) for f in (found, alone))
        np.testing.assert_allclose(heat, alone_heat, rtol=1e-6, atol=1e-12)
        assert found["target_record"] == alone["target_record"]
        assert found["tokens"] == alone["tokens"]
        assert found["metrics"]["image_share"] == pytest.approx(alone["metrics"]["image_share"])
    # and the given answer's map is the library's own
    _assert_same_map(
        json.loads(rows["given"]["explanation_json"]), _expected(library, png, "gradient_x_input")
    )


@pytest.mark.parametrize(
    ("model", "lines", "words"),
    [
        (
            "tiny-random-gpt2",
            [{"id": "both", "image": "picture.png", "text": PROMPT}],
            "row 'both': give exactly one input: a text or an image; model 'tiny-random-gpt2' "
            "takes text (an image with a prompt is a vision-language model's input)",
        ),
        (
            "tiny-random-vit",
            [{"id": "both", "image": "picture.png", "text": PROMPT}],
            "row 'both': give exactly one input: a text or an image; model 'tiny-random-vit' "
            "takes an image",
        ),
        (
            "{folder}",
            [{"id": "ok", "image": "picture.png", "text": PROMPT}, {"id": "t", "text": PROMPT}],
            "row 't': model '{folder}' takes an image and a prompt as input, but the request "
            "gives text",
        ),
    ],
)
def test_batch_lines_the_model_does_not_take_are_refused_before_any_work(
    capsys, folder, png, tmp_path, model, lines, words
):
    model, words = model.format(folder=folder), words.format(folder=folder)
    data, out = _batch_lines(tmp_path, png, lines), tmp_path / "out.jsonl"
    argv = ["batch", "--model", model, "--methods", "gradient_x_input", "--device", "cpu"]
    assert main([*argv, "--input", str(data), "--output", str(out)]) == 2
    error = capsys.readouterr().err
    assert words in error and "Traceback" not in error
    assert not out.exists() or not out.read_text().strip()  # nothing was explained


# Patching with a corrupted image, through every front end, against the library's own report.
#: The study the front ends are asked for: cheap (the residual, exact and AtP), on the answer.
STUDY = {"components": ["residual"], "estimators": ["exact", "atp"]}


@pytest.fixture(scope="module")
def other_png() -> bytes:
    """Another image of the clean one's size (the corrupted side of OtherImage)."""
    return _random_png(1)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _patch_body(folder: Path, png: bytes, corruption: dict | None, **fields: object) -> dict:
    body = {"model": str(folder), "clean": PROMPT, "image_base64": _b64(png), "answer": ANSWER}
    return {**body, **STUDY, "image_corruption": corruption, **fields}


def _library_report(library, png: bytes, corruption) -> PatchingReport:
    """The library's own study of the same request."""
    prompt = ImagePrompt(png, PROMPT)
    return image_patching_report(
        library, prompt, corruption, STUDY["components"], STUDY["estimators"], answer=ANSWER
    )


def _assert_same_report(found: dict, expected: PatchingReport) -> None:
    assert found["clean_score"] == pytest.approx(expected.clean_score, rel=1e-5)
    assert found["corrupted_score"] == pytest.approx(expected.corrupted_score, rel=1e-5)
    assert found["corrupted_score"] != pytest.approx(found["clean_score"])  # it was corrupted
    table = pd.DataFrame(found["table"])
    keys = ["estimator", "direction", "component", "layer", "position", "token"]
    assert table[keys].values.tolist() == expected.table[keys].values.tolist()
    for column in ("effect", "normalised"):
        np.testing.assert_allclose(table[column], expected.table[column], rtol=1e-4, atol=1e-7)
    assert found["visual"] == expected.visual.to_dict()
    assert found["target"] == expected.target


def _corruptions(other_png: bytes) -> dict[str, tuple[dict, object]]:
    """Each corruption as REST sends it, and as the library's record."""
    return {
        "blur": ({"kind": "blur", "sigma": 2.0}, Blurred(2.0)),
        "noise": ({"kind": "noise", "sigma": 40.0, "seed": 3}, Noised(40.0, 3)),
        "mask": ({"kind": "mask", "box": [8, 0, 24, 16], "fill": 0}, Masked((8, 0, 24, 16), 0)),
        "other": ({"kind": "other_image", "image_base64": _b64(other_png)}, OtherImage(other_png)),
    }


@pytest.mark.parametrize("kind", ["blur", "noise", "mask", "other"])
def test_rest_patches_a_corrupted_image_as_the_library_does(
    served, folder, library, png, other_png, kind
):
    sent, corruption = _corruptions(other_png)[kind]
    response = served.post("/api/v1/patch", json=_patch_body(folder, png, sent))
    assert response.status_code == 200, response.text
    _assert_same_report(response.json(), _library_report(library, png, corruption))


def test_a_patching_job_of_an_image_gives_the_reports_of_the_route(served, folder, png):
    body = _patch_body(folder, png, {"kind": "blur", "sigma": 2.0})
    direct = served.post("/api/v1/patch", json=body).json()
    submitted = served.post("/api/v1/patch/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    status = wait_for_job(served, submitted.json()["job_id"])
    assert status["status"] == "done", status
    results = served.get(f"/api/v1/jobs/{submitted.json()['job_id']}/results").text
    (line,) = results.splitlines()
    found = json.loads(line)["report"]
    assert found["table"] == direct["table"] and found["visual"] == direct["visual"]


#: What needs the image or the model is refused when the study runs; the rest before queueing.
_NEEDS_THE_MODEL = ("leaves the", "at most the image's longer", "takes text")


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({"image_base64": None}, 400, "needs the clean image and how it is corrupted"),
        ({"image_corruption": None}, 400, "needs the clean image and how it is corrupted"),
        ({"corrupted": "what is in the box"}, 400, "give no corrupted prompt or noise"),
        ({"contrast": " a dog"}, 400, "a class target or a contrast is not offered"),
        ({"image_corruption": {"kind": "blur", "sigma": 0}}, 422, "the blur's sigma is positive"),
        ({"image_corruption": {"kind": "blur", "sigma": 90}}, 422, "at most the image's longer"),
        ({"image_corruption": {"kind": "noise", "sigma": 5, "seed": -1}}, 422, "seed"),
        ({"image_corruption": {"kind": "swirl"}}, 422, "kind"),
        ({"image_corruption": {"kind": "mask", "box": [1, 2, 3]}}, 422, "box"),
        ({"image_corruption": {"kind": "mask", "box": [40, 0, 49, 5]}}, 400, "leaves the 48 × 32"),
        ({"image_corruption": {"kind": "blur", "sigma": 1, "seed": 2}}, 422, "seed"),
        ({"image_corruption": {"kind": "other_image", "image_base64": "%%%"}}, 400, "not valid"),
        ({"image_base64": _b64(b"not an image")}, 400, "not a readable image"),
        ({"model": "tiny-random-gpt2"}, 400, "model 'tiny-random-gpt2' takes text (an image"),
        ({"model": None}, 400, "name one"),
    ],
)
def test_rest_refuses_a_bad_image_patching_request_in_words(
    served, folder, png, fields, status, words
):
    body = {**_patch_body(folder, png, {"kind": "blur", "sigma": 2.0}), **fields}
    body = {key: value for key, value in body.items() if value is not None}
    response = served.post("/api/v1/patch", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]
    if not any(late in words for late in _NEEDS_THE_MODEL):  # a job is refused before queueing
        queued = served.post("/api/v1/patch/jobs", json=body)
        assert queued.status_code == status and words in queued.json()["error"]["message"]


@pytest.mark.parametrize("kind", ["mask", "other", "kept"])
def test_the_cli_patches_a_corrupted_image_as_the_library_does(
    capsys, folder, library, png, other_png, tmp_path, kind
):
    clean, other, square = tmp_path / "clean.png", tmp_path / "other.png", tmp_path / "sq.png"
    clean.write_bytes(png)
    other.write_bytes(other_png)
    square.write_bytes(_random_png(2, 40, 40))  # LLaVA lays another size out alike
    flags, corruption = {
        "mask": (["--mask", "8,0,24,16", "--mask-fill", "0"], _corruptions(other_png)["mask"][1]),
        "other": (["--corrupt-image", str(other)], OtherImage(other_png)),
        "kept": (
            ["--corrupt-image", str(square), "--keep-size"],
            OtherImage(square.read_bytes(), resize=False),
        ),
    }[kind]
    argv = ["patch", "--model", str(folder), "--image", str(clean), "--text", PROMPT]
    argv += [*flags, "--answer", ANSWER, "--components", "residual"]
    argv += ["--estimators", "exact,atp", "--device", "cpu", "--format", "json"]
    assert main([*argv, "--figures", str(tmp_path / "figures")]) == 0
    found = json.loads(capsys.readouterr().out)
    _assert_same_report(found, _library_report(library, png, corruption))
    # the effects drawn over the image beside the text study's figures
    written = {path.name for path in (tmp_path / "figures").iterdir()}
    assert {"patching_image.html", "patching_residual.html"} <= written


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--blur", "2"], "needs the clean image and how it is corrupted"),
        (["--image", "{clean}", "--corrupt", "what is in the box"], "needs the clean image"),
        (["--image", "{clean}", "--mask", "1,2,3"], "--mask is a box x0,y0,x1,y1"),
        (["--image", "{clean}", "--mask", "0,0,4,4", "--mask-fill", "median"], "fill is 'mean'"),
        (["--image", "{clean}", "--blur", "0"], "the blur's sigma is positive"),
        (["--image", "{clean}", "--image-noise", "4", "--image-noise-seed", "-2"], "seed is 0"),
        (["--image", "/no/such.png", "--blur", "2"], "does not exist or is not a regular file"),
        (["--image", "{clean}", "--blur", "2", "--model", "tiny-random-gpt2"], "takes text (an"),
        (["--image", "{clean}", "--blur", "2", "--keep-size"], "--keep-size goes with"),
        (["--image", "{clean}", "--blur", "2", "--mask-fill", "0"], "--mask-fill goes with"),
        (["--image", "{clean}", "--blur", "2", "--image-noise-seed", "1"], "seed goes with"),
    ],
)
def test_the_cli_refuses_a_bad_image_patching_request_in_words(
    capsys, folder, png, tmp_path, flags, words
):
    clean = tmp_path / "clean.png"
    clean.write_bytes(png)
    flags = [flag.format(clean=clean) for flag in flags]
    model = [] if "--model" in flags else ["--model", str(folder)]
    argv = ["patch", *model, "--text", PROMPT, *flags, "--answer", ANSWER, "--device", "cpu"]
    assert main([*argv, "--components", "residual", "--estimators", "exact"]) == 2
    error = capsys.readouterr().err
    assert words in error and "Traceback" not in error


def test_the_python_api_patches_a_corrupted_image_as_the_library_does(library, png, tmp_path):
    path = tmp_path / "picture.png"
    path.write_bytes(png)
    found = attrlab.patch(
        library, PROMPT, image=path, corruption=Noised(40.0, 3), answer=ANSWER, **STUDY
    )
    _assert_same_report(found.to_dict(), _library_report(library, png, Noised(40.0, 3)))
    with pytest.raises(InvalidInputError, match="needs the clean image"):
        attrlab.patch(library, PROMPT, corruption=Blurred(1.0), answer=ANSWER, **STUDY)


def test_an_image_patching_request_is_priced_and_refused_over_the_servers_seconds(library, png):
    request = PatchRequest(
        model="library",
        clean=PROMPT,
        image=png,
        image_corruption=Blurred(2.0),
        components=("residual",),
        estimators=("exact",),
    )
    with pytest.raises(TooSlowError, match="this patching study would take"):
        run_request(request, library, RequestBounds(max_seconds=1e-6))


def test_several_images_go_through_rest_the_cli_and_the_python_api_as_in_the_library(
    served, folder, library, png, capsys, tmp_path
):
    second = _random_png(1, 40, 24)
    answer = given_answer(library, ANSWER)
    prompt = library.preprocess(ImagePrompt([png, second], PROMPT))
    inputs = with_answer(library, prompt, answer)
    expected = explain(library, "gradient_x_input", inputs, answer_target(library, inputs, answer))
    encoded = [base64.b64encode(one).decode() for one in (png, second)]
    response = served.post(
        "/api/v1/explain",
        json={**_body(folder, png, text=PROMPT, answer=ANSWER), "image_base64": encoded},
    )
    assert response.status_code == 200, response.text
    paths = [tmp_path / "first.png", tmp_path / "second.png"]
    for path, data in zip(paths, (png, second), strict=True):
        path.write_bytes(data)
    common = ["explain", "--model", str(folder), "--method", "gradient_x_input", "--device", "cpu"]
    images = ["--image", str(paths[0]), "--image", str(paths[1])]
    assert main([*common, *images, "--text", PROMPT, "--answer", ANSWER, "--format", "json"]) == 0
    python = attrlab.explain(
        library, image=paths, text=PROMPT, method="gradient_x_input", answer=ANSWER
    )
    assert isinstance(python, Explanation)
    for found in (response.json(), json.loads(capsys.readouterr().out), python.to_dict()):
        np.testing.assert_allclose(found["scores"], expected.scores, rtol=1e-5, atol=1e-9)
        for number, size in ((1, (HEIGHT, WIDTH)), (2, (40, 24))):
            heat = np.array(found["maps"][f"image_heatmap_{number}"], dtype=float)
            assert heat.shape == size
            key = f"image_heatmap_{number}"
            np.testing.assert_allclose(heat, expected.maps[key], rtol=1e-5, atol=1e-9)
        metrics = found["metrics"]
        total = metrics["image_1_share"] + metrics["image_2_share"] + metrics["text_share"]
        assert total == pytest.approx(1.0)
    # each image is decoded on its own, and named when it is not base64
    refused = served.post(
        "/api/v1/explain",
        json={**_body(folder, png, text=PROMPT), "image_base64": [encoded[0], "not base64!"]},
    )
    assert refused.status_code == 400 and "image_base64 is not valid base64" in refused.text
