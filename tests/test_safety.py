"""
The bad-input table: each class of hostile or mistaken input, through the REST API and the CLI,
with the exact status (or exit code), error code and message; plus the server settings.
"""

from __future__ import annotations

import base64
import io
import os
import struct
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings, SettingsError
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import UnknownModelError
from attrlab.attribution.request import ExplainRequest

TEXT_MODEL = "tiny-random-bert"
IMAGE_MODEL = "tiny-random-vit"


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def header_bomb(width: int, height: int) -> bytes:
    """A valid 1×1 PNG whose header is rewritten to claim ``width``×``height`` pixels."""
    data = bytearray(png(np.zeros((1, 1), dtype=np.uint8)))
    chunk = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data[8:33] = struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return bytes(data)


SMALL_PNG = png(np.full((8, 8, 3), 200, dtype=np.uint8))
NOISE_PNG = png(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
CUT_PNG = NOISE_PNG[: len(NOISE_PNG) // 2]  # header intact, pixel data cut off


def _encoded(fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format=fmt)
    return buffer.getvalue()


TGA = _encoded("TGA")  # Pillow reads it, but it is not one of the formats we accept


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def server_settings():
    return ServerSettings.for_server(
        {},
        models=frozenset({TEXT_MODEL, IMAGE_MODEL}),
        max_text_chars=1000,
        max_image_pixels=100_000,
        max_body_bytes=200_000,
        max_forward_passes=1000,
    )


@pytest.fixture(scope="module")
def client(server_settings):
    worker = ExplainWorker(device="cpu", settings=server_settings)
    with TestClient(create_app(worker)) as c:
        yield c
    worker.close()


def _text(**extra):
    return {"model": TEXT_MODEL, "method": "gradient_x_input", "text": "fine words", **extra}


def _ig(**params):
    return _text(method="integrated_gradients", params=params)


def _image(data: bytes, **extra):
    return {"model": IMAGE_MODEL, "method": "gradient_x_input", "image_base64": b64(data), **extra}


REST_CASES = [
    # Inputs are data, never paths; the modality is explicit and checked.
    (
        _text(model=IMAGE_MODEL, text="/etc/hosts"),
        400,
        "invalid_input",
        f"model '{IMAGE_MODEL}' takes an image as input, but the request gives text",
    ),
    (
        _text(model=IMAGE_MODEL, text="/no/such/file.png"),
        400,
        "invalid_input",
        f"model '{IMAGE_MODEL}' takes an image as input, but the request gives text",
    ),
    (
        _image(SMALL_PNG, model=TEXT_MODEL),
        400,
        "invalid_input",
        f"model '{TEXT_MODEL}' takes text as input, but the request gives an image",
    ),
    (_text(text="  \n\t "), 400, "invalid_input", "the text is empty"),
    (
        {"model": TEXT_MODEL, "method": "gradient_x_input"},
        400,
        "invalid_input",
        "give exactly one input: a text or an image",
    ),
    (
        {**_text(), "image_base64": b64(SMALL_PNG)},
        400,
        "invalid_input",
        "give exactly one input: a text or an image",
    ),
    # Hostile and broken images.
    (_image(b"definitely not an image"), 400, "invalid_input", "the data is not a readable image"),
    (_image(TGA), 400, "invalid_input", "the data is not a readable image (expected PNG, JPEG"),
    (_image(b""), 400, "invalid_input", "the image is empty (0 bytes)"),
    (
        {**_image(b""), "image_base64": "%%%"},
        400,
        "invalid_input",
        "image_base64 is not valid base64",
    ),
    (
        _image(header_bomb(60_000, 60_000)),
        413,
        "input_too_large",
        "the image header claims 3,600 megapixels, above the limit of 0.1 megapixels",
    ),
    (
        _image(header_bomb(400, 300)),
        413,
        "input_too_large",
        "image is 400×300 = 0.12 megapixels, above the limit of 0.1 megapixels",
    ),
    (_image(CUT_PNG), 400, "invalid_input", "the image could not be decoded"),
    # Sizes.
    (
        _text(text="word " * 300),
        413,
        "input_too_large",
        "the text has 1500 characters; this server accepts at most 1000",
    ),
    # Models and methods.
    (_text(model="no-such-model"), 404, "unknown_model", "model 'no-such-model' is not served"),
    (_text(model="/etc"), 404, "unknown_model", "model '<path>' is not served here"),
    (_text(model="bert-base/uncased"), 404, "unknown_model", "is not served here"),
    (_text(model="minilm-zeroshot"), 404, "unknown_model", "is not served here"),
    (_text(model="/x/a\x00b"), 404, "unknown_model", "is not served here"),
    (_text(method="no_such_method"), 404, "unknown_method", "unknown method 'no_such_method'"),
    (_text(method="gradcam"), 400, "method_not_applicable", "gradcam"),
    # Parameters, targets, labels.
    (
        _ig(colour="red"),
        422,
        "invalid_parameter",
        "unknown parameter(s) colour",
    ),
    (
        _ig(n_steps=1),
        422,
        "invalid_parameter",
        "parameter 'n_steps' must be between 2 and 2000; got 1",
    ),
    (
        _ig(n_steps="many"),
        422,
        "invalid_parameter",
        "parameter 'n_steps' must be of type int",
    ),
    # JSON is typed: no text parsed into a number (the CLI parses), no fraction taken as an int
    # (a whole 8.0 is one, as JSON Schema counts it: tests/test_safety_space.py).
    (
        _ig(n_steps="8"),
        422,
        "invalid_parameter",
        "parameter 'n_steps' must be of type int; got '8'",
    ),
    (
        _ig(n_steps=8.5),
        422,
        "invalid_parameter",
        "parameter 'n_steps' must be of type int; got 8.5",
    ),
    (_ig(n_steps=True), 422, "invalid_parameter", "parameter 'n_steps' must be of type int"),
    (_text(text="\u200b"), 400, "invalid_input", "the text gives this model no token to explain"),
    (
        {**_image(NOISE_PNG, method="sobol"), "params": {"grid": 32, "n_designs": 1024}},
        422,
        "over_budget",
        # 1024·(32² + 2) Sobol passes and the prediction's own forward pass
        "this request needs 1,050,625 forward passes; this server allows at most 1,000 per "
        "request: lower n_designs or grid",
    ),
    (
        {**_image(NOISE_PNG, method="occlusion"), "params": {"window": 1, "stride": 1}},
        422,
        "over_budget",
        "this request needs 1,026 forward passes",  # 32² windows + 1, and the prediction
    ),
    (
        _ig(n_steps=1000),
        422,
        "invalid_parameter",
        "parameter 'n_steps' = 1000 is above this server's limit of 500 for integrated_gradients",
    ),
    (_text(target=7), 400, "invalid_input", "target index 7 is out of range"),
    (_text(target="neutral"), 400, "invalid_input", "unknown target label 'neutral'"),
    (_text(labels=["a", "b"]), 400, "invalid_input", "has a fixed classification head"),
    # Request shape.
    (_text(seed=-1), 422, "invalid_request", "body.seed"),
    (_text(seed=2**70), 422, "invalid_request", "body.seed"),
    (_text(seed=632.5), 422, "invalid_request", "body.seed: Input should be a valid integer"),
    (_text(seed="632"), 422, "invalid_request", "body.seed: Input should be a valid integer"),
    (_text(prams={}), 422, "invalid_request", "body.prams: Extra inputs are not permitted"),
    ({"method": "gradient_x_input", "image": "x"}, 422, "invalid_request", "body.image"),
    (_text(next_token=True), 400, "invalid_input", "a next-token explanation needs a decoder LM"),
]


@pytest.mark.parametrize(("body", "status", "code", "message"), REST_CASES)
def test_rest_bad_input_table(client, body, status, code, message):
    response = client.post("/api/v1/explain", json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and response.json()["error"]["code"] == code
    assert message in response.json()["error"]["message"]


def test_rest_transport_errors_are_json(client):
    too_big = client.post(
        "/api/v1/explain",
        content=b'{"text": "' + b"x" * 300_000 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(30):
            yield b"x" * 10_000

    chunked = client.post(
        "/api/v1/explain", content=chunks(), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 413 and "200000 bytes" in chunked.json()["error"]["message"]
    broken = client.post(
        "/api/v1/explain", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["error"]["code"] == "invalid_request"
    deep = client.post(  # past the JSON parser's nesting limit
        "/api/v1/explain",
        content=b"[" * 100_000 + b"]" * 100_000,
        headers={"content-type": "application/json"},
    )
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "invalid_request"
    for route in ("/api/v1/no/such/route", "/api/v1", "/api//v1/explain", "/api", "/v1"):
        unknown = client.get(route)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    assert client.head("/api/v1/health").status_code == 200
    wrong_verb = client.get("/api/v1/explain")
    assert wrong_verb.status_code == 405
    assert wrong_verb.json()["error"]["code"] == "method_not_allowed"


def test_a_lone_surrogate_is_refused_before_queueing_and_alone_in_a_batch(client):
    """JSON can carry one (an escape); no tokenizer can encode it."""

    def post(path: str, body: str):
        return client.post(path, content=body, headers={"content-type": "application/json"})

    single = post(
        "/api/v1/explain",
        f'{{"model": "{TEXT_MODEL}", "method": "gradient_x_input", "text": "ok \\ud800"}}',
    )
    assert single.status_code == 400, single.text
    assert single.json()["error"] == {
        "code": "invalid_input",
        "message": "the text is not valid Unicode: it holds a lone surrogate (U+D800) at "
        "character 3",
    }
    batch = post(
        "/api/v1/explain",
        f'{{"model": "{TEXT_MODEL}", "method": "gradient_x_input", '
        '"instances": [{"text": "fine words"}, {"text": "\\udfff"}]}',
    )
    assert batch.status_code == 200, batch.text
    good, bad = (e["gradient_x_input"] for e in batch.json()["explanations"])
    assert good["scores"] == client.post("/api/v1/explain", json=_text()).json()["scores"]
    assert bad["error"]["code"] == "invalid_input" and "U+DFFF" in bad["error"]["message"]
    model = post(
        "/api/v1/explain", '{"model": "m\\ud800", "method": "gradient_x_input", "text": "a"}'
    )
    assert model.status_code == 422 and model.json()["error"]["code"] == "invalid_request"


def test_the_page_api_reads_no_server_file(client, tmp_path):
    """A request naming a file on the server, as if uploaded, is refused alike for any path."""
    secret = tmp_path / "secret.png"
    secret.write_bytes(SMALL_PNG)
    answers = set()
    for path in (str(secret), str(tmp_path / "absent.png"), "/etc/hostname", str(tmp_path)):
        response = client.post(
            "/gradio_api/run/explain_image",
            json={
                "data": [
                    IMAGE_MODEL,
                    "",
                    {"path": path, "meta": {"_type": "gradio.FileData"}},
                    "",
                    ["gradient_x_input"],
                    False,
                    False,
                    0,
                    {},
                    False,
                    None,
                ]
            },
        )
        assert response.status_code != 200
        answers.add((response.status_code, response.text))
    assert len(answers) == 1  # nothing tells an existing file from an absent one
    (answer,) = answers
    assert "secret" not in answer[1] and "hostname" not in answer[1]


def test_every_path_has_the_body_limit(client):
    big = b'{"data": ["' + b"x" * 300_000 + b'"]}'
    for path in ("/gradio_api/run/explain_text", "/api/v1/explain", "/anything"):
        response = client.post(path, content=big, headers={"content-type": "application/json"})
        assert response.status_code == 413, path
        assert response.json()["error"]["code"] == "request_too_large"


def test_explicit_modality_in_the_library_adapters(load_model):
    from attrlab.attribution.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="got text where an image was expected"):
        load_model(IMAGE_MODEL).preprocess("/etc/hosts")
    with pytest.raises(InvalidInputError, match="expected text to tokenise; got bytes"):
        load_model(TEXT_MODEL).preprocess(SMALL_PNG)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"labels": [f"l{i}" for i in range(101)]}, "at most 100 labels"),
        ({"labels": ["x" * 201, "y"]}, "of at most 200 characters"),
        ({"target": "t" * 201}, "target is longer than 200"),
        ({"seed": -1}, "seed must be a whole number from 0 to 4294967295"),
        ({"seed": None}, "seed must be a whole number"),
        ({"text": "w" * 1001}, "accepts at most 1000"),
        ({"text": "fine \udbff"}, r"the text is not valid Unicode: .* \(U\+DBFF\) at character 5"),
        ({"target": "\ud800"}, r"the target is not valid Unicode"),
        ({"labels": ["yes", "n\udfffo"]}, r"a label is not valid Unicode: .* at character 1"),
    ],
)
def test_request_bounds_hold_for_every_front_end(server_settings, fields, message):
    """The worker checks them before queueing, so the page is bounded like the REST API."""
    from attrlab.attribution.errors import InvalidInputError

    worker = ExplainWorker(device="cpu", settings=server_settings)
    try:
        request = ExplainRequest(
            model=TEXT_MODEL, method="gradient_x_input", **{"text": "fine", **fields}
        )
        with pytest.raises(InvalidInputError, match=message):
            worker.submit(request)
        assert worker.status()["queued"] == 0
    finally:
        worker.close()


def test_queue_full_answers_429_and_recovers(server_settings):
    from dataclasses import replace

    worker = ExplainWorker(device="cpu", settings=replace(server_settings, max_queue=1))
    with TestClient(create_app(worker)) as c:
        gate = threading.Event()
        worker._lanes[0].executor.submit(gate.wait)  # keep the worker busy
        first = worker.submit(ExplainRequest(model=TEXT_MODEL, method="gradient_x_input", text="a"))
        response = c.post("/api/v1/explain", json=_text())
        assert response.status_code == 429 and response.headers["retry-after"] == "5"
        assert response.json()["error"]["code"] == "queue_full"
        gate.set()
        first.result(timeout=60)
        assert c.post("/api/v1/explain", json=_text()).status_code == 200
    worker.close()


def test_bearer_token_guards_the_api_but_not_health(server_settings):
    from dataclasses import replace

    worker = ExplainWorker(device="cpu", settings=replace(server_settings, api_token="s3cret"))
    with TestClient(create_app(worker)) as c:
        assert c.get("/api/v1/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            denied = c.post("/api/v1/explain", json=_text(), headers=headers)
            assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
            assert denied.json()["error"]["code"] == "unauthorized"
        ok = c.post("/api/v1/explain", json=_text(), headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/api/v1/status").status_code == 401
        assert c.get("/api/v1/health").json() == {"status": "ok"}  # no model names, no paths
        assert "401" in str(c.get("/openapi.json").json()["paths"]["/api/v1/explain"])
    worker.close()


# The CLI reads the files its user names, and only those; everything else is refused alike.
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    paths = {
        "cat": folder / "cat.png",
        "notes": folder / "notes.png",
        "bomb": folder / "bomb.png",
        "cut": folder / "cut.png",
    }
    paths["cat"].write_bytes(png(np.full((40, 40, 3), 90, dtype=np.uint8)))
    paths["notes"].write_text("just text")
    paths["bomb"].write_bytes(header_bomb(60_000, 60_000))
    paths["cut"].write_bytes(CUT_PNG)
    return {name: str(path) for name, path in paths.items()} | {"folder": str(folder)}


CLI_CASES = [
    (["--text", "   "], "the text is empty"),
    (["--text", "hi", "--model", "no-such-alias"], "not a built-in alias"),
    (["--text", "hi", "--method", "nope"], "unknown method 'nope'"),
    (["--text", "hi", "--param", "n_steps=0"], "'n_steps' must be between 2"),
    (["--text", "hi", "--param", "colour=red"], "unknown parameter"),
    (["--text", "hi", "--param", "oops"], "key=value"),
    (["--text", "hi", "--target", "7"], "out of range"),
    (["--text", "hi", "--target", "neutral"], "unknown target label 'neutral'"),
    (["--text", "hi", "--labels", "a,b"], "has a fixed classification head"),
    (
        ["--text", "hi", "--model", IMAGE_MODEL],
        f"model '{IMAGE_MODEL}' takes an image as input, but the request gives text",
    ),
    (
        ["--image", "{cat}", "--model", TEXT_MODEL],
        f"model '{TEXT_MODEL}' takes text as input, but the request gives an image",
    ),
    (["--image", "/no/such/file.png"], "does not exist or is not a regular file"),
    (["--image", "{folder}"], "does not exist or is not a regular file"),
    (["--image", "/dev/zero"], "does not exist or is not a regular file"),
    (["--image", "{notes}"], "the data is not a readable image"),
    (["--image", "{bomb}"], "the image header claims 3,600 megapixels"),
    (["--image", "{cut}"], "the image could not be decoded"),
]


@pytest.mark.parametrize(("argv", "message"), CLI_CASES)
def test_cli_bad_input_table(capsys, files, argv, message):
    argv = [a.format(**files) for a in argv]
    if "--model" not in argv:
        argv += ["--model", IMAGE_MODEL if "--image" in argv else TEXT_MODEL]
    assert main(["explain", "--method", "integrated_gradients", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_console_script_fails_cleanly_on_a_bomb(files):
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "attrlab.app.cli",
            "explain",
            "--method",
            "gradient_x_input",
            "--image",
            files["bomb"],
            "--model",
            IMAGE_MODEL,
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "megapixels" in bad.stderr


# Server settings: what is served is decided from the spec's text alone.
def test_model_policy(tmp_path):
    root = tmp_path / "models"
    (root / "mine").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "escape").symlink_to(tmp_path / "elsewhere")
    settings = ServerSettings.for_server({}, model_roots=(root.resolve(),))
    assert settings.model_source("minilm-zeroshot") == "builtin"
    assert settings.model_source(str(root / "mine")) == "local"
    assert settings.model_source(str(root / "not-yet")) == "local"
    refusals = set()
    for spec in (
        str(root / "escape"),  # a link out of the root
        str(root / ".." / "elsewhere"),
        "models/mine",  # relative paths are never resolved against the server's folder
        str(tmp_path / "elsewhere"),
        str(tmp_path / "absent"),
        "org/model",  # hub ids only when allowed
    ):
        with pytest.raises(UnknownModelError) as refused:
            settings.model_source(spec)
        refusals.add(str(refused.value).replace(spec, "SPEC"))
    assert len(refusals) == 1  # existing and absent paths are refused in the same words
    hub = ServerSettings.for_server({"ATTRLAB_ALLOW_HUB": "yes"})
    assert hub.model_source("org/model") == "hub"
    assert hub.model_source("hf-hub:timm/resnet18.a1_in1k") == "hub"
    for spec in ("../org", "org/../x", "/abs/path", "a/b/c"):
        with pytest.raises(UnknownModelError):
            hub.model_source(spec)
    assert ServerSettings.unrestricted().model_source("/anything") == "any"


def test_settings_from_environment():
    env = {
        "ATTRLAB_MODELS": "tiny-random-bert, org/model",
        "ATTRLAB_PARAM_LIMITS": "n_masks=100,rise.grid=4",
        "ATTRLAB_MAX_TEXT_CHARS": "50",
        "ATTRLAB_API_TOKEN": "t",
    }
    settings = ServerSettings.for_server(env)
    assert settings.models == {"tiny-random-bert", "org/model"}
    assert settings.model_source("org/model") == "listed"
    assert settings.param_limits["n_masks"] == 100 and settings.param_limits["n_steps"] == 500
    settings.check_params("sobol", {"grid": 8})  # the rise-only limit does not apply
    with pytest.raises(Exception, match="limit of 4 for rise"):
        settings.check_params("rise", {"grid": 8})
    assert settings.api_token == "t" and settings.max_text_chars == 50
    for bad in (
        {"ATTRLAB_MAX_QUEUE": "many"},
        {"ATTRLAB_ALLOW_HUB": "perhaps"},
        {"ATTRLAB_PARAM_LIMITS": "n_masks"},
        {"ATTRLAB_PARAM_LIMITS": "n_masks=-1"},
    ):
        with pytest.raises(SettingsError):
            ServerSettings.for_server(bad)


def test_server_defaults_accept_every_method_default():
    """Budgets never refuse a request that leaves a method's parameters at their defaults."""
    from attrlab.attribution.methods import available_methods
    from attrlab.attribution.request.params import validate_params

    settings = ServerSettings.for_server({})
    for method in available_methods():
        settings.check_params(method.name, validate_params(method.params, {}))


def test_serve_refuses_bad_settings_with_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("ATTRLAB_MAX_QUEUE", "zero")
    assert main(["serve", "--port", "1"]) == 2
    assert "ATTRLAB_MAX_QUEUE must be a positive whole number" in capsys.readouterr().err


def test_model_roots_and_hub_ids_end_to_end(tmp_path, monkeypatch, load_model):
    """A folder under a root is served; a hub id is never read from a local folder."""
    original = load_model(TEXT_MODEL)
    root = tmp_path / "models"
    for folder in (root / "mine", tmp_path / "org" / "model"):
        original.model.save_pretrained(folder)
        original.tokenizer.save_pretrained(folder)
    monkeypatch.chdir(tmp_path)  # "org/model" now also names a local folder
    settings = ServerSettings.for_server({}, model_roots=(root.resolve(),), allow_hub=True)
    worker = ExplainWorker(device="cpu", settings=settings)
    try:
        served = worker.explain(
            ExplainRequest(model=str(root / "mine"), method="gradient_x_input", text="fine words")
        )
        expected = worker.explain(
            ExplainRequest(model=TEXT_MODEL, method="gradient_x_input", text="fine words")
        )
        np.testing.assert_allclose(served.scores, expected.scores, rtol=1e-6, atol=1e-9)
        with pytest.raises(UnknownModelError, match="could not be fetched from the Hugging Face"):
            worker.adapter("org/model")  # offline: the hub is asked, the folder is not read
    finally:
        worker.close()


def test_a_closed_worker_answers_503(server_settings):
    worker = ExplainWorker(device="cpu", settings=server_settings)
    with TestClient(create_app(worker)) as c:
        worker.close()
        response = c.post("/api/v1/explain", json=_text())
    assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
