"""
Which shipped long-context tasks SmolLM2-135M solves with its whole KV cache (issue 39).

Run: ``.venv/bin/python -u benchmarks/kv_tasks.py [--instances 10] [--threads 2]``

On the embedded SmolLM2-135M (real weights: this measures answers, not time), each task of
:mod:`attribution.inputs.long_context` at a few sizes (tokens of the prompt with its answer,
SmolLM2's tokenizer) and settings, over ``--instances`` seeds: greedy exact match of the answer
(teacher-forced, every answer token the argmax at its position given the gold prefix, which
is what greedy decoding producing it means) and the answer's mean log-probability per token.
One forward per task, the vocabulary head on the answer's positions only.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import time
from collections.abc import Callable

import torch
from _tables import print_table

from attrlab.attribution.inputs.long_context import (
    ContextTask,
    kv_retrieval,
    needle,
    task_inputs,
    token_counter,
    variable_tracking,
)
from attrlab.attribution.models import load

#: Each row: task, settings in words, the sizes (max tokens) it is measured at, and the task
#: of (seed, size, count). The smaller settings at one size only, so that the run stays short.
Make = Callable[[int, int, Callable[[str], int]], ContextTask]
CELLS: list[tuple[str, str, tuple[int, ...], Make]] = [
    ("kv_retrieval", "pairs only", (250, 500, 1000), lambda s, n, c: kv_retrieval(s, n, c)),
    (
        "kv_retrieval",
        "4 pairs in filler",
        (250, 500, 1000),
        lambda s, n, c: kv_retrieval(s, n, c, pairs=4),
    ),
    ("kv_retrieval", "8 pairs in filler", (500,), lambda s, n, c: kv_retrieval(s, n, c, pairs=8)),
    ("needle", "depth 0.5", (250, 500, 1000), lambda s, n, c: needle(s, 0.5, n, c)),
    ("needle", "depth 0.0", (500,), lambda s, n, c: needle(s, 0.0, n, c)),
    ("needle", "depth 1.0", (500,), lambda s, n, c: needle(s, 1.0, n, c)),
    (
        "variable_tracking",
        "1 chain, 2 hops",
        (500,),
        lambda s, n, c: variable_tracking(s, 2, 1, n, c),
    ),
    (
        "variable_tracking",
        "2 chains, 2 hops",
        (250, 500),
        lambda s, n, c: variable_tracking(s, 2, 2, n, c),
    ),
]


def solved(adapter, task: ContextTask) -> tuple[bool, float, int]:
    """Exact match, the answer's mean log-probability per token, and the sequence's length."""
    held = task_inputs(adapter, task)
    ids = held.inputs.input_ids
    length = held.inputs.answer_length
    with torch.no_grad():
        logits = adapter.model(**held.inputs.model_kwargs(), logits_to_keep=length + 1).logits
    log_probs = logits[0, :-1].double().log_softmax(-1)  # the positions before each answer token
    answer = ids[0, -length:]
    exact = bool((log_probs.argmax(-1) == answer).all())
    return exact, float(log_probs.gather(1, answer[:, None]).mean()), int(ids.shape[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    adapter = load("smollm2-135m", device="cpu")
    count = token_counter(adapter.tokenizer)
    rows = []
    for kind, settings, sizes, make in CELLS:
        for size in sizes:
            start = time.perf_counter()
            runs = [solved(adapter, make(seed, size, count)) for seed in range(args.instances)]
            exact = sum(r[0] for r in runs)
            row = (
                kind,
                settings,
                size,
                round(sum(r[2] for r in runs) / len(runs)),
                f"{exact}/{len(runs)}",
                f"{sum(r[1] for r in runs) / len(runs):.2f}",
                f"{time.perf_counter() - start:.0f}",
            )
            print(*row, flush=True)
            rows.append(row)
    print(f"\nsmollm2-135m (torch {torch.__version__}, {args.threads} threads, CPU)\n")
    print_table(
        (
            "task",
            "settings",
            "max tokens",
            "mean tokens",
            "exact match",
            "mean log-prob / token",
            "seconds",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
