"""
Bits (issue 38 part 3): each layer's attention and MLP quantised alone, the proxies, allocations.

Run: ``nice .venv/bin/python benchmarks/bits.py [--models smollm2,minilm] [--texts N]
[--draws D]``.

Per model, one :func:`~attribution.bits.study.bits_study` over the first ``N`` texts of its
set (SmolLM2: the bundled LM paragraphs; MiniLM: the ten bundled sentences, sensitivity = KL):
the per-layer attention and MLP parts at 8, 4, 3 and 2 bits, group-wise (32 weights a group);
the sensitivity table (the mean over the parts per width, whether each part's loss rises as
its bits fall, the ten most sensitive parts at 3 and 2 bits), every proxy's rank agreement
with it, the allocation curves at 4.0 and 3.0 bits per weight with the random band, and each
proxy's verdict against random; its cost: forwards per entry (one per text), seconds per
entry, and the quantised weights computed (once per module and width).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pandas as pd
from _tables import print_table

from attrlab.attribution.bits.sensitivity import bundled_lm_texts
from attrlab.attribution.bits.study import bits_study
from attrlab.attribution.metrics.leaderboard import bundled_items
from attrlab.attribution.models import load
from attrlab.attribution.request.run import RunSettings

MODELS = {"smollm2": "smollm2-135m", "minilm": "minilm-zeroshot"}


def _number(value: float) -> str:
    return "" if value != value else f"{value:.4g}"  # NaN: blank


def study(alias: str, texts: int, draws: int) -> None:
    adapter = load(alias)
    decoder = adapter.family == "decoder-lm"
    chosen = (bundled_lm_texts() if decoder else [str(i.raw) for i in bundled_items("text")])[
        :texts
    ]
    started = time.perf_counter()
    found = bits_study(
        adapter,
        chosen,
        kinds=["attention", "mlp"],
        group_sizes=[32],
        draws=draws,
        settings=RunSettings(max_forward_passes=None, max_seconds=None),
    )
    seconds = time.perf_counter() - started
    sensitivity = "loss_change" if decoder else "kl"
    table = found.table
    print(
        f"\n### {alias}: {found.texts} texts, {found.tokens} predictions per forward over the "
        f"set; {found.entries} entries; {seconds:.0f} s in all\n"
    )
    base = f"loss {found.base_loss:.4f}, " if decoder else ""
    print(f"unquantised: {base}mean target log-prob {found.base_log_prob:.4f}\n")
    widths = sorted(table["bits"].unique(), reverse=True)
    by_part = table.pivot(index="part", columns="bits", values=sensitivity)[widths]
    rising = (by_part.diff(axis=1).iloc[:, 1:] >= 0).all(axis=1)
    print_table(
        ["bits", f"mean {sensitivity}", f"max {sensitivity}", "mean KL", "mean Δ log-prob"],
        [
            (
                w,
                _number(table[table.bits == w][sensitivity].mean()),
                _number(table[table.bits == w][sensitivity].max()),
                _number(table[table.bits == w]["kl"].mean()),
                _number(table[table.bits == w]["log_prob_change"].mean()),
            )
            for w in widths
        ],
    )
    print(
        f"\nparts whose {sensitivity} rises (or stays) at every step 8 → 4 → 3 → 2 bits: "
        f"{int(rising.sum())} of {len(rising)}; the mean over parts rises at every step: "
        f"{bool((by_part.mean().diff().iloc[1:] >= 0).all())}\n"
    )
    for w in (3, 2):
        top = table[table.bits == w].nlargest(10, sensitivity)
        print(f"\nmost sensitive parts at {w} bits\n")
        print_table(
            ["part", "parameters", sensitivity, "KL", "Δ log-prob"],
            [
                (
                    r.part,
                    r.parameters,
                    _number(getattr(r, sensitivity)),
                    _number(r.kl),
                    _number(r.log_prob_change),
                )
                for r in top.itertuples()
            ],
        )
    print("\nfull sensitivity table (rows: parts; columns: bits)\n")
    print_table(
        ["part", *[f"{w} bits" for w in widths]],
        [(part, *[_number(v) for v in row]) for part, row in by_part.iterrows()],
    )
    print("\nproxies' rank agreement with the measured sensitivity (top-k: a quarter of parts)\n")
    agreement = found.agreement
    print_table(
        ["proxy", *[f"ρ {w} bits" for w in widths], *[f"top-k {w} bits" for w in widths]],
        [
            (
                proxy,
                *[_number(rows[rows.bits == w]["spearman"].iloc[0]) for w in widths],
                *[_number(rows[rows.bits == w]["top_k_overlap"].iloc[0]) for w in widths],
            )
            for proxy, rows in agreement.groupby("proxy", sort=False)
        ],
    )
    print("\nallocation curves (value: the model's " + ("loss" if decoder else "KL") + ")\n")
    verdicts = found.verdicts
    print_table(
        ["budget", "allocation", "average bits", "value", "random std", "random range", "verdict"],
        [
            (
                f"{r.budget:g}",
                r.allocation,
                f"{r.average_bits:.3f}",
                _number(r.value),
                _number(r.std),
                "" if r.low != r.low else f"{r.low:.4g} … {r.high:.4g}",
                verdicts[f"{r.allocation}@{r.budget:g}"].status
                if f"{r.allocation}@{r.budget:g}" in verdicts
                else "",
            )
            for r in found.curves.itertuples()
        ],
    )
    passing = sorted({k.split("@")[0] for k, v in verdicts.items() if v.status == "pass"})
    print(f"\nproxies that pass against random at some budget: {', '.join(passing) or 'none'}\n")
    print_table(
        [
            "forwards per entry",
            "seconds per entry (all passes / forwards)",
            "forward passes",
            "backward passes",
            "quantised weights computed",
            "entries",
        ],
        [
            (
                found.texts,
                f"{seconds / max(found.forward_passes, 1) * found.texts:.2f}",
                found.forward_passes,
                found.backward_passes,
                found.cached,
                found.entries,
            )
        ],
    )
    for warning in found.warnings:
        print(f"\nwarning: {warning}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2")
    parser.add_argument("--texts", type=int, default=3)
    parser.add_argument("--draws", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {platform.processor() or platform.machine()}"
        f", {os.cpu_count()} cores, torch threads as set"
    )
    pd.set_option("display.width", 200)
    for name in args.models.split(","):
        study(MODELS[name], args.texts, args.draws)


if __name__ == "__main__":
    main()
