"""
Model folders under a server's model roots: every file a loader would open must stay inside the
roots, and a folder whose files are malformed is a 400 naming the file, never a 500, through
the REST app, a live ``attrlab serve --model-root`` on one keep-alive connection, and the CLI.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _live_server import running_server
from fastapi.testclient import TestClient
from PIL import Image

from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.request import ExplainRequest

TEXT_MODEL = "tiny-random-bert"
#: Written into every file planted outside the root: it must never appear in an answer.
PLANTED = "attrlab-planted-7f3a91"
DEEP = "[" * 100_000 + "]" * 100_000


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _write_config(folder: Path, **changes) -> None:
    (folder / "config.json").write_text(json.dumps({**_config(folder), **changes}))


def _link_out(name: str) -> Callable[[Path, Path], None]:
    """Replace the folder's file ``name`` by a link to a copy outside the roots (planted)."""

    def mutate(folder: Path, outside: Path) -> None:
        planted = outside / f"{folder.name}-{name}"
        shutil.copyfile(folder / name, planted)
        if name.endswith(".json"):  # still a valid file of its kind, now holding the marker
            planted.write_text(json.dumps({**json.loads(planted.read_text()), PLANTED: PLANTED}))
        (folder / name).unlink()
        (folder / name).symlink_to(planted)

    return mutate


def _linked_subfolder(folder: Path, outside: Path) -> None:
    target = outside / f"{folder.name}-extra"
    target.mkdir()
    (target / "notes.txt").write_text(PLANTED)
    (folder / "extra").symlink_to(target, target_is_directory=True)


def _link_inside_a_subfolder(folder: Path, outside: Path) -> None:
    (outside / "notes.txt").write_text(PLANTED)
    (folder / "extra").mkdir()
    (folder / "extra" / "notes.txt").symlink_to(outside / "notes.txt")


def _shards_outside(folder: Path, outside: Path, absolute: bool) -> None:
    """Move the weights out and give the folder a shard index naming them there."""
    from safetensors import safe_open

    weights = outside / f"{folder.name}.safetensors"
    shutil.move(folder / "model.safetensors", weights)
    with safe_open(str(weights), "pt") as opened:
        keys = list(opened.keys())
    name = str(weights) if absolute else os.path.relpath(weights, folder)
    index = {"metadata": {}, "weight_map": dict.fromkeys(keys, name)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _config_is_a_folder(folder: Path, _: Path) -> None:
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()


def _config_without_model_type(folder: Path, _: Path) -> None:
    config = _config(folder)
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))


def _config_of_20_mib(folder: Path, _: Path) -> None:
    """A good config padded with whitespace: JSON a loader would read whole."""
    text = json.dumps(_config(folder))
    (folder / "config.json").write_text(text[:-1] + " " * (20 * 2**20) + "}")


def _a_pipe_in_a_subfolder(folder: Path, _: Path) -> None:
    (folder / "extra").mkdir()
    os.mkfifo(folder / "extra" / "stream")


def _ten_thousand_and_one_files(folder: Path, _: Path) -> None:
    """Every request for a folder that does not load walks it again: the walk is bounded."""
    (folder / "cache").mkdir()
    for number in range(10_001 - len(list(folder.iterdir()))):
        (folder / "cache" / f"{number}.txt").touch()


