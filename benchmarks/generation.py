"""
Maps of a decoder LM's whole answer (issue 26): their cost, and Captum's LLMAttribution beside.

Run: ``.venv/bin/python -u benchmarks/generation.py [--threads 2] [--quick]``

On the embedded SmolLM2-135M (a stand-in under ``ATTRLAB_STAND_INS``, see ``stand_ins.py``): a
64-token prompt of 8 sentences and the model's own 16-token greedy answer. For each method, the
whole-answer map and the per-step matrix (16 rows): seconds, the sequences the model ran forward
and backward (counted by hooks on the model itself, so attrlab and Captum are counted alike),
and the seconds as a multiple of one forward + backward of prompt + answer (the gradient of
the answer's log-probability at the token embeddings). Each call runs once, after a warm-up.

Captum 0.9's ``LLMAttribution`` and ``LLMGradientAttribution`` run on the same model, prompt and
answer where the definitions match (read from ``captum/attr/_core/llm_attr.py``): both explain
the sum of the answer tokens' log-probabilities, each step's row its token's; the same baseline
token (the pad token, which ``TextTokenInput(baselines=...)`` sets). ``FeatureAblation`` replaces
one prompt token at a time, as occlusion's default window does; Captum decodes the answer token
by token by default (``forward_in_tokens=True``, with its key/value cache) and teacher-forces it
with ``forward_in_tokens=False``: both are timed. ``LayerIntegratedGradients`` on the token
embeddings with the same ``n_steps`` (Gauss-Legendre in both) runs once per answer token, its
whole map their sum; attrlab's whole map is one integral of the summed log-probabilities (the
same by linearity). Agreement over the 64 prompt tokens: Pearson and Spearman correlation and
the largest absolute difference, of the whole maps and of the per-step matrices (flattened).

Context attribution (leave one sentence out, with the prompt's key/value cache and without)
runs when :mod:`attribution.context` is there. The last table: each method's map of " Paris"
rather than " Lyon" after "The capital of France is".
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from _tables import print_table
from captum.attr import (
    FeatureAblation,
    LayerIntegratedGradients,
    LLMAttribution,
    LLMGradientAttribution,
    TextTokenInput,
)
from scipy.stats import pearsonr, spearmanr
from stand_ins import load_for_benchmark

from attrlab.attribution import explain
from attrlab.attribution.context import context_attribution
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.methods import capabilities
from attrlab.attribution.request.answers import answer_request

SENTENCES = (
    "Ada Lovelace was born in London.",
    "Her mother had her taught mathematics.",
    "At seventeen she met Charles Babbage.",
    "He was designing the Analytical Engine.",
    "She translated an article about the engine.",
    "Her notes were longer than the article.",
    "They showed how the engine could compute.",
    "Today Ada Lovelace is remembered as",
)
PROMPT = " ".join(SENTENCES)
PROMPT_TOKENS, ANSWER_TOKENS = 64, 16
IG_STEPS = 16
#: Methods and their parameters (sampling methods with modest budgets).
METHODS: dict[str, dict[str, Any]] = {
    "gradient_x_input": {},
    "integrated_gradients": {"n_steps": IG_STEPS},
    "attnlrp": {},
    "occlusion": {},
    "rise": {"n_masks": 128},
    "sobol": {"n_designs": 4},
    "shap": {"max_evals": 128},
}
QUICK: dict[str, dict[str, Any]] = {
    "integrated_gradients": {"n_steps": 4},
    "rise": {"n_masks": 16},
    "sobol": {"n_designs": 2},
    "shap": {"max_evals": 16},
}
FRANCE, PARIS, LYON = "The capital of France is", " Paris", " Lyon"


@dataclass
class Passes:
    """Sequences the model ran: calls of its body, rows forward, rows a gradient went through."""

    calls: int = 0
    forward: int = 0
    backward: int = 0

    def __str__(self) -> str:
        return f"{self.forward} / {self.backward}"


@contextmanager
def counted(model: torch.nn.Module) -> Iterator[Passes]:
    """
    Count what ``model`` runs while the block runs (its hook removed after).

    The hook sits on the model's body (``base_model``, the transformer without its head):
    Captum calls the model's ``forward`` method itself, which the model's own hooks miss.
    """
    passes = Passes()

    def backward(grad: torch.Tensor) -> None:
        passes.backward += grad.shape[0]

    def forward(_module: Any, _args: Any, output: Any) -> None:
        hidden = output.last_hidden_state
        passes.calls += 1
        passes.forward += hidden.shape[0]
        if hidden.requires_grad:
            hidden.register_hook(backward)

    handle = model.base_model.register_forward_hook(forward)
    try:
        yield passes
    finally:
        handle.remove()


def timed(model: torch.nn.Module, call: Callable[[], Any]) -> tuple[Any, float, Passes]:
    """``call()``'s result, its seconds and what the model ran for it."""
    with counted(model) as passes:
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start
    return result, seconds, passes


