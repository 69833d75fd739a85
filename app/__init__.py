"""
attrlab front ends: Gradio UI, REST API, worker and CLI (wiring only, no maths).

Exports are imported on first use, so that the CLI's light commands (``--help``, ``models``,
``methods``) import neither torch nor the web stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.app.batch import (
        IMAGE_SUFFIXES,
        BatchConfig,
        DatasetRow,
        ResultFile,
        dataset_rows,
        explain_rows,
        pending_rows,
        unique_ids,
    )
    from attrlab.app.engine_ray import ray_batches
    from attrlab.app.server import serve
    from attrlab.app.settings import (
        ServerSettings,
        SettingsError,
        parse_param_limits,
        placement_setting,
        positive_int,
        split_list,
    )
    from attrlab.app.worker import (
        ExplainWorker,
        parse_param_pairs,
    )

__all__ = [
    "IMAGE_SUFFIXES",
    "BatchConfig",
    "DatasetRow",
    "ExplainWorker",
    "ResultFile",
    "ServerSettings",
    "SettingsError",
    "dataset_rows",
    "explain_rows",
    "parse_param_limits",
    "parse_param_pairs",
    "pending_rows",
    "placement_setting",
    "positive_int",
    "ray_batches",
    "serve",
    "split_list",
    "unique_ids",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "IMAGE_SUFFIXES": "attrlab.app.batch",
        "BatchConfig": "attrlab.app.batch",
        "DatasetRow": "attrlab.app.batch",
        "ResultFile": "attrlab.app.batch",
        "dataset_rows": "attrlab.app.batch",
        "explain_rows": "attrlab.app.batch",
        "pending_rows": "attrlab.app.batch",
        "unique_ids": "attrlab.app.batch",
        "ray_batches": "attrlab.app.engine_ray",
        "serve": "attrlab.app.server",
        "ServerSettings": "attrlab.app.settings",
        "SettingsError": "attrlab.app.settings",
        "parse_param_limits": "attrlab.app.settings",
        "placement_setting": "attrlab.app.settings",
        "positive_int": "attrlab.app.settings",
        "split_list": "attrlab.app.settings",
        "ExplainWorker": "attrlab.app.worker",
        "parse_param_pairs": "attrlab.app.worker",
    },
)
