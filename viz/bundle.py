"""
A downloadable bundle of one page's results: explanations, figures, pages and a manifest, zipped.

Layout of ``folder`` (and of the zip, under ``folder``'s name)::

    index.html  plotly.min.js  manifest.json  <method>.json  <method>.npz
    figures/<name>.html  figures/<name>.png|.jpg  pages/<name>.html
    <method>_layers.csv / .parquet / .json   (an explanation with a layer table)
    data/<name>   (a study's own files: a patching report's JSON, its tables as CSV)

Every HTML page names the model, the input, the methods and the view it shows, and opens from
the unzipped folder without a network: the figures load the bundle's one copy of Plotly's
script (``plotly.min.js``, the smallest build that draws them all). Each Explanation is whole
in its ``.npz``; its ``.json`` is whole too for a text, and for an image names the ``.npz``
that holds its maps (``Explanation.load`` reads either file, exactly).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from attrlab.attribution.explanation import Explanation
from attrlab.viz.stills import write_stills
from attrlab.viz.view import View

__all__ = [
    "PLOTLY_FILE",
    "Subject",
    "plotly_build",
    "safe_name",
    "subject_of",
    "write_bundle",
    "write_figures",
]

BUNDLE_VERSION = 2
#: The bundle's one copy of Plotly's script, at its top; every figure page loads it.
PLOTLY_FILE = "plotly.min.js"
#: Trace types of Plotly's cartesian build (``assets/plotly``), a third of the full one's size.
CARTESIAN_TRACES = frozenset(
    {
        "bar",
        "box",
        "contour",
        "heatmap",
        "histogram",
        "histogram2d",
        "histogram2dcontour",
        "image",
        "pie",
        "scatter",
        "scatterternary",
        "violin",
    }
)
_STYLE = (
    "body{font-family:sans-serif;margin:16px;color:#111;background:#fff}"
    ".attr-bundle-header{border-bottom:1px solid #ccc;margin-bottom:12px;padding-bottom:8px}"
    ".attr-bundle-header h1{font-size:1.2em;margin:0 0 6px}"
    ".attr-bundle-header dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;"
    "margin:0;font-size:0.9em}.attr-bundle-header dt{font-weight:600}"
    ".attr-bundle-header dd{margin:0;white-space:pre-wrap;word-break:break-word}"
)


@dataclass(frozen=True)
class Subject:
    """What an export shows, named at the top of each of its pages."""

    model: str
    #: The input in words: the text, or the image's name and size.
    input: str
    methods: tuple[str, ...]
    #: How the maps are coloured (None: the pages' defaults, or no maps).
    view: View | None = None


def subject_of(
    explanations: Mapping[str, Explanation],
    input_label: str | None = None,
    view: View | None = None,
) -> Subject:
    """
    The subject of ``explanations``: their model(s), methods, and the input they explain.

    ``input_label`` names the input; without one, a text (its tokens' texts) or an image's size
    (as the model saw it) stand in.
    """
    models = dict.fromkeys(e.model.id for e in explanations.values())
    if input_label is None:
        first = next(iter(explanations.values()), None)
        if first is None:
            input_label = "(none)"
        elif first.token_texts is not None:
            input_label = "text: " + "".join(first.token_texts)
        else:
            height, width = first.image_size or first.scores.shape[:2]
            input_label = f"an image, {width}×{height} px as the model saw it"
    return Subject(", ".join(models) or "(none)", input_label, tuple(explanations), view)


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


def plotly_build(figures: Iterable[go.Figure]) -> tuple[str, Path]:
    """
    The smallest Plotly script that draws every figure: (``cartesian`` or ``full``, its file).

    The cartesian build shipped in ``assets/plotly`` when every trace is of its types and it is
    the plotly.js version plotly.py draws with; else the full build plotly.py ships.
    """
    import plotly
    from plotly.offline import get_plotlyjs_version

    cartesian = Path(str(resources.files("attrlab.assets").joinpath("plotly")))
    cartesian /= "plotly-cartesian.min.js"
    traces = {trace.type for figure in figures for trace in figure.data}
    if traces <= CARTESIAN_TRACES and _script_version(cartesian) == get_plotlyjs_version():
        return "cartesian", cartesian
    return "full", Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _script_version(script: Path) -> str | None:
    """The version in a Plotly script's header comment (``plotly.js (...) v4.1.1``)."""
    try:
        with script.open(encoding="utf-8") as handle:
            header = handle.read(200)
    except OSError:
        return None
    found = re.search(r"plotly\.js.*? v(\d+\.\d+\.\d+)", header)
    return found.group(1) if found else None


def _header(subject: Subject, title: str, index: str | None) -> str:
    """The top of a page: its title and what it shows (model, input, methods, view)."""
    rows = [
        ("Model", subject.model),
        ("Input", subject.input),
        ("Methods", ", ".join(subject.methods) or "(none)"),
    ]
    if subject.view is not None:
        rows.append(("View", subject.view.describe()))
    cells = "".join(
        f'<dt>{name}</dt><dd data-field="{name.lower()}">{html.escape(value)}</dd>'
        for name, value in rows
    )
    back = f'<p><a href="{index}">All pages of this export</a></p>' if index else ""
    return (
        f'<header class="attr-bundle-header"><h1>{html.escape(title)}</h1><dl>{cells}</dl>'
        f"{back}</header>"
    )


def _document(subject: Subject, title: str, body: str, index: str | None, script: str) -> str:
    """A whole HTML page: the header, then ``body``; ``script``: a relative script to load."""
    loads = f'<script src="{script}" charset="utf-8"></script>' if script else ""
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)} · {html.escape(subject.model)}</title>"
        f"<style>{_STYLE}</style>{loads}</head>"
        f"<body>{_header(subject, title, index)}{body}</body></html>"
    )


