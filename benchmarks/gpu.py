"""
The one device script (issue 12): RISE, AttnLRP and perturbation throughput on whatever device
is present, and the CUDA path's checks.

Run: ``.venv/bin/python benchmarks/gpu.py [--full]``

On a GPU (or with ``--full``): RISE with 4000 masks on EfficientNet-Lite0 and on a ViT-sized
input (a random ViT-B/16: 224², 16-pixel patches; timing needs no trained weights), in float32
and with bfloat16 autocast (``precision``), AttnLRP on SmolLM2-135M at 1024 tokens, and the
perturbation throughput ratio (RISE passes/s over plain batched inference of the same batch).
On a CPU without ``--full`` it runs a reduced form (400 masks, 40 on the ViT; 128 tokens) that
finishes in about a minute. Each row gives seconds, passes/s and peak device memory (CUDA only).

On CUDA it then checks, and fails loudly otherwise: the automatic batch comes from free memory;
a bfloat16 RISE map agrees with the float32 one; a RISE run whose batch overflows a capped GPU
halves its batch and gives the same map; a job through the worker runs on the GPU. With
``ATTRLAB_STAND_INS`` set, models too large to carry are stand-ins (``stand_ins.py``).

Models that do not fit one device (issue 28; written without a GPU, NOT RUN yet): SmolLM2 from
its folder spread by a device map (its blocks split over the GPUs there are, the second half on
the CPU with one GPU) gives the single-GPU model's gradient × input, integrated-gradients and
AttnLRP maps; loaded in 8-bit and in 4-bit (bitsandbytes) every one of those methods runs, and
its map's correlation with the float32 map is printed.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from _timing import text_of
from skimage import data
from stand_ins import load_for_benchmark

from attrlab.attribution import explain
from attrlab.attribution.inputs.perturb import auto_batch_size, forward_row_bytes, repeated


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
    checks: list[tuple[str, str]] = []
    rows = []
    for spec in ("efficientnet-lite0", "random-vit-b16"):
        if spec == "random-vit-b16":
            adapter = _vit_b16(device)
        else:
            adapter, spec = load_for_benchmark(spec, str(device))
        inputs = adapter.preprocess(data.chelsea())
        count = masks if full or spec == "efficientnet-lite0" else masks // 10  # ViT-B on a CPU
        maps = {}
        for precision in ("float32", "bfloat16") if device.type == "cuda" else ("float32",):
            params = {"n_masks": count, "precision": precision}
            seconds, memory = _timed(
                device,
                lambda a=adapter, i=inputs, p=params, m=maps: m.__setitem__(
                    p["precision"], explain(a, "rise", i, params=p).scores
                ),
            )
            ratio = (count / seconds) / _plain_rate(adapter, inputs, count)
            run = f"RISE {count} masks, {precision}"
            rows.append((run, spec, seconds, count / seconds, ratio, memory))
        if "bfloat16" in maps:
            agreement = _correlation(maps["float32"], maps["bfloat16"])
            checks.append((f"RISE bfloat16 vs float32 map ({spec})", f"r = {agreement:.4f}"))
            assert agreement > 0.99 or spec != "efficientnet-lite0", agreement  # trained only
    smol, smol_name = load_for_benchmark("smollm2-135m", str(device))
    inputs = text_of(smol, tokens)
    seconds, memory = _timed(device, lambda: explain(smol, "attnlrp", inputs))
    rows.append(
        (f"AttnLRP {len(inputs.tokens)} tokens", smol_name, seconds, 2 / seconds, None, memory)
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
    if device.type == "cuda":
        checks += _cuda_checks(device)
        checks += _placement_checks(device)
        print()
        print_table(("CUDA check", "result"), checks)


def _correlation(a: Any, b: Any) -> float:
    import numpy as np

    return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])


def _cuda_checks(device: torch.device) -> list[tuple[str, str]]:
    """The CUDA path's properties; an assertion fails the script if one does not hold."""
    import numpy as np

    from attrlab.app.worker import ExplainWorker
    from attrlab.attribution.request import ExplainRequest

    checks = []
    adapter, spec = load_for_benchmark("efficientnet-lite0", str(device))
    inputs = adapter.preprocess(data.chelsea())
    batch = auto_batch_size(adapter, inputs)
    free = torch.cuda.mem_get_info(device)[0]
    checks.append(
        (f"automatic batch ({spec}, {free / 2**30:.0f} GiB free)", f"{batch} (CPU default 16)")
    )
    assert batch > 16, batch
    worker = ExplainWorker()
    try:
        request = ExplainRequest(
            model="efficientnet-lite0", method="rise", image=data.chelsea(), params={"n_masks": 256}
        )
        served = worker.explain(request).scores
        lanes = worker.status()["devices"]
    finally:
        worker.close()
    direct = explain(adapter, "rise", inputs, params={"n_masks": 256}).scores
    difference = float(np.abs(served - direct).max() / np.abs(direct).max())
    devices = ", ".join(lane["device"] for lane in lanes)
    checks.append((f"worker lanes: {devices}", f"RISE map differs from direct by {difference:.1e}"))
    assert all(lane["device"].startswith("cuda") for lane in lanes), devices
    assert difference < 1e-3, difference
    # Out of memory for real: cap this process's GPU memory near what it holds plus 64 rows, so
    # a batch of 4096 cannot fit (not even in the allocator's cached fragments).
    params = {"n_masks": 4096, "batch_size": 4096}
    reference = explain(adapter, "rise", inputs, params=params).scores
    torch.cuda.empty_cache()
    allowed = torch.cuda.memory_reserved(device) + 64 * forward_row_bytes(adapter, inputs)
    index = torch.cuda.current_device() if device.index is None else device.index
    total = torch.cuda.get_device_properties(index).total_memory
    done: list[int] = []
    torch.cuda.set_per_process_memory_fraction(allowed / total, index)
    try:
        halved = explain(
            adapter, "rise", inputs, params=params, progress=lambda d, t: done.append(d)
        ).scores
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    batch = min(d for d in done if d > 0)  # progress counts passes after each batch
    # Same masks whatever the batch; only float rounding (TF32 convolutions) may differ.
    difference = float(np.abs(halved - reference).max() / np.abs(reference).max())
    checks.append(
        (
            "RISE batch 4096 on a GPU capped near 64 rows",
            f"halved to {batch} after out-of-memory; map differs by {difference:.1e}",
        )
    )
    assert batch < 4096, batch
    assert difference < 1e-3, difference
    return checks


