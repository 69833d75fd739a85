"""
The numbers a server bounds every request by, and the checks that read them.

A request's own rules (how many heads an ablation zeroes, the curve sizes of an evaluation)
are :mod:`attribution.request.records`'; these are the numbers an operator configures
(``app.settings.ServerSettings`` is a :class:`RequestBounds` with the server's other
settings). The defaults bound nothing: the library and the command line trust their user.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attrlab.attribution.errors import (
    InputTooLargeError,
    InvalidInputError,
    InvalidParameterError,
    require_unicode,
)
from attrlab.attribution.models.images import max_image_pixels
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.attribution.request.run import ProgressCallback, RunSettings

__all__ = [
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "MAX_SEED",
    "MAX_TARGET_CHARS",
    "RequestBounds",
]

#: Request fields bounded whatever the bounds (the REST schema says the same).
MAX_LABELS, MAX_LABEL_CHARS, MAX_TARGET_CHARS, MAX_SEED = 100, 200, 200, 2**32 - 1


@dataclass(frozen=True, kw_only=True)
class RequestBounds:
    """
    How large a request may be, and how much work one run of it may do.

    Attributes:
        max_text_chars: Longest text explained (a prompt, an answer, a contrast, a dataset's).
        max_image_pixels: Largest image, checked from its header before decoding.
        param_limits: Ceiling per parameter, by name (``n_masks``) or method and name
            (``rise.n_masks``, which wins).
        max_forward_passes: Most forward passes one request may need (``None``: no limit).
        max_seconds: Longest estimated time of one request; slower ones are refused before
            they start, with the estimate (``None``: no limit).
        max_memory_bytes: Most memory one request may hold at its peak beyond the loaded
            model (``None``: no limit).
        max_batch: Most instances in one batch or uploaded evaluation (``None``: no limit).
    """

    max_text_chars: int | None = None
    max_image_pixels: int = field(default_factory=max_image_pixels)
    param_limits: Mapping[str, float] = field(default_factory=dict)
    max_forward_passes: int | None = None
    max_seconds: float | None = None
    max_memory_bytes: int | None = None
    max_batch: int | None = None

    def check_fields(
        self,
        text: str | None,
        labels: Sequence[str] | None,
        target: Any,
        seed: Any,
        answer: AnswerSpec | None = None,
    ) -> None:
        """
        Refuse request fields out of bounds, whichever front end they came through.

        A decoder's ``answer`` and ``contrast`` are texts of the same bound as the prompt's.
        """
        texts = [("the text", text)]
        if answer is not None:
            texts += [("the answer", answer.answer), ("the contrast", answer.contrast)]
            texts += [("the stop text", answer.stop)]
        for what, value in texts:
            limit = self.max_text_chars
            if value is not None and limit is not None and len(value) > limit:
                raise InputTooLargeError(
                    f"{what} has {len(value)} characters; this server accepts at most {limit}"
                )
        if labels is not None and (
            len(labels) > MAX_LABELS or any(len(label) > MAX_LABEL_CHARS for label in labels)
        ):
            raise InvalidInputError(
                f"give at most {MAX_LABELS} labels of at most {MAX_LABEL_CHARS} characters each"
            )
        if isinstance(target, str) and len(target) > MAX_TARGET_CHARS:
            raise InvalidInputError(f"the target is longer than {MAX_TARGET_CHARS} characters")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise InvalidInputError(f"the seed must be a whole number from 0 to {MAX_SEED}")
        for what, value in (
            *texts,
            ("the target", target),
            *(("a label", x) for x in labels or ()),
        ):
            if isinstance(value, str):
                require_unicode(value, what)

    def check_params(self, method: str, params: Mapping[str, Any]) -> None:
        """Refuse resolved parameters above these bounds' ceilings for ``method``."""
        for name, value in params.items():
            limit = self.param_limits.get(f"{method}.{name}", self.param_limits.get(name))
            if limit is None or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if value > limit:
                raise InvalidParameterError(
                    f"parameter '{name}' = {value} is above this server's limit of "
                    f"{limit:g} for {method}; ask for less"
                )

    def budgets(
        self, progress: ProgressCallback | None, cancel: threading.Event | None
    ) -> RunSettings:
        """The run settings of one request within these bounds: its progress and cancel switch."""
        return RunSettings(
            progress=progress,
            cancel=cancel,
            max_forward_passes=self.max_forward_passes,
            max_seconds=self.max_seconds,
            max_memory_bytes=self.max_memory_bytes,
        )
