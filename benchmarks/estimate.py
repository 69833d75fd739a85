"""
Cost estimates against measured runs on the embedded models (issue 12).

Run: ``.venv/bin/python benchmarks/estimate.py``

For RISE, integrated gradients and AttnLRP on MiniLM, SmolLM2-135M and EfficientNet-Lite0
(where the method applies) with default parameters: the estimated forward / backward passes
and seconds next to what ``explain`` spent (the best of two runs), and their ratio. The
calibration (measured once per model and input size) is timed on its own. Target: estimated
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

from attribution import explain
from attribution.estimate import calibrate, estimate
from attribution.methods import get_method
from attribution.models import load

CASES = (
    ("minilm-zeroshot", "A warm, funny and moving film with a cast that clearly enjoyed it."),
    ("smollm2-135m", "The capital of France is a city where"),
    ("efficientnet-lite0", None),
)
METHODS = ("rise", "integrated_gradients", "attnlrp")


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    for spec, text in CASES:
        adapter = load(spec, device="cpu")
        inputs = adapter.preprocess(text if text is not None else data.chelsea())
        start = time.perf_counter()
        calibrate(adapter, inputs)
        calibration = time.perf_counter() - start
        for method in METHODS:
            if get_method(method).unsupported_reason(adapter) is not None:
                continue
            cost = estimate(adapter, method, inputs)
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
                    f"{calibration:.1f}",
                )
            )
    print("\nEstimated against measured, default parameters, CPU (2 threads)\n")
    print_table(
        (
            "model",
            "method",
            "passes fwd / bwd, estimated",
            "passes fwd / bwd, spent",
            "seconds, estimated",
            "seconds, measured",
            "ratio",
            "calibration s",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
