"""
Faithfulness leaderboards on the bundled evaluation set, and RISE with and without a tolerance
(issue 10 report).

Run: ``.venv/bin/python benchmarks/leaderboard.py [--steps 50] [--random-orders 3]``

EfficientNet-Lite0 on the bundled images and MiniLM zero-shot on the bundled sentences, every
method that applies with its default parameters: each score's mean with its 95 % bootstrap
interval, the share of items on which the method beats random orders, forward passes and
seconds per item. Then RISE on each bundled image at its default 4000 masks against the same
cap with ``tolerance=0.18``: masks used and the top decile's relative standard error.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table

from attribution import explain
from attribution.methods import available_methods
from attribution.metrics import SCORES, bundled_items, evaluate_methods, summarise
from attribution.models import load
from attribution.perturb import top_decile_error

TOLERANCE = 0.18


def leaderboard(spec: str, steps: int, random_orders: int) -> None:
    adapter = load(spec, device="cpu")
    methods = [m.name for m in available_methods() if m.category == "attribution"]
    per_item = evaluate_methods(
        adapter, bundled_items(adapter.modality), methods, None, steps, random_orders
    )
    summary = summarise(per_item, adapter.modality)
    scores = SCORES[adapter.modality]
    header = ["method"]
    for score, _, higher in scores:
        header += [f"{score} ({'higher' if higher else 'lower'} is better)", "beats random"]
    header += ["forward passes / item", "seconds / item"]
    rows = []
    for row in summary.itertuples(index=False):
        cells = [row.method]
        for score, _, _ in scores:
            cells += [
                f"{getattr(row, score):.3f} {getattr(row, score + '_ci')}",
                f"{getattr(row, score + '_wins'):.0%}",
            ]
        cells += [f"{row.forward_passes:.0f}", f"{row.seconds:.1f}"]
        rows.append(cells)
    random = ", ".join(
        f"{random_name} {per_item[random_name].mean():.3f}" for _, random_name, _ in scores
    )
    print(f"\n{spec}, {len(per_item['item'].unique())} bundled items; random orders: {random}\n")
    print_table(header, rows)


def convergence() -> None:
    adapter = load("efficientnet-lite0", device="cpu")
    rows = []
    for item in bundled_items("image"):
        inputs = adapter.preprocess(item.raw)
        fixed = explain(adapter, "rise", inputs, params={"n_masks": 4000})
        fixed_error = top_decile_error(fixed.scores, fixed.maps["std_error"])
        start = time.perf_counter()
        stopped = explain(adapter, "rise", inputs, params={"tolerance": TOLERANCE})
        rows.append(
            (
                item.name,
                f"{fixed.timings.forward_passes}",
                f"{fixed_error:.3f}",
                f"{stopped.timings.forward_passes}",
                f"{stopped.metrics['top_decile_error']:.3f}",
                "yes" if stopped.warnings else "no",
                f"{time.perf_counter() - start:.1f}",
            )
        )
    print(f"\nRISE on efficientnet-lite0, 4000 masks against tolerance={TOLERANCE} (cap 4000)\n")
    print_table(
        (
            "image",
            "passes, fixed",
            "top-decile error, fixed",
            "passes, tolerance",
            "top-decile error, tolerance",
            "cap hit",
            "seconds, tolerance",
        ),
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--random-orders", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    leaderboard("minilm-zeroshot", args.steps, args.random_orders)
    leaderboard("efficientnet-lite0", args.steps, args.random_orders)
    convergence()


if __name__ == "__main__":
    main()
