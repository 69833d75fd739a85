"""
Verdicts on cases whose answer is known independently of the code judged.

Integrated gradients on a linear model (exact at any step count) and on an exponential one with
two Gauss-Legendre points, its sum worked out here by hand; the test against random orders
against SciPy's two-sample t-test; a model that ignores its input (every order scores the
same); the sign test over items against binomial tails written out; the randomisation check of
a map that is the input itself.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from _perturbation_toys import ConstantModel, QuadrantModel, image_adapter
from scipy import stats
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.metrics import (
    faithfulness,
    randomisation_check,
    randomisation_verdicts,
    summarise,
)
from attrlab.attribution.request.target import output_target
from attrlab.attribution.verdicts import (
    FIRST_DRAWS,
    THRESHOLDS,
    Verdict,
    against_random,
    randomisation,
)

IMAGE = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)


class _Linear(nn.Module):
    """Logit 0 = Σ w ⊙ pixels, logit 1 = 0."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        first = (pixels * self.weight).sum((1, 2, 3))
        return torch.stack([first, torch.zeros_like(first)], dim=1)


class _Exponential(nn.Module):
    """Logit 0 = exp(a · mean(pixels)): curved along the straight path from the zero baseline."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = a
        self.anchor = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        first = torch.exp(self.a * pixels.double().mean((1, 2, 3))) + self.anchor
        return torch.stack([first, torch.zeros_like(first)], dim=1)


def test_integrated_gradients_on_a_linear_model_is_exact_and_passes():
    adapter = image_adapter(_Linear())
    inputs = adapter.preprocess(IMAGE)
    e = explain(
        adapter,
        "integrated_gradients",
        inputs,
        target=output_target(adapter, 0),
        params={"n_steps": 2},
    )
    pixels = inputs.pixel_values[0]  # the baseline is the normalised zero
    expected = (adapter.model.weight.detach() * pixels).sum(0).numpy()
    np.testing.assert_allclose(e.scores, expected, rtol=1e-4, atol=1e-4)
    (verdict,) = e.verdicts
    assert (verdict.check, verdict.status) == ("integral_convergence", "pass")
    assert verdict.value < 1e-5 and verdict.threshold == 0.05
    assert verdict.advice == "" and e.warnings == []


def test_two_steps_on_a_curved_model_fail_with_the_n_steps_advice():
    a = 4.0
    adapter = image_adapter(_Exponential(a))
    inputs = adapter.preprocess(np.full((32, 32, 3), 255, dtype=np.uint8))
    s = float(inputs.pixel_values.double().mean())
    # two Gauss-Legendre points on [0, 1]: α = ½ ± ½/√3, weight ½ each; dF/dα = a·s·e^(a·s·α)
    alphas = (0.5 - 0.5 / math.sqrt(3), 0.5 + 0.5 / math.sqrt(3))
    summed = sum(0.5 * a * s * math.exp(a * s * alpha) for alpha in alphas)
    difference = math.exp(a * s) - 1.0
    relative = abs(summed - difference) / abs(difference)
    assert relative > THRESHOLDS["integral_convergence"].warning  # the case is a failing one
    e = explain(
        adapter,
        "integrated_gradients",
        inputs,
        target=output_target(adapter, 0),
        params={"n_steps": 2},
    )
    (verdict,) = e.verdicts
    assert verdict.value == pytest.approx(relative, rel=1e-4)
    assert verdict.status == "fail" and "has not converged" in verdict.reason
    assert verdict.advice == "raise n_steps (this run: 2)"
    assert e.warnings == [verdict.sentence()]
    many = explain(
        adapter,
        "integrated_gradients",
        inputs,
        target=output_target(adapter, 0),
        params={"n_steps": 64},
    )
    assert many.verdicts[0].status == "pass" and many.warnings == []


def test_the_test_against_random_orders_is_the_two_sample_t_test():
    randoms = [0.11, 0.14, 0.09, 0.16, 0.12]
    for value in (0.13, 0.25, 0.02):
        verdict, low, high = against_random("comprehensiveness", value, randoms, higher=True)
        expected = stats.ttest_ind([value], randoms).pvalue  # one draw against the others
        assert verdict.value == pytest.approx(expected, rel=1e-9)
    # the interval is the set of scores the test cannot tell from a random order's
    _, low, high = against_random("comprehensiveness", 0.0, randoms, higher=True)
    for edge in (low, high):
        assert stats.ttest_ind([edge], randoms).pvalue == pytest.approx(0.05, rel=1e-9)
    statuses = {
        value: against_random("comprehensiveness", value, randoms, higher=True)[0].status
        for value in (0.13, 0.25, 0.02)
    }
    assert statuses == {0.13: "inconclusive", 0.25: "pass", 0.02: "fail"}
    # lower is better: the same numbers judged the other way
    assert against_random("sufficiency", 0.02, randoms, higher=False)[0].status == "pass"


def test_a_small_margin_within_the_random_orders_noise_is_inconclusive():
    """The issue's card: 0.008 against a random mean of 0.002 was called better than random."""
    randoms = [-0.004, 0.001, 0.002, 0.006, 0.005]
    assert np.mean(randoms) == pytest.approx(0.002)
    verdict, low, high = against_random("comprehensiveness", 0.008, randoms, higher=True)
    assert verdict.status == "inconclusive"
    assert low < 0.008 < high and "within random orders' noise" in verdict.reason
    # SmolLM2's sufficiency on a five-token prompt: a significant but meaningless margin
    close = [0.7730, 0.7731, 0.7729, 0.7732, 0.7728]
    tiny = against_random("sufficiency", 0.772, close, higher=False)[0]
    assert tiny.value < 0.05 and tiny.status == "inconclusive"
    assert "a margin under 0.01" in tiny.reason
    one = against_random("comprehensiveness", 0.5, [0.1], higher=True)[0]
    assert one.status == "inconclusive" and one.value is None


