"""How user errors reach a client: one status and code per error class, no server paths."""

from __future__ import annotations

import re
from typing import Any

from attrlab.app.worker import (
    InstanceInterruptedError,
    JobTableBusyError,
    QueueFullError,
    WorkerClosedError,
)
from attrlab.attribution.errors import (
    AttrlabError,
    BudgetExceededError,
    DeviceMemoryError,
    InputTooLargeError,
    InvalidInputError,
    InvalidParameterError,
    JobCancelledError,
    ModelLoadError,
    TooMuchMemoryError,
    TooSlowError,
    UnknownMethodError,
    UnknownModelError,
    UnsupportedMethodError,
)
from attrlab.attribution.request import InstanceFailedError

__all__ = [
    "ERROR_STATUS",
    "error_record",
    "error_status",
    "public_message",
    "validation_problems",
]

#: HTTP status and machine-readable code of each user error (the most specific class wins).
ERROR_STATUS: dict[type[AttrlabError], tuple[int, str]] = {
    InputTooLargeError: (413, "input_too_large"),
    InvalidInputError: (400, "invalid_input"),
    UnsupportedMethodError: (400, "method_not_applicable"),
    ModelLoadError: (400, "model_not_loadable"),
    InvalidParameterError: (422, "invalid_parameter"),
    BudgetExceededError: (422, "over_budget"),
    UnknownModelError: (404, "unknown_model"),
    UnknownMethodError: (404, "unknown_method"),
    QueueFullError: (429, "queue_full"),
    DeviceMemoryError: (503, "out_of_device_memory"),
    JobCancelledError: (503, "cancelled"),
    WorkerClosedError: (503, "shutting_down"),
    JobTableBusyError: (503, "jobs_unavailable"),
    InstanceFailedError: (500, "internal"),
    InstanceInterruptedError: (500, "instance_interrupted"),
    TooSlowError: (422, "too_slow"),
    TooMuchMemoryError: (422, "over_memory"),
}

# An absolute POSIX or Windows path not preceded by a word character, e.g. inside a library's
# message about a cached file; hub ids ("org/model") and URLs keep their text.
_SERVER_PATH = re.compile(r"(?<![\w:/.~-])(?:[A-Za-z]:\\|/)(?:[\w.@+-]+[/\\])*[\w.@+-]+")


def error_status(err: AttrlabError) -> tuple[int, str]:
    """Status and code for ``err``, looked up along its class hierarchy."""
    for cls in type(err).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return 400, "bad_request"


def public_message(message: str) -> str:
    """``message`` with any absolute filesystem path replaced by ``<path>``."""
    return _SERVER_PATH.sub("<path>", message)


def error_record(err: AttrlabError) -> dict[str, dict[str, str]]:
    """The JSON error body for ``err``: ``{"error": {"code": ..., "message": ...}}``."""
    return {"error": {"code": error_status(err)[1], "message": public_message(str(err))}}


def validation_problems(errors: list[Any]) -> str:
    """A request body's first few validation errors (pydantic's), one line: ``field: problem``."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg', 'invalid')}"
        for e in errors[:5]
    )
    return problems or "the request is not valid"
