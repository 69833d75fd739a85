"""
An eviction study as the front ends ask for it: tasks made or given, checked, priced, run.

The CLI, REST, the page and Python build one :class:`EvictionRequest`; :meth:`EvictionRequest.
check` refuses what cannot run before a model loads, and :func:`run_eviction` makes the tasks
(:mod:`~attribution.inputs.long_context`: generated from a seed, or the user's), prices the
study (:func:`~attribution.request.gate.clear_study`: its prefills and answer forwards) and runs
it, refused over the settings' budgets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.eviction.cache import check_evictable
from attrlab.attribution.eviction.scorers import ORACLE_METHODS, SCORERS, check_scorers
from attrlab.attribution.eviction.study import (
    EVICTION_UNITS,
    KEEP_RATIOS,
    EvictionItem,
    EvictionStudy,
    check_ratios,
    eviction_rows,
    eviction_study,
    exact_spans,
    layer_budgets,
)
from attrlab.attribution.inputs.long_context import (
    ContextTask,
    kv_retrieval,
    needle,
    task_inputs,
    token_counter,
    variable_tracking,
)
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.defaults import (
    EVICTION_COUNT,
    EVICTION_MAX_TOKENS,
    EVICTION_TASK,
    PRUNING_DRAWS,
)
from attrlab.attribution.request.defaults import EVICTION_MAX_ITEMS as MAX_ITEMS
from attrlab.attribution.request.defaults import EVICTION_TASK_SIZES as TASK_SIZES
from attrlab.attribution.request.defaults import EVICTION_TASKS as TASK_KINDS
from attrlab.attribution.request.estimate import estimate
from attrlab.attribution.request.gate import clear_study
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import decoder_adapter

__all__ = [
    "MAX_ITEMS",
    "TASK_KINDS",
    "TASK_SIZES",
    "EvictionRequest",
    "eviction_items",
    "run_eviction",
]


@dataclass(frozen=True)
class EvictionRequest:
    """
    One eviction study, as asked.

    Attributes:
        task: The generated task kind (:data:`TASK_KINDS`), ignored with ``tasks``.
        count: How many tasks to generate (seeds ``seed … seed + count − 1``; a needle's
            depths spread evenly from the first token to the last).
        max_tokens: The generated prompts' size in the model's tokens, answer included.
        seed: The first task's seed.
        tasks: The user's tasks instead (context, question, answer).
        scorers: The scorers (``None``: every registered one).
        unit, split, ratios, draws, span, solved_only: As
            :func:`~attribution.eviction.study.eviction_study` takes them.
    """

    task: str = EVICTION_TASK
    count: int = EVICTION_COUNT
    max_tokens: int = EVICTION_MAX_TOKENS
    seed: int = 0
    tasks: tuple[ContextTask, ...] | None = None
    scorers: tuple[str, ...] | None = None
    unit: str = "kv_entry"
    split: str = "uniform"
    ratios: tuple[float, ...] = KEEP_RATIOS
    draws: int = PRUNING_DRAWS
    span: int | None = None
    solved_only: bool = True

    def check(self) -> None:
        """
        Refuse, before a model loads, what the study cannot run.

        Raises:
            InvalidParameterError: an unknown task kind, scorer, unit or split; a count, size,
                draws or span out of range; ratios that do not start at 1.0 and fall.
            InvalidInputError: more than :data:`MAX_ITEMS` tasks given, or none.
        """
        if self.tasks is None:
            if self.task not in TASK_KINDS:
                raise InvalidParameterError(
                    f"the task is one of {', '.join(TASK_KINDS)}; got {self.task!r}"
                )
            if not 1 <= self.count <= MAX_ITEMS:
                raise InvalidParameterError(f"count is 1 to {MAX_ITEMS}; got {self.count}")
            low, high = TASK_SIZES
            if not low <= self.max_tokens <= high:
                raise InvalidParameterError(f"max_tokens is {low} to {high}; got {self.max_tokens}")
        elif not 1 <= len(self.tasks) <= MAX_ITEMS:
            raise InvalidInputError(f"give 1 to {MAX_ITEMS} tasks; got {len(self.tasks)}")
        check_scorers(list(SCORERS) if self.scorers is None else list(self.scorers))
        if self.unit not in EVICTION_UNITS:
            raise InvalidParameterError(
                f"the eviction unit is one of {', '.join(EVICTION_UNITS)}; got {self.unit!r}"
            )
        layer_budgets(1, 1, 1.0, self.split)
        check_ratios(self.ratios)
        if self.draws < 2:
            raise InvalidParameterError(
                f"draws is at least 2 (a spread to judge against); got {self.draws}"
            )
        if self.span is not None and self.span != 0:
            exact_spans(1, self.span)
        if self.span == 0 and "exact_loo" in (self.scorers or SCORERS):
            raise InvalidParameterError("exact_loo is the exact effects: leave span above 0")

    def to_json(self) -> dict[str, Any]:
        """What was asked, JSON-ready (the user's tasks as records)."""
        return {
            "task": "jsonl" if self.tasks is not None else self.task,
            "count": len(self.tasks) if self.tasks is not None else self.count,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "scorers": list(self.scorers or SCORERS),
            "unit": self.unit,
            "split": self.split,
            "ratios": list(self.ratios),
            "draws": self.draws,
            "span": self.span,
            "solved_only": self.solved_only,
        }


def _generated(adapter: Adapter, request: EvictionRequest) -> list[ContextTask]:
    count = token_counter(decoder_adapter(adapter).tokenizer)
    seeds = range(request.seed, request.seed + request.count)
    if request.task == "needle":
        depths = [i / max(1, request.count - 1) for i in range(request.count)]
        return [
            needle(seed, depth, request.max_tokens, count)
            for seed, depth in zip(seeds, depths, strict=True)
        ]
    if request.task == "kv_retrieval":  # four pairs among filler: what SmolLM2-135M solves
        return [kv_retrieval(seed, request.max_tokens, count, pairs=4) for seed in seeds]
    return [variable_tracking(seed, max_tokens=request.max_tokens, count=count) for seed in seeds]


def _context(item: EvictionItem) -> int:
    prompt = int(item.inputs.input_ids.shape[1]) - item.inputs.answer_length
    return prompt - 1 if item.context is None else item.context


def _label(task: ContextTask) -> str:
    details = ", ".join(f"{k} {v}" for k, v in task.details.items() if k != "seed")
    return f"{task.task} ({details})" if details else task.task


def eviction_items(adapter: Adapter, request: EvictionRequest) -> list[EvictionItem]:
    """
    The request's tasks on ``adapter``: each prompt with its answer, its context told.

    Raises:
        InvalidInputError: not a decoder LM, or a task longer than the model reads.
    """
    tasks: Sequence[ContextTask] = (
        request.tasks if request.tasks is not None else _generated(adapter, request)
    )
    items = []
    for task in tasks:
        found = task_inputs(adapter, task)
        items.append(EvictionItem(found.inputs, found.target, found.context_tokens, _label(task)))
    return items


def run_eviction(
    adapter: Adapter, request: EvictionRequest, settings: RunSettings | None = None
) -> EvictionStudy:
    """
    The request's study on ``adapter``: checked, priced before it runs, refused over budget.

    Raises:
        InvalidParameterError, InvalidInputError: as :meth:`EvictionRequest.check` and
            :func:`eviction_items`.
        UnsupportedMethodError: a model whose cache cannot be evicted from.
        BudgetExceededError, TooSlowError, TooMuchMemoryError: over the settings' budgets.
        JobCancelledError: cancelled.
    """
    request.check()
    check_evictable(adapter)
    settings = settings or RunSettings()
    run = RunContext.of(settings)
    items = eviction_items(adapter, request)
    chosen = list(request.scorers or SCORERS)
    rows = [
        eviction_rows(
            [_context(item)], len(chosen), len(request.ratios), request.draws, request.span
        )
        for item in items
    ]
    run.plan(sum(rows) + len(items), "the tasks, scorers, ratios or draws")  # prefills too
    parts = []
    for item, answers in zip(items, rows, strict=True):
        # an answer row reads the answer's tokens against the cache: priced as that share of
        # a whole-input row, beside the one prefill
        share = (item.inputs.answer_length + 1) / int(item.inputs.input_ids.shape[1])
        parts.append((item.inputs, 1 + max(1, round(answers * share)), 0, 32))
        if "atp_kv" in chosen:
            parts.append((item.inputs, 1, 1, 1))
        for method in (m for m in chosen if m in ORACLE_METHODS):
            cost = estimate(adapter, method, item.inputs, target=item.target)
            parts.append((item.inputs, cost.forward_passes, cost.backward_passes, 1))
    clear_study(adapter, "eviction", parts, settings, run, "the tasks, scorers, ratios or draws")
    return eviction_study(
        adapter,
        items,
        request.scorers,
        request.unit,
        request.split,
        request.ratios,
        request.draws,
        request.span,
        request.solved_only,
        settings,
        run,
    )
