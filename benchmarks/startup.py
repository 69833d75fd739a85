"""
Whole-process time of CLI commands as a user runs them (issue 14).

Run: ``.venv/bin/python benchmarks/startup.py [--runs 5]``

Each command runs in a fresh process, ``--runs`` times, interleaved with the others (so load
spikes hit all alike); the table gives the median wall time and its ratio to the import floor,
``python -c "import torch, transformers"``, measured in the same run. Targets: ``--help``,
``models`` and ``methods`` ≤ 1 s; ``explain`` on a tiny model ≤ 1.3 × the floor. Two reference
rows show what the tiny LLaMA costs without attrlab: transformers' model code (imported by
building any model) and the model, then Captum, which gradient × input runs on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _tables import print_table
from PIL import Image
from skimage import data

ATTRLAB = str(Path(sys.executable).with_name("attrlab"))
TEXT = "The film was good and the actors were great"
#: What loading tiny-random-llama costs without attrlab: transformers' model code and the model.
TINY_LLAMA = (
    "from transformers import LlamaConfig, LlamaForCausalLM; LlamaForCausalLM(LlamaConfig("
    "hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, "
    "num_key_value_heads=2))"
)


def commands(image: str) -> dict[str, tuple[list[str], str]]:
    """Name -> (command, target)."""
    explain = [ATTRLAB, "explain", "--method", "gradient_x_input", "--device", "cpu"]
    return {
        'python -c "import torch, transformers" (floor)': (
            [sys.executable, "-c", "import torch, transformers"],
            "",
        ),
        "reference: the floor + building the tiny LLaMA with transformers": (
            [sys.executable, "-c", f"import torch, transformers; {TINY_LLAMA}"],
            "",
        ),
        "reference: the same + import captum.attr (gradient × input's library)": (
            [sys.executable, "-c", f"import torch, transformers; {TINY_LLAMA}; import captum.attr"],
            "",
        ),
        "attrlab --help": ([ATTRLAB, "--help"], "≤ 1 s"),
        "attrlab models": ([ATTRLAB, "models"], "≤ 1 s"),
        "attrlab methods": ([ATTRLAB, "methods"], "≤ 1 s"),
        "explain, tiny-random-llama": (
            [*explain, "--model", "tiny-random-llama", "--next-token", "--text", TEXT],
            "≤ 1.3 × floor",
        ),
        "explain, minilm-zeroshot": ([*explain, "--model", "minilm-zeroshot", "--text", TEXT], ""),
        "explain, efficientnet-lite0": (
            [*explain, "--model", "efficientnet-lite0", "--image", image],
            "",
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as folder:
        image = str(Path(folder) / "cat.png")
        Image.fromarray(data.chelsea()).save(image)
        runs = commands(image)
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.runs):
            for name, (command, _) in runs.items():
                start = time.perf_counter()
                subprocess.run(command, env=env, check=True, capture_output=True)
                seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    floor = next(iter(median.values()))
    rows = []
    for name, (_, target) in runs.items():
        verdict = ""
        if target == "≤ 1 s":
            verdict = "met" if median[name] <= 1 else "missed"
        elif target:
            verdict = "met" if median[name] <= 1.3 * floor else "missed"
        rows.append(
            (name, f"{median[name]:.2f}", f"{median[name] / floor:.2f}", f"{target} {verdict}")
        )
    print(f"\nWhole-process wall time, median of {args.runs} runs (CPU, {os.cpu_count()} cores)\n")
    print_table(("command", "seconds", "× floor", "target"), rows)


if __name__ == "__main__":
    main()
