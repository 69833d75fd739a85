"""
The method catalog and the importance engine's catalog as text for a terminal.

Plain Python on the catalogs' entries (``attrlab methods``, ``attrlab units``): listing the
methods imports none of them, nor NumPy.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["methods_text", "param_range", "units_text"]


def param_range(schema: Mapping[str, Any]) -> str:
    """
    What values a parameter takes, from its schema: its choices, or its type and bounds.

    ``[a, b]`` includes a bound and ``(a, b)`` leaves it out; an open end is ``∞``.
    """
    if "enum" in schema:
        return "one of " + ", ".join(str(choice) for choice in schema["enum"])
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low, opening = schema["exclusiveMinimum"], "("
    else:
        opening = "["
    if "exclusiveMaximum" in schema:
        high, closing = schema["exclusiveMaximum"], ")"
    else:
        closing = "]"
    if low is None and high is None:
        return schema["type"]
    low_text = "-∞" if low is None else f"{low:g}"
    high_text = "∞" if high is None else f"{high:g}"
    return f"{schema['type']} {opening}{low_text}, {high_text}{closing}"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def methods_text(entries: Sequence[Mapping[str, Any]], width: int = 100) -> str:
    """
    A table of the methods, then each method's parameters with defaults, ranges and help.

    ``entries``: the catalog's (:func:`attribution.methods.catalog.catalog_entries`); ``width``
    the terminal's columns, to which the help texts are wrapped.
    """
    header = ("METHOD", "TITLE", "KIND", "APPLIES TO", "NEEDS", "PARAMETERS")
    rows = [header] + [
        (
            e["name"],
            e["title"],
            e["category"],
            ", ".join(e["modalities"]),
            ", ".join(e["requires"]) or "forward passes only",
            str(len(e["params"])),
        )
        for e in entries
    ]
    lines = _columns(rows)
    lines += ["", "Cost on an input: attrlab explain --method NAME ... --estimate"]
    wrap = textwrap.TextWrapper(
        width=max(40, width), initial_indent=" " * 6, subsequent_indent=" " * 6
    )
    for e in entries:
        lines += ["", f"{e['name']}: {e['title']} ({e['paper']})"]
        if not e["params"]:
            lines.append("    no parameters")
            continue
        cells = [
            (
                f"    {name}",
                "default " + ("automatic" if s.get("default") is None else str(s["default"])),
                param_range(s),
            )
            for name, s in e["params"].items()
        ]
        for line, schema in zip(_columns(cells), e["params"].values(), strict=True):
            lines.append(line)
            if schema.get("help"):
                lines += wrap.wrap(schema["help"])
    return "\n".join(lines)


def units_text(entries: Sequence[Mapping[str, Any]], width: int = 100) -> str:
    """
    The unit kinds with their removals, then each kind's estimators with what they cost.

    ``entries``: the engine's catalog (:func:`attribution.engine.estimators.engine_catalog`);
    ``width`` the terminal's columns, to which descriptions are wrapped.
    """
    rows = [("UNIT", "REMOVED BY", "WHAT")] + [
        (e["name"], ", ".join(e["removals"]), e["description"]) for e in entries
    ]
    lines = _columns(rows)
    wrap = textwrap.TextWrapper(
        width=max(40, width), initial_indent=" " * 6, subsequent_indent=" " * 6
    )
    for e in entries:
        lines += ["", f"{e['name']}: estimators"]
        if not e["estimators"]:
            lines.append("    none registered: random orders only")
            continue
        cells = [
            (f"    {s['name']}", "exact" if s["exact"] else "estimate", s["cost"])
            for s in e["estimators"]
        ]
        for line, estimator in zip(_columns(cells), e["estimators"], strict=True):
            lines.append(line)
            lines += wrap.wrap(f"{estimator['description']} ({estimator['source']})")
    return "\n".join(lines)