#: name -> (how the folder is spoilt, the words of the 400 error)
BROKEN: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "config-not-json": (
        lambda f, _: (f / "config.json").write_text("{not json"),
        "model folder file 'config.json': not JSON",
    ),
    "config-nested-too-deeply": (
        lambda f, _: (f / "config.json").write_text(DEEP),
        "model folder file 'config.json': not JSON (nested too deeply to read)",
    ),
    "config-a-list": (
        lambda f, _: (f / "config.json").write_text("[1, 2]"),
        "model folder file 'config.json' is not a JSON object",
    ),
    "config-not-utf8": (
        lambda f, _: (f / "config.json").write_bytes(b"\xff\xfe{}"),
        "model folder file 'config.json' is not UTF-8 text",
    ),
    "config-without-model-type": (
        _config_without_model_type,
        "model folder file 'config.json' names no model_type",
    ),
    "config-is-a-folder": (_config_is_a_folder, "the model folder has no file 'config.json'"),
    "config-too-large": (
        _config_of_20_mib,
        "model folder file 'config.json' is 20 MiB; a model folder's JSON files are read up to "
        "16 MiB",
    ),
    "a-shard-index-that-is-a-pipe": (  # reading it would wait for a writer for ever
        lambda f, _: os.mkfifo(f / "model.safetensors.index.json"),
        "model folder file 'model.safetensors.index.json' is not a regular file",
    ),
    "ten-thousand-and-one-entries": (
        _ten_thousand_and_one_files,
        "the model folder holds more than 10,000 files and folders",
    ),
    "a-pipe-in-a-subfolder": (
        _a_pipe_in_a_subfolder,
        "model folder file 'extra/stream' is not a regular file",
    ),
    "config-field-of-the-wrong-type": (
        lambda f, _: _write_config(f, hidden_size="wide"),
        "its config.json is not a configuration transformers can read",
    ),
    "config-of-2000-layers": (  # its size check would build 2,000 layers' skeleton first
        lambda f, _: _write_config(f, num_hidden_layers=2000),
        "model folder file 'config.json' asks for num_hidden_layers = 2,000; at most 1,024 are "
        "served",
    ),
    "config-larger-than-its-weights": (  # transformers would fill the missing layers at random
        lambda f, _: _write_config(f, num_hidden_layers=1000),
        "model folder file 'config.json' describes a model of ",
    ),
    "timm-architecture-from-the-hub": (
        lambda f, _: (f / "config.json").write_text('{"architecture": "hf-hub:timm/resnet18"}'),
        "model folder file 'config.json' names an architecture that is not one of timm's models",
    ),
    "tokenizer-config-a-list": (
        lambda f, _: (f / "tokenizer_config.json").write_text("[1]"),
        "could not be loaded",
    ),
    "weights-not-safetensors": (
        lambda f, _: (f / "model.safetensors").write_bytes(b"garbage" * 10),
        "could not be loaded",
    ),
    "config-links-out": (
        _link_out("config.json"),
        "model folder file 'config.json' links outside the model roots",
    ),
    "tokenizer-links-out": (
        _link_out("tokenizer.json"),
        "model folder file 'tokenizer.json' links outside the model roots",
    ),
    "weights-link-out": (
        _link_out("model.safetensors"),
        "model folder file 'model.safetensors' links outside the model roots",
    ),
    "a-linked-subfolder-out": (
        _linked_subfolder,
        "model folder file 'extra' links outside the model roots",
    ),
    "a-link-out-in-a-subfolder": (
        _link_inside_a_subfolder,
        "model folder file 'extra/notes.txt' links outside the model roots",
    ),
    "a-dangling-link": (
        lambda f, _: (f / "gone.json").symlink_to("/nonexistent/attrlab/gone.json"),
        "model folder file 'gone.json' links outside the model roots",
    ),
    "shards-named-out-relative": (
        lambda f, o: _shards_outside(f, o, absolute=False),
        "model folder file 'model.safetensors.index.json' names a weight file outside",
    ),
    "shards-named-out-absolute": (
        lambda f, o: _shards_outside(f, o, absolute=True),
        "model folder file 'model.safetensors.index.json' names a weight file outside",
    ),
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory, load_model):
    """``(root, outside)``: a good folder, one spoilt folder per BROKEN row, a linked one."""
    base = tmp_path_factory.mktemp("model-roots")
    root, outside = base / "root", base / "outside"
    outside.mkdir()
    original = load_model(TEXT_MODEL)
    good = root / "good"
    original.model.save_pretrained(good)
    original.tokenizer.save_pretrained(good)
    for name, (spoil, _) in BROKEN.items():
        shutil.copytree(good, root / name)
        spoil(root / name, outside)
    # Links between folders inside the roots (as a hub cache's snapshots) are served.
    linked = root / "linked"
    linked.mkdir()
    for file in good.iterdir():
        (linked / file.name).symlink_to(file)
    return root.resolve(), outside.resolve()


@pytest.fixture(scope="module")
def client(roots, tmp_path_factory):
    settings = ServerSettings.for_server(
        {}, model_roots=(roots[0],), data_dir=tmp_path_factory.mktemp("data")
    )
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as c:
        yield c
    worker.close()


def _body(model: str) -> dict:
    return {"model": model, "method": "gradient_x_input", "text": "fine words"}


