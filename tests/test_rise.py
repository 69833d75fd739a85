"""RISE: estimator, toy signals, reproducibility, noise report, the embedded EfficientNet."""

from __future__ import annotations

import _perturbation_toys as toys
import numpy as np
import pytest
import torch

from attrlab import attribution
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.masks import ShiftedGridMasks
from attrlab.attribution.methods.rise import MIN_MASKS_BEFORE_STOPPING
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import output_target

SMALL = {"n_masks": 400, "grid": 4}


@pytest.fixture(scope="module")
def tokenizer(load_model):
    return load_model("tiny-random-bert").tokenizer


@pytest.mark.parametrize("quadrant", ["top-left", "bottom-right", "top-right"])
def test_toy_image_map_peaks_in_the_quadrant_the_model_reads(quadrant):
    adapter = toys.image_adapter(toys.QuadrantModel(quadrant))
    inputs = adapter.preprocess(toys.white_image())
    explanation = attribution.explain(
        adapter, "rise", inputs, target=output_target(adapter, 0), params=SMALL
    )
    assert toys.in_quadrant(explanation.scores, quadrant)


def test_map_equals_the_estimator_written_out():
    """S = Σ f(I⊙M)·M / (N·p) with f = probabilities, for the same masks."""
    model = toys.QuadrantModel("bottom-left")
    adapter = toys.image_adapter(model)
    inputs = adapter.preprocess(toys.white_image())
    params = {"n_masks": 50, "grid": 3, "p": 0.3, "seed": 11}
    explanation = attribution.explain(
        adapter, "rise", inputs, target=output_target(adapter, 0), params=params
    )
    masks = ShiftedGridMasks(
        50, 3, 0.3, (32, 32), torch.Generator().manual_seed(11), adapter.device
    )
    stack = masks.batch(0, 50)
    with torch.no_grad():
        probs = model(inputs.pixel_values * stack[:, None]).softmax(-1)[:, 0].double()
    terms = probs[:, None, None] * stack.double() / 0.3  # one estimate per mask
    assert np.allclose(explanation.scores, terms.mean(0).numpy(), atol=1e-6)
    std_error = terms.std(0, unbiased=True) / np.sqrt(50)
    assert np.allclose(explanation.maps["std_error"], std_error.numpy(), atol=1e-6)


def test_constant_output_shift_shifts_the_map_by_that_constant():
    base = toys.image_adapter(toys.QuadrantModel("top-left"))
    shifted = toys.image_adapter(toys.QuadrantModel("top-left", shift=3.0))
    inputs = base.preprocess(toys.white_image())
    params = {**SMALL, "output": "logit"}
    plain = attribution.explain(
        base, "rise", inputs, target=output_target(base, 0), params=params
    ).scores
    moved = attribution.explain(
        shifted, "rise", inputs, target=output_target(shifted, 0), params=params
    ).scores
    difference = moved - plain
    assert abs(difference.mean() - 3.0) < 0.15  # c · mean mask / p ≈ c
    assert np.abs(difference - 3.0).max() < 0.6
    doubled = toys.image_adapter(toys.QuadrantModel("top-left", scale=8.0, bias=-8.8))
    twice = attribution.explain(
        doubled, "rise", inputs, target=output_target(doubled, 0), params=params
    ).scores
    assert np.allclose(twice, 2 * plain, rtol=1e-5, atol=1e-6)  # linear in f


@pytest.mark.parametrize("kind", ["mask", "pad", "delete"])
def test_toy_text_model_ranks_the_token_it_reads_first(tokenizer, kind):
    adapter = toys.token_reader_adapter(tokenizer, "wonderful")
    inputs = adapter.preprocess("the plot was wonderful but far too long")
    params = {"n_masks": 200, "text_perturbation": kind}
    explanation = attribution.explain(
        adapter, "rise", inputs, target=output_target(adapter, 0), params=params
    )
    assert inputs.tokens[int(np.argmax(explanation.scores))] == "wonderful"
    special = inputs.special_tokens.numpy()
    assert not explanation.scores[special].any()  # never hidden, so no score