def agreement(ours: np.ndarray, theirs: np.ndarray) -> str:
    """Pearson, Spearman and the largest absolute difference of two maps (flattened)."""
    a, b = np.ravel(ours), np.ravel(theirs)
    return (
        f"{pearsonr(a, b)[0]:.6f} / {spearmanr(a, b)[0]:.6f} / "
        f"{np.abs(a - b).max():.1e} (of {np.abs(a).max():.2g})"
    )


def answer_forward_backward(adapter: Any, inputs: Any, target: Any) -> Callable[[], Any]:
    """One forward + backward: the answer's log-probability, its gradient at the embeddings."""

    def run() -> Any:
        with torch.no_grad():
            embeddings = adapter.token_embedding_module()(inputs.input_ids)
        embeddings.requires_grad_(True)
        outputs = target.outputs(
            adapter, inputs_embeds=embeddings, attention_mask=inputs.attention_mask
        )
        return torch.autograd.grad(target.score(outputs).sum(), embeddings)

    return run


def method_rows(
    adapter: Any, inputs: Any, target: Any, methods: dict[str, dict[str, Any]], unit: float
) -> tuple[list[list[object]], dict[str, tuple[Explanation, Explanation]]]:
    """Each method's whole map and per-step matrix: seconds, passes, multiple of ``unit``."""
    rows: list[list[object]] = []
    maps = {}
    for method, params in methods.items():
        runs = []
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        label = f"{method} ({shown})" if shown else method
        for per_step in (False, True):
            e, seconds, passes = timed(
                adapter.model,
                lambda m=method, p=params, s=per_step: explain(
                    adapter, m, inputs, target, p, per_step=s
                ),
            )
            runs.append(e)
            what = f"per-step matrix ({ANSWER_TOKENS} rows)" if per_step else "whole answer"
            rows.append([label, what, f"{seconds:.2f}", passes, f"{seconds / unit:.1f}"])
        maps[method] = (runs[0], runs[1])
    return rows, maps


