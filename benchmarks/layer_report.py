"""
Which heads carry two predictions of the embedded models, by four estimators (issue 9 report).

Run: ``.venv/bin/python benchmarks/layer_report.py``

SmolLM2-135M on "When Mary and John went to the store, John gave a drink to" (target " Mary")
and MiniLM zero-shot on a positive review (labels positive / negative). For each head
estimator: its top-5 heads; the agreement of the estimators (Spearman over all heads, top-5
overlap); and the drop of the target probability when an estimator's top-5 heads are zeroed
together, against 5 heads drawn at random (mean and standard deviation of 20 seeded draws).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table

from attrlab.attribution.engine.recheck import recheck_heads
from attrlab.attribution.layers import HEAD_ESTIMATORS, agreement, analyze_layers
from attrlab.attribution.layers.agreement import head_ranking
from attrlab.attribution.models import load
from attrlab.attribution.request.target import resolve_target

CASES = (
    ("smollm2-135m", "When Mary and John went to the store, John gave a drink to", " Mary", None),
    ("minilm-zeroshot", "A moving, beautifully acted film.", "positive", ["positive", "negative"]),
)
TOP, DRAWS = 5, 20


def report(spec: str, text: str, target_label: str, labels: list[str] | None) -> None:
    adapter = load(spec, device="cpu")
    if labels is not None:
        adapter = adapter.with_labels(labels)
    inputs = adapter.preprocess(text)
    with torch.no_grad():
        logits = adapter.logits(**inputs.model_kwargs())[0]
    target = resolve_target(adapter, target_label, logits)
    table = analyze_layers(adapter, inputs, target)
    print(f"\n### {spec}: {text!r} -> {target.label!r}\n")
    top = {m: list(head_ranking(table, m).nlargest(TOP).index) for m in HEAD_ESTIMATORS}
    print_table(
        ("estimator", f"top {TOP} heads (layer.head)"),
        [(m, ", ".join(f"{int(layer)}.{int(head)}" for layer, head in top[m])) for m in top],
    )
    print()
    pairs = agreement(table, HEAD_ESTIMATORS, TOP)
    print_table(
        ("estimators", "Spearman ρ", f"top-{TOP} overlap"),
        [
            (f"{r.first} / {r.second}", f"{r.spearman:.2f}", f"{r.top_k_overlap:.1f}")
            for r in pairs.itertuples(index=False)
        ],
    )
    rechecked = recheck_heads(adapter, inputs, target, table, TOP, DRAWS)
    print(f"\ntarget probability without ablation: {rechecked.score:.4f}\n")
    sets = rechecked.sets
    rows = [
        (r.chosen_by, r.heads, f"{r.change:+.4f}")
        for r in sets[sets.chosen_by != "random"].itertuples()
    ]
    drawn = sets[sets.chosen_by == "random"].change
    rows.append(
        (f"{TOP} random heads ({DRAWS} draws)", "", f"{drawn.mean():+.4f} ± {drawn.std():.4f}")
    )
    print_table((f"top-{TOP} heads of", "heads zeroed", "change of the probability"), rows)
    print()
    print_table(
        ("re-check", "verdict", "why"),
        [(v.title, v.status, v.reason) for v in rechecked.verdicts],
    )


def main() -> None:
    torch.set_num_threads(2)
    for case in CASES:
        report(*case)


if __name__ == "__main__":
    main()
