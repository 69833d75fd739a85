"""
Parameter records and schemas: one declaration drives validation, UI widgets, CLI and REST docs.

A method declares its parameters once, as the typed fields of a frozen dataclass over
:class:`MethodParams`, each field made by :func:`param` (its default, help, bounds, choices).
The record's :meth:`~MethodParams.schema` (a :class:`Param` per field) is derived from those
fields: what widgets, the CLI, the REST docs and :func:`validate_params` read. Front ends and
explanations speak plain names and values; the method reads its record's attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import NoneType, UnionType
from typing import Any, Generic, TypeVar, cast, get_args, get_type_hints

from attrlab.attribution.errors import InvalidParameterError

__all__ = [
    "MethodParams",
    "Param",
    "Spec",
    "param",
    "parse_param_value",
    "power_of_two",
    "validate_params",
    "whole_float_as_int",
]

_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
_KINDS = {kind: name for name, kind in _TYPES.items()}
_SPEC = "attrlab.param"  # a record field's metadata key for its Spec
T = TypeVar("T")
R = TypeVar("R", bound="MethodParams")


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


@dataclass(frozen=True)
class Spec(Generic[T]):
    """
    How one field of a parameter record is checked and shown.

    Its :class:`Param` less the name and kind, which the field's name and type give. A spec
    shared by several methods' records (a batch size, a baseline) is declared once and made a
    field of each with :meth:`as_field`.
    """

    default: T
    help: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False
    choices: Sequence[str] | None = None
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)

    def as_field(self) -> T:
        """A field with this default and spec (a fresh one per record: fields are not shared)."""
        return cast(T, dataclasses.field(default=self.default, metadata={_SPEC: self}))


def param(
    default: T,
    help: str,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive: bool = False,
    choices: Sequence[str] | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> T:
    """
    A field of a parameter record: its default and how it is checked and shown.

    The arguments are :class:`Param`'s but the name and kind, which the field gives:
    ``n_masks: int = param(4000, "Number of masks.", 1, 200_000)``.
    """
    return Spec(default, help, minimum, maximum, exclusive, choices, check).as_field()


@dataclass(frozen=True, kw_only=True)
class MethodParams:
    """
    Base of a method's parameter record: a frozen dataclass, one typed field per parameter.

    Subclasses are declared ``@dataclass(frozen=True, kw_only=True)`` with each field made by
    :func:`param` (or a shared :meth:`Spec.as_field`); a field's type is ``int``, ``float``,
    ``str`` or ``bool``, or one of them ``| None`` where ``None`` means "automatic". Shared
    groups of parameters (smoothing, checkpointing) are records a method's record derives from.
    """

    @classmethod
    def schema(cls) -> tuple[Param, ...]:
        """
        A :class:`Param` per field, derived from the fields.

        The record's own fields come first, then those of the records it derives from (the
        shared groups, listed last as widgets and docs show them).

        Raises:
            TypeError: a record not declared a dataclass, a field made without :func:`param`,
                a type that is no parameter kind, or a default its own schema refuses.
        """
        if cls not in _SCHEMAS:
            _SCHEMAS[cls] = _schema_of(cls)
        return _SCHEMAS[cls]

    @classmethod
    def validated(cls: type[R], params: Mapping[str, Any] | None, strict: bool = False) -> R:
        """The record of ``params`` checked by :func:`validate_params`, defaults filled in."""
        return cls(**validate_params(cls.schema(), params, strict))

    @classmethod
    def of(cls: type[R], values: Mapping[str, Any]) -> R:
        """
        The record of parameters already checked, given as plain names and values.

        As :meth:`validated` or a method's ``resolve`` give them: each of the record's names
        is read from ``values``, a name missing there takes its default, and names of other
        records are not read.
        """
        return cls(**{p.name: values[p.name] for p in cls.schema() if p.name in values})

    def to_dict(self) -> dict[str, Any]:
        """Plain names and values, in :meth:`schema` order (an Explanation's ``params``, JSON)."""
        return {p.name: getattr(self, p.name) for p in self.schema()}


_SCHEMAS: dict[type[MethodParams], tuple[Param, ...]] = {}


def _schema_of(record: type[MethodParams]) -> tuple[Param, ...]:
    if "__dataclass_fields__" not in vars(record):
        raise TypeError(f"{record.__name__}: declare it @dataclass(frozen=True, kw_only=True)")
    fields = {f.name: f for f in dataclasses.fields(record)}
    hints = get_type_hints(record)
    own_first = dict.fromkeys(
        name for klass in record.__mro__ for name in vars(klass).get("__annotations__", {})
    )
    schema = []
    for name in (n for n in own_first if n in fields):
        spec = fields[name].metadata.get(_SPEC)
        if not isinstance(spec, Spec):
            raise TypeError(f"{record.__name__}.{name}: make the field with param()")
        entry = Param(
            name,
            _kind(record, name, hints[name]),
            spec.default,
            spec.help,
            spec.minimum,
            spec.maximum,
            spec.exclusive,
            spec.choices,
            spec.check,
        )
        try:
            entry.validate(entry.default)
        except InvalidParameterError as err:
            raise TypeError(f"{record.__name__}.{name}: its default is refused: {err}") from None
        schema.append(entry)
    return tuple(schema)


def _kind(record: type, name: str, hint: Any) -> str:
    """The :class:`Param` kind of a field's type: ``int``, ``int | None``, ... -> ``"int"``."""
    types = [t for t in get_args(hint) if t is not NoneType] if type(hint) is UnionType else [hint]
    if len(types) != 1 or types[0] not in _KINDS:
        raise TypeError(f"{record.__name__}.{name}: {hint} is no parameter kind")
    return _KINDS[types[0]]


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
