"""
How integrated gradients' convergence delta falls with ``n_steps`` on the embedded text models.

Run: ``.venv/bin/python benchmarks/ig_convergence.py [--models minilm-zeroshot,smollm2-135m]
[--steps 16,32,64] [--items 10]``

For each model and number of path points, integrated gradients (Gauss-Legendre, the default
baseline) on each item: MiniLM zero-shot on the bundled sentences (10 by default, up to 128
steps), SmolLM2-135M on next-token prompts (the page's sample prompt by default, up to the
schema's 2000 steps: about 0.3 s a step on 2 CPU cores). The relative delta is
``|Σ attributions − (F(x) − F(baseline))| / |F(x) − F(baseline)|`` (what the trust card's
verdict judges); the table gives its median and largest value over the items, the share of
items within the verdict's pass threshold, and the seconds per item.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table

from attrlab.attribution import explain
from attrlab.attribution.metrics import bundled_items
from attrlab.attribution.models import load
from attrlab.attribution.verdicts import THRESHOLDS

#: Path points and items per model, unless given.
DEFAULTS = {
    "minilm-zeroshot": ("8,16,32,64,128", 10),
    "smollm2-135m": ("32,64,256,512,1024,2000", 1),
}
#: Next-token prompts for the decoder (the page's samples first).
PROMPTS = (
    "The capital of France is",
    "When Mary and John went to the store, John gave a drink to",
    "The opposite of hot is",
    "Water freezes at zero degrees",
)


def items_of(spec: str, count: int) -> list[str]:
    """Texts to explain: the bundled sentences, or the prompts for the decoder."""
    texts = PROMPTS if spec == "smollm2-135m" else [item.raw for item in bundled_items("text")]
    return list(texts[:count])


def convergence(spec: str, steps: list[int], count: int) -> list[tuple[object, ...]]:
    """One row per ``n_steps``: the relative delta over the items, and seconds per item."""
    adapter = load(spec, device="cpu")
    inputs = [adapter.preprocess(text) for text in items_of(spec, count)]
    passing = THRESHOLDS["integral_convergence"].passing
    rows = []
    for n_steps in steps:
        deltas, seconds = [], []
        for item in inputs:
            start = time.perf_counter()
            explanation = explain(
                adapter,
                "integrated_gradients",
                item,
                params={"n_steps": n_steps, "internal_batch_size": 32},
            )
            seconds.append(time.perf_counter() - start)
            deltas.append(explanation.metrics["relative_convergence_delta"])
        within = sum(d <= passing for d in deltas) / len(deltas)
        rows.append(
            (
                spec,
                n_steps,
                f"{statistics.median(deltas):.3g}",
                f"{max(deltas):.3g}",
                f"{within:.0%}",
                f"{statistics.mean(seconds):.1f}",
            )
        )
        print(*rows[-1], flush=True)  # partial results, for long runs on the CPU
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULTS))
    parser.add_argument("--steps", help="comma-separated n_steps (default: per model)")
    parser.add_argument("--items", type=int, help="items per model (default: per model)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    for spec in args.models.split(","):
        steps, items = DEFAULTS.get(spec, ("16,32,64", 10))
        chosen = [int(s) for s in (args.steps or steps).split(",")]
        rows += convergence(spec, chosen, args.items or items)
    passing = THRESHOLDS["integral_convergence"].passing
    print_table(
        (
            "model",
            "n_steps",
            "median relative delta",
            "largest",
            f"items within {passing:.0%}",
            "seconds / item",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
