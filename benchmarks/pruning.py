"""
Pruning curves per layer and head estimator against random orders (ShortGPT's test).

Run: ``.venv/bin/python benchmarks/pruning.py [smollm2|minilm ...]`` (default: both).

* SmolLM2-135M: the layers and heads ranked on the IOI pair of ``benchmarks/patching.py``
  (" Mary" rather than " John"; exact residual patching ranks the layers too), pruned over
  ten IOI-style prompts, each scored on ``log p`` of its indirect object's name.
* MiniLM (zero-shot sentiment): ranked on the first bundled sentence and its label, pruned
  over the ten bundled sentences, each scored on the unpruned model's class.

Prints, per model and unit, the area under each curve (the curve's mean height over
``k = 0 … K``) of each ranking beside the random orders' mean, standard deviation and range,
and each ranking's verdict against them (t-test over the draws' areas, as
:func:`attribution.verdicts.against_random`), with the planned and spent passes and seconds.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from patching import CLEAN, CORRUPTED

from attrlab.attribution.engine.study import (
    PruningStudy,
    bundled_texts,
    pruning_study,
    study_parts,
)
from attrlab.attribution.models import load
from attrlab.attribution.patching import patching_problem
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.estimate import study_estimate
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import output_target

#: Random orders per unit.
DRAWS = 10
#: IOI-style prompts and their indirect object (the name the model should give).
IOI = (
    ("When Mary and John went to the store, John gave a drink to", " Mary"),
    ("When Tom and Anna went to the park, Anna gave a ball to", " Tom"),
    ("After Sarah and James arrived at the party, James handed a gift to", " Sarah"),
    ("While Paul and Emma were at the cafe, Emma passed the sugar to", " Paul"),
    ("When Lisa and Mark went to the library, Mark lent a book to", " Lisa"),
    ("After David and Kate finished dinner, Kate gave the bill to", " David"),
    ("When Anna and Peter met at the station, Peter gave a ticket to", " Anna"),
    ("While John and Lucy walked home, Lucy gave an umbrella to", " John"),
    ("When Emma and Tom went to the beach, Tom threw the ball to", " Emma"),
    ("After Mark and Sarah cleaned the kitchen, Sarah handed a towel to", " Mark"),
)


def smollm2() -> None:
    adapter = load("smollm2-135m", device="cpu")
    problem = patching_problem(adapter, CLEAN, CORRUPTED, answer=" Mary", contrast=" John")
    items = [answer_request(adapter, text, answer=name) for text, name in IOI]
    print("## SmolLM2-135M: ranked on the IOI pair, pruned over 10 IOI prompts\n")
    _run(adapter, problem.clean, problem.target, items=items, problem=problem)


def minilm() -> None:
    adapter = load("minilm-zeroshot", device="cpu")
    first = bundled_texts()[0]
    inputs = adapter.preprocess(first)
    with torch.no_grad():
        logits = adapter.logits(**inputs.model_kwargs())[0]
    target = int(logits.argmax())
    print(
        f"## MiniLM: ranked on {first!r} ({adapter.label(target)}), pruned over the bundled set\n"
    )
    _run(adapter, inputs, output_target(adapter, target), texts=bundled_texts())


def _run(adapter, inputs, target, **given) -> None:
    items, texts, problem = given.get("items"), given.get("texts"), given.get("problem")
    dataset = [i for i, _ in items] if items else [adapter.preprocess(t) for t in texts]
    parts = study_parts(adapter, inputs, dataset, problem, draws=DRAWS, targets_known=bool(items))
    estimate = study_estimate(adapter, "pruning", parts)
    print(f"planned: {estimate.summary()}\n")
    start = time.perf_counter()
    study = pruning_study(adapter, inputs, target, draws=DRAWS, settings=RunSettings(), **given)
    spent = time.perf_counter() - start
    passes = f"{study.forward_passes:,} forward, {study.backward_passes} backward"
    print(f"spent: {passes}, {spent:.0f} s\n")
    _print(study)


def _print(study: PruningStudy) -> None:
    for unit, curves in study.curves().items():
        removed = curves.curves["removed"].max()
        print(f"### {unit}s: k = 0 … {removed}, {DRAWS} random orders\n")
        scores = curves.scores.set_index(["order", "metric"])
        metrics = list(dict.fromkeys(curves.scores["metric"]))
        rows = []
        for metric in metrics:
            random = scores.loc["random", metric]
            band = (
                f"{random['auc']:.4g} ± {random['std']:.2g} "
                f"[{random['low']:.4g}, {random['high']:.4g}]"
            )
            rows.append((metric, "random", band, ""))
            for order in dict.fromkeys(curves.scores["order"]):
                if order == "random":
                    continue
                found = scores.loc[order, metric]
                p = found["p_value"]
                verdict = found["status"] + ("" if p is None or p != p else f" (p = {p:.2g})")
                rows.append((metric, order, f"{found['auc']:.4g}", verdict))
        print_table(("metric", "order", "area", "against random"), rows)
        print()


if __name__ == "__main__":
    torch.set_num_threads(os.cpu_count() or 1)
    chosen = sys.argv[1:] or ["smollm2", "minilm"]
    for name in chosen:
        {"smollm2": smollm2, "minilm": minilm}[name]()
