"""
Load time of the embedded models, each in a fresh process (issue 8).

Run: ``.venv/bin/python benchmarks/embedded_load.py [--repeats 3]``

SmolLM2 ships as a quantised GGUF file: its first load dequantises it and writes float32
safetensors to the cache (``ATTRLAB_CACHE``, here a fresh temporary folder), later loads read
the cache. Each figure is ``attribution.models.load(alias)`` alone (imports excluded), the median
of ``--repeats`` processes; the first-load row always starts from an empty cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from _tables import print_table

CHILD = """
import time, torch
torch.set_num_threads(2)
from attrlab.attribution.models import load
start = time.perf_counter()
load({alias!r}, device="cpu")
print(time.perf_counter() - start)
"""


def seconds(alias: str, cache: str) -> float:
    env = {**os.environ, "ATTRLAB_CACHE": cache, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(alias=alias)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    first, cached = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            first.append(seconds("smollm2-135m", cache))
            cached.append(seconds("smollm2-135m", cache))
    rows.append(
        (
            "smollm2-135m, first load",
            f"{statistics.median(first):.1f}",
            "GGUF dequantised, cache written",
        )
    )
    rows.append(
        (
            "smollm2-135m, cached",
            f"{statistics.median(cached):.1f}",
            "float32 safetensors from the cache",
        )
    )
    with tempfile.TemporaryDirectory() as cache:
        for alias in ("minilm-zeroshot", "efficientnet-lite0"):
            median = statistics.median(seconds(alias, cache) for _ in range(args.repeats))
            rows.append((alias, f"{median:.1f}", ""))
    print_table(("model", "load (s)", "note"), rows)


if __name__ == "__main__":
    main()
