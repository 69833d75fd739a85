"""
Peak memory and seconds of long-context attributions, with and without gradient checkpointing.

Run: ``.venv/bin/python benchmarks/memory.py [--tokens 256 1024 4096] [--plain-up-to 2048]
[--threads 2] [--repeats 1]``

On the embedded SmolLM2-135M (30 layers, eager attention; a stand-in under
``ATTRLAB_STAND_INS``, see ``stand_ins.py``), a text of each length, AttnLRP and integrated
gradients (``--ig-steps`` path points, ``--ig-batch`` per pass), each with ``checkpointing``
off and on. Each run is a fresh process (so one run's freed memory cannot hide the next's),
after a warm-up explain of a short text: peak memory is
:func:`attribution.request.memory.peak_memory` around the one ``explain`` call (on the CPU the
process's sampled resident size above its resting size, on a GPU torch's allocator peak),
seconds its wall time. A plain run (no checkpointing) longer than ``--plain-up-to`` tokens is
not run: its attention maps alone would not fit this machine (it is printed as not run). The
last columns compare checkpointed with plain runs where both ran: the target is at most 0.5 ×
the memory for at most 1.5 × the time. With ``--repeats N`` the plain and checkpointed runs
alternate N times (so that other work on the machine slows both alike): seconds are the fastest
of each, peaks the largest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

METHODS = ("attnlrp", "integrated_gradients")


def _one(method: str, tokens: int, checkpointing: bool, args: argparse.Namespace) -> None:
    """Run one configuration in this process; print its result as one JSON line."""
    import torch
    from _timing import text_of
    from stand_ins import load_for_benchmark

    from attrlab.attribution.explain import explain
    from attrlab.attribution.request.memory import peak_memory

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    adapter, label = load_for_benchmark("smollm2-135m", device)
    params: dict[str, object] = {"checkpointing": checkpointing}
    if method == "integrated_gradients":
        params |= {"n_steps": args.ig_steps, "internal_batch_size": args.ig_batch}
    explain(adapter, method, text_of(adapter, 16), params=params)  # warm-up: lazy imports, caches
    inputs = text_of(adapter, tokens)
    with peak_memory(adapter.device) as peak:
        start = time.perf_counter()
        explanation = explain(adapter, method, inputs, params=params)
        seconds = time.perf_counter() - start
    record = {
        "model": label,
        "method": method,
        "tokens": len(inputs.tokens),
        "checkpointing": checkpointing,
        "seconds": seconds,
        "peak_bytes": peak(),
        "score_sum": float(explanation.scores.sum()),
    }
    print(json.dumps(record), flush=True)


def _spawn(method: str, tokens: int, checkpointing: bool, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--one", method, str(tokens), str(int(checkpointing))]
    command += ["--threads", str(args.threads), "--ig-steps", str(args.ig_steps)]
    command += ["--ig-batch", str(args.ig_batch)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {done.returncode}: {tail[0]}"}
    result: dict = json.loads(lines[-1])
    return result


def _best(records: list[dict]) -> dict:
    """The fastest seconds and the largest peak of a configuration's runs (or why none ran)."""
    if not records:
        return {"error": "not run (does not fit)"}
    ran = [r for r in records if "seconds" in r]
    if not ran:
        return records[0]
    peaks = [r["peak_bytes"] for r in ran if r.get("peak_bytes") is not None]
    return {
        "seconds": min(r["seconds"] for r in ran),
        "peak_bytes": max(peaks) if peaks else None,
    }


def _gb(record: dict) -> str:
    peak = record.get("peak_bytes")
    return "n/a" if peak is None else f"{peak / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--plain-up-to", type=int, default=2048)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ig-steps", type=int, default=8)
    parser.add_argument("--ig-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, tokens, checkpointing = args.one
        _one(method, int(tokens), bool(int(checkpointing)), args)
        return

    from _tables import print_table

    rows = []
    for tokens in args.tokens:
        for method in args.methods:
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.repeats):
                for checkpointing in (False, True):
                    if checkpointing or tokens <= args.plain_up_to:
                        record = _spawn(method, tokens, checkpointing, args)
                        print(json.dumps({"tokens": tokens, "method": method, **record}))
                        runs[checkpointing].append(record)
            plain, kept = (_best(runs[checkpointing]) for checkpointing in (False, True))
            both = "seconds" in plain and "seconds" in kept
            memory_ratio = (
                f"{kept['peak_bytes'] / plain['peak_bytes']:.2f}"
                if both and plain.get("peak_bytes") and kept.get("peak_bytes") is not None
                else ""
            )
            time_ratio = f"{kept['seconds'] / plain['seconds']:.2f}" if both else ""
            rows.append(
                [
                    method,
                    tokens,
                    plain.get("error") or _gb(plain),
                    f"{plain['seconds']:.1f}" if "seconds" in plain else "",
                    kept.get("error") or _gb(kept),
                    f"{kept['seconds']:.1f}" if "seconds" in kept else "",
                    memory_ratio,
                    time_ratio,
                ]
            )
    print_table(
        [
            "method",
            "tokens",
            "plain peak GiB",
            "plain s",
            "checkpointed peak GiB",
            "checkpointed s",
            "memory ×",
            "time ×",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
