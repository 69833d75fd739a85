"""Explanation JSON / npz round trips and parameter validation."""

from __future__ import annotations

import json
from typing import cast

import numpy as np
import pandas as pd
import pytest

import attrlab.viz
from attrlab.attribution import rendering
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.explanation import (
    Explanation,
    ModelInfo,
    Prediction,
    TargetValues,
    Timings,
)
from attrlab.attribution.request.params import Param, power_of_two, validate_params
from attrlab.attribution.verdicts import Verdict


def _full_explanation() -> Explanation:
    rng = np.random.default_rng(1)
    layers = pd.DataFrame(
        {
            "layer": [0, 0, 1],
            "head": [None, 2, None],
            "kv_head": [None, 1, None],
            "component": ["block", "head", "block"],
            "measure": ["residual_relevance", "head_gradient", "residual_relevance"],
            "value": [0.5, 1 / 3, np.pi],
        }
    )
    return Explanation(
        model=ModelInfo("tiny-random-bert", "abc123", "text"),
        method="integrated_gradients",
        params={"n_steps": 50, "baseline": "pad", "internal_batch_size": None},
        target=TargetValues(1, "LABEL_1", 0.123456789012345, 0.5),
        predictions=[Prediction(1, "LABEL_1", 0.5), Prediction(0, "LABEL_0", 0.5)],
        scores=rng.normal(size=5).astype(np.float32),
        tokens=["[CLS]", "a", "b", "c", "[SEP]"],
        token_texts=["[CLS]", "A", " b", " c", "[SEP]"],
        positional_scores=rng.normal(size=5),
        layers=layers,
        maps={"std_error": rng.random(5)},
        metrics={"convergence_delta": 1e-7},
        timings=Timings(1.5, 53, 50),
        seed=7,
        versions={"torch": "x"},
        warnings=["the text was truncated"],
        verdicts=[
            Verdict("lrp_conservation", "relevance accounted", "pass", 1e-7, 1e-3, "accounted"),
            Verdict("randomisation", "randomisation", "inconclusive", None, 0.3, "constant", "x"),
        ],
    )


def _assert_same(a: Explanation, b: Explanation) -> None:
    assert a.to_json() == b.to_json()
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.positional_scores, b.positional_scores)
    pd.testing.assert_frame_equal(a.layers, b.layers)


def test_json_round_trip_is_lossless():
    original = _full_explanation()
    text = original.to_json()
    restored = Explanation.from_json(text)
    _assert_same(original, restored)
    data = json.loads(text)
    assert set(data) >= {
        "schema_version",
        "model",
        "method",
        "params",
        "target",
        "predictions",
        "tokens",
        "token_texts",
        "image_size",
        "scores",
        "positional_scores",
        "layers",
        "metrics",
        "timings",
        "seed",
        "versions",
        "verdicts",
    }
    assert restored.verdicts == original.verdicts
    assert data["verdicts"][0]["status"] == "pass" and data["verdicts"][1]["value"] is None
    assert data["layers"][0]["head"] is None and data["layers"][1]["head"] == 2
    assert data["target"]["logit"] == 0.123456789012345


def test_npz_round_trip_keeps_arrays_and_metadata(tmp_path):
    original = _full_explanation()
    path = tmp_path / "e.npz"
    original.save_npz(path)
    _assert_same(original, Explanation.load_npz(path))


def test_npz_keeps_float32_where_that_is_exact_and_float64_elsewhere(tmp_path):
    original = _full_explanation()  # its scores came from float32, its other arrays did not
    original.maps["edges"] = np.array([np.nan, np.inf, -0.0, 0.5])  # each exact in float32
    original.maps["fine"] = np.array([0.5, 1e-320])  # below float32's smallest: not exact
    original.maps["huge"] = np.array([1e300])  # beyond float32's range
    path = tmp_path / "e.npz"
    original.save_npz(path)
    with np.load(path) as stored:
        dtypes = {name: stored[name].dtype for name in stored.files if name != "meta"}
    assert dtypes == {
        "scores": np.float32,
        "positional_scores": np.float64,
        "map__std_error": np.float64,
        "map__edges": np.float32,
        "map__fine": np.float64,
        "map__huge": np.float64,
    }
    restored = Explanation.load_npz(path)
    _assert_same(original, restored)
    assert restored.scores.dtype == np.float64
    for name, array in original.maps.items():
        assert restored.maps[name].dtype == np.float64
        np.testing.assert_array_equal(restored.maps[name], array)
    assert np.signbit(restored.maps["edges"][2])  # -0.0 kept