def test_a_short_texts_map_is_the_expectation_over_every_mask(load_model):
    """Few enough tokens: every keep pattern once, weighted by its probability (no sampling)."""
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("a fine small cat")
    free = [i for i, special in enumerate(inputs.special_tokens.tolist()) if not special]
    n, p = len(free), 0.3
    params = {"n_masks": 2**n, "p": p, "text_perturbation": "mask"}
    target = output_target(adapter, 1)
    explanation = attribution.explain(adapter, "rise", inputs, target=target, params=params)
    # written out: S_i = Σ over the 2^n subsets kept of P(subset) · f(x with the rest masked)
    # · [i kept] / p, f the class-1 probability
    expected = np.zeros(inputs.input_ids.shape[1])
    mask_id = adapter.tokenizer.mask_token_id
    for code in range(2**n):
        kept = [free[j] for j in range(n) if code >> j & 1]
        ids = inputs.input_ids.clone()
        for i in set(free) - set(kept):
            ids[0, i] = mask_id
        with torch.no_grad():
            logits = adapter.model(input_ids=ids, attention_mask=inputs.attention_mask).logits
        f = float(logits.double().softmax(-1)[0, 1])
        weight = p ** len(kept) * (1 - p) ** (n - len(kept))
        for i in kept:
            expected[i] += weight * f / p
    assert np.allclose(explanation.scores, expected, atol=1e-6)
    assert explanation.timings.forward_passes == 2**n + 1  # the patterns and the prediction
    assert explanation.metrics["exact_expectation"] == 1.0
    assert not explanation.maps["std_error"].any()
    reseeded = attribution.explain(
        adapter, "rise", inputs, target=target, params=params, settings=RunSettings(seed=9)
    )
    assert np.array_equal(reseeded.scores, explanation.scores)  # nothing was drawn
    sampled = attribution.explain(
        adapter, "rise", inputs, target=target, params={**params, "n_masks": 2**n - 1}
    )
    assert sampled.metrics["exact_expectation"] == 0.0 and sampled.maps["std_error"].any()
    asked = attribution.explain(
        adapter, "rise", inputs, target=target, params={**params, "every_pattern": False}
    )
    assert asked.metrics["exact_expectation"] == 0.0 and asked.timings.forward_passes == 2**n + 1
    # with a tolerance, only as many patterns as the masks a sampled run may stop at
    tolerant = attribution.explain(
        adapter, "rise", inputs, target=target, params={**params, "tolerance": 0.5}
    )
    assert tolerant.metrics["exact_expectation"] == float(2**n <= MIN_MASKS_BEFORE_STOPPING)
    assert tolerant.metrics["top_decile_error"] == 0.0


def test_same_seed_same_map_other_seed_other_map():
    adapter = toys.image_adapter(toys.QuadrantModel("top-left"))
    inputs = adapter.preprocess(toys.white_image())
    first = attribution.explain(
        adapter, "rise", inputs, params=SMALL, settings=RunSettings(seed=5)
    ).scores
    again = attribution.explain(
        adapter, "rise", inputs, params=SMALL, settings=RunSettings(seed=5)
    ).scores
    other = attribution.explain(
        adapter, "rise", inputs, params=SMALL, settings=RunSettings(seed=6)
    ).scores
    rebatched = attribution.explain(
        adapter, "rise", inputs, params={**SMALL, "batch_size": 7}, settings=RunSettings(seed=5)
    ).scores
    own_seed = attribution.explain(
        adapter, "rise", inputs, params={**SMALL, "seed": 5}, settings=RunSettings(seed=123)
    ).scores
    assert np.array_equal(first, again)
    assert np.allclose(first, rebatched, atol=1e-9)  # masks do not depend on the batch size
    assert np.array_equal(first, own_seed)
    assert not np.allclose(first, other)


def test_noise_report_shrinks_with_more_masks():
    adapter = toys.image_adapter(toys.QuadrantModel("top-right"))
    inputs = adapter.preprocess(toys.white_image())
    few = attribution.explain(adapter, "rise", inputs, params={"n_masks": 50, "grid": 4})
    many = attribution.explain(adapter, "rise", inputs, params={"n_masks": 800, "grid": 4})
    ratio = few.maps["std_error"].mean() / many.maps["std_error"].mean()
    assert 2.5 < ratio < 6.0  # about sqrt(800 / 50) = 4
    assert few.metrics["noise_ratio"] > many.metrics["noise_ratio"] > 0


