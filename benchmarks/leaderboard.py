"""
Faithfulness leaderboards on the bundled evaluation set, RISE's and ROAD's image fills side by
side, and the sampling methods with and without a tolerance (issue 10 report).

Run: ``.venv/bin/python benchmarks/leaderboard.py [--steps 50] [--random-orders 3]
[--parts leaderboards,road,convergence]``

EfficientNet-Lite0 on the bundled images and MiniLM zero-shot on the bundled sentences, every
method that applies with its default parameters: each score's mean with its 95 % bootstrap
interval, the share of items on which the method beats random orders, forward passes and
seconds per item. Then five fast methods scored with RISE's fill and with ROAD's noisy linear
imputation (20 steps per curve). Then RISE, Sobol and SHAP on each bundled image at a cap
against the same cap with a tolerance: passes, samples used and the top decile's relative
standard error (for SHAP: its relative change between refinements); the capped run's error
comes from an unreachable tolerance, which only adds the error to ``metrics``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table

from attrlab.attribution import explain
from attrlab.attribution.methods import available_methods
from attrlab.attribution.metrics import SCORES, bundled_items, evaluate_methods, summarise
from attrlab.attribution.models import load
from attrlab.viz.evaluate import score_label

#: Each sampling method with its cap and the tolerance compared against it.
CONVERGENCE = (
    ("rise", {"n_masks": 4000}, 0.18, "masks_used"),
    ("sobol", {"n_designs": 64}, 0.5, "designs_used"),
    ("shap", {"max_evals": 2000}, 0.1, "evals_used"),
)
#: Methods scored with both image fills (RISE's and ROAD's), at fewer steps: every ROAD
#: step solves one sparse system per curve point.
ROAD_METHODS = ("gradient_x_input", "integrated_gradients", "deeplift", "gradcam", "occlusion")


def leaderboard(
    spec: str,
    steps: int,
    random_orders: int,
    methods: tuple[str, ...] | None = None,
    image_fill: str = "rise",
) -> None:
    adapter = load(spec, device="cpu")
    chosen = methods or [m.name for m in available_methods() if m.category == "attribution"]
    per_item = evaluate_methods(
        adapter,
        bundled_items(adapter.modality),
        chosen,
        None,
        steps,
        random_orders,
        image_fill=image_fill,
    )
    summary = summarise(per_item, adapter.modality)
    scores = SCORES[adapter.modality]
    header = ["method"]
    for score, _, higher in scores:
        header += [score_label(score, higher), "beats random"]
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
    fill = f", image fill {image_fill}, {steps} steps" if adapter.modality == "image" else ""
    items = len(per_item["item"].unique())
    print(f"\n{spec}, {items} bundled items{fill}; random orders: {random}\n")
    print_table(header, rows)


def convergence() -> None:
    adapter = load("efficientnet-lite0", device="cpu")
    rows = []
    for method, cap, tolerance, used in CONVERGENCE:
        for item in bundled_items("image"):
            inputs = adapter.preprocess(item.raw)
            start = time.perf_counter()
            fixed = explain(adapter, method, inputs, params={**cap, "tolerance": 1e-9})
            fixed_s = time.perf_counter() - start
            start = time.perf_counter()
            stopped = explain(adapter, method, inputs, params={**cap, "tolerance": tolerance})
            stopped_s = time.perf_counter() - start
            rows.append(
                (
                    method,
                    item.name,
                    f"{tolerance:g}",
                    f"{fixed.timings.forward_passes}",
                    f"{fixed.metrics['top_decile_error']:.3f}",
                    f"{fixed_s:.1f}",
                    f"{stopped.timings.forward_passes}",
                    f"{stopped.metrics['top_decile_error']:.3f}",
                    f"{stopped.metrics[used]:.0f}",
                    "yes"
                    if any("did not reach tolerance" in w for w in stopped.warnings)
                    else "no",
                    f"{stopped_s:.1f}",
                )
            )
    print("\nSampling methods on efficientnet-lite0: the cap against a tolerance\n")
    print_table(
        (
            "method",
            "image",
            "tolerance",
            "passes, cap",
            "top-decile error, cap",
            "seconds, cap",
            "passes, tolerance",
            "top-decile error, tolerance",
            "samples used",
            "cap hit",
            "seconds, tolerance",
        ),
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--random-orders", type=int, default=3)
    parser.add_argument(
        "--parts",
        default="leaderboards,road,convergence",
        help="comma-separated: leaderboards, road, convergence",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(2)
    if "leaderboards" in parts:
        leaderboard("minilm-zeroshot", args.steps, args.random_orders)
        leaderboard("efficientnet-lite0", args.steps, args.random_orders)
    if "road" in parts:
        for fill in ("rise", "road"):
            leaderboard("efficientnet-lite0", 20, args.random_orders, ROAD_METHODS, fill)
    if "convergence" in parts:
        convergence()


if __name__ == "__main__":
    main()
