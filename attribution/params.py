"""Parameter schemas: one declaration drives validation, UI widgets, CLI and REST docs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attrlab.attribution.errors import InvalidParameterError

__all__ = ["Param", "parse_param_value", "power_of_two", "validate_params", "whole_float_as_int"]

_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


@dataclass(frozen=True)
class Param:
    """
    One method parameter.

    Attributes:
        name: Key used in ``params`` dicts, on the CLI (``--param name=value``) and in JSON.
        kind: ``"int"``, ``"float"``, ``"str"`` or ``"bool"``.
        default: Value used when the caller gives none; ``None`` means "automatic".
        help: One sentence shown in the UI and ``attrlab methods``.
        minimum: Inclusive lower bound (numbers).
        maximum: Inclusive upper bound (numbers).
        exclusive: Bounds are exclusive instead (e.g. a probability in (0, 1)).
        choices: Allowed values (strings).
        check: Extra rule returning an error sentence or ``None``.
    """

    name: str
    kind: str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False
    choices: Sequence[str] | None = None
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)

    def validate(self, value: Any, strict: bool = False) -> Any:
        """
        Return ``value`` coerced to this parameter's type, or raise a clear error.

        ``strict`` (JSON from REST) takes only values already of the type, no text parsed;
        a whole float (``8.0``) is an int either way, as JSON Schema counts it
        (:func:`whole_float_as_int`). ``None`` means the default either way.
        """
        if value is None:
            if self.default is None:
                return None
            value = self.default
        value = self._coerce(value, strict)
        if self.choices is not None and value not in self.choices:
            raise InvalidParameterError(
                f"parameter '{self.name}' must be one of {', '.join(self.choices)}; got {value!r}"
            )
        self._check_range(value)
        if self.check is not None and (problem := self.check(value)):
            raise InvalidParameterError(f"parameter '{self.name}' {problem}; got {value!r}")
        return value

    def _coerce(self, value: Any, strict: bool = False) -> Any:
        target = _TYPES[self.kind]
        if isinstance(value, str) and target is not str and not strict:
            return parse_param_value(self, value)
        if target is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise InvalidParameterError(
                    f"parameter '{self.name}' is too large a number"
                ) from None
        if target is int:
            value = whole_float_as_int(value)
        if not isinstance(value, target) or (target is not bool and isinstance(value, bool)):
            raise InvalidParameterError(
                f"parameter '{self.name}' must be of type {self.kind}; got {value!r}"
            )
        return value

    def _check_range(self, value: Any) -> None:
        if self.kind not in ("int", "float"):
            return
        low, high = self.minimum, self.maximum
        if self.exclusive:
            ok = (low is None or value > low) and (high is None or value < high)
            span = f"strictly between {low} and {high}"
        else:
            ok = (low is None or value >= low) and (high is None or value <= high)
            span = f"between {low} and {high}" if high is not None else f"at least {low}"
        if not ok:
            raise InvalidParameterError(f"parameter '{self.name}' must be {span}; got {value!r}")

    def to_schema(self) -> dict[str, Any]:
        """JSON-schema-like description (used by ``attrlab methods`` and the REST docs)."""
        schema: dict[str, Any] = {"type": self.kind, "default": self.default, "help": self.help}
        if self.minimum is not None:
            schema["exclusiveMinimum" if self.exclusive else "minimum"] = self.minimum
        if self.maximum is not None:
            schema["exclusiveMaximum" if self.exclusive else "maximum"] = self.maximum
        if self.choices is not None:
            schema["enum"] = list(self.choices)
        return schema


def whole_float_as_int(value: Any) -> Any:
    """
    A float with no fractional part (``632.0``) as the int it equals; anything else unchanged.

    JSON Schema counts such a number as an integer, so a client that follows a schema saying
    ``integer`` may send it; ``8.5``, ``"8"`` and ``true`` stay what they are.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_param_value(param: Param, text: str) -> Any:
    """Parse a ``key=value`` string from the CLI or a form field into the parameter's type."""
    text = text.strip()
    try:
        if param.kind == "int":
            return int(text)
        if param.kind == "float":
            return float(text)
        if param.kind == "bool":
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
    except ValueError:
        raise InvalidParameterError(
            f"parameter '{param.name}' must be of type {param.kind}; got {text!r}"
        ) from None
    return text


def validate_params(
    schema: Sequence[Param], params: Mapping[str, Any] | None, strict: bool = False
) -> dict[str, Any]:
    """
    Validate ``params`` against ``schema`` and fill in defaults.

    ``strict``: values only of their own type (see :meth:`Param.validate`).

    Raises:
        InvalidParameterError: for an unknown key (the message lists the known ones) or a bad value.
    """
    params = dict(params or {})
    known = {p.name: p for p in schema}
    unknown = sorted(set(params) - set(known))
    if unknown:
        listing = ", ".join(known) or "none"
        raise InvalidParameterError(
            f"unknown parameter(s) {', '.join(unknown)}; this method takes: {listing}"
        )
    return {name: p.validate(params.get(name), strict) for name, p in known.items()}


def power_of_two(value: int) -> str | None:
    """Check for :class:`Param`: the value must be a power of two."""
    return None if value > 0 and value & (value - 1) == 0 else "must be a power of two"
