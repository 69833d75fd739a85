"""
Where AttnLRP's relevance goes on the embedded text models: the map, positions, softmax, biases.

Run: ``.venv/bin/python benchmarks/lrp_accounting.py``

AttnLRP explained (:func:`attribution.explain`, default parameters, the top prediction) on
SmolLM2-135M ("The capital of France is") and MiniLM zero-shot ("the film was wonderful and
moving"). Each share is a part of the run's own accounting in ``metrics`` over the explained
logit (``target_logit``): the input relevance (the map's sum), ``positional_absorbed``,
``softmax_absorbed``, ``bias_absorbed``; and ``unaccounted_relevance``, the logit minus all
of them, which the verdict judges.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from stand_ins import load_for_benchmark

from attrlab.attribution import explain

CASES = (
    ("smollm2-135m", "The capital of France is"),
    ("minilm-zeroshot", "the film was wonderful and moving"),
)
PARTS = ("input_relevance", "positional_absorbed", "softmax_absorbed", "bias_absorbed")


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    for spec, text in CASES:
        adapter, name = load_for_benchmark(spec, "cpu")
        explanation = explain(adapter, "attnlrp", adapter.preprocess(text))
        metrics = explanation.metrics
        logit = metrics["target_logit"]
        shares = [f"{metrics.get(part, 0.0) / logit:.0%}" for part in PARTS]
        unaccounted = metrics["unaccounted_relevance"] / logit
        rows.append(
            (f'{name}, "{text}" → {explanation.target.label!r}', *shares, f"{unaccounted:.1e}")
        )
    print_table(
        (
            "model, input → target",
            "map (input relevance)",
            "positions",
            "attention's softmax",
            "biases",
            "unaccounted",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