def write_figures(
    figures: Mapping[str, go.Figure],
    folder: Path,
    subject: Subject,
    png: bool = True,
    index: str | None = None,
) -> tuple[dict[str, list[Path]], str | None, str]:
    """
    Each figure as ``folder/figures/<name>.html`` (and a still), sharing one Plotly script.

    The script (:func:`plotly_build`) is written once, as ``folder/plotly.min.js``; each page
    loads it by a relative path, so the folder opens offline. The stills (a PNG, or a JPEG for a
    figure drawing a photograph) are rendered by kaleido in one browser session for all
    figures; when that fails (no Chromium for kaleido), they are left out and the reason is
    returned.

    Args:
        figures: name -> figure; names are reduced to ``[A-Za-z0-9_.-]``.
        folder: where ``figures/`` and the script go.
        subject: what the figures show, named at the top of each page.
        png: render the stills too.
        index: a page's address, relative to ``figures/``, that each page links back to.

    Returns:
        (name -> its files, the stills' error or None, the Plotly build written).
    """
    (folder / "figures").mkdir(parents=True, exist_ok=True)
    build, script = plotly_build(figures.values())
    if figures:
        shutil.copyfile(script, folder / PLOTLY_FILE)
    files: dict[str, list[Path]] = {}
    for name, stem in _stems(figures).items():
        body = figures[name].to_html(full_html=False, include_plotlyjs=False, include_mathjax=False)
        page = folder / "figures" / f"{stem}.html"
        page.write_text(
            _document(subject, name, body, index, f"../{PLOTLY_FILE}"), encoding="utf-8"
        )
        files[name] = [page]
    png_error = _write_stills(figures, files) if png and figures else None
    return files, png_error, build


def _write_stills(figures: Mapping[str, go.Figure], files: dict[str, list[Path]]) -> str | None:
    """
    Every figure's still beside its page, in one kaleido session; the error, if it failed.

    A PNG, or a JPEG for a figure that draws its picture as one (a photograph: a fifth of the
    PNG's bytes).
    """
    targets = {
        name: files[name][0].with_suffix(".jpg" if _draws_a_jpeg(figure) else ".png")
        for name, figure in figures.items()
    }
    try:
        write_stills(
            list(figures.values()),
            list(targets.values()),
            [f.layout.width for f in figures.values()],
            [f.layout.height for f in figures.values()],
        )
    except Exception as error:  # kaleido without a Chromium: keep the HTML, say why
        for target in targets.values():
            target.unlink(missing_ok=True)
        return f"{type(error).__name__}: {error}"
    for name, target in targets.items():
        files[name].append(target)
    return None


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


def _draws_a_jpeg(figure: go.Figure) -> bool:
    """Whether ``figure`` draws a picture encoded as a JPEG (:func:`viz.image.picture_uri`)."""
    return any(
        trace.type == "image" and str(trace.source or "").startswith("data:image/jpeg")
        for trace in figure.data
    )


