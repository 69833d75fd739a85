"""
Activation patching on SmolLM2-135M's IOI prompt, and how well AtP, AtP* and RelP match it.

Run: ``.venv/bin/python benchmarks/patching.py [--model minilm-zeroshot] [components ...]``
(default: smollm2-135m; residual, head).

SmolLM2: "When Mary and John went to the store, John gave a drink to" against the same prompt
with the second name swapped ("... store, Mary gave ..."), target " Mary" rather than " John"
(the logit difference). MiniLM zero-shot (a sentence encoder): "A wonderful, heartwarming
story." against "A dreadful, heartwarming story.", target the class "positive" (its logit,
100 × cosine). Prints the passes planned, the seconds each estimator took, the sites exact
patching ranks highest per component, and each estimator's agreement with exact patching.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pandas as pd
import torch
from _tables import print_table
from _timing import forward_backward, interleaved_seconds

from attrlab.attribution.engine.agreement import agreement_with_exact
from attrlab.attribution.models import load
from attrlab.attribution.patching import (
    ESTIMATORS,
    patching_problem,
    patching_report,
    planned_passes,
)
from attrlab.attribution.patching.problem import Runs
from attrlab.attribution.request.run import RunSettings

#: Each model's clean text, corrupted text and target.
PAIRS: dict[str, tuple[str, str, dict[str, str]]] = {
    "smollm2-135m": (
        "When Mary and John went to the store, John gave a drink to",
        "When Mary and John went to the store, Mary gave a drink to",
        {"answer": " Mary", "contrast": " John"},
    ),
    "minilm-zeroshot": (
        "A wonderful, heartwarming story.",
        "A dreadful, heartwarming story.",
        {"target": "positive"},
    ),
}
TOP = 5


def main(model: str, components: list[str]) -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    adapter = load(model, device="cpu")
    clean, corrupted, target = PAIRS[model]
    problem = patching_problem(adapter, clean, corrupted, **target)
    forward, backward, widest = planned_passes(adapter, problem, None, components)
    print(f"planned: {forward:,} forward rows, {backward} backward passes, batch {widest}\n")
    reports, seconds = {}, {}
    for name in ESTIMATORS:
        start = time.perf_counter()
        settings = RunSettings(progress=_progress(name))
        reports[name] = patching_report(adapter, problem, [name], components, settings=settings)
        seconds[name] = time.perf_counter() - start
        print(f"{name}: {seconds[name]:.1f} s")
    exact = reports["exact"]
    _costs(adapter, problem, components)
    print(f"\nclean {exact.clean_score:.3f}, corrupted {exact.corrupted_score:.3f}\n")
    rows = []
    for (direction, component), frame in exact.table.groupby(["direction", "component"]):
        best = frame.reindex(frame["effect"].abs().sort_values(ascending=False).index)[:TOP]
        rows.append((direction, component, ", ".join(_site(r) for r in best.itertuples())))
    print_table(
        ("direction", "component", f"top {TOP} sites by |effect| (exact; normalised)"), rows
    )
    print()
    magnitudes = {e.name for e in ESTIMATORS.values() if e.magnitude}
    together = pd.concat([r.table for r in reports.values()], ignore_index=True)
    found = agreement_with_exact(together, magnitudes, top_k=10)
    print_table(
        ("estimator", "direction", "component", "sites", "Pearson r", "Spearman ρ", "top-10"),
        [
            (
                r.estimator,
                r.direction,
                r.component,
                r.sites,
                f"{r.pearson:.2f}",
                f"{r.spearman:.2f}",
                f"{r.top_k_overlap:.1f}",
            )
            for r in found.itertuples(index=False)
        ],
    )


def _costs(adapter: Any, problem: Any, components: list[str]) -> None:
    """
    What each estimator costs against plain passes, all timed interleaved (fastest of two each,
    :func:`best_seconds`, so load spikes hit all alike).

    AtP, AtP* and RelP on ``components``: seconds per direction as multiples of one forward +
    backward of the target. Exact patching: its seconds per patched row, on the heads of one
    direction (a layer's heads are one batch), against a plain forward row at that width.
    """
    width = Runs.of(adapter, problem).heads
    wide = {
        k: v.repeat(width, *[1] * (v.dim() - 1)) for k, v in problem.clean.model_kwargs().items()
    }

    def plain_forward() -> None:
        with torch.no_grad():
            problem.target.outputs(adapter, **wide)

    def estimator(name: str, chosen: list[str], directions: list[str] | None = None) -> Any:
        return lambda: patching_report(adapter, problem, [name], chosen, directions)

    calls = {"fb": forward_backward(adapter, problem.clean, 0), "wide": plain_forward}
    calls |= {name: estimator(name, components) for name in ESTIMATORS if name != "exact"}
    calls["exact"] = estimator("exact", ["head"], ["denoising"])
    best = interleaved_seconds(calls, 2)
    fb, per_row = best["fb"], best["wide"] / width
    rows = planned_passes(adapter, problem, ["exact"], ["head"], ["denoising"])[0]
    print(
        f"\none forward + backward {fb:.3f} s; a plain forward of {width} rows {per_row:.4f} s/row"
    )
    table = [  # every estimator runs both directions
        (name, f"{best[name]:.2f}", f"{best[name] / 2 / fb:.1f} × forward+backward", "≤ 3")
        for name in ESTIMATORS
        if name != "exact"
    ]
    exact_row = best["exact"] / rows
    ratio = f"{exact_row / per_row:.2f} × a plain forward row"
    table.append((f"exact, heads ({rows} rows)", f"{best['exact']:.2f}", ratio, "≤ 1"))
    print_table(("estimator", "seconds", "per direction / per row", "target"), table)
    print()


def _progress(name: str) -> Any:
    """Print ``name``'s progress at every tenth of its work (to stderr)."""
    shown: set[int] = set()

    def report(done: int, total: int) -> None:
        tenth = 10 * done // max(1, total)
        if tenth not in shown:
            shown.add(tenth)
            print(f"  {name}: {done}/{total}", file=sys.stderr, flush=True)

    return report


def _site(row: Any) -> str:
    """``L3.H4@' John' 0.52``: layer, head, token and normalised effect of a table row."""
    head = "" if pd.isna(row.head) else f".H{row.head}"
    token = "" if pd.isna(row.token) else f"@{row.token!r}"
    return f"L{row.layer}{head}{token} {row.normalised:.2f}"


if __name__ == "__main__":
    arguments = sys.argv[1:]
    chosen = "smollm2-135m"
    if arguments[:1] == ["--model"]:
        chosen, arguments = arguments[1], arguments[2:]
    main(chosen, arguments or ["residual", "head"])