def test_slic_superpixels_as_mask_basis(tokenizer):
    adapter = toys.image_adapter(toys.QuadrantModel("bottom-right"))
    inputs = adapter.preprocess(toys.quadrant_colours_image())
    params = {"n_masks": 300, "segments": "slic", "n_segments": 16}
    explanation = attribution.explain(
        adapter, "rise", inputs, target=output_target(adapter, 0), params=params
    )
    assert toys.in_quadrant(explanation.scores, "bottom-right")
    text = toys.token_reader_adapter(tokenizer, "good")
    with pytest.raises(InvalidParameterError, match="segments=slic applies to images"):
        attribution.explain(text, "rise", text.preprocess("good"), params={"segments": "slic"})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n_masks": 0}, "'n_masks' must be between 1"),
        ({"grid": 1}, "'grid' must be between 2"),
        ({"p": 0.0}, "'p' must be strictly between 0.0 and 1.0"),
        ({"p": 1.0}, "'p' must be strictly between"),
        ({"p": 1.5}, "'p' must be strictly between"),
        ({"perturbation": "smudge"}, "'perturbation' must be one of"),
    ],
)
def test_bad_parameters_give_clear_errors(params, message):
    adapter = toys.image_adapter(toys.QuadrantModel("top-left"))
    inputs = adapter.preprocess(toys.white_image())
    with pytest.raises(InvalidParameterError, match=message):
        attribution.explain(adapter, "rise", inputs, params=params)


@pytest.mark.slow
def test_efficientnet_cat_in_corner(effnet: Adapter):
    """The cat fills the top-left quadrant; two 1000-mask RISE maps agree and peak there."""
    inputs = effnet.preprocess(toys.chelsea_in_corner())
    params = {"n_masks": 1000, "batch_size": 16}
    first = attribution.explain(effnet, "rise", inputs, params=params, settings=RunSettings(seed=0))
    second = attribution.explain(
        effnet, "rise", inputs, params=params, settings=RunSettings(seed=1)
    )
    assert first.target.index in toys.CAT_CLASSES
    for explanation in (first, second):
        assert toys.in_quadrant(explanation.scores, "top-left")
    correlation = np.corrcoef(first.scores.ravel(), second.scores.ravel())[0, 1]
    assert correlation > 0.7
    kept = {k for k in first.maps if k.startswith("class_")}
    assert kept == {f"class_{p.index}" for p in first.predictions}  # top-5, target included
    assert np.array_equal(first.maps[f"class_{first.target.index}"], first.scores)
    assert first.maps["std_error"].shape == (224, 224)
    assert 0 < first.metrics["noise_ratio"] < 1


def test_tolerance_stops_early_and_agrees_with_four_times_the_masks():
    """
    The estimate at the stopping point against an independent run at 4× its masks.

    The stopping rule reads only the estimator's own standard error, so a toy at the default
    7×7 grid stands in for a real CNN: like EfficientNet on the corner cat (2,016 masks) it
    stops after about 2,000 masks, and the bar is one that a map stopped at the first check
    misses.
    """
    adapter = toys.image_adapter(toys.QuadrantModel("top-right"))
    inputs = adapter.preprocess(toys.white_image())
    stopped = attribution.explain(
        adapter, "rise", inputs, params={"tolerance": 0.18, "n_masks": 8000}
    )
    used = int(stopped.metrics["masks_used"])
    assert used < 8000 and stopped.metrics["top_decile_error"] <= 0.18
    assert not stopped.warnings
    assert stopped.timings.forward_passes == used + 1  # every mask's pass + the prediction
    reference = attribution.explain(
        adapter, "rise", inputs, params={"n_masks": 4 * used}, settings=RunSettings(seed=1)
    )
    assert np.corrcoef(stopped.scores.ravel(), reference.scores.ravel())[0, 1] >= 0.9
    first = {"n_masks": MIN_MASKS_BEFORE_STOPPING}
    first_check = attribution.explain(adapter, "rise", inputs, params=first)
    assert np.corrcoef(first_check.scores.ravel(), reference.scores.ravel())[0, 1] < 0.9


def test_tolerance_not_reached_within_the_cap_warns(effnet):
    from skimage import data

    inputs = effnet.preprocess(data.chelsea())  # the cat fills the frame: a flat, noisy map
    e = attribution.explain(effnet, "rise", inputs, params={"tolerance": 0.05, "n_masks": 256})
    assert e.metrics["masks_used"] == 256
    assert e.metrics["top_decile_error"] > 0.05
    (warning,) = e.warnings
    assert "did not reach tolerance 0.05" in warning


def test_top_decile_error_of_a_map_written_out():
    from attrlab.attribution.inputs.perturb import top_decile_error

    saliency = np.zeros(100)
    saliency[:10] = 1.0  # centred: the top decile deviates by 0.9, the rest by 0.1
    std_error = np.full(100, 0.09)
    assert top_decile_error(saliency, std_error) == pytest.approx(0.1)
    assert top_decile_error(np.full(100, 3.0), std_error) == float("inf")  # no structure
