"""
Key/value eviction (issue 39): what the study costs, and each scorer's curves on SmolLM2.

Run: ``nice .venv/bin/python -u benchmarks/eviction.py [costs] [curves] [--items N]``.

``costs``: on SmolLM2-135M, a prompt of about 1,000 tokens (the bundled LM paragraphs, then a
question) and its greedy 4-token answer: the prefill with the scorers' readings beside the
model's own prefill; one point of a curve (an answer forward against a kept cache, in a batch
of 32) beside one answer forward against transformers' own cache; a curves-only study of six
policy scorers × ten keep ratios beside one prefill and 60 answer forwards; what the prefill
keeps per layer beside the ``prompt × prompt`` attention it reads.

``curves``: the study on the shipped long-context tasks SmolLM2 solves at full cache
(:mod:`attribution.inputs.long_context`): every scorer's curves against random evictions and
its agreement with the exact effect of evicting each token. ``--splits uniform,pyramid``
adds PyramidKV's per-layer budgets for ``kv_entry``: the policies' curves only (no exact
effects: the agreement is the split's own no more than the uniform table's, and the oracles'
orders are not policies).
"""

from __future__ import annotations

import argparse
import copy
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from _timing import best_seconds
from transformers import DynamicCache

from attrlab.attribution.bits.sensitivity import bundled_lm_texts
from attrlab.attribution.eviction.cache import evicted_logits, keep_all, prefill
from attrlab.attribution.eviction.request import EvictionRequest, run_eviction
from attrlab.attribution.eviction.scorers import SCORERS
from attrlab.attribution.eviction.study import EvictionItem, eviction_study
from attrlab.attribution.models import load
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.run import RunSettings

PLAIN = "prefill (the model's own, with its cache)"
READ = "prefill with the scorers' readings"
ANSWER = "answer forward against its own cache (copied)"
COPY = "copying that cache"
BATCH = "32 evicted answer forwards, one batch"
STUDY = "curves-only study, 6 scorers × 10 ratios"
#: The six policies of the speed target.
SIX = ("streaming_llm", "h2o", "snapkv", "tova", "knorm", "vatp")


def _long_prompt(adapter: Adapter, tokens: int = 1000) -> EvictionItem:
    """The bundled paragraphs up to about ``tokens`` tokens, a question, its greedy answer."""
    context = ""
    for paragraph in bundled_lm_texts():
        if len(adapter.preprocess(context + paragraph).input_ids[0]) > tokens - 20:
            break
        context += paragraph + "\n\n"
    prompt = context + "Question: What is the first paragraph about?\nAnswer:"
    inputs, target = answer_request(adapter, prompt, generate=4)
    question = len(adapter.preprocess(context).input_ids[0])
    return EvictionItem(inputs, target, question)


def costs() -> None:
    adapter = load("smollm2-135m")
    item = _long_prompt(adapter)
    model = adapter.model
    prompt = item.inputs.input_ids[:, : item.inputs.input_ids.shape[1] - item.inputs.answer_length]
    cached = prompt[:, :-1]
    cache = prefill(adapter, item.inputs, item.context)
    steps = len(cache.queries)

    def plain_prefill() -> DynamicCache:
        own = DynamicCache()
        with torch.no_grad():
            model(input_ids=cached, cache=own, use_cache=True)
        return own

    full = plain_prefill()

    def plain_answer() -> None:
        with torch.no_grad():
            model(input_ids=cache.queries[None], cache=copy.deepcopy(full), use_cache=True)

    def copy_only() -> None:
        copy.deepcopy(full)

    batch = keep_all(cache, 32)
    seconds = {
        PLAIN: best_seconds(plain_prefill),
        READ: best_seconds(lambda: prefill(adapter, item.inputs, item.context)),
        ANSWER: best_seconds(plain_answer),
        COPY: best_seconds(copy_only),
        BATCH: best_seconds(lambda: evicted_logits(adapter, cache, batch)),
    }
    started = time.perf_counter()
    study = eviction_study(adapter, [item], SIX, draws=5, span=0)
    seconds[STUDY] = time.perf_counter() - started
    answer = seconds[ANSWER] - seconds[COPY]
    per_point = seconds[BATCH] / 32
    bound = 2 * (seconds[PLAIN] + 60 * answer)
    print(
        f"\n### SmolLM2-135M: a {cache.positions + 1}-token prompt ({cache.context} context "
        f"tokens), a {steps}-token answer, {torch.get_num_threads()} threads\n"
    )
    print_table(
        ["run", "seconds (best of 3; the study once)"],
        [(k, f"{v:.3f}") for k, v in seconds.items()],
    )
    print()
    print_table(
        ["target", "measured", "bound"],
        [
            (
                "prefill with readings / plain prefill",
                f"{seconds[READ] / seconds[PLAIN]:.2f}",
                "≤ 1.1",
            ),
            ("one point of a curve / one answer forward", f"{per_point / answer:.2f}", "≤ 1"),
            (
                "curves-only study / 2 × (prefill + 60 answer forwards)",
                f"{seconds[STUDY] / bound:.2f}",
                "≤ 1",
            ),
        ],
    )
    print(f"\nthe study ran {study.forward_passes} forwards: one prefill, the full cache's answer,")
    print("then one row per scorer and random eviction at each ratio below 1.0 (with the full row)")
    readings = sum(
        r.accumulated.numel() + r.window.numel() + r.outputs.numel() for r in cache.readings
    )
    square = cache.layers * cache.heads * cache.positions**2
    print(
        f"\nkept from the prefill's attention: {readings:,} numbers over {cache.layers} layers, "
        f"beside {square:,} in the layers' prompt × prompt attention "
        f"({readings / square:.3f}); each layer's attention is freed when the layer ends"
    )


