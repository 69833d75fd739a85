"""Each method's typed parameter record and its schema are one declaration, read by attribute."""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from pathlib import Path

import pytest

from attrlab.attribution.methods import available_methods
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.smoothing import SmoothingParams
from attrlab.attribution.request.params import MethodParams, param, validate_params

METHODS = Path(__file__).resolve().parents[1] / "attribution" / "methods"
KINDS = {int: "int", float: "float", str: "str", bool: "bool"}


def _declared_kind(hint: object) -> tuple[str, bool]:
    """A field's annotation as (kind, may be None), read here from the typing objects."""
    if isinstance(hint, types.UnionType):
        args = typing.get_args(hint)
        (only,) = [a for a in args if a is not type(None)]
        return KINDS[only], type(None) in args
    return KINDS[hint], False  # type: ignore[index]


@pytest.mark.parametrize("method", available_methods(), ids=lambda m: m.name)
def test_a_methods_record_fields_are_its_schema(method):
    record = method.param_record
    fields = {f.name: f for f in dataclasses.fields(record)}
    hints = typing.get_type_hints(record)
    assert [p.name for p in method.params] == list(method.describe()["params"])
    assert {p.name for p in method.params} == set(fields)
    for entry in method.params:
        kind, optional = _declared_kind(hints[entry.name])
        assert entry.kind == kind
        assert entry.default == fields[entry.name].default
        if entry.default is None:  # "automatic": the field's type takes None
            assert optional
        # the default is one the schema accepts, of the field's own type
        assert entry.validate(entry.default) == entry.default
    # the record of no parameters given is the schema's defaults, and reads back as plain data
    defaults = {p.name: p.default for p in method.params}
    assert record().to_dict() == defaults == validate_params(method.params, {})
    assert record.validated({}) == record()
    assert record.of(defaults) == record()


def test_the_shared_groups_come_after_a_methods_own_parameters():
    """As widgets, `attrlab methods` and catalog.json list them."""
    names = [
        p.name
        for p in next(m for m in available_methods() if m.name == "integrated_gradients").params
    ]
    assert names == [
        "n_steps",
        "internal_batch_size",
        "baseline",
        "smoothing",
        "smoothing_samples",
        "smoothing_sigma",
        "smoothing_weight_sigma",
        "checkpointing",
    ]


def test_a_record_that_could_disagree_with_its_schema_is_refused():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class NoSpec(MethodParams):
        n: int = 3

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class NoKind(MethodParams):
        n: bytes = param(b"", "Bytes.")

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class OutOfBounds(MethodParams):
        n: int = param(0, "Count.", 1, 10)

    class NotADataclass(MethodParams):
        n: int = param(1, "Count.", 1, 10)

    for record, message in [
        (NoSpec, "make the field with param"),
        (NoKind, "no parameter kind"),
        (OutOfBounds, "default is refused"),
        (NotADataclass, "declare it @dataclass"),
    ]:
        with pytest.raises(TypeError, match=message):
            record.schema()


def test_a_gradient_method_without_the_smoothing_record_is_refused():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Own(MethodParams):
        n: int = param(1, "Count.", 1, 10)

    with pytest.raises(TypeError, match="must derive from SmoothingParams"):

        class _Gradient(AttributionMethod[Own]):
            name = title = paper = "toy"
            requires = frozenset({"gradients"})
            param_record = Own

            @classmethod
            def _passes(cls, adapter, inputs, params):
                return Passes(1, 1)

            @classmethod
            def _attribute(cls, adapter, inputs, target, params, run):
                return Attribution(scores=None)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Smoothed(SmoothingParams):
        n: int = param(1, "Count.", 1, 10)

    with pytest.raises(TypeError, match="must not derive from SmoothingParams"):

        class _Perturbation(AttributionMethod[Smoothed]):
            name = title = paper = "toy"
            param_record = Smoothed


def _string_reads(tree: ast.AST) -> list[int]:
    """Lines reading a ``params``-named value by a string: ``params["x"]``, ``params.get("x")``."""

    def params_named(node: ast.expr) -> bool:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        return name == "params" or name.endswith("_params")

    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and params_named(node.value)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            lines.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and params_named(node.func.value)
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            lines.append(node.lineno)
    return lines


def test_the_check_finds_string_reads():
    source = (
        'def f(params, run_params):\n    params["n"]\n    run_params.get("x", 1)\n    params.n\n'
    )
    assert _string_reads(ast.parse(source)) == [2, 3]


def test_no_method_reads_its_parameters_by_string():
    found = {
        str(path.relative_to(METHODS)): lines
        for path in sorted(METHODS.rglob("*.py"))
        if (lines := _string_reads(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}
