"""
Faithfulness metrics on toy models whose right answer is known: a model that reads one image
quadrant, and one that reads one word.
"""

from __future__ import annotations

import io
import json
import threading

import numpy as np
import pandas as pd
import pytest
import torch
from _perturbation_toys import QUADRANTS, SIZE, QuadrantModel, image_adapter, token_reader_adapter
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.inputs.imputation import noisy_linear_imputation
from attrlab.attribution.metrics import (
    cascading_units,
    faithfulness,
    map_agreement,
    randomisation_check,
)
from attrlab.attribution.metrics.faithfulness import gaussian_blur
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import output_target


@pytest.fixture
def quadrant():
    return image_adapter(QuadrantModel("top-left"))


def _oracle() -> np.ndarray:
    scores = np.zeros((SIZE, SIZE))
    scores[QUADRANTS["top-left"]] = 1.0
    return scores + np.random.default_rng(0).random((SIZE, SIZE)) * 1e-3  # break ties


def _bright(adapter):
    image = np.full((SIZE, SIZE, 3), 40, dtype=np.uint8)
    image[QUADRANTS["top-left"]] = 255
    return adapter.preprocess(image)


def test_the_oracle_map_beats_random_and_its_inverse_on_deletion_and_insertion(quadrant):
    inputs = _bright(quadrant)
    good = faithfulness(
        quadrant, inputs, _oracle(), output_target(quadrant, 0), steps=16, random_orders=3
    ).metrics
    bad = faithfulness(
        quadrant, inputs, -_oracle(), output_target(quadrant, 0), steps=16, random_orders=0
    ).metrics
    assert good["deletion_morf_auc"] < good["deletion_random_auc"] < bad["deletion_morf_auc"]
    assert good["insertion_morf_auc"] > good["insertion_random_auc"] > bad["insertion_morf_auc"]
    # the least relevant first is the inverse map's most relevant first
    assert good["deletion_lerf_auc"] == pytest.approx(bad["deletion_morf_auc"])


def test_curve_endpoints_are_the_models_own_output(quadrant):
    inputs = _bright(quadrant)
    result = faithfulness(
        quadrant, inputs, _oracle(), output_target(quadrant, 0), steps=8, random_orders=2
    )
    with torch.no_grad():
        plain = float(quadrant.logits(**inputs.model_kwargs()).softmax(-1)[0, 0])
        blurred = gaussian_blur(inputs.pixel_values)
        start = float(quadrant.logits(pixel_values=blurred).softmax(-1)[0, 0])
        emptied = float(quadrant.logits(pixel_values=torch.zeros_like(blurred)).softmax(-1)[0, 0])
    for name, curve in result.curves.items():
        if name.startswith("deletion"):
            assert curve[0] == pytest.approx(plain) and curve[-1] == pytest.approx(emptied)
        else:
            assert curve[-1] == pytest.approx(plain) and curve[0] == pytest.approx(start)
        assert len(curve) == 9


def test_road_imputes_a_hidden_pixel_as_the_weighted_mean_of_its_neighbours():
    """ROAD's weights written out: edge neighbours 1/6, diagonal 1/12, off-image ones dropped."""
    image = np.arange(1.0, 10.0).reshape(1, 3, 3) ** 2
    centre = np.ones((3, 3), bool)
    centre[1, 1] = False
    x = image[0]
    expected = (x[0, 1] + x[1, 0] + x[1, 2] + x[2, 1]) / 6 + (
        x[0, 0] + x[0, 2] + x[2, 0] + x[2, 2]
    ) / 12
    out = noisy_linear_imputation(image, centre, 0.0, np.random.default_rng(0))
    assert out[0, 1, 1] == pytest.approx(expected)
    corner = np.ones((3, 3), bool)
    corner[0, 0] = False
    out = noisy_linear_imputation(image, corner, 0.0, np.random.default_rng(0))
    expected = (x[0, 1] / 6 + x[1, 0] / 6 + x[1, 1] / 12) / (5 / 12)
    assert out[0, 0, 0] == pytest.approx(expected)
    np.testing.assert_array_equal(np.delete(out.ravel(), 0), np.delete(image.ravel(), 0))


