"""
Cost of the layer and head analysis relative to one forward + backward pass (issue 9).

Run: ``.venv/bin/python benchmarks/layers.py [--repeats 3] [--threads 2]``

On MiniLM (zero-shot, 64 tokens) and the embedded SmolLM2-135M (32 tokens), on the GPU where
there is one, it times one
forward, one forward + backward (gradient of the target logit at the token embeddings), each
measure group of ``attribution.layers.MEASURES`` alone, and all of them in one call; the
fastest of ``--repeats`` interleaved runs after a warm-up. Target: every measure of one input
≤ (number of layers + 3) × forward+backward.
"""

from __future__ import annotations

import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from _timing import forward, forward_backward, interleaved_seconds, text_of, timing_run
from stand_ins import load_for_benchmark

from attrlab.attribution.layers import MEASURES, analyze_layers
from attrlab.attribution.request.target import Target, output_target

CASES = (("minilm-zeroshot", 64), ("smollm2-135m", 32))


def analysis(adapter, inputs, target: Target, measures: list[str] | None) -> Callable[[], object]:
    return lambda: analyze_layers(adapter, inputs, target, measures)


def bench(
    spec: str, tokens: int, repeats: int, device: str
) -> tuple[str, list[tuple[str, str, str, str]]]:
    adapter, name = load_for_benchmark(spec, device)
    inputs = text_of(adapter, tokens)
    with torch.no_grad():
        index = int(adapter.logits(**inputs.model_kwargs())[0].argmax())
    target = output_target(adapter, index)
    groups = [m for m in MEASURES.values() if m.applies_to(adapter)]
    calls = {
        "forward": forward(adapter, inputs),
        "forward+backward": forward_backward(adapter, inputs, index),
        **{m.name: analysis(adapter, inputs, target, [m.name]) for m in groups},
        "all but ablation": analysis(
            adapter, inputs, target, [m.name for m in groups if m.name != "ablation"]
        ),
        "all measures": analysis(adapter, inputs, target, None),
    }
    seconds = interleaved_seconds(calls, repeats)
    unit = seconds["forward+backward"]
    layers = adapter.num_layers
    rows = [
        (f"forward ({len(inputs.tokens)} tokens)", f"{seconds['forward'] * 1e3:.0f}", "", ""),
        ("forward+backward", f"{unit * 1e3:.0f}", "1.00", ""),
    ]
    for m in groups:
        rows.append(
            (m.name, f"{seconds[m.name] * 1e3:.0f}", f"{seconds[m.name] / unit:.2f}", m.cost)
        )
    for group in ("all but ablation", "all measures"):
        total = seconds[group] / unit
        verdict = "met" if total <= layers + 3 else "missed"
        rows.append(
            (
                group,
                f"{seconds[group] * 1e3:.0f}",
                f"{total:.2f}",
                f"≤ L+3 = {layers + 3}: {verdict}",
            )
        )
    return name, rows


def main() -> None:
    args, device, where = timing_run(__doc__.split("\n\n")[0])
    for spec, tokens in CASES:
        name, rows = bench(spec, tokens, args.repeats, device)
        print(f"\n{name}  (torch {torch.__version__}, {where})\n")
        print_table(("measure", "time (ms)", "× fwd+bwd", "note"), rows)


if __name__ == "__main__":
    main()
