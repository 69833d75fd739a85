"""
Which method to believe for this model: every method on every item, scored for faithfulness.

Each (item, method) pair gives one row with the faithfulness scores of the method's map and of
random orders, the forward passes and seconds it took. :func:`summarise` turns the rows into
one line per method: the mean of each score with a 95 % bootstrap interval (SciPy), the share
of items on which the method beats random orders with a sign test over the items and its
verdict (:func:`~attribution.verdicts.items_sign_test`), and the cost per item.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.inputs.features import check_features, with_features
from attrlab.attribution.inputs.runs import explain_rows
from attrlab.attribution.methods import get_method
from attrlab.attribution.metrics.faithfulness import (
    RANDOM_ORDERS,
    SCORES,
    check_options,
    faithfulness_of_maps,
)
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.defaults import EVALUATION_ORDERS, EVALUATION_STEPS
from attrlab.attribution.request.run import ProgressCallback, RunContext, RunSettings
from attrlab.attribution.verdicts import items_sign_test

__all__ = [
    "MAP_DRAWS",
    "SCORES",
    "EvalItem",
    "bundled_items",
    "check_granularity",
    "evaluate_methods",
    "summarise",
]


@dataclass(frozen=True)
class EvalItem:
    """One input (as ``adapter.preprocess`` takes it), its target (None = top) and a name."""

    raw: Any
    target: int | str | None = None
    name: str = ""


#: Redrawn maps per sampled map and item: the spread of its score under its own sampling.
MAP_DRAWS = 8
#: Marks a redrawn map's name (never a method's).
_REDRAWN = "#redrawn"


def bundled_items(modality: str) -> list[EvalItem]:
    """The small evaluation set shipped in ``assets/eval`` (images or labelled sentences)."""
    root = resources.files("attrlab.assets").joinpath("eval")
    if modality == "image":
        images = root.joinpath("images")
        return [
            EvalItem(entry.read_bytes(), None, entry.name)
            for entry in sorted(images.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".jpg")
        ]
    lines = root.joinpath("sentences.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [EvalItem(r["text"], r.get("target"), r["text"][:40]) for r in records]


def check_granularity(granularity: str) -> None:
    """
    Refuse a granularity an evaluation cannot explain its items by (``span`` is one text's).

    Raises:
        InvalidParameterError: ``span``, or a granularity that does not exist.
    """
    if granularity == "span":
        raise InvalidParameterError(
            "granularity=span needs the spans of one text; evaluate items by word or sentence"
        )
    check_features(granularity)


def evaluate_methods(
    adapter: Adapter,
    items: Iterable[EvalItem],
    methods: Sequence[str],
    params: dict[str, dict[str, Any]] | None = None,
    steps: int = EVALUATION_STEPS,
    random_orders: int = EVALUATION_ORDERS,
    settings: RunSettings | None = None,
    progress: Callable[[int], None] | None = None,
    image_fill: str = "rise",
    text_removal: str = "delete",
    passes: ProgressCallback | None = None,
    granularity: str = "token",
) -> pd.DataFrame:
    """
    One row per item and method: faithfulness and random-order scores, and the method's cost.

    ``granularity``: texts explained and scored by ``word`` or ``sentence`` features
    (:func:`~attribution.inputs.features.with_features`; ``span`` needs spans of one text).

    The cost is the method's own forward passes and seconds (scoring the map is not counted).
    ``steps``, ``image_fill`` and ``text_removal`` are :func:`~attribution.metrics.faithfulness`'s.
    Each item's maps are compared with a random order's expected scores
    (:func:`~attribution.metrics.faithfulness.faithfulness_of_maps` with ``expected``): exact on
    a short text, else the mean of random orders drawn until every map's margin is settled, at
    most ``random_orders`` (and at most :data:`~attribution.metrics.faithfulness.RANDOM_ORDERS`
    per method that applies, what the gate prices); ``*_random_se`` is its standard error,
    ``random_orders`` the orders
    drawn (0: exact).

    Methods that do not apply to ``adapter`` are left out; an unknown name is an error.
    ``settings``: the seed (item ``n``'s random orders draw from seed + n), the cancel switch
    (checked between items, and within a method or a score that checks it) and each
    explanation's budgets, as one request's; ``progress`` receives the items done, and
    ``passes`` the forward passes done of each explanation and each scoring in turn.

    Raises:
        JobCancelledError: once the cancel switch is set.
    """
    check_options(image_fill, text_removal)
    check_granularity(granularity)
    settings = settings or RunSettings()
    # the explanations alone: no trust card of their own, no price of their own (a server prices
    # the whole evaluation before it starts)
    each = RunSettings(
        seed=settings.seed, cancel=settings.cancel, max_forward_passes=settings.max_forward_passes
    )
    applicable = [name for name in methods if get_method(name).unsupported_reason(adapter) is None]
    # an item's orders within what its methods' trust cards are priced for (each at most
    # RANDOM_ORDERS beside its own two orders): the gate's price stays an upper bound
    random_orders = min(random_orders, RANDOM_ORDERS * max(1, len(applicable)))
    explained = explain_rows(
        adapter,
        items,
        applicable,
        lambda item: with_features(adapter.preprocess(item.raw), granularity),
        params=params,
        settings=each,
        progress=progress,
        passes=passes,
    )
    rows = []
    for done, result in enumerate(explained, start=1):
        inputs, explanations = result.explained()
        # each item its own random orders, shared by the methods explaining the same output
        by_target: dict[int, dict[str, Explanation]] = {}
        for name, explanation in explanations.items():
            by_target.setdefault(explanation.target.index, {})[name] = explanation
        for same in by_target.values():
            first = next(iter(same.values()))
            assert first.target_record is not None  # a fresh explanation holds its record
            orders = RunContext(seed=settings.seed + done, cancel=settings.cancel, progress=passes)
            maps = {name: explanation.scores for name, explanation in same.items()}
            redrawn = _redrawn_maps(same, np.random.default_rng([settings.seed, done]))
            scored = faithfulness_of_maps(
                adapter,
                inputs,
                {**maps, **redrawn},
                first.target_record,
                steps,
                # each method's curves within its trust card's price, the redrawn maps' too
                max(0, min(random_orders, RANDOM_ORDERS * len(applicable) - len(redrawn))),
                text_removal,
                run=orders,
                image_fill=image_fill,
                expected=True,
            )
            rows += [
                {
                    "item": result.row.name or str(done),
                    "method": name,
                    **scored[name].metrics,
                    **_map_errors(name, scored, inputs.modality),
                    "forward_passes": explanation.timings.forward_passes,
                    "seconds": explanation.timings.total_s,  # the method's, not the scoring's
                }
                for name, explanation in same.items()
            ]
    return pd.DataFrame(rows)


def _redrawn_maps(
    explanations: Mapping[str, Explanation], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """
    A sampled map's score moves with its own draw: :data:`MAP_DRAWS` maps as it might have come.

    A method that samples (RISE's masks, Sobol's designs) reports each element's standard
    error (``maps["std_error"]``); each redrawn map adds independent normal noise of that size
    to every element, a parametric bootstrap of the map. Deterministic maps get none, nor do
    maps of no error (RISE's expectation taken exactly).
    """
    redrawn = {}
    for name, explanation in explanations.items():
        error = explanation.maps.get("std_error")
        if error is None or not np.any(error):  # an exact map (RISE's on a short text)
            continue
        scores = np.asarray(explanation.scores, dtype=np.float64)
        spread = np.broadcast_to(np.asarray(error, dtype=np.float64), scores.shape)
        for draw in range(MAP_DRAWS):
            redrawn[f"{name}{_REDRAWN}{draw}"] = (
                scores + rng.normal(0.0, 1.0, scores.shape) * spread
            )
    return redrawn


def _map_errors(name: str, scored: Mapping[str, Any], modality: str) -> dict[str, float]:
    """Each score's standard deviation over ``name``'s redrawn maps (``*_map_se``), if any."""
    draws = [scored[key].metrics for key in scored if key.startswith(f"{name}{_REDRAWN}")]
    if not draws:
        return {}
    return {
        f"{score}_map_se": float(np.std([d[score] for d in draws], ddof=1))
        for score, _, _ in SCORES[modality]
    }


def _interval(values: np.ndarray, seed: int) -> tuple[float, float]:
    if values.size < 2 or np.ptp(values) == 0:
        return float(values.mean()), float(values.mean())
    result = bootstrap(
        (values,), np.mean, confidence_level=0.95, n_resamples=2000, rng=seed, method="percentile"
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def summarise(per_item: pd.DataFrame, modality: str, seed: int = 0) -> pd.DataFrame:
    """
    One row per method: each score's mean and 95 % bootstrap interval, and more.

    Also the share of items on which it beats random orders (``*_wins``: a settled margin of at
    least 0.01 over the item's reference, :func:`~attribution.verdicts.item_outcome`), the items
    that won or lost (``*_untied``), the two-sided sign test of wins against losses over them
    (``*_sign_p``) and its verdict (``*_verdict``: pass = better than random, fail = worse,
    inconclusive; under :data:`~attribution.verdicts.MIN_SIGN_TRIALS` untied items always
    inconclusive, and inconclusive too where redraws of the items' margins within their noise
    would not keep a pass or fail: :func:`~attribution.verdicts.items_sign_test`), and the mean
    forward passes and seconds per item.
    """
    rows = []
    for method, group in per_item.groupby("method", sort=False):
        row: dict[str, Any] = {"method": method, "items": len(group)}
        for score, random, higher in SCORES[modality]:
            values = group[score].to_numpy(dtype=float)
            low, high = _interval(values, seed)
            row[score] = float(values.mean())
            row[f"{score}_ci"] = f"[{low:.3f}, {high:.3f}]"
            if random in group:  # absent when no random orders were drawn
                randoms = group[random].to_numpy(dtype=float)
                # rows written before draws became adaptive carry no error: their mean as is
                errors = group.get(f"{random}_se", pd.Series(0.0, index=group.index)).fillna(0.0)
                # a sampled map's own noise adds to the reference's (independent draws)
                own = group.get(f"{score}_map_se", pd.Series(0.0, index=group.index)).fillna(0.0)
                errors = np.sqrt(errors**2 + own**2)
                verdict, outcomes = items_sign_test(
                    score, values, randoms, errors.to_numpy(float), higher, seed
                )
                row[f"{score}_wins"] = float(np.mean(outcomes == 1))
                row[f"{score}_untied"] = int((outcomes != 0).sum())
                row[f"{score}_sign_p"] = verdict.value
                row[f"{score}_verdict"] = verdict.status
        row["forward_passes"] = float(group["forward_passes"].mean())
        row["seconds"] = float(group["seconds"].mean())
        rows.append(row)
    return pd.DataFrame(rows)