def test_road_restores_a_linear_ramp_and_adds_noise_of_the_given_scale():
    """Hidden pixels of an affine image, away from the border, are its own values (+ noise)."""
    rows, cols = np.mgrid[0:40, 0:30]
    image = np.stack([2.0 * rows + 3.0 * cols + 1.0, 0.5 * cols - rows]).astype(np.float64)
    keep = np.ones((40, 30), bool)
    keep[5:35, 4:26] = False
    exact = noisy_linear_imputation(image, keep, 0.0, np.random.default_rng(0))
    np.testing.assert_allclose(exact, image, atol=1e-9)
    noisy = noisy_linear_imputation(image, keep, 0.5, np.random.default_rng(1))
    deviation = (noisy - image)[:, ~keep]
    assert deviation.std() == pytest.approx(0.5, rel=0.05)
    np.testing.assert_array_equal(noisy[:, keep], image[:, keep])
    nothing = noisy_linear_imputation(image, np.zeros_like(keep), 0.0, np.random.default_rng(0))
    assert not nothing.any()  # no visible pixel: the normalised zero


def test_road_noise_follows_the_mask_not_the_batch_and_imputation_stops_when_cancelled():
    from attrlab.attribution.errors import JobCancelledError
    from attrlab.attribution.inputs.perturb import ImagePerturbation

    pixels = torch.rand(1, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    masks = (torch.rand(3, 12, 12, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    road = ImagePerturbation(pixels, "road", seed=4)
    together = road(masks)["pixel_values"]
    alone = torch.cat([road(masks[i : i + 1])["pixel_values"] for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=0, atol=0)  # as after an OOM retry
    assert not torch.equal(
        together, ImagePerturbation(pixels, "road", seed=5)(masks)["pixel_values"]
    )

    def cancelled() -> None:
        raise JobCancelledError("the job was cancelled")

    with pytest.raises(JobCancelledError):
        ImagePerturbation(pixels, "road", stop_if_cancelled=cancelled)(masks)


def test_road_keeps_the_oracle_ahead_of_random_and_the_endpoints_at_the_models_output(quadrant):
    inputs = _bright(quadrant)
    good = faithfulness(
        quadrant, inputs, _oracle(), output_target(quadrant, 0), 16, 3, image_fill="road"
    )
    bad = faithfulness(
        quadrant, inputs, -_oracle(), output_target(quadrant, 0), 16, 0, image_fill="road"
    ).metrics
    scores = good.metrics
    assert scores["deletion_morf_auc"] < scores["deletion_random_auc"] < bad["deletion_morf_auc"]
    assert scores["insertion_morf_auc"] > scores["insertion_random_auc"]
    assert scores["insertion_random_auc"] > bad["insertion_morf_auc"]
    with torch.no_grad():
        plain = float(quadrant.logits(**inputs.model_kwargs()).softmax(-1)[0, 0])
    for name, curve in good.curves.items():
        assert curve[0 if name.startswith("deletion") else -1] == pytest.approx(plain)
    # differs from RISE's fill: imputation, not the constant, replaces the hidden pixels
    rise = faithfulness(quadrant, inputs, _oracle(), output_target(quadrant, 0), 16, 0).metrics
    assert rise["deletion_morf_auc"] != pytest.approx(scores["deletion_morf_auc"])


def test_forward_passes_are_counted_and_batched(quadrant):
    run = RunContext()
    faithfulness(
        quadrant,
        _bright(quadrant),
        _oracle(),
        output_target(quadrant, 0),
        steps=4,
        random_orders=1,
        run=run,
    )
    assert run.forward_passes == 2 * 5 * (2 + 1)  # two kinds × 5 points × (MoRF, LeRF, random)


def test_gaussian_blur_is_the_rise_kernel_written_out():
    """RISE's gkern: gaussian_filter(σ=5) of an 11×11 delta, convolved with zero padding."""
    from scipy.ndimage import gaussian_filter

    delta = np.zeros((11, 11))
    delta[5, 5] = 1.0
    kernel = gaussian_filter(delta, 5)
    assert kernel.sum() == pytest.approx(1.0) and kernel.min() / kernel.max() > 0.85  # ~flat
    image = torch.from_numpy(np.random.default_rng(0).random((1, 1, 20, 20)))
    padded = np.pad(image[0, 0].numpy(), 5)
    expected = np.array(
        [[(padded[i : i + 11, j : j + 11] * kernel).sum() for j in range(20)] for i in range(20)]
    )
    np.testing.assert_allclose(gaussian_blur(image)[0, 0].numpy(), expected, rtol=1e-12)


def test_comprehensiveness_of_the_oracle_token_beats_random(load_model):
    tokenizer = load_model("tiny-random-bert").tokenizer
    adapter = token_reader_adapter(tokenizer, "cat")
    inputs = adapter.preprocess("the cat sat on a red mat today")
    scores = np.zeros(len(inputs.tokens))
    scores[inputs.tokens.index("cat")] = 1.0
    for removal in ("delete", "mask"):
        metrics = faithfulness(
            adapter,
            inputs,
            scores,
            output_target(adapter, 0),
            random_orders=4,
            text_removal=removal,
        )
        m = metrics.metrics
        # removing "cat" (the top 10-50 %) always drops p; random orders only sometimes do
        assert m["comprehensiveness"] > m["comprehensiveness_random"]
        assert m["sufficiency"] < m["sufficiency_random"]
        plain = metrics.curves["deletion_morf"][0]
        assert m["comprehensiveness"] == pytest.approx(plain - metrics.curves["deletion_morf"][1])
        assert m["sufficiency"] == pytest.approx(0.0, abs=1e-12)  # "cat" alone suffices


def test_scores_must_match_the_input(quadrant):
    with pytest.raises(InvalidInputError, match="do not match"):
        faithfulness(quadrant, _bright(quadrant), np.zeros((4, 4)), output_target(quadrant, 0))
    for bad, name in (({"image_fill": "zero"}, "image_fill"), ({"text_removal": "x"}, "removal")):
        with pytest.raises(InvalidParameterError, match=name):
            faithfulness(quadrant, _bright(quadrant), _oracle(), output_target(quadrant, 0), **bad)


def _small_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(128, 2),
    )
    return image_adapter(model)


def test_randomisation_decorrelates_a_gradient_map_but_not_a_model_free_map():
    adapter = _small_cnn()
    image = np.random.default_rng(1).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    inputs = adapter.preprocess(image)
    gradient = randomisation_check(
        adapter, lambda a: explain(a, "gradient_x_input", inputs, target=output_target(a, 0)).scores
    )
    brightness = randomisation_check(adapter, lambda a: inputs.pixel_values[0].sum(0).numpy())
    assert list(gradient["layer"]) == ["none", "6", "2", "0"]  # top layer first, cascading
    assert gradient["spearman"].iloc[-1] < 0.5 and gradient["spearman_abs"].iloc[-1] < 0.8
    assert (brightness["spearman"] == 1.0).all()


def test_randomisation_restores_the_model_exactly_even_on_error():
    adapter = _small_cnn()
    inputs = adapter.preprocess(np.zeros((SIZE, SIZE, 3), np.uint8))
    with torch.no_grad():
        before = adapter.logits(**inputs.model_kwargs()).clone()
    randomisation_check(adapter, lambda a: explain(a, "gradient_x_input", inputs).scores)
    calls = []

    def failing(a):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return np.arange(4.0)

    with pytest.raises(RuntimeError, match="boom"):
        randomisation_check(adapter, failing)
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits(**inputs.model_kwargs()), before, rtol=0, atol=0)


def test_transformers_cascade_from_the_head_down_to_the_embeddings(load_model):
    adapter = load_model("tiny-random-llama")
    names = [name for name, _ in cascading_units(adapter)]
    assert names == [
        "output (after the blocks)",
        "block 1",
        "block 0",
        "embeddings (before the blocks)",
    ]
    units = dict(cascading_units(adapter))
    head = adapter.model.get_output_embeddings().weight
    assert any(p is head for p in units["output (after the blocks)"].parameters())
    inputs = adapter.preprocess("the cat sat on the mat")
    with torch.no_grad():
        before = adapter.logits(**inputs.model_kwargs()).clone()
    table = randomisation_check(
        adapter, lambda a: explain(a, "attnlrp", inputs, target=output_target(a, 5)).scores
    )
    assert len(table) == 5 and table["spearman"].iloc[-1] < 0.9
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits(**inputs.model_kwargs()), before, rtol=0, atol=0)


def test_a_check_shares_one_budget_and_restores_the_model_when_cancelled(load_model):
    from attrlab.attribution.errors import BudgetExceededError, JobCancelledError
    from attrlab.attribution.metrics.check import check_methods

    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("the cat sat on the mat")
    with torch.no_grad():
        before = adapter.logits(**inputs.model_kwargs())
    seen = []
    methods, params = ["rise", "occlusion"], {"rise": {"n_masks": 40}}
    checked = check_methods(
        adapter,
        methods,
        inputs,
        params=params,
        settings=RunSettings(progress=lambda *p: seen.append(p)),
    )
    spent = sum(e.timings.forward_passes for e in checked.explanations.values())
    assert seen == [(1, 2), (2, 2)] and checked.randomisation.empty
    # one pass short of the whole check: the second method is refused, not the first
    with pytest.raises(BudgetExceededError, match=f"'occlusion' needs .* {spent - 1} this server"):
        check_methods(
            adapter,
            methods,
            inputs,
            params=params,
            settings=RunSettings(max_forward_passes=spent - 1),
        )
    check_methods(
        adapter, methods, inputs, params=params, settings=RunSettings(max_forward_passes=spent)
    )
    # a method that plans nothing is not started once the budget is spent
    with pytest.raises(BudgetExceededError, match="before 'rollout'"):
        rise_spent = checked.explanations["rise"].timings.forward_passes
        check_methods(
            adapter,
            ["rise", "rollout"],
            inputs,
            params=params,
            settings=RunSettings(max_forward_passes=rise_spent),
        )
    cancel = threading.Event()

    def cancel_after_the_second(done: int, total: int) -> None:
        if done == 2:  # inside the randomisation check, one layer randomised
            cancel.set()

    with pytest.raises(JobCancelledError):
        check_methods(
            adapter,
            ["gradient_x_input"],
            inputs,
            randomise=True,
            settings=RunSettings(progress=cancel_after_the_second, cancel=cancel),
        )
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits(**inputs.model_kwargs()), before, rtol=0, atol=0)