@pytest.fixture(scope="module")
def expected_scores(load_model) -> list[float]:
    """The built-in model's own scores: what each folder saved from it must give."""
    worker = ExplainWorker(device="cpu")
    try:
        request = ExplainRequest(model=TEXT_MODEL, method="gradient_x_input", text="fine words")
        return list(worker.explain(request).scores)
    finally:
        worker.close()


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_spoilt_model_folder_is_a_400_naming_the_file(client, roots, expected_scores, name):
    root, outside = roots
    response = client.post("/api/v1/explain", json=_body(str(root / name)))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "model_not_loadable"
    assert BROKEN[name][1] in error["message"]
    assert PLANTED not in response.text
    assert str(outside) not in response.text and str(root) not in response.text
    follow = client.post("/api/v1/explain", json=_body(str(root / "good")))
    assert follow.status_code == 200
    np.testing.assert_allclose(follow.json()["scores"], expected_scores, rtol=1e-5)


def test_links_that_stay_inside_the_roots_are_served(client, roots, expected_scores):
    response = client.post("/api/v1/explain", json=_body(str(roots[0] / "linked")))
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["scores"], expected_scores, rtol=1e-5)
    assert client.post("/api/v1/explain", json=_body(str(roots[0] / "config-not-json"))).is_error


def test_a_timm_folder_under_a_root_is_served(tmp_path):
    """A timm classifier saved as a folder (config naming its architecture, its weights)."""
    import timm
    from safetensors.torch import save_file

    root = tmp_path / "root"
    folder = root / "resnet"
    folder.mkdir(parents=True)
    model = timm.create_model("test_resnet", pretrained=False)
    save_file(model.state_dict(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"architecture": "test_resnet"}))
    size = timm.data.resolve_data_config({}, model=model)["input_size"][1:]
    hub_named = root / "hub-named"
    shutil.copytree(folder, hub_named)
    (hub_named / "config.json").write_text('{"architecture": "local-dir:' + str(folder) + '"}')
    settings = ServerSettings.for_server({}, model_roots=(root.resolve(),), data_dir=tmp_path)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), "teal").save(buffer, format="PNG")
    image = base64.b64encode(buffer.getvalue()).decode()
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as c:
        body = {"model": str(folder), "method": "gradient_x_input", "image_base64": image}
        served = c.post("/api/v1/explain", json=body)
        refused = c.post("/api/v1/explain", json={**body, "model": str(hub_named)})
    worker.close()
    assert served.status_code == 200, served.text
    assert np.asarray(served.json()["scores"]).shape == tuple(size)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == BROKEN["timm-architecture-from-the-hub"][1]


def test_the_command_line_names_a_malformed_config(roots, capsys):
    """Unrestricted use reads any folder, but a malformed config is a clear error there too."""
    for name in ("config-not-json", "config-a-list", "tokenizer-config-a-list"):
        argv = ["explain", "--model", str(roots[0] / name), "--method", "gradient_x_input"]
        assert main([*argv, "--text", "fine words"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attrlab: error: ") and "Traceback" not in err
        assert BROKEN[name][1] in err


@pytest.fixture
def live_server(roots, tmp_path):
    """``attrlab serve --model-root ROOT`` on a free loopback port: ``(port, its log)``."""
    env = {**os.environ, "ATTRLAB_DATA": str(tmp_path)}
    log = tmp_path / "server.log"
    with running_server(env, log, "--model-root", str(roots[0])) as (port, _):
        yield port, log


@pytest.mark.server
def test_refusals_keep_the_connection_of_a_live_server(live_server, roots, expected_scores):
    port, log = live_server
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(model: str) -> tuple[int, dict, str]:
        connection.request(
            "POST",
            "/api/v1/explain",
            body=json.dumps(_body(model)),
            headers={"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read()), response.getheader("connection", "")

    status, answer, _ = post(str(roots[0] / "good"))
    assert status == 200
    socket_name = connection.sock.getsockname()  # the client's end of the one connection
    for name in (
        "config-not-json",
        "config-links-out",
        "weights-link-out",
        "shards-named-out-relative",
    ):
        status, answer, closing = post(str(roots[0] / name))
        assert status == 400 and BROKEN[name][1] in answer["error"]["message"]
        assert PLANTED not in json.dumps(answer) and closing.lower() != "close"
        status, answer, _ = post(str(roots[0] / "good"))
        assert status == 200
        np.testing.assert_allclose(answer["scores"], expected_scores, rtol=1e-5)
        assert connection.sock is not None and connection.sock.getsockname() == socket_name
    connection.close()
    assert "Traceback" not in log.read_text()
