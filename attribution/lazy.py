"""Package exports imported on first use, so that light commands never import torch."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """
    A package's ``__getattr__`` and ``__dir__`` for ``exports`` (name -> defining module).

    The first access imports the defining module; each access reads the value there, so that
    code reaching an export through its package sees what its module holds now (a value a test
    replaced in the module, say). An export named like the submodule that defines it
    (``attribution.explain``) stays the export even after the submodule is imported, which would
    otherwise bind the module in its place.
    """
    module_object = sys.modules[package]
    module_object.__class__ = _Package
    vars(module_object)["_lazy_exports"] = dict(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__


class _Package(types.ModuleType):
    """A package whose exports shadow same-named submodules."""

    def __setattr__(self, name: str, value: Any) -> None:
        exports = vars(self).get("_lazy_exports", {})
        if isinstance(value, types.ModuleType) and exports.get(name) == value.__name__:
            value = getattr(value, name)  # the import system binding the submodule
        super().__setattr__(name, value)
