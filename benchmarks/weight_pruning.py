"""
What the weights can lose (issue 38): neuron, channel and expert estimators against removal.

Run: ``.venv/bin/python benchmarks/weight_pruning.py [curves] [costs] [--models a,b]``
(default: both parts, every model).

``curves``: a pruning study per model over its bundled set (the ten sentences; the bundled
images for the CNN), each estimator's curve beside random orders with its verdict, and each
estimator's agreement with exact removal (a seeded sample of 512 sites plus each estimator's
five highest and lowest where a model has more):

* SmolLM2-135M: its 30 × 1,536 MLP neurons, zeroed; globally (``smollm2``), then per layer
  (uniform, and OWL's allocation: ``smollm2-owl``);
* MiniLM (zero-shot sentiment): its 6 × 1,536 neurons;
* EfficientNet-Lite0: its convolutions' output channels.

``costs`` (SmolLM2, the ten sentences, alone on the machine): seconds of one forward per text,
of one forward + backward (the target's log-probability) per text, of the channel statistics
the estimators read (activations alone: Wanda and mean |activation|; with the target's
gradient: Taylor), side by side in one run, with their ratios; forward rows per text of one
ranking's 16-point curve; peak resident memory of a forward + backward and of the statistics
with the target's gradient, each in a fresh process (the model loaded, freed memory handed
back, Linux's high-water mark reset, less the resident memory before it).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table
from _timing import best_seconds

from attrlab.attribution.engine import (
    bundled_texts,
    channel_statistics,
    curve_passes,
    pruning_study,
)
from attrlab.attribution.models import Adapter, load
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import resolve_target

STUDIES = {
    "smollm2": ("smollm2-135m", "neuron", [{}]),
    "smollm2-owl": ("smollm2-135m", "neuron", [{"sparsity": "per_layer", "allocation": "owl"}]),
    "minilm": ("minilm-zeroshot", "neuron", [{}]),
    "efficientnet": ("efficientnet-lite0", "channel", [{}]),
}


def _items(adapter: Adapter) -> list:
    found = []
    for text in bundled_texts():
        inputs = adapter.preprocess(text)
        with torch.no_grad():
            logits = adapter.logits(**inputs.model_kwargs())[0]
        found.append((inputs, resolve_target(adapter, None, logits)))
    return found


def curves(names: list[str]) -> None:
    for name in names:
        alias, unit, options = STUDIES[name]
        adapter = load(alias)
        ranked = (
            adapter.preprocess(bundled_texts()[0])
            if adapter.modality == "text"
            else _first_image(adapter)
        )
        for option in options:
            started = time.perf_counter()
            study = pruning_study(
                adapter,
                ranked,
                None,
                units=[unit],
                draws=20,
                agreement=not option,
                settings=RunSettings(max_forward_passes=None, max_seconds=None),
                **option,
            )
            seconds = time.perf_counter() - started
            described = ", ".join(f"{k}={v}" for k, v in option.items()) or "global"
            print(
                f"\n### {alias}: {unit}s, {described} ({study.texts} inputs, {seconds:.0f} s, "
                f"{study.forward_passes} forward rows, {study.backward_passes} backward)\n"
            )
            scores = study.score_table()
            rows = [
                (r.unit, r.order, r.metric, f"{r.auc:.4g}", _number(r.std), _verdict(r.status))
                for r in scores.itertuples()
                if r.metric != "top1_agreement"
            ]
            print_table(["unit", "order", "metric", "area", "random std", "verdict"], rows)
            agreement = study.agreements.get(unit)
            if agreement is not None:
                which = "sampled" if agreement.sampled else "every site"
                sites = int(agreement.table["sites"].iloc[0])
                print(f"\nagreement with exact removal ({which}, {sites} sites)\n")
                print_table(
                    ["estimator", "spearman", "sample spearman", "top-5 overlap"],
                    [
                        (
                            r.estimator,
                            _number(r.spearman),
                            _number(r.sample_spearman),
                            f"{r.top_k_overlap:.2f}",
                        )
                        for r in agreement.table.itertuples()
                    ],
                )


def _verdict(status: object) -> str:
    return status if isinstance(status, str) else ""  # the random orders have none


def _number(value: float) -> str:
    return "" if value != value else f"{value:.3g}"  # NaN: blank


def _first_image(adapter: Adapter) -> object:
    from attrlab.attribution.metrics import bundled_items

    return adapter.preprocess(bundled_items("image")[0].raw)


def _forward_backward(adapter: Adapter, items: list) -> None:
    for inputs, target in items:
        with torch.enable_grad():
            embeds = adapter.model.get_input_embeddings()(inputs.model_kwargs()["input_ids"])
            embeds = embeds.detach().requires_grad_(True)
            logits = adapter.model(inputs_embeds=embeds).logits
            value = target.log_probability(
                target.from_logits(adapter, logits, inputs.model_kwargs())
            )
            value.sum().backward()


def costs() -> None:
    adapter = load("smollm2-135m")
    items = _items(adapter)

    def forward() -> None:
        with torch.no_grad():
            for inputs, _ in items:
                adapter.logits(**inputs.model_kwargs())

    measured = {
        "forward": best_seconds(forward),
        "forward + backward": best_seconds(lambda: _forward_backward(adapter, items)),
        "statistics (Wanda, activation)": best_seconds(
            lambda: channel_statistics(adapter, items, "neuron")
        ),
        "statistics + target gradient (Taylor)": best_seconds(
            lambda: channel_statistics(adapter, items, "neuron", ("target",))
        ),
    }
    base = {
        "statistics (Wanda, activation)": "forward",
        "statistics + target gradient (Taylor)": "forward + backward",
    }
    print("\n### SmolLM2-135M, 30 × 1,536 neurons, the ten bundled sentences\n")
    print_table(
        ["run", "seconds (best of 3)", "ratio", "against"],
        [
            (
                name,
                f"{s:.2f}",
                f"{s / measured[base[name]]:.2f}" if name in base else "",
                base.get(name, ""),
            )
            for name, s in measured.items()
        ],
    )
    per_ranking = curve_passes(adapter, 2, 1, "neuron") - curve_passes(adapter, 1, 1, "neuron")
    print(f"\none ranking's curve: {per_ranking} pruned forward rows per text, beside the one")
    print("unpruned row every order shares (17 in all for one ranking alone)")
    peaks = {what: _peak(what) for what in ("forward + backward", "statistics + target gradient")}
    print()
    print_table(
        ["run", "peak resident MiB beyond the model", "ratio"],
        [
            (what, f"{mib:.0f}", f"{mib / peaks['forward + backward']:.2f}")
            for what, mib in peaks.items()
        ],
    )


def _peak(what: str) -> float:
    """``what``'s peak resident memory beyond the loaded model, in a fresh process."""
    found = subprocess.run(
        [sys.executable, __file__, "--peak", what], capture_output=True, text=True, check=True
    )
    return float(found.stdout.strip().splitlines()[-1])


def _peak_child(what: str) -> None:
    """Load, hand freed memory back, reset Linux's high-water mark, run ``what``, print it."""
    adapter = load("smollm2-135m")
    items = _items(adapter)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # the loader's freed buffers back to the system
    with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")  # the high-water mark from here on
    before = _status("VmRSS")
    if what == "forward + backward":
        _forward_backward(adapter, items)
    else:
        channel_statistics(adapter, items, "neuron", ("target",))
    print(_status("VmHWM") - before)


def _status(field: str) -> float:
    """A ``/proc/self/status`` memory field in MiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(row for row in status if row.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("parts", nargs="*", default=["curves", "costs"])
    parser.add_argument("--models", default=",".join(STUDIES))
    parser.add_argument("--peak", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak:
        _peak_child(args.peak)
        return
    if "costs" in args.parts:
        costs()
    if "curves" in args.parts:
        curves(args.models.split(","))


if __name__ == "__main__":
    main()
