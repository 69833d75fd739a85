"""
Placement from the command line and a server's settings: set once by the operator, never by a
request; maps equal the undispatched model's, and the server says where each model is.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from test_placement import LLAMA_MAP, TEXT

from attrlab.app.batch import BatchConfig
from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings, SettingsError, placement_setting
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.explain import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.models.loading import load
from attrlab.attribution.models.placement import Placement, private_offload

MODEL = "tiny-random-llama"


@pytest.fixture(scope="module")
def plain_map():
    """The undispatched model's gradient × input map of its top next token."""
    plain = load(MODEL, device="cpu")
    return explain(plain, "gradient_x_input", plain.preprocess(TEXT))


def test_explain_with_a_device_map_gives_the_undispatched_map(capsys, tmp_path, plain_map):
    argv = ["explain", "--model", MODEL, "--method", "gradient_x_input", "--next-token"]
    argv += ["--text", TEXT, "--format", "json", "--offload-folder", str(tmp_path)]
    code = main([*argv, "--device-map", json.dumps(LLAMA_MAP)])
    assert code == 0
    got = Explanation.from_json(capsys.readouterr().out)
    assert got.target.index == plain_map.target.index
    np.testing.assert_allclose(got.scores, plain_map.scores, rtol=1e-5, atol=1e-6)
    assert list(tmp_path.iterdir()) == []  # the command's offloaded layers are gone with it


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device-map", "everywhere"], "--device-map: device_map 'everywhere' is not one of"),
        (["--device-map", "{'a': 0}"], "--device-map: the device_map: not JSON"),
        (["--device-map", '["auto"]'], "--device-map: device_map '[\"auto\"]' is not one of"),
        (["--device-map", '{"lm_head": "gpu"}'], "--device-map: device_map['lm_head'] = 'gpu'"),
        (["--device-map", '{"lm_head": "disk"}'], "--offload-folder: a device_map with 'disk'"),
        (["--quantization", "3bit"], "--quantization: quantization '3bit' is not one of"),
    ],
)
def test_bad_placement_flags_exit_2_naming_the_flag(capsys, flags, message):
    argv = ["explain", "--model", MODEL, "--method", "gradient_x_input", "--text", TEXT]
    assert main([*argv, *flags]) == 2
    assert capsys.readouterr().err.startswith(f"attrlab: error: {message}")


