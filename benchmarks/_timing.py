"""Timing helpers shared by the benchmark scripts: inputs of a set length, the stopwatches."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from attrlab.attribution.methods import available_methods
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import output_target

WORDS = [
    "the",
    "film",
    "was",
    "good",
    "and",
    "the",
    "actors",
    "were",
    "great",
    "but",
    "the",
    "plot",
    "felt",
    "slow",
    "at",
    "times",
]


def text_of(adapter, tokens: int) -> object:
    """Inputs of exactly ``tokens`` tokens (special tokens included)."""
    for words in range(tokens, 0, -1):
        inputs = adapter.preprocess(" ".join(WORDS[i % len(WORDS)] for i in range(words)))
        if len(inputs.tokens) <= tokens:
            return inputs
    raise ValueError("cannot build the input")


def timing_run(description: str) -> tuple[argparse.Namespace, str, str]:
    """
    ``--repeats`` and ``--threads`` read from the command line, the threads set.

    Returns the arguments, the device (the GPU where there is one) and where the run goes, in words.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name() if device == "cuda" else f"{args.threads} threads, CPU"
    return args, device, where


def best_seconds(run: Callable[[], Any], repeats: int = 3) -> float:
    """The shortest of ``repeats`` runs of ``run()``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def interleaved_seconds(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Fastest of ``repeats`` runs per call; runs are interleaved so load spikes hit all alike."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if torch.cuda.is_available():  # kernels run asynchronously: wait for them
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def forward(adapter, inputs) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return adapter.logits(**inputs.model_kwargs())

    return run


def forward_backward(adapter, inputs, target: int) -> Callable[[], object]:
    """Plain gradient of the target logit at the token embeddings (what LRP is compared to)."""

    def run() -> object:
        seen = {}

        def leaf(_m, _a, out):
            seen["embedding"] = out.detach().requires_grad_(True)
            return seen["embedding"]

        handle = adapter.token_embedding_module().register_forward_hook(leaf)
        try:
            logit = adapter.logits(**inputs.model_kwargs())[0, target]
            return torch.autograd.grad(logit, seen["embedding"])
        finally:
            handle.remove()

    return run


def method_call(
    name: str, adapter, inputs, target: int, logits: torch.Tensor | None = None
) -> Callable[[], object] | None:
    """
    A registered method's ``attribute`` on ``inputs`` with its default parameters, resolved.

    ``logits``: the input's own logits, as :func:`attribution.explain`'s prediction hands them
    to a method that reads them (so F(x) of a convergence delta costs no pass); without them
    such a method spends one forward of its own. ``None`` where the method is not registered or
    does not support the model.
    """
    registered = {m.name: m for m in available_methods()}
    method = registered.get(name)
    if method is None or method.unsupported_reason(adapter) is not None:
        return None
    params = method.resolve(adapter, {})  # as ``explain`` runs it: "auto" values resolved
    explained = output_target(adapter, target)
    return lambda: method.attribute(adapter, inputs, explained, params, RunContext(logits=logits))
