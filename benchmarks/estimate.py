"""
Cost estimates against measured runs on the embedded models (issue 12).

Run: ``.venv/bin/python benchmarks/estimate.py`` (on the GPU where there is one)

For RISE, integrated gradients and AttnLRP on MiniLM, SmolLM2-135M and EfficientNet-Lite0
(where the method applies) with default parameters: the estimated forward / backward passes
and seconds next to what ``explain`` spent (the best of two runs), their ratio, and how long
the estimate took (it measures the costs it needs on first use: a model's first estimates pay
for its calibration). Target: estimated
seconds within a factor 2 of the measured ones; pass counts exact.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from skimage import data
from stand_ins import load_for_benchmark

from attrlab.attribution import explain
from attrlab.attribution.methods import get_method
from attrlab.attribution.request.estimate import estimate

CASES = (
    ("minilm-zeroshot", "A warm, funny and moving film with a cast that clearly enjoyed it."),
    ("smollm2-135m", "The capital of France is a city where"),
    ("efficientnet-lite0", None),
)
METHODS = ("rise", "integrated_gradients", "attnlrp")


def main() -> None:
    torch.set_num_threads(2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for spec, text in CASES:
        adapter, spec = load_for_benchmark(spec, device)
        inputs = adapter.preprocess(text if text is not None else data.chelsea())
        for method in METHODS:
            if get_method(method).unsupported_reason(adapter) is not None:
                continue
            start = time.perf_counter()
            cost = estimate(adapter, method, inputs)  # measures the costs it needs the first time
            estimating = time.perf_counter() - start
            seconds = []
            for _ in range(2):
                start = time.perf_counter()
                spent = explain(adapter, method, inputs)
                seconds.append(time.perf_counter() - start)
            measured = min(seconds)
            rows.append(
                (
                    spec,
                    method,
                    f"{cost.forward_passes} / {cost.backward_passes}",
                    f"{spent.timings.forward_passes} / {spent.timings.backward_passes}",
                    f"{cost.seconds:.2f}",
                    f"{measured:.2f}",
                    f"{cost.seconds / measured:.2f}",
                    f"{estimating:.2f}",
                )
            )
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (2 threads)"
    print(f"\nEstimated against measured, default parameters, {where}\n")
    print_table(
        (
            "model",
            "method",
            "passes fwd / bwd, estimated",
            "passes fwd / bwd, spent",
            "seconds, estimated",
            "seconds, measured",
            "ratio",
            "estimate s (calibration included)",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
