"""
Visual tokens (issue 40): what one curve point costs beside one forward, on a tiny VLM.

Run: ``nice .venv/bin/python -u benchmarks/vlm_tokens.py [--image 64] [--repeats 5]``.

On the tiny random LLaVA of the tests (a CLIP tower of 8-px patches: ``(image / 8)²`` visual
tokens, a 2-block LLaMA-like language model), an image and prompt followed by a 3-token answer:
one plain forward beside one curve point (half the visual tokens dropped at the input, through
the routed eager attention), each alone and as one row of a batch of 32; and ShortV's forward
(every block's row and the full model's in one batch) beside that many plain rows. The target:
a curve point costs no more than a forward (ratio ≤ 1 within timing noise).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np
import torch
from _tables import print_table
from _timing import best_seconds
from _tiny_vlm import tiny_llava

from attrlab.attribution.layers.hooks import skip_blocks_at
from attrlab.attribution.models.vlm import ImagePrompt, with_answer
from attrlab.attribution.request.answers import given_answer
from attrlab.attribution.visual_tokens.answer import batched_kwargs
from attrlab.attribution.visual_tokens.removal import dropped_rows, visual_attention

BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", type=int, default=64, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    adapter = tiny_llava(image_size=args.image)
    image = (np.random.default_rng(0).random((args.image, args.image, 3)) * 255).astype(np.uint8)
    inputs = adapter.preprocess(ImagePrompt(image, "what is on the table"))
    item = with_answer(adapter, inputs, given_answer(adapter, " a red cup"))
    count = int(item.visual_tokens.sum())
    half = list(range(0, count, 2))
    model = adapter.model

    def plain(rows: int) -> None:
        with torch.no_grad():
            model(**batched_kwargs(item, rows))

    def point(rows: int) -> None:
        with torch.no_grad(), visual_attention(adapter, dropped_rows(item, [half] * rows)):
            model(**batched_kwargs(item, rows))

    blocks = adapter.blocks()
    shortv_rows = len(blocks) + 1

    def shortv() -> None:
        frozen = skip_blocks_at(blocks, list(range(1, shortv_rows)), item.visual_tokens)
        with torch.no_grad(), frozen:
            model(**batched_kwargs(item, shortv_rows))

    timed = {
        "plain, 1 row": best_seconds(lambda: plain(1), args.repeats),
        "point, 1 row": best_seconds(lambda: point(1), args.repeats),
        f"plain, {BATCH} rows": best_seconds(lambda: plain(BATCH), args.repeats) / BATCH,
        f"point, {BATCH} rows": best_seconds(lambda: point(BATCH), args.repeats) / BATCH,
        f"plain, {shortv_rows} rows": best_seconds(lambda: plain(shortv_rows), args.repeats),
        f"ShortV, {shortv_rows} rows": best_seconds(shortv, args.repeats),
    }
    print(f"tiny LLaVA, {count} visual tokens, {item.input_ids.shape[1]} tokens in all\n")
    print_table(
        ["what", "plain (ms per row)", "dropped (ms per row)", "ratio"],
        [
            _row("one curve point alone", timed["plain, 1 row"], timed["point, 1 row"]),
            _row(
                f"one curve point in a batch of {BATCH}",
                timed[f"plain, {BATCH} rows"],
                timed[f"point, {BATCH} rows"],
            ),
            _row(
                f"ShortV, every block in one batch ({shortv_rows} rows)",
                timed[f"plain, {shortv_rows} rows"] / shortv_rows,
                timed[f"ShortV, {shortv_rows} rows"] / shortv_rows,
            ),
        ],
    )


def _row(what: str, plain: float, changed: float) -> list[str]:
    return [what, f"{plain * 1e3:.2f}", f"{changed * 1e3:.2f}", f"{changed / plain:.2f}"]


if __name__ == "__main__":
    main()