def captum_rows(
    adapter: Any,
    inputs: Any,
    target: Any,
    maps: dict[str, tuple[Explanation, Explanation]],
    n_steps: int,
    unit: float,
) -> list[list[object]]:
    """Captum's LLMAttribution on the same prompt and answer, and its agreement with ours."""
    model, tokenizer = adapter.model, adapter.tokenizer
    pad = adapter.pad_token_id
    prompt = TextTokenInput(PROMPT, tokenizer, baselines=pad)
    width = int(inputs.input_ids.shape[1]) - inputs.answer_length
    if not torch.equal(prompt.inp_tensor[0], inputs.input_ids[0, :width].cpu()):
        raise SystemExit("Captum's TextTokenInput tokenises the prompt differently")
    answer = torch.tensor(target.tokens)
    rows: list[list[object]] = []

    def compare(name: str, theirs: Any, seconds: float, passes: Passes, ours: str) -> None:
        whole, steps = maps[ours]
        rows.append(
            [
                name,
                f"{seconds:.2f}",
                f"{passes.forward} / {passes.backward} ({passes.calls} calls)",
                f"{seconds / unit:.1f}",
                agreement(whole.scores[:width], theirs.seq_attr.double().numpy()),
                agreement(steps.maps["steps"][:, :width], theirs.token_attr.double().numpy()),
            ]
        )

    ablation = LLMAttribution(FeatureAblation(model), tokenizer)
    with torch.no_grad():  # the answer's log-probability as each of Captum's forwards reads it
        read = {
            in_tokens: float(
                ablation._forward_func(None, prompt, answer, True, None, in_tokens)[0, 0]
            )
            for in_tokens in (True, False)
        }
    print(
        f"log p(answer | prompt): attrlab {maps['occlusion'][0].target.score:.4f}; Captum "
        f"teacher-forced {read[False]:.4f}, token by token with its cache {read[True]:.4f}\n"
    )
    for in_tokens, how in ((True, "token by token (default)"), (False, "teacher-forced")):
        result, seconds, passes = timed(
            model,
            lambda in_tokens=in_tokens: ablation.attribute(
                prompt, target=answer, forward_in_tokens=in_tokens
            ),
        )
        compare(f"Captum FeatureAblation, {how}", result, seconds, passes, "occlusion")
    embeddings = adapter.token_embedding_module()
    gradients = LLMGradientAttribution(LayerIntegratedGradients(model, embeddings), tokenizer)
    result, seconds, passes = timed(
        model, lambda: gradients.attribute(prompt, target=answer, n_steps=n_steps)
    )
    compare(
        f"Captum LayerIntegratedGradients (n_steps={n_steps})",
        result,
        seconds,
        passes,
        "integrated_gradients",
    )
    return rows


def race(adapter: Any, inputs: Any, target: Any, rounds: int) -> list[list[object]]:
    """
    Occlusion's whole-answer map against Captum's teacher-forced FeatureAblation (the same map).

    Each round runs both in turn, after one warm-up of each; the fastest round of each counts.
    """
    prompt = TextTokenInput(PROMPT, adapter.tokenizer, baselines=adapter.pad_token_id)
    ablation = LLMAttribution(FeatureAblation(adapter.model), adapter.tokenizer)
    answer = torch.tensor(target.tokens)
    calls = {
        "attrlab occlusion": lambda: explain(adapter, "occlusion", inputs, target),
        "Captum FeatureAblation (teacher-forced)": lambda: ablation.attribute(
            prompt, target=answer, forward_in_tokens=False
        ),
    }
    best: dict[str, tuple[float, Passes]] = {}
    for round_ in range(rounds + 1):
        for name, call in calls.items():
            _, seconds, passes = timed(adapter.model, call)
            if round_ and (name not in best or seconds < best[name][0]):
                best[name] = (seconds, passes)
    return [[name, f"{s:.2f}", str(p)] for name, (s, p) in best.items()]


def context_rows(adapter: Any, inputs: Any, target: Any) -> list[list[object]]:
    """Leave one sentence out, with and without the prompt's key/value cache."""
    ends = np.cumsum(
        [len(adapter.tokenizer.encode((" " if i else "") + s)) for i, s in enumerate(SENTENCES)]
    )
    features = list(zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True))
    results = {}
    rows: list[list[object]] = []
    for reuse in (True, False):
        result, seconds, passes = timed(
            adapter.model,
            lambda reuse=reuse: context_attribution(
                adapter, inputs, target, features, reuse_cache=reuse
            ),
        )
        results[reuse] = result
        rows.append(
            [
                "with the prompt's key/value cache" if reuse else "plain leave-one-out",
                f"{seconds:.2f}",
                passes.forward,
                result.token_positions,
            ]
        )
    difference = np.abs(results[True].scores - results[False].scores).max()
    rows.append(["largest difference of a sentence's score", f"{difference:.1e}", "", ""])
    return rows


