"""
A patching study's gradient estimators split their noise draws to fit a memory bound.

AtP, RelP and AtP* run the destination's noise draws (AtP*: times its dropped layers) in passes
of the rows the bound leaves (:func:`~attribution.request.gate.memory_rows`), as the baseline and
exact patching do: their tables equal the unbounded ones, the passes counted equal the plan and the
model's own forwards, and a study the gate refused while its draws ran in one batch now runs.
Their per-site sums build no mask per site.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch

from attrlab.attribution.errors import TooMuchMemoryError
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.patching import (
    GaussianNoise,
    PatchingProblem,
    patching_problem,
    patching_report,
    planned_passes,
)
from attrlab.attribution.patching.base import site_sums
from attrlab.attribution.request.estimate import calibrate
from attrlab.attribution.request.gate import MEMORY_HEADROOM, clear_study, memory_rows
from attrlab.attribution.request.memory import peak_memory
from attrlab.attribution.request.run import RunContext, RunSettings

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


def test_site_sums_equal_a_loop_over_each_sites_part():
    """Each site's sum, found without a mask per site, against a plain loop over its part."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(3, 5, 8, generator=generator)  # rows, positions, 2 heads × 4
    sites = [(1, None), (None, 1), (4, 0), (None, None), (0, 1)]
    found = site_sums(values, sites, heads=2)
    assert found.dtype == torch.float64 and found.shape == (3, len(sites))
    for row in range(3):
        for column, (position, head) in enumerate(sites):
            total = 0.0
            for t in range(5):
                for f in range(8):
                    if position in (None, t) and head in (None, f // 4):
                        total += float(values[row, t, f])
            assert float(found[row, column]) == pytest.approx(total, rel=1e-12, abs=1e-12)


def test_site_sums_of_every_head_at_every_position_hold_no_mask_per_site():
    """800 sites over 200 × 256 features: a float64 mask per site would be 330 MB."""
    heads, length, features = 4, 200, 256
    values = torch.ones(1, length, features)
    sites = [(position, head) for head in range(heads) for position in range(length)]
    with peak_memory(torch.device("cpu")) as peak:
        found = site_sums(values, sites, heads)
    torch.testing.assert_close(found, torch.full((1, len(sites)), features / heads).double())
    assert peak() is not None and peak() < 64 * 2**20, peak()
