"""
What a model's first estimate costs, by the size of the request that asks for it (issue 36).

Run: ``.venv/bin/python benchmarks/calibration.py`` (quiet machine; each case in a fresh
process, so that every one pays for a calibration)

A calibration times forward and gradient passes at three batch widths. Side by side, for
requests of 10, 150 and 500 words: calibrating on the model's own short reference input
(``calibrate``, what every estimate does now) and on the request's own input (a
``Calibration`` made with it, as estimates did before). Seconds and the process's peak memory
(resident, beyond the loaded model) of the whole calibration. Target: a few seconds and a
bounded amount of memory, the same whatever the request's size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from _tables import print_table

MODELS = ("minilm-zeroshot", "smollm2-135m")
WORDS = (10, 150, 500)
#: A case stopped after this long is reported as such (calibrating on a long request's own
#: input could take many minutes).
LONGEST_S = 300


def _case(model: str, words: int, own: bool) -> dict[str, float]:
    import torch

    from attrlab.attribution.models import load
    from attrlab.attribution.request.calibration import Calibration, calibrate
    from attrlab.attribution.request.memory import peak_memory

    torch.set_num_threads(2)
    adapter = load(model, device="cpu")
    inputs = adapter.preprocess("word " * words)
    start = time.perf_counter()
    with peak_memory(torch.device("cpu")) as peak:
        made = calibrate(adapter) if own else Calibration(adapter, inputs)
        made.measure_all()
    return {
        "seconds": time.perf_counter() - start,
        "peak": peak() or 0,
        "tokens": len(made.inputs.tokens),
    }


def _seconds(seconds: float) -> str:
    return f"> {LONGEST_S}" if seconds == float("inf") else f"{seconds:.1f}"


def main() -> None:
    rows = []
    for model in MODELS:
        for words in WORDS:
            found = {}
            for own in (True, False):
                code = (
                    "import json, sys; sys.path.insert(0, 'benchmarks'); import calibration; "
                    f"print(json.dumps(calibration._case({model!r}, {words}, {own})))"
                )
                try:
                    done = subprocess.run(
                        [sys.executable, "-c", code],
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=LONGEST_S,
                    )
                except subprocess.TimeoutExpired:
                    found[own] = {"seconds": float("inf"), "peak": float("nan"), "tokens": "?"}
                    continue
                found[own] = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(
                [
                    model,
                    f"{words}",
                    f"{found[True]['tokens']}",
                    _seconds(found[True]["seconds"]),
                    f"{found[True]['peak'] / 2**20:,.0f}",
                    f"{found[False]['tokens']}",
                    _seconds(found[False]["seconds"]),
                    f"{found[False]['peak'] / 2**20:,.0f}",
                ]
            )
    print_table(
        [
            "model",
            "request words",
            "reference tokens",
            "on the reference: s",
            "peak MiB",
            "request tokens",
            "on the request: s",
            "peak MiB",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
