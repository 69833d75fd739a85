"""
The one device script (issue 12): RISE, AttnLRP and perturbation throughput on whatever device
is present.

Run: ``.venv/bin/python benchmarks/gpu.py [--full]``

On a GPU (or with ``--full``): RISE with 4000 masks on EfficientNet-Lite0 and on a ViT-sized
input (a random ViT-B/16: 224², 16-pixel patches; timing needs no trained weights), AttnLRP on
SmolLM2-135M at 1024 tokens, and the perturbation throughput ratio (RISE passes/s over plain
batched inference of the same batch). On a CPU without ``--full`` it runs a reduced form
(400 masks, 40 on the ViT; 128 tokens) that finishes in about a minute. Each row gives
seconds, passes/s and peak device memory (CUDA only).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from _timing import text_of
from skimage import data

from attribution import explain
from attribution.models import load
from attribution.perturb import auto_batch_size, repeated


def _timed(device: torch.device, call: Callable[[], Any]) -> tuple[float, int | None]:
    """Seconds of ``call`` (after a warm-up) and its peak CUDA memory."""
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter() - start, torch.cuda.max_memory_allocated(device)
    return time.perf_counter() - start, None


def _plain_rate(adapter: Any, inputs: Any, passes: int) -> float:
    """Passes/s of plain batched inference of copies of the input (the engine's batch)."""
    batch = auto_batch_size(adapter, inputs)
    rows = {k: repeated(v, batch) for k, v in inputs.model_kwargs().items()}

    def run() -> None:
        with torch.no_grad():
            for _ in range(max(1, passes // batch)):
                adapter.logits(**rows)

    seconds, _ = _timed(adapter.device, run)
    return max(1, passes // batch) * batch / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="full sizes on a CPU too")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    full = args.full or device.type == "cuda"
    masks, tokens = (4000, 1024) if full else (400, 128)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows = []
    for spec in ("efficientnet-lite0", "random-vit-b16"):
        adapter = _vit_b16(device) if spec == "random-vit-b16" else load(spec, device=str(device))
        inputs = adapter.preprocess(data.chelsea())
        count = masks if full or spec == "efficientnet-lite0" else masks // 10  # ViT-B on a CPU
        seconds, memory = _timed(
            device,
            lambda a=adapter, i=inputs, n=count: explain(a, "rise", i, params={"n_masks": n}),
        )
        ratio = (count / seconds) / _plain_rate(adapter, inputs, count)
        rows.append((f"RISE {count} masks", spec, seconds, count / seconds, ratio, memory))
    smol = load("smollm2-135m", device=str(device))
    inputs = text_of(smol, tokens)
    seconds, memory = _timed(device, lambda: explain(smol, "attnlrp", inputs))
    rows.append(
        (f"AttnLRP {len(inputs.tokens)} tokens", "smollm2-135m", seconds, 2 / seconds, None, memory)
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"\nDevice: {device} ({name}), {'full' if full else 'reduced'} sizes\n")
    print_table(
        ("run", "model", "seconds", "passes/s", "RISE / plain inference", "peak CUDA memory"),
        [
            (
                name,
                spec,
                f"{seconds:.2f}",
                f"{rate:.0f}",
                "" if ratio is None else f"{ratio:.2f}",
                "" if memory is None else f"{memory / 2**20:.0f} MiB",
            )
            for name, spec, seconds, rate, ratio, memory in rows
        ],
    )


def _vit_b16(device: torch.device) -> Any:
    """A ViT-B/16-shaped random model (224², 16-pixel patches, 12 layers of width 768)."""
    import transformers as tf

    from attribution.models.images import ImageTransform
    from attribution.models.vision import ViTAdapter

    config = tf.ViTConfig(image_size=224, patch_size=16, num_labels=1000)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(config).eval().to(device)
    transform = ImageTransform((224, 224), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    return ViTAdapter(model, "random-vit-b16", transform)


if __name__ == "__main__":
    main()