def test_an_undefined_agreement_is_null_in_json():
    from attrlab.attribution.metrics.check import MethodCheck

    table = map_agreement({"flat": np.ones(4), "ranked": np.arange(4.0)})
    record = MethodCheck({}, table, pd.DataFrame()).to_dict()["agreement"][0]
    assert record["spearman"] is None and record["top_k_overlap"] == 0.0  # {0} vs {3}
    assert json.loads(json.dumps(record, allow_nan=False)) == record


def test_a_vit_cascade_keeps_its_patch_embedding_for_last(load_model):
    adapter = load_model("tiny-random-vit")
    units = cascading_units(adapter)
    first, last = dict(units)["output (after the blocks)"], units[-1][1]
    patch = adapter.model.vit.embeddings.patch_embeddings.projection.weight
    assert not any(p is patch for p in first.parameters())
    assert any(p is patch for p in last.parameters())


@pytest.mark.slow
def test_leaderboard_runs_on_the_bundled_images_and_sentences(capsys, tmp_path):
    from attrlab.app.cli import main

    per_item = tmp_path / "items.csv"
    args = [
        "evaluate",
        "--model",
        "efficientnet-lite0",
        "--methods",
        "gradient_x_input,gradcam",
        "--steps",
        "8",
        "--random-orders",
        "1",
        "--per-item",
        str(per_item),
        "--format",
        "csv",
    ]
    assert main(args) == 0
    summary = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(summary.method) == ["gradient_x_input", "gradcam"]
    assert (summary["items"] == 4).all()  # the four bundled images
    rows = pd.read_csv(per_item)
    assert len(rows) == 8 and rows["deletion_morf_auc"].between(0, 1).all()
    # the default model and sentences; curves as short as the images' (the counts are the point)
    text_args = ["evaluate", "--methods", "gradient_x_input,attnlrp", "--format", "json"]
    assert main([*text_args, "--steps", "8", "--random-orders", "1"]) == 0
    text = pd.read_json(io.StringIO(capsys.readouterr().out))
    assert set(text.method) == {"gradient_x_input", "attnlrp"} and (text["items"] == 10).all()
    assert {"comprehensiveness", "sufficiency_wins"} <= set(text.columns)