def test_an_offload_folder_that_cannot_be_made_exits_2(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["layers", "--model", MODEL, "--text", TEXT, "--offload-folder", str(blocker / "x")]
    assert main(argv) == 2
    assert "--offload-folder: the offload folder" in capsys.readouterr().err


def _env(tmp_path, **placement: str) -> dict[str, str]:
    names = {f"ATTRLAB_{k.upper()}": v for k, v in placement.items()}
    return {"ATTRLAB_DATA": str(tmp_path / "data"), "ATTRLAB_MODELS": MODEL, **names}


def test_a_placed_server_serves_the_undispatched_map_and_says_where_models_are(tmp_path, plain_map):
    offload = tmp_path / "offload"
    env = _env(tmp_path, device_map=json.dumps(LLAMA_MAP), offload_folder=str(offload))
    worker = ExplainWorker(settings=ServerSettings.for_server(env))
    try:
        with TestClient(create_app(worker)) as client:
            body = {"model": MODEL, "method": "gradient_x_input", "text": TEXT}
            response = client.post("/api/v1/explain", json={**body, "next_token": True})
            assert response.status_code == 200, response.text
            got = Explanation.from_dict(response.json())
            np.testing.assert_allclose(got.scores, plain_map.scores, rtol=1e-5, atol=1e-6)
            status = client.get("/api/v1/status").json()
            where = {"devices": ["cpu"], "disk": True, "quantization": None}
            assert status["placements"] == {MODEL: where}
            assert str(offload) not in json.dumps(status)  # no server path goes out
            layers = [p.name for p in offload.rglob("*.dat")]  # in the private folder
            assert "model.layers.0.mlp.up_proj.weight.dat" in layers
            # a request cannot place a model: not as a field, nor as a method parameter
            for extra in (
                {"offload_folder": "/tmp/x"},
                {"device_map": "auto"},
                {"params": {"device_map": {"": "disk"}}},
            ):
                refused = client.post("/api/v1/explain", json={**body, **extra})
                assert refused.status_code == 422, refused.text
                assert refused.json()["error"]["code"] in ("invalid_request", "invalid_parameter")
    finally:
        worker.close()
    assert list(offload.iterdir()) == []  # the server's offloaded layers removed when it stops


def test_bad_placement_settings_refuse_to_start(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [
        ({"device_map": "everywhere"}, "ATTRLAB_DEVICE_MAP: device_map 'everywhere'"),
        ({"offload_folder": str(blocker)}, "ATTRLAB_OFFLOAD_FOLDER: the offload folder"),
        ({"device_map": '{"lm_head": "disk"}'}, "--offload-folder (ATTRLAB_OFFLOAD_FOLDER): a"),
        ({"quantization": "3bit"}, "ATTRLAB_QUANTIZATION: quantization '3bit'"),
    ]
    for placement, message in cases:
        with pytest.raises(SettingsError) as refused:
            ServerSettings.for_server(_env(tmp_path, **placement))
        assert str(refused.value).startswith(message)
    # built-in models are built in memory: bitsandbytes cannot quantise them as they load
    env = {**_env(tmp_path, quantization="8bit"), "ATTRLAB_MODELS": f"{MODEL},org/model"}
    with pytest.raises(SettingsError, match=f"'{MODEL}' is a built-in model"):
        ServerSettings.for_server(env)
    # `attrlab serve`'s flags win over the environment, and a refusal names the flag
    with pytest.raises(SettingsError, match=r"^--quantization: quantization '2bit'"):
        placement_setting({"ATTRLAB_QUANTIZATION": "8bit"}, {"quantization": "2bit"})
    flagged = placement_setting({"ATTRLAB_DEVICE_MAP": "auto"}, {"device_map": "sequential"})
    assert flagged == Placement("sequential")


def test_the_private_offload_folder_goes_also_after_an_error_and_after_a_dead_process(tmp_path):
    orphan = tmp_path / ".offload-999999999-abc"  # a process id no process has
    orphan.mkdir()
    placement = Placement(LLAMA_MAP, tmp_path)
    with pytest.raises(RuntimeError, match="inside"), private_offload(placement) as private:
        with private_offload(placement) as other:  # another worker on the same folder
            assert other.offload_folder != private.offload_folder
        assert private.offload_folder.parent == tmp_path
        (private.offload_folder / "layer.dat").write_bytes(b"0")
        raise RuntimeError("inside")
    assert list(tmp_path.iterdir()) == []


def test_a_ray_actor_gets_the_batch_placement(tmp_path, monkeypatch):
    from attrlab.app.engine_ray import ExplainActor

    monkeypatch.setenv("ATTRLAB_ACTOR_THREADS", str(torch.get_num_threads()))  # as it was
    config = BatchConfig(MODEL, ("gradient_x_input",), placement=Placement(LLAMA_MAP, tmp_path))
    actor = ExplainActor(asdict(config))  # as Ray hands it over
    try:
        assert actor.config == config
        assert actor.worker.settings.placement == config.placement
        assert actor.worker.placement.offload_folder.parent == tmp_path
    finally:
        actor.worker.close()


def test_a_batch_output_is_not_resumed_with_other_weights(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "the cat sat"}\n')
    out = tmp_path / "out.jsonl"
    argv = ["batch", "--model", "tiny-random-bert", "--methods", "gradient_x_input"]
    argv += ["--input", str(data), "--output", str(out)]
    assert main(argv) == 0
    rows = out.read_text()
    assert main([*argv, "--quantization", "8bit"]) == 2  # 8-bit weights give other maps
    assert "made with quantization None; this run asks for '8bit'" in capsys.readouterr().err
    assert out.read_text() == rows
