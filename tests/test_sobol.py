"""Sobol attribution: the Jansen estimator on known functions, toy signals, EfficientNet."""

from __future__ import annotations

import json

import _perturbation_toys as toys
import numpy as np
import pytest
from scipy.stats import qmc

from attrlab import attribution
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.methods.sobol import (
    jansen_total_order,
    sobol_design,
    split_outputs,
    total_order_indices,
)
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import output_target

ISHIGAMI_TOTAL = np.array([0.5576, 0.4424, 0.2437])  # a = 7, b = 0.1 (analytic)


def ishigami(u: np.ndarray, a: float = 7.0, b: float = 0.1) -> np.ndarray:
    x = -np.pi + 2 * np.pi * u  # inputs uniform on [-π, π]
    return np.sin(x[:, 0]) + a * np.sin(x[:, 1]) ** 2 + b * x[:, 2] ** 4 * np.sin(x[:, 0])


@pytest.mark.parametrize("n_designs", [1024, 4096])
def test_ishigami_total_order_indices(n_designs):
    indices = total_order_indices(ishigami, 3, n_designs)
    assert np.abs(indices - ISHIGAMI_TOTAL).max() < 0.02


def test_additive_function_indices_are_squared_weights():
    weights = np.array([1.0, -2.0, 3.0, 0.5, 0.0])
    indices = total_order_indices(lambda u: u @ weights, 5, 1024)
    assert np.allclose(indices, weights**2 / np.sum(weights**2), atol=0.005)


def test_design_is_unscrambled_sobol_with_replicated_columns():
    design = sobol_design(4, 8)
    points = qmc.Sobol(8, scramble=False).random(8)
    a, b = design[:8], design[8:16]
    assert np.array_equal(a, points[:, :4]) and np.array_equal(b, points[:, 4:])
    assert not a[0].any()  # the all-zero first point is expected
    for i in range(4):
        c = design[16 + 8 * i : 16 + 8 * (i + 1)]
        assert np.array_equal(c[:, i], b[:, i])
        assert np.array_equal(np.delete(c, i, axis=1), np.delete(a, i, axis=1))


def test_jansen_matches_the_formula_and_guards_zero_variance():
    rng = np.random.default_rng(0)
    y_a, y_c = rng.normal(size=16), rng.normal(size=(3, 16))
    expected = [np.sum((y_a - row) ** 2) / (2 * 16 * np.var(y_a, ddof=1)) for row in y_c]
    assert np.allclose(jansen_total_order(y_a, y_c), expected)
    flat = jansen_total_order(np.full(16, 2.5), y_c)
    assert np.array_equal(flat, np.zeros(3))
    y = np.arange(8 * 5, dtype=float)
    split_a, split_c = split_outputs(y, 3, 8)
    assert np.array_equal(split_a, y[:8]) and np.array_equal(split_c[2], y[32:40])


@pytest.mark.parametrize("quadrant", ["top-right", "bottom-left"])
def test_toy_image_mass_lies_in_the_quadrant_the_model_reads(quadrant):
    adapter = toys.image_adapter(toys.QuadrantModel(quadrant))
    inputs = adapter.preprocess(toys.white_image())
    params = {"grid": 4, "n_designs": 32}
    explanation = attribution.explain(
        adapter, "sobol", inputs, target=output_target(adapter, 0), params=params
    )
    assert toys.in_quadrant(explanation.scores, quadrant)
    assert toys.quadrant_share(explanation.scores, quadrant) > 0.9
    assert explanation.timings.forward_passes == 1 + 32 * (16 + 2)
    assert explanation.maps["std_error"].shape == (32, 32)
    assert np.isfinite(explanation.metrics["noise_ratio"])


@pytest.mark.parametrize("kind", ["blur", "amplitude"])
def test_other_image_perturbations_find_the_quadrant(kind):
    adapter = toys.image_adapter(toys.QuadrantModel("bottom-right"))
    inputs = adapter.preprocess(toys.quadrant_colours_image())
    params = {"grid": 4, "n_designs": 16, "perturbation": kind}
    explanation = attribution.explain(
        adapter, "sobol", inputs, target=output_target(adapter, 0), params=params
    )
    assert toys.in_quadrant(explanation.scores, "bottom-right")


def test_zero_variance_gives_a_zero_map_and_a_warning():
    adapter = toys.image_adapter(toys.ConstantModel())
    inputs = adapter.preprocess(toys.white_image())
    explanation = attribution.explain(adapter, "sobol", inputs, params={"n_designs": 4})
    assert not explanation.scores.any() and np.isfinite(explanation.scores).all()
    assert np.isfinite(explanation.maps["std_error"]).all()
    assert any("zero variance" in w for w in explanation.warnings)