def test_leaderboard_scores_with_road_imputation_and_refuses_an_unknown_fill(capsys):
    from attrlab.app.cli import main

    args = ["evaluate", "--model", "tiny-random-vit", "--methods", "gradient_x_input"]
    args += ["--max-items", "1", "--steps", "6", "--random-orders", "1", "--format", "json"]
    assert main([*args, "--image-fill", "road"]) == 0
    road = pd.read_json(io.StringIO(capsys.readouterr().out)).iloc[0]
    assert main(args) == 0
    rise = pd.read_json(io.StringIO(capsys.readouterr().out)).iloc[0]
    assert 0 <= road["deletion_morf_auc"] <= 1
    assert road["deletion_morf_auc"] != pytest.approx(rise["deletion_morf_auc"])
    assert main([*args, "--image-fill", "zero"]) == 2
    assert "image_fill must be one of rise, road" in capsys.readouterr().err


def test_summary_intervals_and_wins_are_computed_from_the_rows():
    from attrlab.attribution.metrics import summarise

    rows = pd.DataFrame(
        {
            "item": list("abcd"),
            "method": ["m"] * 4,
            "comprehensiveness": [0.4, 0.5, 0.6, 0.5],
            "comprehensiveness_random": [0.1, 0.6, 0.1, 0.1],
            "sufficiency": [0.1, 0.2, 0.0, 0.1],
            "sufficiency_random": [0.3, 0.1, 0.3, 0.3],
            "forward_passes": [2, 2, 2, 2],
            "seconds": [1.0, 2.0, 3.0, 4.0],
        }
    )
    summary = summarise(rows, "text").iloc[0]
    assert summary["comprehensiveness"] == pytest.approx(0.5)
    assert summary["comprehensiveness_wins"] == 0.75 and summary["sufficiency_wins"] == 0.75
    low, high = (float(v) for v in summary["comprehensiveness_ci"].strip("[]").split(","))
    assert 0.4 <= low <= 0.5 <= high <= 0.6
    assert summary["seconds"] == 2.5


