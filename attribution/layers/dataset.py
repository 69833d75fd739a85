"""
Dataset mode: the layer measures over many inputs, as mean and spread per layer and head.

Inputs stream through one at a time (a list or any iterable, e.g. the lines of a JSONL file);
only running sums are kept (Welford's update), so memory does not grow with the dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from attrlab.attribution.inputs.runs import run_rows
from attrlab.attribution.layers.analysis import analyze
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import resolve_target

__all__ = ["DATASET_COLUMNS", "DatasetItem", "analyze_dataset"]

#: Columns of the dataset table: the key columns of the layer table, then the statistics.
DATASET_COLUMNS = ("layer", "head", "kv_head", "component", "measure", "mean", "std", "count")


@dataclass(frozen=True)
class DatasetItem:
    """One input (a text or an image as the adapter takes it) and its target (None = top)."""

    raw: Any
    target: int | str | None = None


@dataclass
class _Welford:
    count: int = 0
    mean: float = 0.0
    squares: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.squares += delta * (value - self.mean)

    @property
    def std(self) -> float:
        """Sample standard deviation (NaN for a single value)."""
        return float(np.sqrt(self.squares / (self.count - 1))) if self.count > 1 else float("nan")


def analyze_dataset(
    adapter: Adapter,
    items: Iterable[DatasetItem],
    measures: Collection[str] | None = None,
    settings: RunSettings | None = None,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """
    Mean, sample standard deviation and count of every layer measure over ``items``.

    ``progress`` receives the number of inputs done after each; ``settings`` are one run's
    over the whole dataset (its seed, cancel switch, and pass budget for all inputs together).

    Returns:
        A table with :data:`DATASET_COLUMNS`, one row per layer / head and measure.
    """
    shared = RunContext.of(settings)

    def layer_table(item: DatasetItem) -> pd.DataFrame:
        inputs = adapter.preprocess(item.raw)
        with torch.no_grad():
            logits = adapter.logits(**inputs.model_kwargs())[0]
        shared.count(forward=1)
        target = resolve_target(adapter, item.target, logits)
        return analyze(adapter, inputs, target, measures, shared).table

    stats: dict[tuple, _Welford] = {}
    for _, table in run_rows(items, layer_table, shared.cancel, progress):
        for row in table.itertuples(index=False):
            head, kv = _nullable(row.head), _nullable(row.kv_head)
            key = (row.layer, head, kv, row.component, row.measure)
            stats.setdefault(key, _Welford()).add(float(row.value))
    records = [(*key, s.mean, s.std, s.count) for key, s in stats.items()]
    frame = pd.DataFrame.from_records(records, columns=list(DATASET_COLUMNS))
    return frame.astype({"layer": "int64", "head": "Int64", "kv_head": "Int64"})


def _nullable(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)
