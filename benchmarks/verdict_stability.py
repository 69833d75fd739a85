"""
Do the evaluation's verdicts survive a change of seed (issue 41 report)?

Run: ``.venv/bin/python benchmarks/verdict_stability.py [--seeds 5] [--before 3] [--most 100]
[--modality text|image] [--methods a,b] [--rules before,after]``

``attrlab evaluate`` on the bundled set (MiniLM zero-shot on the sentences, EfficientNet-Lite0
on the images), every method that applies, once per seed, twice: as before issue 41 (each map
scored alone against ``--before`` random orders, their mean the reference; a win any margin of
at least 0.01 over it), and as now (``attrlab evaluate --random-orders MOST``: a short text's
exact expected score, else random orders drawn until every method's margin is settled, at most
``--most``; a win only a settled margin).
Printed: each method's sign-test verdict per seed under both rules and whether it stayed the
same, then the cost per item under both (random orders drawn, the scoring's forward rows
counted by a hook on the model less the methods' own passes, wall seconds of the whole
evaluation divided by the items).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pandas as pd
import torch
from _tables import print_table

from attrlab.attribution.inputs.runs import explain_rows
from attrlab.attribution.methods import available_methods
from attrlab.attribution.metrics import (
    SCORES,
    bundled_items,
    evaluate_methods,
    faithfulness,
    summarise,
)
from attrlab.attribution.models import Adapter, load
from attrlab.attribution.request.defaults import EVALUATION_ORDERS
from attrlab.attribution.request.run import RunContext, RunSettings

MODELS = {"text": "minilm-zeroshot", "image": "efficientnet-lite0"}


def before(adapter: Adapter, methods: list[str], seed: int, orders: int) -> pd.DataFrame:
    """
    The per-item rows as ``attrlab evaluate`` made them before issue 41.

    Each map scored alone against ``orders`` random orders of the item's seed (seed + item
    number, the same for every method), their mean the reference, with no standard error.
    """
    items = bundled_items(adapter.modality)
    rows = []
    explained = explain_rows(
        adapter,
        items,
        methods,
        lambda item: adapter.preprocess(item.raw),
        settings=RunSettings(seed=seed),
    )
    for done, result in enumerate(explained, start=1):
        inputs, explanations = result.explained()
        for name, explanation in explanations.items():
            scored = faithfulness(
                adapter,
                inputs,
                explanation.scores,
                explanation.target_record,
                50,
                orders,
                run=RunContext(seed=seed + done),
            )
            metrics = {k: v for k, v in scored.metrics.items() if not k.endswith("_se")}
            # the cost columns the summary reads (the method's own passes, as evaluate's)
            rows.append(
                {
                    "item": result.row.name,
                    "method": name,
                    **metrics,
                    "forward_passes": explanation.timings.forward_passes,
                    "seconds": 0,
                }
            )
    return pd.DataFrame(rows)


def _rows_counted(model: torch.nn.Module) -> list[int]:
    """A running count of the rows ``model`` runs forward (a hook; one entry, updated)."""
    counted = [0]

    def count(_: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        first = next(v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor))
        counted[0] += int(first.shape[0])

    model.register_forward_pre_hook(count, with_kwargs=True)
    return counted


def run(
    modality: str, methods: list[str] | None, seed: int, orders: int, old_rule: bool
) -> tuple[pd.DataFrame, pd.DataFrame, float, int]:
    """
    The per-item rows and summary of one evaluation, its wall seconds and its scoring's rows.

    The scoring's rows: every row the model ran forward, less the methods' own passes.
    """
    adapter = load(MODELS[modality], device="cpu")
    counted = _rows_counted(adapter.model)
    chosen = methods or [
        m.name
        for m in available_methods()
        if m.category == "attribution" and m.unsupported_reason(adapter) is None
    ]
    start = time.perf_counter()
    if old_rule:
        per_item = before(adapter, chosen, seed, orders)
    else:
        per_item = evaluate_methods(
            adapter, bundled_items(modality), chosen, None, 50, orders, RunSettings(seed=seed)
        )
    seconds = time.perf_counter() - start
    scoring = counted[0] - int(per_item["forward_passes"].sum())
    return per_item, summarise(per_item, modality, seed), seconds, scoring


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modality", choices=tuple(MODELS), default="text")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--before", type=int, default=3)
    parser.add_argument("--most", type=int, default=EVALUATION_ORDERS)
    parser.add_argument("--methods", default=None)
    parser.add_argument("--rules", default="before,after", help="before, after or both")
    args = parser.parse_args()
    torch.manual_seed(0)
    methods = args.methods.split(",") if args.methods else None
    verdicts: dict[tuple[str, str, str], list[str]] = {}
    costs = []
    rules = (("before", args.before, True), ("after", args.most, False))
    for rule, orders, old in [r for r in rules if r[0] in args.rules.split(",")]:
        drawn, seconds, items, scoring = [], 0.0, 0, 0
        for seed in range(args.seeds):
            per_item, summary, took, rows = run(args.modality, methods, seed, orders, old)
            seconds, scoring = seconds + took, scoring + rows
            items += per_item["item"].nunique()
            drawn += list(per_item.groupby("item")["random_orders"].first().fillna(orders))
            for row in summary.itertuples(index=False):
                for score, _, _ in SCORES[args.modality]:
                    key = (row.method, score, rule)
                    verdicts.setdefault(key, []).append(str(getattr(row, f"{score}_verdict")))
        mean_orders = sum(drawn) / len(drawn)
        costs.append(
            [
                rule,
                f"{mean_orders:.1f} (max {max(drawn):.0f})",
                f"{scoring / items:,.0f}",
                f"{seconds / items:.2f}",
            ]
        )
    rows = []
    names = sorted({(m, s) for m, s, _ in verdicts})
    ran = [rule for rule in ("before", "after") if rule in args.rules.split(",")]

    def stable(seen: list[str]) -> str:
        return "-" if not seen else "yes" if len(set(seen)) == 1 else "**no**"

    for method, score in names:
        before, after = (verdicts.get((method, score, rule), []) for rule in ("before", "after"))
        seen = [" ".join(before) or "-", stable(before), " ".join(after) or "-", stable(after)]
        rows.append([method, score, *seen])
    print(f"{MODELS[args.modality]}, bundled {args.modality} items, seeds 0–{args.seeds - 1}")
    print_table(["method", "score", "before: verdict per seed", "stable", "after", "stable"], rows)
    counts = {rule: sum(r[i] == "yes" for r in rows) for rule, i in (("before", 3), ("after", 5))}
    print("\nstable verdicts: " + ", ".join(f"{r} {counts[r]}/{len(rows)}" for r in ran) + "\n")
    print_table(
        [
            "rule",
            "random orders per item",
            "scoring's forward rows per item",
            "seconds per item (explain + score)",
        ],
        costs,
    )


if __name__ == "__main__":
    main()
