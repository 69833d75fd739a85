"""
What a request's method parameters may be, wherever they arrive: REST, the page, the Space.

Every method parameter is a number, a flag or a short text (the registry's kinds: ``int``,
``float``, ``bool``, ``str``), so a value of any other form is refused as it is met, without
reading into it: a parameter given a list of millions of items costs one type check. The
REST bodies' fields are of these types (:mod:`app.api`, and the Space's ``/explain_batch``,
which reads REST's body); the page's parameters field is checked against the same type
(:func:`page_params`) before anything else reads it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError, WithJsonSchema

from attrlab.app.errors import validation_problems
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.methods.catalog import catalog_entries

__all__ = [
    "MAX_NAMES",
    "MAX_PARAMS",
    "MAX_PARAM_CHARS",
    "METHOD_COUNT",
    "MethodParams",
    "ParamOrParams",
    "ParamValue",
    "ParamsByMethod",
    "one_methods_params",
    "page_params",
]

#: No request names more methods than attrlab has (from the catalog: no method imported).
METHOD_COUNT = len(catalog_entries())
#: The most parameters one method is given, and the longest text a parameter takes.
MAX_PARAMS, MAX_PARAM_CHARS = 50, 200
#: The longest name of a method or a parameter.
MAX_NAME_CHARS = 100
#: The most names one request lists of anything else (unit kinds, components, estimators).
MAX_NAMES = 32
#: A method's or a parameter's name.
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
_SCALAR = f"a number, true or false, or a text of at most {MAX_PARAM_CHARS} characters"


def _scalar(value: Any) -> Any:
    """``value`` if a parameter can take it: JSON null, a number, a flag, a short text."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str) and len(value) <= MAX_PARAM_CHARS:
        return value
    raise ValueError(f"a parameter's value is {_SCALAR}")


_SCALAR_SCHEMA = {"type": ["number", "boolean", "string", "null"], "maxLength": MAX_PARAM_CHARS}

#: One parameter's value.
ParamValue = Annotated[Any, AfterValidator(_scalar), WithJsonSchema(_SCALAR_SCHEMA)]
#: One method's parameters: name -> value.
MethodParams = Annotated[dict[Name, ParamValue], Field(max_length=MAX_PARAMS)]
#: Several methods' parameters: method name -> its parameters.
ParamsByMethod = Annotated[dict[Name, MethodParams], Field(max_length=METHOD_COUNT)]


def _scalar_or_params(value: Any) -> Any:
    """A parameter's value, or (where a body names several methods) a method's parameters."""
    if not isinstance(value, dict):
        return _scalar(value)
    if len(value) > MAX_PARAMS:
        raise ValueError(f"a method takes at most {MAX_PARAMS} parameters")
    for name, item in value.items():
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
            raise ValueError(f"a parameter's name is a text of at most {MAX_NAME_CHARS} characters")
        _scalar(item)
    return value


#: A value of a body's ``params`` whose form depends on ``methods`` (REST's explain body).
ParamOrParams = Annotated[
    Any,
    AfterValidator(_scalar_or_params),
    WithJsonSchema(
        {
            "anyOf": [
                _SCALAR_SCHEMA,
                {
                    "type": "object",
                    "maxProperties": MAX_PARAMS,
                    "propertyNames": {"maxLength": MAX_NAME_CHARS},
                    "additionalProperties": _SCALAR_SCHEMA,
                },
            ]
        }
    ),
]


def one_methods_params(params: dict[str, Any]) -> None:
    """
    Refuse a body's ``params`` that hold an object where it names one method (no ``methods``).

    Raises:
        ValueError: for pydantic, as a model validator's refusal.
    """
    for value in params.values():
        _scalar(value)


_BY_METHOD: TypeAdapter[dict[str, dict[str, Any]]] = TypeAdapter(ParamsByMethod)


def page_params(value: Any) -> dict[str, dict[str, Any]]:
    """
    The page's parameters field (method -> its parameters), checked as REST checks a body's.

    ``None`` is no parameters. The sizes are checked before the items are read.

    Raises:
        InvalidParameterError: not of that form, naming where (never quoting the value).
    """
    if value is None:
        return {}
    if not isinstance(value, dict) or any(not isinstance(p, dict) for p in value.values()):
        raise InvalidParameterError(
            "the parameters are a JSON object of each method's parameters (method -> object)"
        )
    if len(value) > METHOD_COUNT or any(len(p) > MAX_PARAMS for p in value.values()):
        raise InvalidParameterError(
            f"the parameters name at most {METHOD_COUNT} methods of at most {MAX_PARAMS} "
            "parameters each"
        )
    try:
        return _BY_METHOD.validate_python(value)
    except ValidationError as err:  # it holds the value: raised outside, so nothing keeps it
        problems = validation_problems(list(err.errors()))
    raise InvalidParameterError(f"the parameters are not valid: {problems}")