def write_bundle(
    explanations: Mapping[str, Explanation],
    figures: Mapping[str, go.Figure],
    folder: Path,
    extra: Mapping[str, Any] | None = None,
    png: bool = True,
    pages: Mapping[str, str] | None = None,
    *,
    input_label: str | None = None,
    view: View | None = None,
    data: Mapping[str, str] | None = None,
    model: str | None = None,
) -> Path:
    """
    Write the explanations, figures, pages and a manifest into ``folder``; zip it.

    Each explanation as ``<method>.npz`` (whole: ``Explanation.load_npz``) and
    ``<method>.json`` (whole for a text; an image's names the ``.npz`` for its maps:
    ``Explanation.load``; its layer table, where it has one, also as
    ``<method>_layers.csv``, ``.parquet`` and ``.json`` records); each figure as
    ``figures/<name>.html`` (all loading the bundle's one ``plotly.min.js``) and, with ``png``,
    a still: ``figures/<name>.png``, or ``.jpg`` for a figure drawing a photograph (kaleido,
    one session for all). ``pages`` (name -> an HTML
    fragment, such as the token columns or the trust cards) become ``pages/<name>.html``;
    ``index.html`` links everything. Every page names the model, the input (``input_label``:
    the text, or the image's name and size; see :func:`subject_of`), the methods and the
    ``view`` the maps were drawn in, which the manifest records too. Names are reduced to
    ``[A-Za-z0-9_.-]``. When the stills fail (no Chromium for kaleido) they are left out and
    the reason goes to ``manifest["png_error"]``: the bundle still builds. ``data`` (file
    name -> text, such as a study's report JSON and tables as CSV) become ``data/<name>``;
    ``model`` names the model where no explanation does (a patching study's export).

    Returns:
        The path of the zip file, ``<folder>.zip``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    subject = subject_of(explanations, input_label, view)
    if model is not None:
        subject = replace(subject, model=model)
    manifest: dict[str, Any] = {
        "bundle_version": BUNDLE_VERSION,
        "subject": {"model": subject.model, "input": subject.input},
        "view": None if view is None else view.to_dict(),
        "methods": {},
        "figures": {},
    }
    for method, stem in _stems(explanations).items():
        explanation = explanations[method]
        explanation.save_npz(folder / f"{stem}.npz")
        # an image's maps only in the .npz: as JSON text they weighed ten times as much
        apart = f"{stem}.npz" if explanation.tokens is None else None
        explanation.save_json(folder / f"{stem}.json", arrays=apart)
        data_files = [f"{stem}.json", f"{stem}.npz"]
        data_files += _write_layers(explanation, folder, f"{stem}_layers")
        manifest["methods"][method] = {
            "files": data_files,
            "method": explanation.method,
            "model": asdict(explanation.model),
            "params": explanation.params,
            "seed": explanation.seed,
            "target": asdict(explanation.target),
            "versions": explanation.versions,
        }
    written, png_error, build = write_figures(figures, folder, subject, png, "../index.html")
    manifest["figures"] = {
        name: [f.relative_to(folder).as_posix() for f in files] for name, files in written.items()
    }
    if figures:
        from plotly.offline import get_plotlyjs_version

        manifest["plotly"] = {
            "file": PLOTLY_FILE,
            "build": build,
            "version": get_plotlyjs_version(),
        }
    if png_error is not None:
        manifest["png_error"] = png_error
    if pages:
        (folder / "pages").mkdir(exist_ok=True)
        manifest["pages"] = {}
        for name, stem in _stems(pages).items():
            path = folder / "pages" / f"{stem}.html"
            path.write_text(
                _document(subject, name, pages[name], "../index.html", ""), encoding="utf-8"
            )
            manifest["pages"][name] = path.relative_to(folder).as_posix()
    if data:
        (folder / "data").mkdir(exist_ok=True)
        manifest["data"] = {}
        for name, stem in _stems(data).items():
            path = folder / "data" / stem
            path.write_text(data[name], encoding="utf-8")
            manifest["data"][name] = path.relative_to(folder).as_posix()
    (folder / "index.html").write_text(_index(subject, manifest), encoding="utf-8")
    manifest["extra"] = dict(extra or {})
    (folder / "manifest.json").write_text(
        json.dumps(manifest, indent=1, default=_plain), encoding="utf-8"
    )
    archive = folder.with_name(folder.name + ".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zipped:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zipped.write(path, path.relative_to(folder.parent).as_posix())
    return archive


def _index(subject: Subject, manifest: Mapping[str, Any]) -> str:
    """The bundle's first page: links to its pages, figures and data files."""

    def links(entries: Mapping[str, Any]) -> str:
        items = []
        for name, files in entries.items():
            paths = [files] if isinstance(files, str) else files
            anchors = " · ".join(
                f'<a href="{html.escape(p)}">{html.escape(Path(p).suffix[1:])}</a>' for p in paths
            )
            items.append(f"<li>{html.escape(name)}: {anchors}</li>")
        return f"<ul>{''.join(items)}</ul>"

    body = ""
    if manifest.get("pages"):
        body += f"<h2>Pages</h2>{links(manifest['pages'])}"
    if manifest["figures"]:
        body += f"<h2>Figures</h2>{links(manifest['figures'])}"
    if manifest.get("data"):
        body += f"<h2>Data</h2>{links(manifest['data'])}"
    if manifest["methods"] or not manifest.get("data"):
        data = {m: entry["files"] for m, entry in manifest["methods"].items()}
        body += f"<h2>Explanations (JSON, NumPy arrays)</h2>{links(data)}"
    body += '<p><a href="manifest.json">manifest.json</a>: inputs, parameters, seeds, versions</p>'
    return _document(subject, "attrlab export", body, None, "")