def test_map_agreement_on_maps_with_known_rankings():
    base = np.arange(20.0).reshape(4, 5)
    pairs = map_agreement(
        {"a": base, "negated": -base, "reversed": base.max() - base, "same": base * 3}, 0.2
    ).set_index(["first", "second"])
    assert pairs.loc[("a", "same"), "spearman"] == pytest.approx(1.0)
    assert pairs.loc[("a", "negated"), "spearman"] == pytest.approx(1.0)  # importance = |score|
    assert pairs.loc[("a", "reversed"), "spearman"] == pytest.approx(-1.0)
    assert pairs.loc[("a", "reversed"), "top_k_overlap"] == 0.0
    assert (pairs["k"] == 4).all()
    with pytest.raises(ValueError, match="different shapes"):
        map_agreement({"a": base, "b": np.zeros(3)})


def test_the_trust_card_adds_faithfulness_to_the_explanation(quadrant):
    inputs = _bright(quadrant)
    card = explain(
        quadrant,
        "gradient_x_input",
        inputs,
        target=output_target(quadrant, 0),
        settings=RunSettings(evaluate=True),
    )
    plain = explain(quadrant, "gradient_x_input", inputs, target=output_target(quadrant, 0))
    scores = faithfulness(quadrant, inputs, plain.scores, output_target(quadrant, 0)).metrics
    for name, value in scores.items():
        assert card.metrics[name] == pytest.approx(value)
    assert card.timings.forward_passes > plain.timings.forward_passes + 100
    assert "deletion_morf_auc" not in plain.metrics


def test_the_trust_card_counts_against_the_servers_budget():
    """A request's budget covers the method and the scoring of its map together."""
    from attrlab.attribution.errors import BudgetExceededError

    adapter = image_adapter(QuadrantModel("top-left"))
    inputs = _bright(adapter)
    explain(
        adapter,
        "rise",
        inputs,
        params={"n_masks": 90},
        settings=RunSettings(max_forward_passes=100),
    )
    with pytest.raises(BudgetExceededError, match="forward passes"):
        explain(
            adapter,
            "rise",
            inputs,
            params={"n_masks": 90},
            settings=RunSettings(max_forward_passes=100, evaluate=True),
        )