def _placement_checks(device: torch.device) -> list[tuple[str, str]]:
    """A device-mapped and a quantised SmolLM2 against the model on one GPU (issue 28)."""
    import numpy as np

    from attrlab.attribution.models import load
    from attrlab.attribution.models.builtin import smollm2_folder
    from attrlab.attribution.models.placement import Placement

    stand_in = Path(os.environ.get("ATTRLAB_STAND_INS", "/nonexistent")) / "smollm2-135m"
    folder = str(stand_in if any(stand_in.glob("*.safetensors")) else smollm2_folder())
    methods = {"gradient_x_input": {}, "integrated_gradients": {"n_steps": 16}, "attnlrp": {}}
    whole = load(folder, device=str(device))
    text = whole.preprocess("When Mary and John went to the store, John gave a drink to")
    expected = {m: explain(whole, m, text, params=p).scores for m, p in methods.items()}
    layers = whole.num_layers
    gpus = torch.cuda.device_count()
    spread = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 0, "lm_head": 0}
    for layer in range(layers):
        half = layer >= layers // 2
        spread[f"model.layers.{layer}"] = (1 if gpus > 1 else "cpu") if half else 0
    checks = []
    variants: dict[str, Placement] = {
        f"device map over {'2 GPUs' if gpus > 1 else 'GPU + CPU'}": Placement(spread),
        "8-bit (bitsandbytes)": Placement(quantization="8bit"),
        "4-bit (bitsandbytes)": Placement(quantization="4bit"),
    }
    for name, placement in variants.items():
        placed = load(folder, placement=placement)
        inputs = placed.preprocess(text.text)
        for method, params in methods.items():
            scores = explain(placed, method, inputs, params=params).scores
            assert np.isfinite(scores).all(), (name, method)
            if placement.quantization is None:
                difference = float(np.abs(scores - expected[method]).max())
                scale = float(np.abs(expected[method]).max())
                checks.append((f"{method}, {name}", f"map differs by {difference / scale:.1e}"))
                assert difference < 1e-3 * scale, (name, method, difference)
            else:
                correlation = _correlation(scores, expected[method])
                checks.append((f"{method}, {name}", f"r = {correlation:.3f} with float32"))
        del placed
        torch.cuda.empty_cache()
    return checks


def _vit_b16(device: torch.device) -> Any:
    """A ViT-B/16-shaped random model (224², 16-pixel patches, 12 layers of width 768)."""
    import transformers as tf

    from attrlab.attribution.models.images import ImageTransform
    from attrlab.attribution.models.vision import ViTAdapter

    config = tf.ViTConfig(image_size=224, patch_size=16, num_labels=1000)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(config).eval().to(device)
    transform = ImageTransform((224, 224), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    return ViTAdapter(model, "random-vit-b16", transform)


if __name__ == "__main__":
    main()
