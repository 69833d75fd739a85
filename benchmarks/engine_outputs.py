"""
The importance engine's outputs before and after a change to it, compared bit for bit.

Run: ``.venv/bin/python benchmarks/engine_outputs.py write FILE`` on the commit before a change,
then ``… compare FILE`` on the commit after it. Each writes or compares, per model, the pruning
study's whole JSON (orders, curves, areas, verdicts, passes) and its layer analysis table:
tiny random GPT-2, LLaMA and BERT (layers and heads; the decoders ranked for " mary" rather
than " john", with exact residual patching of a corrupted prompt) and SmolLM2-135M (layers;
" Paris" rather than " Rome"), two dataset texts, two random draws, seed 3, one thread. Beside
them, on the tiny models, a whole patching report (every estimator, component and direction;
on LLaMA with Gaussian noise of two draws as well), its agreement in words, its planned passes
and patched scores of several sites together. ``compare`` prints one row per output and exits 1
when any differs (an output the file lacks, written before it was added here, is named so).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from _tables import print_table

from attrlab.attribution.engine.study import pruning_study, ranked_input
from attrlab.attribution.models import load
from attrlab.attribution.patching import (
    COMPONENTS,
    GaussianNoise,
    agreement_reading,
    patched_score,
    patching_problem,
    patching_report,
    planned_passes,
)
from attrlab.attribution.request.run import RunSettings

CLEAN = "when mary and john went to the store john gave a drink to"
CORRUPTED = "when mary and john went to the store mary gave a drink to"
TEXTS = ("the cat sat on the mat and", "mary gave john a")
MODELS = ("tiny-random-gpt2", "tiny-random-llama", "tiny-random-bert", "smollm2-135m")


def outputs() -> dict[str, Any]:
    """Every model's study and analysis, JSON-ready (NaN as ``None``)."""
    found: dict[str, Any] = {}
    for alias in MODELS:
        adapter = load(alias, device="cpu")
        if alias == "smollm2-135m":
            ranked = ranked_input(
                adapter,
                "The capital of France is",
                answer=" Paris",
                contrast=" Rome",
                corrupted="The capital of Italy is",
            )
            units: tuple[str, ...] = ("layer",)
        elif adapter.family == "decoder-lm":
            ranked = ranked_input(
                adapter, CLEAN, answer=" mary", contrast=" john", corrupted=CORRUPTED
            )
            units = ("layer", "head")
        else:
            ranked = ranked_input(adapter, "a fine day at the beach")
            units = ("layer", "head")
        inputs, target, problem = ranked
        study = pruning_study(
            adapter,
            inputs,
            target,
            TEXTS,
            problem=problem,
            units=units,
            draws=2,
            head_step=2,
            settings=RunSettings(seed=3),
        )
        analysis = study.analysis.astype(object).where(study.analysis.notna(), None)
        found[alias] = {"study": study.to_dict(), "analysis": analysis.to_dict(orient="records")}
    return found


def patching_outputs() -> dict[str, Any]:
    """Patching reports on the tiny models, JSON-ready (NaN as ``None``)."""
    found: dict[str, Any] = {}
    for alias in MODELS[:3]:
        adapter = load(alias, device="cpu")
        if adapter.family == "decoder-lm":
            problems = {
                "corrupted": patching_problem(
                    adapter, CLEAN, CORRUPTED, answer=" mary", contrast=" john"
                )
            }
            if alias == "tiny-random-llama":
                noise = GaussianNoise((1, 2), seeds=2, seed=5)
                problems["noise"] = patching_problem(
                    adapter, CLEAN, answer=" mary", contrast=" john", noise=noise
                )
        else:
            problems = {
                "corrupted": patching_problem(
                    adapter, "a fine day at the beach", "a awful day at the beach"
                )
            }
        for name, problem in problems.items():
            settings = RunSettings(seed=3)
            report = patching_report(adapter, problem, settings=settings, top_k=4)
            patched = {
                f"{c}:{d}": patched_score(adapter, problem, c, 1, [0, 2], direction=d)
                for c in COMPONENTS
                for d in ("denoising", "noising")
            }
            found[f"patching:{alias}:{name}"] = {
                "report": report.to_dict(),
                "reading": agreement_reading(report),
                "planned": planned_passes(adapter, problem, max_rows=7),
                "patched": patched,
            }
    return found


def main(action: str, path: Path) -> int:
    torch.set_num_threads(1)
    now = json.loads(json.dumps({**outputs(), **patching_outputs()}, sort_keys=True, default=str))
    if action == "write":
        path.write_text(json.dumps(now, sort_keys=True))
        return 0
    before = json.loads(path.read_text())
    rows = [
        (
            alias,
            "not in the file"
            if alias not in before
            else "identical"
            if before[alias] == now[alias]
            else "DIFFERS",
        )
        for alias in now
    ]
    print_table(("output", "before vs after"), rows)
    return int(any(state == "DIFFERS" for _, state in rows))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "compare"):
        sys.exit("usage: engine_outputs.py write|compare FILE")
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