def _number(value: object) -> str:
    return "" if value is None or value != value else f"{value:.3g}"


def _runs(units: list[str], splits: list[str]) -> list[tuple[str, str]]:
    """``(unit, split)`` pairs: a split divides ``kv_entry``'s budget only."""
    return [(u, s) for u in units for s in (splits if u == "kv_entry" else ["uniform"])]


def curves(tasks: list[str], count: int, tokens: int, units: list[str], splits: list[str]) -> None:
    adapter = load("smollm2-135m")
    policies = tuple(n for n, s in SCORERS.items() if s.score is not None)
    for task in tasks:
        for unit, split in _runs(units, splits):
            plain = split == "uniform"
            request = EvictionRequest(
                task=task,
                count=count,
                max_tokens=tokens,
                unit=unit,
                split=split,
                draws=10,
                seed=1,
                scorers=None if plain else policies,
                span=None if plain else 0,
            )
            started = time.perf_counter()
            study = run_eviction(adapter, request, RunSettings(max_forward_passes=None))
            seconds = time.perf_counter() - started
            solved = sum(v["full"]["exact_match"] for v in study.views)
            print(
                f"\n### {task}, {unit} ({study.split}): {solved} of {len(study.views)} tasks "
                f"solved at full cache and judged; contexts {study.context} tokens; "
                f"{study.forward_passes} forwards, {seconds:.0f} s\n"
            )
            scores = study.curves.scores
            rows = []
            for scorer in study.scorers:
                name = scorer["name"]
                row = [name, scorer["awareness"]]
                for metric in ("log_prob", "exact_match", "kl"):
                    found = scores[(scores.order == name) & (scores.metric == metric)].iloc[0]
                    row += [_number(found.auc), found.status]
                agreed = study.agreement[study.agreement.scorer == name]
                row += [
                    _number(agreed.spearman.iloc[0]) if len(agreed) else "",
                    _number(agreed.top_k_overlap.iloc[0]) if len(agreed) else "",
                ]
                rows.append(row)
            drawn = scores[scores.order == "random"].set_index("metric")
            rows.append(
                [
                    "random",
                    "",
                    *(
                        x
                        for m in ("log_prob", "exact_match", "kl")
                        for x in (
                            f"{_number(drawn.auc[m])} ± {_number(drawn['std'][m])}",
                            "",
                        )
                    ),
                    "",
                    "",
                ]
            )
            print_table(
                [
                    "scorer",
                    "knows",
                    "log-prob area",
                    "verdict",
                    "exact-match area",
                    "verdict",
                    "KL area",
                    "verdict",
                    "ρ with exact",
                    "top-10 % overlap",
                ],
                rows,
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("parts", nargs="*", default=["costs", "curves"])
    parser.add_argument("--tasks", default="needle,kv_retrieval")
    parser.add_argument("--units", default="kv_entry,kv_position")
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--splits", default="uniform")
    args = parser.parse_args()
    if "costs" in args.parts:
        costs()
    if "curves" in args.parts:
        curves(
            args.tasks.split(","),
            args.items,
            args.tokens,
            args.units.split(","),
            args.splits.split(","),
        )


if __name__ == "__main__":
    main()
