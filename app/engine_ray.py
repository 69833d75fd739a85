"""
``attrlab batch --engine ray``: the same worker code as a Ray Data actor pool.

Each actor loads the model once and explains the batches of rows Ray hands it with
:func:`app.batch.explain_rows`, exactly as the local engine does; on a GPU cluster each actor
holds ``gpus_per_worker`` GPUs, so a dataset spreads over every GPU of the cluster.
``RAY_ADDRESS`` joins an existing cluster; without it a local Ray starts for the run. Ray is an
optional extra (``pip install attrlab[ray]``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
import torch

from attrlab.app.batch import BatchConfig, DatasetRow, explain_rows, result_arrow
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import AttrlabError
from attrlab.attribution.models.placement import Placement
from attrlab.attribution.request.answers import AnswerSpec

__all__ = ["ExplainActor", "RayEngineError", "ray_batches", "ray_items"]


class RayEngineError(AttrlabError):
    """Ray is not installed, or the cluster cannot be reached."""


class ExplainActor:
    """One model per actor; a pandas batch of dataset rows in, result rows out."""

    def __init__(self, config: dict[str, Any]) -> None:
        torch.set_num_threads(max(1, int(os.environ.get("ATTRLAB_ACTOR_THREADS", "1"))))
        # asdict made the placement a dict on its way here
        self.config = BatchConfig(**{**config, "placement": Placement(**config["placement"])})
        settings = ServerSettings.unrestricted(self.config.placement)
        self.worker = ExplainWorker(device=self.config.device, max_models=1, settings=settings)

    def __call__(self, batch: Any) -> Any:
        rows = self.dataset_rows(batch)
        # the file's own schema, whatever the rows hold (a batch of errors has no scores)
        return result_arrow(explain_rows(self.worker, self.config, rows))

    @staticmethod
    def dataset_rows(batch: pd.DataFrame) -> list[DatasetRow]:
        """The rows of a pandas batch of :func:`ray_items`, as they were."""
        return [
            DatasetRow(
                id=str(r["id"]),
                text=_value(r["text"]),
                image=_value(r["image"]),
                target=_target(r["target_index"], r["target_label"]),
                answer=_answer(r["answer"]),
                granularity=str(r["granularity"]),
                spans=None if _value(r["spans"]) is None else json.loads(r["spans"]),
                problem=_value(r["problem"]),
            )
            for r in batch.to_dict("records")
        ]


def ray_items(rows: Sequence[DatasetRow]) -> list[dict[str, Any]]:
    """Dataset rows as Ray Data items: columns of one Arrow type each, whatever rows hold."""
    return [
        {
            "id": r.id,
            "text": r.text,
            "image": r.image,
            # a target index and a target label travel apart
            "target_index": r.target if isinstance(r.target, int) else None,
            "target_label": r.target if isinstance(r.target, str) else None,
            # an answer's fields as one JSON text
            "answer": None if r.answer is None else json.dumps(r.answer.to_json()),
            "granularity": r.granularity,
            "spans": None if r.spans is None else json.dumps(r.spans),  # as one JSON text
            "problem": r.problem,
        }
        for r in rows
    ]


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
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            else:
                ray.init(
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"),  # short: socket paths
                )
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RayEngineError(f"cannot start or reach Ray: {err}") from None
    if not os.environ.get("RAY_ADDRESS"):  # a joined cluster may scale up to what is asked
        _check_resources(ray.cluster_resources(), workers, gpus_per_worker, cpus_per_worker)
    items = ray_items(rows)
    # an actor's error (a model that cannot load) reaches here as itself, not as Ray's wrapper
    ray.data.DataContext.get_current().raise_original_map_exception = True
    dataset = ray.data.from_items(items).map_batches(
        ExplainActor,
        fn_constructor_kwargs={"config": asdict(config)},
        batch_size=batch_size,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_gpus=gpus_per_worker,
        num_cpus=cpus_per_worker,
    )
    batches = iter(dataset.iter_batches(batch_format="pandas", batch_size=None))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as err:  # an actor's error arrives wrapped in Ray's own
            raise _unwrapped(err) from None
        answers = [
            {key: _plain(_value(value)) for key, value in row.items()}
            for row in pd.DataFrame(batch).to_dict("records")
        ]
        for answer in answers:  # a column with missing targets comes back as floats
            answer["target"] = None if answer["target"] is None else int(answer["target"])
        yield answers


def _check_resources(
    cluster: dict[str, float], workers: int, gpus_per_worker: float, cpus_per_worker: float
) -> None:
    """
    Refuse an actor pool the local Ray cannot hold: Ray would wait for it for ever.

    Raises:
        RayEngineError: naming what is asked and what the cluster has.
    """
    asked = (("GPU", "gpus", gpus_per_worker), ("CPU", "cpus", cpus_per_worker))
    for resource, flag, each in asked:
        has = cluster.get(resource, 0.0)
        if workers * each > has + 1e-9:  # 25 × 0.28 is 7.000000000000001
            raise RayEngineError(
                f"--workers {workers} × --{flag}-per-worker {each:g} needs {workers * each:g} "
                f"{resource}s; this Ray cluster has {has:g}"
            )


def _unwrapped(err: BaseException) -> AttrlabError:
    """The attrlab error inside Ray's wrapping of an actor's failure, or one naming it."""
    chain: list[BaseException] = []
    seen: Any = err
    while isinstance(seen, BaseException) and all(seen is not e for e in chain):
        chain.append(seen)
        # RayTaskError keeps the actor's own exception as ``cause``
        seen = getattr(seen, "cause", None) or seen.__cause__
    for inner in reversed(chain):  # the actor's own error, not Ray's copy holding its trace
        if isinstance(inner, AttrlabError):
            return inner
    last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return RayEngineError(f"a Ray worker failed: {last}")


def _value(value: Any) -> Any:
    """Arrow's missing value (NaN / None) as None."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value


def _plain(value: Any) -> Any:
    """A list column's value as Python lists, dicts and numbers (Arrow hands back arrays)."""
    if isinstance(value, np.ndarray | list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def _answer(fields: Any) -> AnswerSpec | None:
    fields = _value(fields)
    return None if fields is None else AnswerSpec.from_json(json.loads(fields))


def _target(index: Any, label: Any) -> int | str | None:
    index = _value(index)
    return int(index) if index is not None else _value(label)
