"""
One request and its gate: the records every front end builds, the bounds, admit and resolve.

:mod:`~attribution.request.records` holds the requests and their rules,
:mod:`~attribution.request.bounds` the numbers a server bounds them by, and
:mod:`~attribution.request.admission` the gate: :func:`admit` before the model loads,
:func:`resolve` once it is loaded. The worker (``app.worker``) adds the device: queues, lanes,
the model cache, progress and cancel.
"""

from __future__ import annotations

from attrlab.attribution.request.admission import admit, resolve
from attrlab.attribution.request.bounds import (
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_SEED,
    MAX_TARGET_CHARS,
    RequestBounds,
)
from attrlab.attribution.request.records import (
    MAX_ABLATED_HEADS,
    MAX_CURVE_STEPS,
    MAX_ORDERS,
    AblationRequest,
    AttentionRequest,
    BatchRequest,
    CheckRequest,
    EstimateRequest,
    EvaluateRequest,
    ExplainRequest,
    InputRequest,
    Instance,
    InstanceFailedError,
    InstanceResults,
    JobContext,
    LayersDatasetRequest,
    PatchRequest,
    PreviewRequest,
    PruneRequest,
    Request,
    check_instance_features,
    check_modality,
)

__all__ = [
    "MAX_ABLATED_HEADS",
    "MAX_CURVE_STEPS",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "MAX_ORDERS",
    "MAX_SEED",
    "MAX_TARGET_CHARS",
    "AblationRequest",
    "AttentionRequest",
    "BatchRequest",
    "CheckRequest",
    "EstimateRequest",
    "EvaluateRequest",
    "ExplainRequest",
    "InputRequest",
    "Instance",
    "InstanceFailedError",
    "InstanceResults",
    "JobContext",
    "LayersDatasetRequest",
    "PatchRequest",
    "PreviewRequest",
    "PruneRequest",
    "Request",
    "RequestBounds",
    "admit",
    "check_instance_features",
    "check_modality",
    "resolve",
]
