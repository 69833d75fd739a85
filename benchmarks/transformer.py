"""
Cost of transformer attribution methods relative to one forward + backward pass (issue 4).

Run: ``.venv/bin/python benchmarks/transformer.py [--repeats 7] [--threads 2]``

For MiniLM (zero-shot), the tiny random LLaMA and the embedded SmolLM2-135M (30 layers, GQA), each
at 128 tokens, it times: the
forward pass, forward + backward (gradient of the target logit at the input embedding), and
each registered method's ``attribute`` (rollout, attnlrp, pa_lrp, deeplift on the 128-token
input; attention_flow on a 64-token input). Times are the fastest of ``--repeats`` interleaved
runs after one warm-up (the least disturbed by other load on the machine). Ratios are to
forward + backward (rollout also to the forward). Peak memory compares
pa_lrp with the plain forward + backward: the largest amount of CPU memory allocated by torch
during the call above what was allocated when it started, from the torch profiler's memory
timeline (``profile_memory=True``; it sees tensors, not Python objects). Methods that are not
registered show as n/a. Targets: attnlrp and pa_lrp ≤ 2× forward+backward, rollout ≤ 1.5×
forward, pa_lrp peak memory ≤ 2× plain backward.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import torch
from _tables import print_table
from _timing import forward, forward_backward, interleaved_seconds, method_call, text_of
from torch.profiler import ProfilerActivity, profile

from attrlab.attribution.models import load

METHODS = ("rollout", "attnlrp", "pa_lrp", "deeplift", "attention_flow")
FLOW_TOKENS = 64


def peak_bytes(call: Callable[[], object]) -> float:
    """Peak torch CPU allocation during ``call`` above the level at its start (bytes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        activities = [ProfilerActivity.CPU]
        with profile(
            activities=activities, profile_memory=True, record_shapes=True, with_stack=True
        ) as prof:
            call()
        path = Path(tempfile.mkdtemp()) / "memory.raw.json"
        prof.export_memory_timeline(str(path), device="cpu")
    _, sizes = json.loads(path.read_text())
    totals = [sum(row) for row in sizes]
    return float(max(totals) - totals[0]) if totals else float("nan")


def bench(spec: str, tokens: int, repeats: int) -> list[tuple[str, str, str, str]]:
    adapter = load(spec, device="cpu")
    inputs, flow_inputs = text_of(adapter, tokens), text_of(adapter, FLOW_TOKENS)
    with torch.no_grad():
        target = int(adapter.logits(**inputs.model_kwargs())[0].argmax())
    plain = forward_backward(adapter, inputs, target)
    calls = {"forward": forward(adapter, inputs), "forward+backward": plain}
    for name in METHODS:
        use = flow_inputs if name == "attention_flow" else inputs
        call = method_call(name, adapter, use, target)
        if call is not None:
            calls[name] = call
    seconds = interleaved_seconds(calls, repeats)
    t_fwd, t_fb = seconds["forward"], seconds["forward+backward"]
    rows = [
        (f"forward ({len(inputs.tokens)} tok)", f"{t_fwd * 1e3:.1f}", f"{t_fwd / t_fb:.2f}", ""),
        ("forward+backward", f"{t_fb * 1e3:.1f}", "1.00", ""),
    ]
    for name in METHODS:
        if name not in seconds:
            rows.append((name, "n/a", "n/a", "not registered"))
            continue
        note = f"{seconds[name] / t_fwd:.2f}× forward" if name == "rollout" else ""
        if name == "attention_flow":
            note = f"{len(flow_inputs.tokens)} tokens"
        rows.append((name, f"{seconds[name] * 1e3:.1f}", f"{seconds[name] / t_fb:.2f}", note))
    if "pa_lrp" in calls:
        plain_peak, lrp_peak = peak_bytes(plain), peak_bytes(calls["pa_lrp"])
        rows.append(
            (
                "peak memory pa_lrp / backward",
                f"{lrp_peak / 2**20:.2f} / {plain_peak / 2**20:.2f} MiB",
                f"{lrp_peak / plain_peak:.2f}",
                "torch profiler memory timeline",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--models", default="minilm-zeroshot,tiny-random-llama,smollm2-135m", help="comma-separated"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for spec in args.models.split(","):
        print(f"\n{spec}  (torch {torch.__version__}, {args.threads} threads, CPU)\n")
        print_table(("measure", "time (ms)", "× fwd+bwd", "note"), bench(spec, 128, args.repeats))


if __name__ == "__main__":
    main()
