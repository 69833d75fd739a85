"""The pruning study: rankings from the analysis, passes as planned, budgets refused up front."""

from __future__ import annotations

import numpy as np
import pytest
from _model_state import model_state

from attrlab.attribution.engine.study import pruning_study, ranked_input, study_parts
from attrlab.attribution.errors import BudgetExceededError, InvalidInputError, TooSlowError
from attrlab.attribution.layers import analyze_layers
from attrlab.attribution.patching import patched_score, patching_report
from attrlab.attribution.request.estimate import study_estimate
from attrlab.attribution.request.run import RunSettings

CLEAN = "when mary and john went to the store john gave a drink to"
CORRUPT = "when mary and john went to the store mary gave a drink to"
TEXTS = ("the cat sat on the mat and", "mary gave john a")


@pytest.fixture(scope="module")
def gpt2(load_model):
    return load_model("tiny-random-gpt2")


@pytest.fixture(scope="module")
def ranked(gpt2):
    return ranked_input(gpt2, CLEAN, answer=" mary", contrast=" john", corrupted=CORRUPT)


def test_a_study_ranks_by_the_analysis_and_spends_what_it_planned(gpt2, ranked):
    inputs, target, problem = ranked
    study = pruning_study(gpt2, inputs, target, TEXTS, problem=problem, draws=2, head_step=2)
    dataset = [gpt2.preprocess(t) for t in TEXTS]
    parts = study_parts(gpt2, inputs, dataset, problem, draws=2, head_step=2)
    assert study.forward_passes == sum(rows for _, rows, _, _ in parts)
    assert study.texts == len(TEXTS)
    assert set(study.layers.orders) == {
        "block_influence",
        "skip",
        "lrp",
        "logit_lens",
        "residual_patching",
    }
    assert set(study.heads.orders) == {
        "head_gradient",
        "ablation_zero",
        "ablation_mean",
        "head_lrp",
    }
    # skip's order: the layers by |Δ log p| of the skip measure, computed on its own
    skip = analyze_layers(gpt2, inputs, target, ["skip"])
    skip = skip[skip["measure"] == "skip_logprob"].sort_values("layer")["value"].abs()
    assert study.layers.orders["skip"] == list(np.argsort(skip.to_numpy(), kind="stable"))
    # residual patching's: how much each block adds to the patched residual where it is read
    read_at = len(problem.clean.token_texts) - 2
    at = [patched_score(gpt2, problem, "residual", layer, (read_at,)) for layer in (0, 1)]
    gains = np.abs(np.diff([*at, 1.0]))
    assert study.layers.orders["residual_patching"] == list(np.argsort(gains, kind="stable"))
    # each dataset text is scored on the unpruned model's own top next token: top-1 agrees at k=0
    curves = study.heads.curves
    plain = curves[(curves["removed"] == 0) & (curves["metric"] == "top1_agreement")]
    assert set(plain["value"]) == {1.0}


def test_an_over_budget_study_is_refused_before_any_forward(gpt2, ranked):
    inputs, target, problem = ranked
    dataset = [gpt2.preprocess(t) for t in TEXTS]
    parts = study_parts(gpt2, inputs, dataset, problem, draws=2)
    planned = sum(rows for _, rows, _, _ in parts)
    study_estimate(gpt2, "pruning", parts)  # calibrates now: the refusals below run nothing
    before = model_state(gpt2.model)
    calls: list[int] = []
    handle = gpt2.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        tight = RunSettings(max_forward_passes=planned - 1)
        with pytest.raises(BudgetExceededError, match=f"needs {planned:,} forward passes"):
            pruning_study(gpt2, inputs, target, TEXTS, problem=problem, draws=2, settings=tight)
        quick = RunSettings(max_seconds=1e-6)
        with pytest.raises(TooSlowError, match="pruning study would take"):
            pruning_study(gpt2, inputs, target, TEXTS, problem=problem, draws=2, settings=quick)
        with pytest.raises(TooSlowError, match="patching study would take"):
            patching_report(gpt2, problem, settings=quick)
        assert calls == []
    finally:
        handle.remove()
    assert model_state(gpt2.model) == before
    with pytest.raises(InvalidInputError, match="give a target, or an answer"):
        ranked_input(gpt2, CLEAN, target=3, answer=" mary")


def test_a_study_with_agreement_removes_each_unit_alone_and_spends_what_it_planned(gpt2, ranked):
    inputs, target, problem = ranked
    study = pruning_study(
        gpt2, inputs, target, TEXTS, problem=problem, draws=2, head_step=2, agreement=True
    )
    dataset = [gpt2.preprocess(t) for t in TEXTS]
    parts = study_parts(gpt2, inputs, dataset, problem, draws=2, head_step=2, agreement=True)
    assert study.forward_passes == sum(rows for _, rows, _, _ in parts)
    plain_parts = study_parts(gpt2, inputs, dataset, problem, draws=2, head_step=2)
    sites = gpt2.num_layers + gpt2.num_layers * gpt2.num_heads
    assert sum(r for _, r, _, _ in parts) - sum(r for _, r, _, _ in plain_parts) == len(TEXTS) * (
        2 + sites
    )  # per text: the plain model and each layer, then the plain model and each head
    checked = 0
    for unit, curves in study.curves().items():
        agreement = study.agreements[unit]
        assert list(agreement.table["estimator"]) == list(curves.orders)
        # removing a ranking's least important unit alone is its curve's first step
        values = curves.curves.set_index(["order", "removed", "metric"])["value"]
        sites, drops = map(str, agreement.effects["site"]), agreement.effects["effect"]
        effects = dict(zip(sites, drops, strict=True))
        for order, removal in curves.orders.items():
            k = int(curves.curves[curves.curves["order"] == order]["removed"].iloc[1])
            if k != 1:
                continue
            drop = values[order, 0, "log_prob"] - values[order, 1, "log_prob"]
            assert effects[str(removal[0])] == pytest.approx(drop, abs=1e-9)
            checked += 1
    assert checked == len(study.layers.orders)  # every layer ranking (the head curves step by 2)
    assert set(study.to_dict()["agreements"]) == {"layer", "head"}