def test_a_json_leaving_its_arrays_to_the_npz_beside_it(tmp_path):
    original = _full_explanation()
    original.save_npz(tmp_path / "e.npz")
    original.save_json(tmp_path / "e.json", arrays="e.npz")
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["arrays"] == "e.npz" and not {"scores", "positional_scores", "maps"} & set(data)
    assert data["target"]["logit"] == 0.123456789012345  # the rest as in to_json
    _assert_same(original, Explanation.load(tmp_path / "e.json"))
    _assert_same(original, Explanation.load(tmp_path / "e.npz"))
    with pytest.raises(ValueError, match=r"'e.npz'.*Explanation.load"):
        Explanation.from_json((tmp_path / "e.json").read_text())
    original.save_json(tmp_path / "whole.json")  # without: to_json's whole text
    _assert_same(original, Explanation.load(tmp_path / "whole.json"))
    for elsewhere in ("../e.npz", "/tmp/e.npz", "", ".."):
        with pytest.raises(ValueError, match="beside the JSON"):
            original.save_json(tmp_path / "x.json", arrays=elsewhere)
        (tmp_path / "x.json").write_text(json.dumps({**data, "arrays": elsewhere}))
        with pytest.raises(ValueError, match="beside the JSON"):
            Explanation.load(tmp_path / "x.json")


def test_image_explanation_round_trip(tmp_path):
    original = _full_explanation()
    original.tokens, original.positional_scores, original.layers = None, None, None
    original.scores = np.arange(12.0).reshape(3, 4)
    original.image_size = (3, 4)
    restored = Explanation.from_json(original.to_json())
    assert restored.image_size == (3, 4) and restored.scores.shape == (3, 4)
    _assert_same_image = restored.to_json() == original.to_json()
    assert _assert_same_image


def test_params_defaults_coercion_and_errors():
    schema = (
        Param("n", "int", 8, "count", 1, 64, check=power_of_two),
        Param("p", "float", 0.5, "probability", 0.0, 1.0, exclusive=True),
        Param("mode", "str", "a", "mode", choices=("a", "b")),
        Param("flag", "bool", False, "flag"),
        Param("batch", "int", None, "automatic when missing", 1, 10),
    )
    assert validate_params(schema, None) == {
        "n": 8,
        "p": 0.5,
        "mode": "a",
        "flag": False,
        "batch": None,
    }
    assert validate_params(schema, {"n": "16", "p": "0.25", "flag": "yes"})["n"] == 16
    cases = [
        ({"n": 12}, "power of two"),
        ({"n": 128}, "between 1 and 64"),
        ({"p": 1.0}, "strictly between"),
        ({"p": "x"}, "type float"),
        ({"mode": "c"}, "one of a, b"),
        ({"flag": "maybe"}, "type bool"),
        ({"n": True}, "type int"),
        ({"zzz": 1}, "unknown parameter.*takes: n, p, mode, flag, batch"),
    ]
    for params, message in cases:
        with pytest.raises(InvalidParameterError, match=message):
            validate_params(schema, params)


def test_schema_1_layer_records_are_read():
    """Files written before kv_head/component existed load with the columns filled in."""
    data = _full_explanation().to_dict()
    data["schema_version"] = 1
    data["layers"] = [
        {"layer": 0, "head": None, "metric": "residual_relevance", "value": 0.5},
        {"layer": 0, "head": 3, "metric": "head_importance", "value": 0.25},
    ]
    layers = Explanation.from_dict(data).layers
    assert layers["measure"].tolist() == ["residual_relevance", "head_importance"]
    assert layers["component"].tolist() == ["block", "head"]
    assert layers["kv_head"].isna().all() and layers["head"].tolist()[1] == 3


class _Recorder:
    """A renderer that says what it was asked to draw."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def figures_for(self, explanation, image=None):
        self.asked.append(f"figures of {explanation.method}")
        return {"first": lambda: "drawn first", "second": lambda: "drawn second"}

    def explanation_html(self, explanation):
        return f"<p>{explanation.method}</p>"

    def comparison_html(self, check):
        return "<p>comparison</p>"


def test_an_explanation_draws_with_the_renderer_registered_and_viz_is_the_one_imported():
    assert rendering.renderer() is attrlab.viz  # `import attrlab` imports it: it registers
    e = _full_explanation()
    recorder = _Recorder()
    try:
        rendering.register_renderer(recorder)
        assert e.figures() == ["first", "second"]
        assert (e.figure(), e.figure("second")) == ("drawn first", "drawn second")
        with pytest.raises(ValueError, match="no figure 'third'"):
            e.figure("third")
        assert e._repr_html_() == f"<p>{e.method}</p>"
        assert recorder.asked == [f"figures of {e.method}"] * 4
    finally:
        rendering.register_renderer(cast(rendering.Renderer, attrlab.viz))
    assert rendering.renderer() is attrlab.viz
