"""
One request and its gate: what to explain, whether it may run, what it costs, how it runs.

:mod:`~attribution.request.records` holds the requests and their rules,
:mod:`~attribution.request.bounds` the numbers a server bounds them by, and
:mod:`~attribution.request.admission` the gate: :func:`admit` before the model loads,
:func:`resolve` once it is loaded, :func:`run_request` both and the run in the caller's
thread. Beside them: what is explained (:mod:`~attribution.request.target`,
:mod:`~attribution.request.answers`), one method's run cleared and priced
(:mod:`~attribution.request.gate`, :mod:`~attribution.request.estimate`,
:mod:`~attribution.request.calibration`, :mod:`~attribution.request.memory`,
:mod:`~attribution.request.pricing`), the run's settings and state
(:mod:`~attribution.request.run`), parameter schemas (:mod:`~attribution.request.params`) and
the numbers a request leaves out (:mod:`~attribution.request.defaults`). The worker
(``app.worker``) adds the device: queues, lanes, the model cache, progress and cancel. Exports
are imported on first use: the bounds need no model code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.request.admission import admit, resolve, run_request
    from attrlab.attribution.request.bounds import (
        MAX_LABEL_CHARS,
        MAX_LABELS,
        MAX_SEED,
        MAX_TARGET_CHARS,
        RequestBounds,
    )
    from attrlab.attribution.request.gate import check_modality
    from attrlab.attribution.request.records import (
        MAX_ABLATED_HEADS,
        MAX_CURVE_STEPS,
        MAX_ORDERS,
        AblationRequest,
        AttentionRequest,
        BatchRequest,
        BitsRequest,
        CheckRequest,
        EstimateRequest,
        EvaluateRequest,
        EvictRequest,
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
        VisualTokensRequest,
        check_instance_features,
        check_instance_modalities,
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
    "BitsRequest",
    "CheckRequest",
    "EstimateRequest",
    "EvaluateRequest",
    "EvictRequest",
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
    "VisualTokensRequest",
    "admit",
    "check_instance_features",
    "check_instance_modalities",
    "check_modality",
    "resolve",
    "run_request",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "admit": "attrlab.attribution.request.admission",
        "resolve": "attrlab.attribution.request.admission",
        "run_request": "attrlab.attribution.request.admission",
        "MAX_LABEL_CHARS": "attrlab.attribution.request.bounds",
        "MAX_LABELS": "attrlab.attribution.request.bounds",
        "MAX_SEED": "attrlab.attribution.request.bounds",
        "MAX_TARGET_CHARS": "attrlab.attribution.request.bounds",
        "RequestBounds": "attrlab.attribution.request.bounds",
        "MAX_ABLATED_HEADS": "attrlab.attribution.request.records",
        "MAX_CURVE_STEPS": "attrlab.attribution.request.records",
        "MAX_ORDERS": "attrlab.attribution.request.records",
        "AblationRequest": "attrlab.attribution.request.records",
        "AttentionRequest": "attrlab.attribution.request.records",
        "BatchRequest": "attrlab.attribution.request.records",
        "CheckRequest": "attrlab.attribution.request.records",
        "EstimateRequest": "attrlab.attribution.request.records",
        "EvaluateRequest": "attrlab.attribution.request.records",
        "EvictRequest": "attrlab.attribution.request.records",
        "ExplainRequest": "attrlab.attribution.request.records",
        "InputRequest": "attrlab.attribution.request.records",
        "Instance": "attrlab.attribution.request.records",
        "InstanceFailedError": "attrlab.attribution.request.records",
        "InstanceResults": "attrlab.attribution.request.records",
        "JobContext": "attrlab.attribution.request.records",
        "LayersDatasetRequest": "attrlab.attribution.request.records",
        "PatchRequest": "attrlab.attribution.request.records",
        "PreviewRequest": "attrlab.attribution.request.records",
        "PruneRequest": "attrlab.attribution.request.records",
        "BitsRequest": "attrlab.attribution.request.records",
        "Request": "attrlab.attribution.request.records",
        "VisualTokensRequest": "attrlab.attribution.request.records",
        "check_instance_features": "attrlab.attribution.request.records",
        "check_instance_modalities": "attrlab.attribution.request.records",
        "check_modality": "attrlab.attribution.request.gate",
    },
)