def test_toy_text_model_ranks_the_token_it_reads_first(load_model):
    adapter = toys.token_reader_adapter(load_model("tiny-random-bert").tokenizer, "wonderful")
    inputs = adapter.preprocess("the plot was wonderful but far too long")
    explanation = attribution.explain(
        adapter, "sobol", inputs, target=output_target(adapter, 0), params={"n_designs": 16}
    )
    assert inputs.tokens[int(np.argmax(explanation.scores))] == "wonderful"
    others = np.delete(explanation.scores, inputs.tokens.index("wonderful"))
    assert np.allclose(others, 0.0)  # the model ignores every other token


def test_tolerance_stops_in_doubling_blocks_and_agrees_with_four_times_the_designs():
    adapter = toys.image_adapter(toys.QuadrantModel("top-right"))
    inputs = adapter.preprocess(toys.quadrant_colours_image())
    params = {"grid": 4, "n_designs": 2048, "tolerance": 0.2}
    stopped = attribution.explain(
        adapter, "sobol", inputs, target=output_target(adapter, 0), params=params
    )
    used = int(stopped.metrics["designs_used"])
    assert used in (8, 16, 32, 64, 128, 256, 512, 1024) and not stopped.warnings
    assert stopped.metrics["top_decile_error"] <= 0.2
    assert stopped.timings.forward_passes == 1 + used * (16 + 2)  # the target's, then designs
    params = {"grid": 4, "n_designs": 4 * used}
    reference = attribution.explain(
        adapter, "sobol", inputs, target=output_target(adapter, 0), params=params
    )
    assert np.corrcoef(stopped.scores.ravel(), reference.scores.ravel())[0, 1] >= 0.9
    # the first `used` designs of the longer run are the stopped run's designs
    prefix = attribution.explain(
        adapter, "sobol", inputs, output_target(adapter, 0), {"grid": 4, "n_designs": used}
    )
    np.testing.assert_allclose(stopped.scores, prefix.scores, rtol=1e-12, atol=1e-15)


def test_tolerance_not_reached_within_the_cap_warns_and_needs_a_bootstrap():
    adapter = toys.image_adapter(toys.ConstantModel())  # no structure: the error never falls
    inputs = adapter.preprocess(toys.white_image())
    params = {"grid": 2, "n_designs": 32, "tolerance": 0.2}
    explanation = attribution.explain(adapter, "sobol", inputs, params=params)
    assert explanation.metrics["designs_used"] == 32
    assert explanation.timings.forward_passes == 1 + 32 * (4 + 2)
    assert any("did not reach tolerance 0.2" in w for w in explanation.warnings)
    # a flat map has no finite relative error: JSON carries it as null
    assert explanation.metrics["top_decile_error"] == float("inf")
    wire = json.loads(json.dumps(explanation.to_dict(), allow_nan=False))
    assert wire["metrics"]["top_decile_error"] is None
    assert np.isnan(Explanation.from_dict(wire).metrics["top_decile_error"])
    with pytest.raises(InvalidParameterError, match="set bootstrap to 2 or more"):
        attribution.explain(adapter, "sobol", inputs, params={**params, "bootstrap": 0})


def test_same_seed_same_map():
    adapter = toys.image_adapter(toys.QuadrantModel("top-left"))
    inputs = adapter.preprocess(toys.white_image())
    params = {"grid": 3, "n_designs": 8}
    first = attribution.explain(
        adapter, "sobol", inputs, params=params, settings=RunSettings(seed=1)
    )
    again = attribution.explain(
        adapter, "sobol", inputs, params=params, settings=RunSettings(seed=1)
    )
    assert np.array_equal(first.scores, again.scores)
    assert np.array_equal(first.maps["std_error"], again.maps["std_error"])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n_designs": 24}, "'n_designs' must be a power of two"),
        ({"n_designs": 0}, "'n_designs' must be between 2"),
        ({"grid": 1}, "'grid' must be between 2"),
        ({"perturbation": "smudge"}, "'perturbation' must be one of"),
        ({"segments": "slic"}, "segments=slic applies to an image and a prompt; use segments=grid"),
    ],
)
def test_bad_parameters_give_clear_errors(params, message):
    adapter = toys.image_adapter(toys.QuadrantModel("top-left"))
    inputs = adapter.preprocess(toys.white_image())
    with pytest.raises(InvalidParameterError, match=message):
        attribution.explain(adapter, "sobol", inputs, params=params)


def test_efficientnet_cat_in_corner(effnet: Adapter):
    """At g=4 and 16 designs (289 forwards) Sobol puts nearly all its mass on the cat."""
    inputs = effnet.preprocess(toys.chelsea_in_corner())
    params = {"grid": 4, "n_designs": 16, "batch_size": 16}  # the cat's quadrant is 2×2 cells
    explanation = attribution.explain(effnet, "sobol", inputs, params=params)
    assert explanation.target.index in toys.CAT_CLASSES
    assert toys.in_quadrant(explanation.scores, "top-left")
    assert toys.quadrant_share(explanation.scores, "top-left") > 0.85
