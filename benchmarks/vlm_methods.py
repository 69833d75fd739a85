"""
The attribution methods on an image and a prompt (issue 40): their cost beside plain passes.

Run: ``nice .venv/bin/python -u benchmarks/vlm_methods.py [--image 64] [--repeats 3]
[--language-model tiny|smollm2] [--gradients-only]``.

On the tiny random LLaVA of the tests (a CLIP tower of 8-px patches: ``(image / 8)²`` visual
tokens, a 2-block LLaMA-like language model of width 32), or with ``--language-model smollm2``
the same tower before a random LLaMA of SmolLM2-135M's sizes (30 blocks of width 576, 9 heads
over 3 key/value heads; the tests' small vocabulary), an image and prompt followed by a 3-token
answer, explained for that answer. Two tables, each measured side by side in one run:

* the gradient methods and AttnLRP against one forward + backward of the answer's
  log-probability to the first language-model block's input (where the methods attribute):
  seconds of the whole ``explain`` call (its prediction and gate included), and of the
  method's own ``attribute`` alone, as ``benchmarks/transformer.py`` times the text methods;
  the target: AttnLRP ≤ 1.5 × forward + backward;
* the perturbation methods' forward passes per second against plain batched inference of the
  same number of rows (the image and prompt repeated, at the methods' default batch size), the
  target: ≥ 0.9 of plain inference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np
import torch
from _tables import print_table
from _timing import best_seconds
from _tiny_vlm import tiny_llava

from attrlab.attribution.explain import explain
from attrlab.attribution.inputs.perturb import auto_batch_size
from attrlab.attribution.methods.registry import get_method
from attrlab.attribution.models.vlm import ImagePrompt, with_answer
from attrlab.attribution.request.answers import answer_target, given_answer
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.visual_tokens.answer import answer_scores, batched_kwargs

#: The language model's sizes: the tests' own, or SmolLM2-135M's (its vocabulary aside).
LANGUAGE_MODELS: dict[str, dict[str, int] | None] = {
    "tiny": None,
    "smollm2": {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
    },
}
#: Gradient methods: (name, parameters), against one forward + backward.
GRADIENTS = [
    ("gradient", {}),
    ("gradient_x_input", {}),
    ("integrated_gradients", {"n_steps": 16}),
    ("attnlrp", {}),
]
#: Perturbation methods: (name, parameters), against plain batched inference.
PERTURBATIONS = [
    ("occlusion", {}),
    ("rise", {"n_masks": 512, "grid": 4}),
    ("sobol", {"grid": 4, "n_designs": 32}),
    ("shap", {"max_evals": 256}),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", type=int, default=64, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--language-model", choices=list(LANGUAGE_MODELS), default="tiny")
    parser.add_argument(
        "--gradients-only", action="store_true", help="the first table alone (the larger model's)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    adapter = tiny_llava(image_size=args.image, language_model=LANGUAGE_MODELS[args.language_model])
    image = (np.random.default_rng(0).random((args.image, args.image, 3)) * 255).astype(np.uint8)
    answer = given_answer(adapter, " a red cup")
    item = with_answer(
        adapter, adapter.preprocess(ImagePrompt(image, "what is on the table")), answer
    )
    target = answer_target(adapter, item, answer)
    model = adapter.model
    first = adapter.blocks()[0]
    batch = auto_batch_size(adapter, item)  # the perturbation methods' rows per forward

    def forward_backward() -> None:
        def leaf(_m: torch.nn.Module, args_: tuple, kwargs: dict) -> tuple:
            hidden = (args_[0] if args_ else kwargs["hidden_states"]).detach().requires_grad_()
            held.append(hidden)
            if args_:
                return (hidden, *args_[1:]), kwargs
            return args_, {**kwargs, "hidden_states": hidden}

        held: list[torch.Tensor] = []
        handle = first.register_forward_pre_hook(leaf, with_kwargs=True)
        try:
            log_prob = answer_scores(model(**item.model_kwargs()).logits, item)[0][0]
            torch.autograd.grad(log_prob, held[0])
        finally:
            handle.remove()

    def run(name: str, params: dict) -> int:
        return explain(adapter, name, item, target, params).timings.forward_passes

    def alone(name: str, params: dict) -> None:
        """The method's own ``attribute`` (no prediction, gate or Explanation around it)."""
        method = get_method(name)
        method.attribute(adapter, item, target, method.resolve(adapter, params), RunContext())

    base = best_seconds(forward_backward, args.repeats)
    gradient_rows = []
    for name, params in GRADIENTS:
        seconds = best_seconds(lambda n=name, p=params: run(n, p), args.repeats)
        own = best_seconds(lambda n=name, p=params: alone(n, p), args.repeats)
        gradient_rows.append(
            [name, f"{seconds * 1e3:.1f}", f"{seconds / base:.2f}", f"{own / base:.2f}"]
        )

    perturbation_rows = []
    for name, params in [] if args.gradients_only else PERTURBATIONS:
        started = time.perf_counter()
        passes = run(name, params)
        seconds = time.perf_counter() - started

        def plain(rows: int = passes) -> None:
            with torch.no_grad():
                for start in range(0, rows, batch):
                    model(**batched_kwargs(item, min(batch, rows - start)))

        plain_seconds = best_seconds(plain, args.repeats)
        seconds = min(seconds, best_seconds(lambda n=name, p=params: run(n, p), args.repeats))
        perturbation_rows.append(
            [
                name,
                str(passes),
                f"{passes / seconds:,.0f}",
                f"{passes / plain_seconds:,.0f}",
                f"{plain_seconds / seconds:.2f}",
            ]
        )
    count = int(item.visual_tokens.sum())
    print(
        f"LLaVA ({args.language_model} language model), {count} visual tokens, "
        f"{item.input_ids.shape[1]} tokens in all\n"
    )
    print(f"one forward + backward to the first block's input: {base * 1e3:.1f} ms\n")
    print_table(
        ["method", "explain (ms)", "× forward + backward", "its attribute alone ×"],
        gradient_rows,
    )
    if args.gradients_only:
        return
    print()
    print_table(
        ["method", "forward passes", "passes/s", "plain inference passes/s", "ratio"],
        perturbation_rows,
    )


if __name__ == "__main__":
    main()
