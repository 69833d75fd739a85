"""
``attrlab batch --engine ray``: the same worker code as a Ray Data actor pool.

Each actor loads the model once and explains the batches of rows Ray hands it with
:func:`app.batch.explain_rows`, exactly as the local engine does; on a GPU cluster each actor
holds ``gpus_per_worker`` GPUs, so a dataset spreads over every GPU of the cluster.
``RAY_ADDRESS`` joins an existing cluster; without it a local Ray starts for the run. Ray is an
optional extra (``pip install attrlab[ray]``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from app.batch import BatchConfig, DatasetRow, explain_rows
from attribution.errors import AttrlabError

__all__ = ["RayEngineError", "ray_batches"]


class RayEngineError(AttrlabError):
    """Ray is not installed, or the cluster cannot be reached."""


class ExplainActor:
    """One model per actor; a pandas batch of dataset rows in, result rows out."""

    def __init__(self, config: dict[str, Any]) -> None:
        import torch

        from app.worker import ExplainWorker

        torch.set_num_threads(max(1, int(os.environ.get("ATTRLAB_ACTOR_THREADS", "1"))))
        self.config = BatchConfig(**config)
        self.worker = ExplainWorker(device=self.config.device, max_models=1)

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        rows = [
            DatasetRow(
                id=str(r["id"]),
                text=_value(r["text"]),
                image=_value(r["image"]),
                target=_target(r["target_index"], r["target_label"]),
                problem=_value(r["problem"]),
            )
            for r in batch.to_dict("records")
        ]
        return pd.DataFrame.from_records(explain_rows(self.worker, self.config, rows))


def ray_batches(
    rows: Sequence[DatasetRow],
    config: BatchConfig,
    workers: int,
    gpus_per_worker: float,
    cpus_per_worker: float,
    batch_size: int,
) -> Iterator[list[dict[str, Any]]]:
    """
    Result rows of ``rows`` in batches, as Ray's actors finish them (not in input order).

    Raises:
        RayEngineError: Ray is missing or cannot start or connect.
    """
    try:
        import ray
        import ray.data
    except ImportError:
        raise RayEngineError(
            "the Ray engine needs Ray: pip install 'attrlab[ray]' (or use --engine local)"
        ) from None
    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token file in the home folder
        address = os.environ.get("RAY_ADDRESS")
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(
                    include_dashboard=False,
                    log_to_driver=False,
                    _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"),  # short: socket paths
                )
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RayEngineError(f"cannot start or reach Ray: {err}") from None
    # an Arrow column has one type: a target index and a target label travel apart
    items = [
        {
            "id": r.id,
            "text": r.text,
            "image": r.image,
            "target_index": r.target if isinstance(r.target, int) else None,
            "target_label": r.target if isinstance(r.target, str) else None,
            "problem": r.problem,
        }
        for r in rows
    ]
    dataset = ray.data.from_items(items).map_batches(
        ExplainActor,
        fn_constructor_kwargs={"config": asdict(config)},
        batch_size=batch_size,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_gpus=gpus_per_worker,
        num_cpus=cpus_per_worker,
    )
    for batch in dataset.iter_batches(batch_format="pandas", batch_size=None):
        rows = [
            {key: _value(value) for key, value in row.items()} for row in batch.to_dict("records")
        ]
        for row in rows:  # a column with missing targets comes back as floats
            row["target"] = None if row["target"] is None else int(row["target"])
        yield rows


def _value(value: Any) -> Any:
    """Arrow's missing value (NaN / None) as None."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value


def _target(index: Any, label: Any) -> int | str | None:
    index = _value(index)
    return int(index) if index is not None else _value(label)
