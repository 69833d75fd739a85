"""The eviction request (issue 39): tasks made or given, checked before a model loads, priced."""

from __future__ import annotations

import pytest

from attrlab.attribution.errors import (
    BudgetExceededError,
    InvalidInputError,
    InvalidParameterError,
)
from attrlab.attribution.eviction.request import (
    MAX_ITEMS,
    EvictionRequest,
    eviction_items,
    run_eviction,
)
from attrlab.attribution.eviction.study import eviction_rows
from attrlab.attribution.inputs.long_context import ContextTask, task_inputs
from attrlab.attribution.request.run import RunSettings


@pytest.fixture(scope="module")
def llama(load_model):
    return load_model("tiny-random-llama")


TASK = ContextTask(
    context="The red door is at the end of the hall. The key is under the mat.",
    question="Where is the key?",
    answer="under the mat",
    task="jsonl",
)


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        ({"task": "sudoku"}, "task"),
        ({"count": 0}, "count"),
        ({"count": MAX_ITEMS + 1}, "count"),
        ({"max_tokens": 10}, "max_tokens"),
        ({"scorers": ("nope",)}, "scorer"),
        ({"unit": "layer"}, "unit"),
        ({"split": "global"}, "split"),
        ({"ratios": (0.5, 0.1)}, "ratios"),
        ({"draws": 1}, "draws"),
        ({"span": -1}, "span"),
        ({"span": 0, "scorers": ("exact_loo",)}, "exact_loo"),
    ],
)
def test_a_bad_request_is_refused_before_a_model_loads(asked, named):
    with pytest.raises(InvalidParameterError, match=named):
        EvictionRequest(**asked).check()


def test_given_tasks_are_counted():
    with pytest.raises(InvalidInputError, match="tasks"):
        EvictionRequest(tasks=()).check()
    with pytest.raises(InvalidInputError, match="tasks"):
        EvictionRequest(tasks=(TASK,) * (MAX_ITEMS + 1)).check()


def test_the_items_are_the_tasks_as_the_model_reads_them(llama):
    items = eviction_items(llama, EvictionRequest(tasks=(TASK, TASK)))
    held = task_inputs(llama, TASK)
    assert len(items) == 2
    assert items[0].inputs.input_ids.tolist() == held.inputs.input_ids.tolist()
    assert items[0].context == held.context_tokens and items[0].label == "jsonl"
    needles = eviction_items(llama, EvictionRequest(task="needle", count=3, max_tokens=120, seed=5))
    depths = [float(item.label.split("depth ")[1].split(",")[0]) for item in needles]
    assert depths == [0.0, 0.5, 1.0]  # spread from the first token to the last
    for item in needles:
        assert item.inputs.input_ids.shape[1] <= 120


def test_the_study_is_priced_before_it_runs(llama):
    request = EvictionRequest(
        tasks=(TASK,), scorers=("h2o", "knorm"), ratios=(1.0, 0.5), solved_only=False
    )
    item = eviction_items(llama, request)[0]
    rows = eviction_rows([item.context], 2, 2, request.draws, None)
    too_few = RunSettings(max_forward_passes=rows)  # the prefill makes one more
    with pytest.raises(BudgetExceededError, match="forward passes"):
        run_eviction(llama, request, too_few)
    study = run_eviction(llama, request, RunSettings(max_forward_passes=rows + 1))
    assert study.forward_passes <= rows + 1
    assert study.views[0]["tokens"] == item.inputs.token_texts[: item.context]
