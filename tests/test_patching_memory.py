"""
A patching study's gradient estimators split their noise draws to fit a memory bound.

AtP, RelP and AtP* run the destination's noise draws (AtP*: times its dropped layers) in passes
of the rows the bound leaves (:func:`~attribution.gate.memory_rows`), as the baseline and exact
patching do: their tables equal the unbounded ones, the passes counted equal the plan and the
model's own forwards, and a study the gate refused while its draws ran in one batch now runs.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch

from attrlab.attribution.errors import TooMuchMemoryError
from attrlab.attribution.estimate import calibrate
from attrlab.attribution.gate import MEMORY_HEADROOM, clear_study, memory_rows
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.patching import (
    GaussianNoise,
    PatchingProblem,
    patching_problem,
    patching_report,
    planned_passes,
)
from attrlab.attribution.run import RunContext, RunSettings

IOI = "when mary and john went to the store john gave a drink to"
DRAWS = 5
STUDY = {
    "estimators": ["atp", "atp_star", "relp"],
    "components": ["residual", "head_position", "mlp"],
}


def _problem(adapter: DecoderLMAdapter) -> PatchingProblem:
    noise = GaussianNoise(positions=(1, 2), seeds=DRAWS)
    return patching_problem(adapter, IOI, answer=" mary", contrast=" john", noise=noise)


def _bound(adapter: DecoderLMAdapter, problem: PatchingProblem, rows: int) -> RunSettings:
    """A memory bound that leaves room for ``rows`` rows per pass on the problem's input."""
    calibration = calibrate(adapter)
    calibration.measure_all()
    row = calibration.row_bytes(problem.clean)
    one = calibration.peak_bytes(problem.clean, 1)
    assert row and one
    usable = one + (rows - 1) * row + row // 2
    settings = RunSettings(max_memory_bytes=int(usable / MEMORY_HEADROOM))
    assert memory_rows(adapter, problem.clean, settings) == rows
    return settings


class _Batches:
    """The rows of every forward of ``model`` while the block runs."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.seen = model, []

    def __enter__(self) -> list[int]:
        def record(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            tensor = ids if ids is not None else kwargs["inputs_embeds"]
            self.seen.append(int(tensor.shape[0]))

        self.handle = self.model.register_forward_pre_hook(record, with_kwargs=True)
        return self.seen

    def __exit__(self, *exc) -> None:
        self.handle.remove()


@pytest.fixture(scope="module")
def gpt2(load_model):
    return load_model("tiny-random-gpt2")


@pytest.fixture(scope="module")
def gpt2_float64(gpt2):
    model = copy.deepcopy(gpt2.model).double()
    return DecoderLMAdapter(model, gpt2.tokenizer, "tiny-gpt2-float64", add_special_tokens=False)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("name", ["gpt2", "gpt2_float64"])
def test_split_draws_give_the_unsplit_tables_in_the_planned_passes(name, rows, request):
    adapter = request.getfixturevalue(name)
    problem = _problem(adapter)
    layers = adapter.num_layers
    assert layers > 1  # AtP* drops layers: its rows are draws × layers
    free = patching_report(adapter, problem, **STUDY)
    settings = _bound(adapter, problem, rows)
    with _Batches(adapter.model) as batches:
        bounded = patching_report(adapter, problem, **STUDY, settings=settings)
    assert max(batches) == rows  # every forward within the bound, the baseline's too
    # per direction: AtP and RelP one row per destination draw, AtP* one per draw and layer;
    # the clean side (noising's destination) has one row
    passes = {
        direction: 2 * math.ceil(draws / rows) + math.ceil(draws * layers / rows)
        for direction, draws in (("denoising", DRAWS), ("noising", 1))
    }
    assert bounded.backward_passes == sum(passes.values())
    assert free.backward_passes == 3 * 2  # one per estimator and direction
    assert bounded.forward_passes == free.forward_passes == sum(batches)
    planned = planned_passes(adapter, problem, **STUDY, max_rows=rows)
    assert planned == (bounded.forward_passes, bounded.backward_passes, rows)
    # a pass's width may change a model's rounding: float32's or float64's, of the largest value
    tolerance = 1e-6 if name == "gpt2" else 1e-12
    assert free.table["effect"].abs().max() > 1e-6  # something to compare
    values = ["effect", "patched", "normalised"]
    pd.testing.assert_frame_equal(
        bounded.table.drop(columns=values), free.table.drop(columns=values)
    )
    for column in values:
        expected = free.table[column].to_numpy(float)
        atol = tolerance * np.nanmax(np.abs(expected))
        np.testing.assert_allclose(bounded.table[column].to_numpy(float), expected, tolerance, atol)
    assert bounded.corrupted_scores == pytest.approx(free.corrupted_scores, rel=tolerance)


def test_a_study_refused_while_its_draws_ran_in_one_batch_now_runs_within_the_bound(gpt2):
    problem = _problem(gpt2)
    settings = _bound(gpt2, problem, 2)
    forward, backward, widest = planned_passes(gpt2, problem, **STUDY)
    assert widest == DRAWS * gpt2.num_layers  # AtP*'s rows, unsplit
    # the gate's price of the study as it ran before: all of AtP*'s rows in one batch
    with pytest.raises(TooMuchMemoryError, match="patching study would need"):
        unsplit = [(problem.clean, forward, backward, widest)]
        clear_study(gpt2, "patching", unsplit, settings, RunContext.of(settings), "the draws")
    report = patching_report(gpt2, problem, **STUDY, settings=settings)
    assert set(report.table["estimator"]) == set(STUDY["estimators"])
    assert report.table["effect"].notna().all()
