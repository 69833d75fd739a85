"""
Per-step maps of a whole answer: the steps in one batch against one run per step (issue 26).

Run: ``.venv/bin/python benchmarks/per_step.py [--repeats 2] [--threads 2]``

On the embedded SmolLM2-135M, a 64-token prompt and a 16-token answer (teacher-forced), the
per-step matrix of AttnLRP and of gradient × input batched
(:meth:`~attribution.methods.base.AttributionMethod.attribute_steps`: one forward of the input
repeated once per step, one backward), AttnLRP's one run per step (what ``attribution.explain``
does for methods without a batch), and, as the unit, 16 separate plain forward+backward passes
of prompt + answer (the gradient of one logit at the token embeddings). The fastest of
``--repeats`` interleaved runs after a warm-up. Target (issue 26): AttnLRP's batched matrix
≤ 0.5 × the 16 passes.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from _timing import forward_backward, interleaved_seconds, text_of
from stand_ins import load_for_benchmark

from attrlab.attribution import get_method
from attrlab.attribution.request.answers import Answer, answer_inputs, answer_target, given_answer
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import StepTarget

PROMPT_TOKENS, ANSWER_TOKENS = 64, 16
ANSWER = " and the ending left the whole audience quiet for a long time after the lights came up"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    adapter, model = load_for_benchmark("smollm2-135m", device)
    ids = given_answer(adapter, ANSWER).ids[:ANSWER_TOKENS]
    answer = Answer(ids, adapter.tokenizer.decode(ids))
    inputs = answer_inputs(adapter, text_of(adapter, PROMPT_TOKENS), answer)
    target = answer_target(adapter, inputs, answer)
    steps = range(target.steps)
    plain = forward_backward(adapter, inputs, target.tokens[0])
    methods = {name: get_method(name) for name in ("attnlrp", "gradient_x_input")}
    params = {name: cls.resolve(adapter, {}) for name, cls in methods.items()}
    calls = {"16 × forward+backward": lambda: [plain() for _ in steps]}
    for name, cls in methods.items():
        calls[f"{name}: batched"] = lambda name=name, cls=cls: cls.attribute_steps(
            adapter, inputs, target, steps, params[name], RunContext()
        )
    calls["attnlrp: one run per step"] = lambda: [
        methods["attnlrp"].compute(
            adapter, inputs, StepTarget(target, k), params["attnlrp"], RunContext()
        )
        for k in steps
    ]
    seconds = interleaved_seconds(calls, args.repeats)
    unit = seconds["16 × forward+backward"]
    where = torch.cuda.get_device_name() if device == "cuda" else f"{args.threads} threads, CPU"
    print(f"\n{model}, {len(inputs.tokens)} tokens ({target.steps} answered)  ({where})\n")
    rows = [(call, f"{s:.2f}", f"{s / unit:.2f}") for call, s in seconds.items()]
    print_table(("per-step matrix", "seconds", "× 16 forward+backward"), rows)


if __name__ == "__main__":
    main()