def paris_rows(adapter: Any, methods: dict[str, dict[str, Any]]) -> tuple[list[str], list[list]]:
    """
    Each decoder method's map of " Paris" rather than " Lyon" over the prompt's tokens.

    Default parameters but for ``methods``' (``--quick``'s budgets); a check that did not pass
    is named beside the map.
    """
    inputs, target = answer_request(adapter, FRANCE, answer=PARIS, contrast=LYON)
    width = int(inputs.input_ids.shape[1]) - inputs.answer_length
    words = inputs.token_texts[:width]
    rows = []
    for method, why in capabilities(adapter).items():
        if why is not None or method == "layers":  # the layer analysis makes no token map
            continue
        e = explain(adapter, method, inputs, target, methods.get(method, {}))
        scores = e.scores[:width]
        order = np.argsort(-scores)
        rank = int(np.flatnonzero(order == words.index(" France"))[0]) + 1
        failed = ", ".join(f"{v.check}: {v.status}" for v in e.verdicts if v.status != "pass")
        shown = [f"{s:.3g}" for s in scores]
        rows.append([method, *shown, repr(words[order[0]]), f"{rank} of {width}", failed])
    return words, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny budgets: a smoke run")
    parser.add_argument(
        "--race",
        type=int,
        default=0,
        metavar="N",
        help="only the same work timed side by side: occlusion's whole-answer map and Captum's "
        "teacher-forced FeatureAblation, N interleaved rounds each",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        raise SystemExit("Captum's LLMAttribution here runs on the CPU: run this on a CPU")
    adapter, name = load_for_benchmark("smollm2-135m", device)
    methods = {m: {**p, **(QUICK.get(m, {}) if args.quick else {})} for m, p in METHODS.items()}
    n_steps = methods["integrated_gradients"]["n_steps"]
    inputs, target = answer_request(adapter, PROMPT, generate=ANSWER_TOKENS)
    if inputs.input_ids.shape[1] != PROMPT_TOKENS + ANSWER_TOKENS:
        raise SystemExit(f"expected {PROMPT_TOKENS} + {ANSWER_TOKENS} tokens")
    # warm-up, then the unit: one forward + backward of prompt + answer (fastest of 5)
    fwd_bwd = answer_forward_backward(adapter, inputs, target)
    times = []
    for _ in range(6):
        start = time.perf_counter()
        fwd_bwd()
        times.append(time.perf_counter() - start)
    unit = min(times[1:])
    with torch.no_grad():
        start = time.perf_counter()
        adapter.model(**inputs.model_kwargs())
        forward = time.perf_counter() - start
    print(
        f"\n{name}, {args.threads} threads, torch {torch.__version__}: {PROMPT_TOKENS}-token "
        f"prompt, answer {target.label!r} ({ANSWER_TOKENS} tokens); one forward "
        f"{forward * 1000:.0f} ms, one forward + backward {unit * 1000:.0f} ms; "
        f"{ANSWER_TOKENS} separate forward + backward passes {ANSWER_TOKENS * unit:.2f} s\n"
    )
    if args.race:
        print_table(
            ("same work", "seconds (fastest)", "sequences fwd / bwd"),
            race(adapter, inputs, target, args.race),
        )
        return
    # every decoder method on a short input first: also their warm-up (imports, first calls)
    words, paris = paris_rows(adapter, QUICK if args.quick else {})
    rows, maps = method_rows(adapter, inputs, target, methods, unit)
    print_table(("method", "map", "seconds", "sequences fwd / bwd", "× fwd+bwd"), rows)
    print()
    print_table(
        (
            "Captum 0.9 LLMAttribution",
            "seconds",
            "sequences fwd / bwd",
            "× fwd+bwd",
            "whole map vs attrlab: Pearson / Spearman / max |Δ|",
            "per-step matrix vs attrlab",
        ),
        captum_rows(adapter, inputs, target, maps, n_steps, unit),
    )
    context = context_rows(adapter, inputs, target)
    print()
    print_table(
        ("leave one of 8 sentences out", "seconds", "sequences", "token positions"), context
    )
    print(f"\n{PARIS!r} rather than {LYON!r} after {FRANCE!r}\n")
    header = ("method", *(repr(w) for w in words), "largest", "' France' ranks", "checks")
    print_table(header, paris)


if __name__ == "__main__":
    main()
