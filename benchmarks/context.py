"""
Context attribution with the prompt's key/value cache against plain leave-one-out (issue 26).

Run: ``.venv/bin/python benchmarks/context.py [--repeats 3] [--threads 2]``

On the embedded SmolLM2-135M (a stand-in under ``ATTRLAB_STAND_INS``, see ``stand_ins.py``), two
prompts, each followed by a given answer of a few tokens: 8 sentences about Marie Curie and a
question (each sentence a feature), and 20 one-sentence documents and a question, RAG-style
(each document a feature). For each, :func:`attribution.context.context_attribution` with
``reuse_cache`` and without: forwards, token positions computed, seconds (fastest of
``--repeats`` interleaved runs after a warm-up), and the largest difference of a feature's
score between the two.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from _tables import print_table
from _timing import interleaved_seconds, timing_run
from stand_ins import load_for_benchmark

from attrlab.attribution.context import context_attribution
from attrlab.attribution.request.answers import answer_request

SENTENCES = [
    "Marie Curie was born in Warsaw in 1867.",
    "She moved to Paris to study physics and mathematics.",
    "At the Sorbonne she met Pierre Curie, a physicist.",
    "Together they studied the radiation of uranium ores.",
    "In 1898 they announced the discovery of polonium and radium.",
    "Marie Curie won the Nobel Prize in Physics in 1903.",
    "She won a second Nobel Prize, in Chemistry, in 1911.",
    "She died in 1934 near Passy, in France.",
]
PLACES = [
    ("The Eiffel Tower", "Paris"),
    ("The Colosseum", "Rome"),
    ("Big Ben", "London"),
    ("The Brandenburg Gate", "Berlin"),
    ("The Sagrada Familia", "Barcelona"),
    ("The Acropolis", "Athens"),
    ("The Little Mermaid statue", "Copenhagen"),
    ("The Atomium", "Brussels"),
    ("The Charles Bridge", "Prague"),
    ("The Rijksmuseum", "Amsterdam"),
    ("The Hagia Sophia", "Istanbul"),
    ("The Kremlin", "Moscow"),
    ("The Forbidden City", "Beijing"),
    ("The Statue of Liberty", "New York"),
    ("The Golden Gate Bridge", "San Francisco"),
    ("The Opera House", "Sydney"),
    ("The Christ the Redeemer statue", "Rio de Janeiro"),
    ("The Burj Khalifa", "Dubai"),
    ("The Petronas Towers", "Kuala Lumpur"),
    ("The CN Tower", "Toronto"),
]
CASES = {
    "8 sentences": (
        " ".join(SENTENCES) + " Question: in which city did Marie Curie study? Answer:",
        SENTENCES,
        " She studied in Paris.",
    ),
    "20 documents (RAG)": (
        " ".join(f"Document {i + 1}: {p} is in {c}." for i, (p, c) in enumerate(PLACES))
        + " Question: in which city is the Colosseum? Answer:",
        [f"Document {i + 1}: {p} is in {c}." for i, (p, c) in enumerate(PLACES)],
        " It is in Rome.",
    ),
}


def token_ranges(inputs, text: str, parts: list[str]) -> list[tuple[int, int]]:
    """Each part's tokens ``(start, stop)``: those whose characters start within it."""
    ranges = []
    for part in parts:
        begin = text.index(part)
        end = begin + len(part)
        inside = [i for i, (a, b) in enumerate(inputs.offsets) if b > a and begin <= a < end]
        ranges.append((inside[0], inside[-1] + 1))
    return ranges


def bench(adapter, case: str, repeats: int) -> list[tuple[object, ...]]:
    prompt, parts, answer = CASES[case]
    inputs, target = answer_request(adapter, prompt, answer=answer)
    features = token_ranges(inputs, prompt, parts)
    runs = {
        "KV cache": lambda: context_attribution(adapter, inputs, target, features),
        "plain": lambda: context_attribution(adapter, inputs, target, features, reuse_cache=False),
    }
    seconds = interleaved_seconds(runs, repeats)
    results = {name: run() for name, run in runs.items()}
    plain = results["plain"]
    gap = float(np.abs(results["KV cache"].scores - plain.scores).max())
    rows = []
    for name, result in results.items():
        rows.append(
            (
                case,
                len(inputs.tokens),
                len(features),
                name,
                result.forward_passes,
                result.token_positions,
                f"{seconds[name]:.2f}",
                f"{seconds[name] / seconds['plain']:.2f}",
                f"{result.token_positions / plain.token_positions:.2f}",
                f"{gap:.1e}" if name == "KV cache" else "",
            )
        )
    top = int(np.argmax(plain.scores))
    print(f"{case}: largest drop {plain.scores[top]:.2f} nats, feature {parts[top]!r}")
    return rows


def main() -> None:
    args, device, where = timing_run(__doc__.split("\n\n")[0])
    adapter, name = load_for_benchmark("smollm2-135m", device)
    rows = [row for case in CASES for row in bench(adapter, case, args.repeats)]
    print(f"\n{name}  (torch {torch.__version__}, {where})\n")
    print_table(
        (
            "prompt",
            "tokens",
            "features",
            "leave-one-out",
            "forwards",
            "token positions",
            "seconds",
            "× plain, time",
            "× plain, positions",
            "max |Δ score| vs plain",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
