"""
Perturbation engine throughput: RISE and Sobol forward passes vs plain batched inference.

For each embedded model (EfficientNet-Lite0 on an image, MiniLM zero-shot on a sentence) and
one batch size, it times plain inference of unperturbed copies of the input, RISE and Sobol,
and prints passes/s and the ratio to plain inference (1.0 = mask generation, perturbation and
accumulation cost nothing). Plain inference is timed before and after the methods and
averaged, to damp drift on a shared machine. A second table gives the peak resident memory
of RISE runs with growing ``n_masks``, each in a fresh process, next to what an N×H×W mask
bank would take.

    .venv/bin/python benchmarks/perturbation.py [--passes 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time
from typing import Any

import numpy as np
import torch
from _tables import print_table
from skimage import data

from attrlab import attribution
from attrlab.attribution.inputs.masks import ShiftedGridMasks
from attrlab.attribution.inputs.perturb import TextPerturbation, perturbation_for
from attrlab.attribution.models.base import Adapter, Inputs

SENTENCE = "I absolutely loved this wonderful film, though the ending dragged on a little."
IMAGE_BATCH = 16
TEXT_BATCH = 64


def plain(
    adapter: Adapter, batch: dict[str, torch.Tensor], passes: int, batch_size: int
) -> tuple[int, float]:
    """Forward ``passes`` inputs from a ready batch of kwargs; (passes, seconds)."""
    done, start = 0, time.perf_counter()
    with torch.no_grad():
        while done < passes:
            size = min(batch_size, passes - done)
            adapter.logits(**{k: v[:size] for k, v in batch.items()})
            done += size
    return done, time.perf_counter() - start


def unperturbed(inputs: Inputs, batch_size: int) -> dict[str, torch.Tensor]:
    """``batch_size`` contiguous copies of the input."""
    return {k: v.repeat(batch_size, *[1] * (v.dim() - 1)) for k, v in inputs.model_kwargs().items()}


def perturbed(adapter: Adapter, inputs: Inputs, batch_size: int) -> dict[str, torch.Tensor]:
    """One batch of RISE-perturbed inputs, made before timing (no mask cost in the loop)."""
    generator = torch.Generator().manual_seed(0)
    perturbation = perturbation_for(adapter, inputs)
    if isinstance(perturbation, TextPerturbation):
        keep = torch.rand(batch_size, perturbation.n_tokens, generator=generator) < 0.5
        return perturbation(keep.float())
    masks = ShiftedGridMasks(batch_size, 7, 0.5, perturbation.size, generator, adapter.device)
    return perturbation(masks.batch(0, batch_size))


def method(
    adapter: Adapter, inputs: Inputs, name: str, params: dict[str, Any]
) -> tuple[int, float]:
    """Run one method end to end; (forward passes, seconds)."""
    start = time.perf_counter()
    explanation = attribution.explain(adapter, name, inputs, params=params)
    return explanation.timings.forward_passes, time.perf_counter() - start


def throughput_rows(
    label: str, adapter: Adapter, inputs: Inputs, passes: int, batch: int
) -> list[tuple]:
    if inputs.modality == "image":  # 4×4 grid: 18 forwards per design
        designs = max(2, 2 ** int(np.log2(passes / 18)))
        sobol = {"grid": 4, "n_designs": designs, "batch_size": batch}
    else:
        sobol = {"n_designs": 32, "batch_size": batch}
    copies, masked = unperturbed(inputs, batch), perturbed(adapter, inputs, batch)
    plain(adapter, copies, batch, batch)  # warm-up
    first = plain(adapter, copies, passes, batch)
    first_masked = plain(adapter, masked, passes, batch)
    rise = method(adapter, inputs, "rise", {"n_masks": passes, "batch_size": batch})
    sob = method(adapter, inputs, "sobol", sobol)
    second_masked = plain(adapter, masked, passes, batch)
    second = plain(adapter, copies, passes, batch)
    timed = {
        "plain inference": (first[0] + second[0], first[1] + second[1]),
        "plain inference, perturbed inputs": (
            first_masked[0] + second_masked[0],
            first_masked[1] + second_masked[1],
        ),
        "rise": rise,
        "sobol": sob,
    }
    base_rate = timed["plain inference"][0] / timed["plain inference"][1]
    masked_rate = (
        timed["plain inference, perturbed inputs"][0]
        / (timed["plain inference, perturbed inputs"][1])
    )
    rows = []
    for name, (count, seconds) in timed.items():
        rate = count / seconds
        rows.append((label, name, count, seconds, rate, rate / base_rate, rate / masked_rate))
    return rows


def _peak_rss(n_masks: int, threads: int, queue: Any) -> None:
    torch.set_num_threads(threads)
    adapter = attribution.load("efficientnet-lite0", device="cpu")
    inputs = adapter.preprocess(data.chelsea())
    plain(adapter, unperturbed(inputs, IMAGE_BATCH), 2 * IMAGE_BATCH, IMAGE_BATCH)  # warm-up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    attribution.explain(
        adapter, "rise", inputs, params={"n_masks": n_masks, "batch_size": IMAGE_BATCH}
    )
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put((before / 1024, after / 1024))


def memory_rows(sizes: list[int], threads: int) -> list[tuple]:
    context = multiprocessing.get_context("spawn")
    rows = []
    for n in sizes:
        queue = context.Queue()
        process = context.Process(target=_peak_rss, args=(n, threads, queue))
        process.start()
        before, after = queue.get()
        process.join()
        bank = n * 224 * 224 * 4 / 2**20
        rows.append((n, before, after, after - before, bank))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--passes", type=int, default=256, help="forwards per image row")
    parser.add_argument("--text-passes", type=int, default=2048, help="forwards per text row")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-masks", type=int, nargs="*", default=[64, 256, 1024])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    effnet = attribution.load("efficientnet-lite0", device="cpu")
    minilm = attribution.load("minilm-zeroshot", device="cpu")
    rows = throughput_rows(
        f"efficientnet-lite0 (batch {IMAGE_BATCH})",
        effnet,
        effnet.preprocess(data.chelsea()),
        args.passes,
        IMAGE_BATCH,
    )
    rows += throughput_rows(
        f"minilm-zeroshot (batch {TEXT_BATCH})",
        minilm,
        minilm.preprocess(SENTENCE),
        args.text_passes,
        TEXT_BATCH,
    )
    print(f"torch {torch.__version__}, {args.threads} CPU threads")
    print()
    print_table(
        (
            "model",
            "method",
            "forward passes",
            "seconds",
            "passes/s",
            "ratio to plain",
            "ratio to plain on perturbed inputs",
        ),
        [
            (model, name, count, f"{seconds:.1f}", f"{rate:.1f}", f"{ratio:.2f}", f"{masked:.2f}")
            for model, name, count, seconds, rate, ratio, masked in rows
        ],
    )
    print()
    print_table(
        (
            "n_masks",
            "peak RSS before (MB)",
            "peak RSS after (MB)",
            "growth (MB)",
            "N×H×W bank (MB)",
        ),
        [
            (n, *(f"{value:.0f}" for value in values))
            for n, *values in memory_rows(args.memory_masks, args.threads)
        ],
    )


if __name__ == "__main__":
    main()
