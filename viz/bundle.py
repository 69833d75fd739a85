"""
A downloadable bundle of one page's results: explanations, figures and a manifest, zipped.

Layout of ``folder`` (and of the zip, under ``folder``'s name)::

    <method>.json  <method>.npz  figures/<name>.html  figures/<name>.png  manifest.json
    <method>_layers.csv / .parquet / .json   (an explanation with a layer table)
"""

from __future__ import annotations

import html
import json
import re
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from attrlab.attribution.explanation import Explanation
from attrlab.viz.layers import export_figure

__all__ = ["safe_name", "write_bundle"]

BUNDLE_VERSION = 1


def safe_name(name: str) -> str:
    """``name`` as a file stem of ``[A-Za-z0-9_.-]`` only, never empty or starting with a dot."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".")
    return stem or "_"


def _stems(names: Iterable[str]) -> dict[str, str]:
    """A distinct safe stem per name (``a/b`` and ``a_b`` get ``a_b`` and ``a_b-2``)."""
    stems: dict[str, str] = {}
    for name in names:
        stem, count = safe_name(name), 1
        while stem.lower() in {s.lower() for s in stems.values()}:
            count += 1
            stem = f"{safe_name(name)}-{count}"
        stems[name] = stem
    return stems


def _plain(value: Any) -> Any:
    """JSON fallback for the manifest's ``extra``: arrays and NumPy scalars as lists/numbers."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


def _write_layers(explanation: Explanation, folder: Path, stem: str) -> list[str]:
    """The layer table, if any, as ``<stem>.csv``, ``.parquet`` and ``.json`` (its records)."""
    table = explanation.layers
    if table is None:
        return []
    table.to_csv(folder / f"{stem}.csv", index=False)
    table.to_parquet(folder / f"{stem}.parquet", index=False)
    records = explanation.to_dict()["layers"]
    (folder / f"{stem}.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    return [f"{stem}.csv", f"{stem}.parquet", f"{stem}.json"]


def write_bundle(
    explanations: Mapping[str, Explanation],
    figures: Mapping[str, go.Figure],
    folder: Path,
    extra: Mapping[str, Any] | None = None,
    png: bool = True,
    pages: Mapping[str, str] | None = None,
) -> Path:
    """
    Write the explanations, figures and a manifest into ``folder``; zip it to ``<folder>.zip``.

    Each explanation as ``<method>.json`` and ``<method>.npz`` (its layer table, where it has
    one, also as ``<method>_layers.csv``, ``.parquet`` and ``.json`` records), each figure as
    standalone ``figures/<name>.html`` and, with ``png``, ``figures/<name>.png`` (kaleido).
    Names are reduced to ``[A-Za-z0-9_.-]``. When PNG export fails (no Chromium for kaleido)
    the PNGs are left out and the reason goes to ``manifest["png_error"]``: the bundle still
    builds.
    ``pages`` (name -> an HTML fragment, such as the token columns or the trust cards) become
    standalone ``pages/<name>.html``.

    Returns:
        The path of the zip file.
    """
    folder = Path(folder)
    (folder / "figures").mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"bundle_version": BUNDLE_VERSION, "methods": {}, "figures": {}}
    for method, stem in _stems(explanations).items():
        explanation = explanations[method]
        (folder / f"{stem}.json").write_text(explanation.to_json(indent=1), encoding="utf-8")
        explanation.save_npz(folder / f"{stem}.npz")
        written = [f"{stem}.json", f"{stem}.npz"]
        written += _write_layers(explanation, folder, f"{stem}_layers")
        manifest["methods"][method] = {
            "files": written,
            "method": explanation.method,
            "model": asdict(explanation.model),
            "params": explanation.params,
            "seed": explanation.seed,
            "target": asdict(explanation.target),
            "versions": explanation.versions,
        }
    png_error: str | None = None
    for name, stem in _stems(figures).items():
        files = [export_figure(figures[name], folder / "figures" / f"{stem}.html")]
        if png and png_error is None:
            target = folder / "figures" / f"{stem}.png"
            try:
                files.append(export_figure(figures[name], target))
            except Exception as error:  # kaleido without a Chromium: keep the HTML, say why
                target.unlink(missing_ok=True)
                png_error = f"{type(error).__name__}: {error}"
        manifest["figures"][name] = [f.relative_to(folder).as_posix() for f in files]
    if png_error is not None:
        manifest["png_error"] = png_error
    if pages:
        (folder / "pages").mkdir(exist_ok=True)
        manifest["pages"] = {}
        for name, stem in _stems(pages).items():
            path = folder / "pages" / f"{stem}.html"
            document = (
                '<!doctype html><html><head><meta charset="utf-8">'
                f"<title>{html.escape(name)}</title></head>"
                f'<body style="font-family:sans-serif">{pages[name]}</body></html>'
            )
            path.write_text(document, encoding="utf-8")
            manifest["pages"][name] = path.relative_to(folder).as_posix()
    manifest["extra"] = dict(extra or {})
    (folder / "manifest.json").write_text(
        json.dumps(manifest, indent=1, default=_plain), encoding="utf-8"
    )
    archive = folder.with_name(folder.name + ".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zipped.write(path, path.relative_to(folder.parent).as_posix())
    return archive
