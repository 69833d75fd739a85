"""
DeepLIFT's and DeepLIFT-SHAP's convergence delta on the embedded models, and DeepLIFT's cost.

Run: ``.venv/bin/python benchmarks/deeplift_delta.py [--repeats 3] [--threads 2] [--tokens 128]
[--parts deltas,costs]``

The first table: each method explained (:func:`attribution.explain`, default reference: pad
tokens on text, the mean colour on images) on EfficientNet-Lite0 and the bundled cat, MiniLM
zero-shot on a bundled sentence (as loaded, in float32, and cast to float64), and SmolLM2-135M
on two next-token prompts. The delta is the library's ``relative_convergence_delta``,
``|Σ attributions − (F(x) − F(x'))| / |F(x) − F(x')|`` against the model's own forward passes
(DeepLIFT-SHAP: the mean over its references). The last column is how far DeepLIFT's map is
from gradient × input's: the largest per-token (per-pixel) difference over the largest
gradient × input score.

The second table: DeepLIFT's ``attribute`` against gradient × input's (one forward + backward)
on ``--tokens`` tokens, both handed the input's logits as ``explain`` hands them (F(x) costs no
pass); the fastest of ``--repeats`` interleaved runs after one warm-up.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from _tables import print_table
from _timing import interleaved_seconds, method_call, text_of
from stand_ins import load_for_benchmark

from attrlab.attribution import explain
from attrlab.attribution.metrics import bundled_items
from attrlab.attribution.request.target import target_record

METHODS = ("deeplift", "deeplift_shap")
FRANCE = ("The capital of France is", " Paris")
MARY = ("When Mary and John went to the store, John gave a drink to", " Mary")
TIMED = ("minilm-zeroshot", "smollm2-135m")
TIMED_METHODS = ("gradient_x_input", "deeplift")
GAP_HEADER = "DeepLIFT − gradient × input, largest / largest gradient × input"


def cases() -> list[tuple[str, str, Any, str | None, bool]]:
    """(row label, model, raw input, target label or the top prediction, cast to float64)."""
    cat = next(item.raw for item in bundled_items("image") if item.name == "chelsea.jpg")
    sentence = bundled_items("text")[0]
    quoted = f'"{sentence.raw}" → {sentence.target}'
    return [
        (
            "EfficientNet-Lite0 (ReLU6, batch norm), the bundled cat",
            "efficientnet-lite0",
            cat,
            None,
            False,
        ),
        (f"MiniLM (float32), {quoted}", "minilm-zeroshot", sentence.raw, sentence.target, False),
        (
            "MiniLM cast to float64, the same",
            "minilm-zeroshot",
            sentence.raw,
            sentence.target,
            True,
        ),
        (f'SmolLM2-135M, "{FRANCE[0]}" → "{FRANCE[1]}"', "smollm2-135m", *FRANCE, False),
        ('SmolLM2-135M, the Mary/John prompt → " Mary"', "smollm2-135m", *MARY, False),
    ]


def delta_rows(device: str) -> list[tuple[str, ...]]:
    """One row per case: each method's relative delta, and DeepLIFT's gap to gradient × input."""
    adapters: dict[str, Any] = {}
    rows = []
    for label, spec, raw, target, double in cases():
        if spec not in adapters:
            adapters[spec] = load_for_benchmark(spec, device)[0]
        adapter = adapters[spec]
        if double:
            adapter = copy.deepcopy(adapter)
            adapter.model.double()
        inputs, record = adapter.preprocess(raw), target_record(adapter, target)
        runs = {m: explain(adapter, m, inputs, record) for m in (*METHODS, "gradient_x_input")}
        plain = np.abs(runs["gradient_x_input"].scores)
        gap = np.abs(runs["deeplift"].scores - runs["gradient_x_input"].scores).max() / plain.max()
        deltas = [f"{runs[m].metrics['relative_convergence_delta']:.1e}" for m in METHODS]
        rows.append((label, *deltas, f"{gap:.2f}"))
        print(*rows[-1], sep=" | ", flush=True)  # partial results, for long runs on the CPU
    return rows


def cost_rows(device: str, tokens: int, repeats: int) -> list[tuple[str, ...]]:
    """Per model: gradient × input's and DeepLIFT's seconds, and their ratio."""
    rows = []
    for spec in TIMED:
        adapter, name = load_for_benchmark(spec, device)
        inputs = text_of(adapter, tokens)
        with torch.no_grad():
            logits = adapter.logits(**inputs.model_kwargs())[0]
        target = int(logits.argmax())
        calls = {m: method_call(m, adapter, inputs, target, logits) for m in TIMED_METHODS}
        seconds = interleaved_seconds({m: c for m, c in calls.items() if c is not None}, repeats)
        plain, lifted = seconds["gradient_x_input"], seconds["deeplift"]
        rows.append(
            (
                f"{name}, {len(inputs.tokens)} tokens",
                f"{plain * 1e3:.1f}",
                f"{lifted * 1e3:.1f}",
                f"{lifted / plain:.2f}",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128, help="tokens of the timed input")
    parser.add_argument("--parts", default="deltas,costs", help="comma-separated tables to print")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name() if device == "cuda" else f"{args.threads} threads, CPU"
    parts = args.parts.split(",")
    print(f"\n(torch {torch.__version__}, {where})\n")
    if "deltas" in parts:
        header = ("model, input → target", *METHODS, GAP_HEADER)
        print_table(header, delta_rows(device))
        print()
    if "costs" in parts:
        print_table(
            ("model", "gradient × input ms", "deeplift ms", "deeplift × gradient × input"),
            cost_rows(device, args.tokens, args.repeats),
        )


if __name__ == "__main__":
    main()
