"""
User-facing errors: each names the problem in words a researcher can act on.

Front ends (UI, REST, CLI) show the message of an :class:`AttrlabError` as it is and never
a traceback; any other exception is a bug.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "AttrlabError",
    "BudgetExceededError",
    "DeviceMemoryError",
    "InputTooLargeError",
    "InvalidInputError",
    "InvalidParameterError",
    "JobCancelledError",
    "ModelLoadError",
    "TooSlowError",
    "UnknownMethodError",
    "UnknownModelError",
    "UnsupportedMethodError",
    "parse_json",
    "require_unicode",
]


class AttrlabError(Exception):
    """Base class of every error whose message is meant for the user."""


class InvalidInputError(AttrlabError):
    """The text or image given cannot be explained (empty, unreadable, too large)."""


class InputTooLargeError(InvalidInputError):
    """The input exceeds a size limit (text length, image pixels, request size)."""


class InvalidParameterError(AttrlabError):
    """A method parameter is unknown, of the wrong type or out of range."""


class BudgetExceededError(InvalidParameterError):
    """The parameters ask for more forward passes than this server allows per request."""


class UnknownModelError(AttrlabError):
    """The model spec is neither a built-in alias, a local directory nor a reachable hub id."""


class ModelLoadError(AttrlabError):
    """
    The model was found but cannot be loaded or is of an unsupported family.

    ``detail`` keeps the underlying library's message (it may name files on the machine): the
    command line shows it, servers log it and show only the message.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class UnknownMethodError(AttrlabError):
    """No attribution method is registered under that name."""


class UnsupportedMethodError(AttrlabError):
    """The method exists but cannot be applied to this model or input."""


class TooSlowError(AttrlabError):
    """A run whose estimated time is over the seconds its caller allows."""


class TooMuchMemoryError(AttrlabError):
    """A run whose estimated peak memory is over the memory its caller allows."""


class JobCancelledError(AttrlabError):
    """The user cancelled the job; partial work is discarded."""


class DeviceMemoryError(AttrlabError):
    """The job does not fit in device memory even at batch size 1."""


def require_unicode(text: str, what: str) -> None:
    """
    Refuse a string that is not valid Unicode: one holding a lone surrogate (U+D800 to U+DFFF).

    Python strings can hold one, but no tokenizer can encode it.

    Raises:
        InvalidInputError: naming ``what`` ("the text", "a label").
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(err.object[err.start])
        raise InvalidInputError(
            f"{what} is not valid Unicode: it holds a lone surrogate (U+{code:04X}) at "
            f"character {err.start}"
        ) from None


def parse_json(text: str, what: str) -> Any:
    """
    ``text`` parsed as JSON, or a refusal naming ``what`` (``"line 3"``, a file's name).

    Python's parser recurses once per level of nesting: a text nested deeper than the recursion
    limit (``[[[[...`` a hundred thousand times) is refused like one that is not JSON, and so is
    a number longer than Python converts (4,300 digits by default).

    Raises:
        InvalidInputError: ``"<what>: not JSON (<why>)"``.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}" if err.lineno > 1 else f"column {err.colno}"
        raise InvalidInputError(f"{what}: not JSON ({err.msg} at {where})") from None
    except ValueError:  # int()'s digit limit, which the parser meets inside a valid text
        raise InvalidInputError(f"{what}: not JSON (a number too long to read)") from None
    except RecursionError:
        raise InvalidInputError(f"{what}: not JSON (nested too deeply to read)") from None