def test_a_model_that_ignores_its_input_gives_an_inconclusive_faithfulness_verdict():
    adapter = image_adapter(ConstantModel())
    scores = np.random.default_rng(0).random((32, 32))
    scored = faithfulness(
        adapter, adapter.preprocess(IMAGE), scores, output_target(adapter, 0), steps=8
    )
    judged = {v.check: v for v in scored.verdicts}
    for score in ("deletion_morf_auc", "insertion_morf_auc"):
        assert judged[score].status == "inconclusive", judged[score].reason
        # draws equal to the last digit settle at once: no more than the first are drawn
        assert f"{FIRST_DRAWS} random orders all scored" in judged[score].reason


def test_the_oracle_map_of_a_quadrant_model_passes_both_curves():
    adapter = image_adapter(QuadrantModel("top-left"))
    image = np.full((32, 32, 3), 40, dtype=np.uint8)
    image[:16, :16] = 255
    oracle = np.zeros((32, 32))
    oracle[:16, :16] = 1.0
    oracle += np.random.default_rng(0).random((32, 32)) * 1e-3
    scored = faithfulness(
        adapter, adapter.preprocess(image), oracle, output_target(adapter, 0), steps=16
    )
    assert {v.check: v.status for v in scored.verdicts} == {
        "deletion_morf_auc": "pass",
        "insertion_morf_auc": "pass",
    }
    m = scored.metrics
    assert m["deletion_morf_auc"] < m["deletion_random_auc_low"]
    assert m["insertion_morf_auc"] > m["insertion_random_auc_high"]


def test_the_leaderboard_tests_wins_over_items_against_binomial_tails():
    def rows(wins: int, losses: int) -> pd.DataFrame:
        values = [0.5] * (wins + losses)
        randoms = [0.1] * wins + [0.9] * losses
        return pd.DataFrame(
            {
                "item": range(wins + losses),
                "method": "m",
                "comprehensiveness": values,
                "comprehensiveness_random": randoms,
                "sufficiency": values,
                "sufficiency_random": randoms,
                "forward_passes": 1,
                "seconds": 0.1,
            }
        )

    # two-sided, n = 10: P(X ≥ 9) = 11/1024, P(X ≥ 6) = 386/1024
    cases = {(9, 1): (22 / 1024, "pass"), (6, 4): (772 / 1024, "inconclusive")}
    for (wins, losses), (p, status) in cases.items():
        row = summarise(rows(wins, losses), "text").iloc[0]
        assert row["comprehensiveness_sign_p"] == pytest.approx(p)
        assert row["comprehensiveness_verdict"] == status
        # sufficiency: lower is better, so the same rows are losses
        assert row["sufficiency_verdict"] == {"pass": "fail"}.get(status, status)


def test_a_map_that_is_the_input_itself_fails_the_randomisation_check():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 32 * 32, 2)
    )
    adapter = image_adapter(model)
    inputs = adapter.preprocess(IMAGE)
    brightness = inputs.pixel_values[0].sum(0).numpy()
    table = randomisation_check(adapter, lambda _a: brightness).assign(method="input")
    verdict = randomisation_verdicts(table)["input"]
    assert verdict.status == "fail" and verdict.value == 1.0
    assert "hardly depends on the weights" in verdict.reason


@pytest.mark.parametrize(
    ("signed", "magnitudes", "status"),
    [
        (0.1, 0.25, "pass"),
        (0.5, 0.1, "warn"),
        (-0.9, 0.2, "fail"),  # a map that flips sign still ranks like the original
        (float("nan"), float("nan"), "inconclusive"),
    ],
)
def test_randomisation_verdicts_follow_the_last_steps_correlation(signed, magnitudes, status):
    verdict = randomisation("m", signed, magnitudes, "block 0")
    assert verdict.status == status and verdict.threshold == 0.3


def test_a_verdict_round_trips_through_json_and_refuses_an_unknown_status():
    verdict = randomisation("m", float("nan"), float("nan"), "block 0")
    assert verdict.value is None  # JSON has no NaN
    assert Verdict.from_dict(verdict.to_dict()) == verdict
    with pytest.raises(ValueError, match="status"):
        Verdict("x", "x", "maybe", None, None, "")
