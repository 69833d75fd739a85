"""
Stand-ins for embedded models too large to carry to a device machine (its upload is 64 MiB).

Timing needs the architecture, not the weights: a stand-in has the embedded model's config and
tokenizer and seeded random weights, and loads through attrlab's local-folder path.

Run here: ``.venv/bin/python benchmarks/stand_ins.py export DIR`` (configs and tokenizers,
a few MiB); there: ``python benchmarks/stand_ins.py build DIR`` (random weights), then the
benchmarks with ``ATTRLAB_STAND_INS=DIR``: :func:`load_for_benchmark` loads a stand-in where
the folder has one, the embedded model otherwise.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

#: Embedded models whose weights are too large to carry, and the head their stand-in gets.
STAND_INS = {
    "smollm2-135m": "AutoModelForCausalLM",
    # MiniLM is a zero-shot sentence encoder; a classifier of its shape costs the same per pass.
    "minilm-zeroshot": "AutoModelForSequenceClassification",
}


def export(folder: Path) -> None:
    """Write each model's config and tokenizer (from the embedded model) under ``folder``."""
    from attrlab.attribution.models import load

    for spec, head in STAND_INS.items():
        adapter = load(spec, device="cpu")
        config = (
            adapter.model.config if head == "AutoModelForCausalLM" else _encoder_config(adapter)
        )
        config.architectures = [head.replace("Auto", config.model_type.title().replace("_", ""))]
        config.save_pretrained(folder / spec)
        adapter.tokenizer.save_pretrained(folder / spec)


def _encoder_config(adapter: Any) -> Any:
    import transformers as tf

    config = tf.BertConfig(**adapter.model.encoder.config.to_dict())
    config.num_labels = 2
    return config


def build(folder: Path) -> None:
    """Give each exported stand-in seeded random weights."""
    import torch
    import transformers as tf

    for spec, head in STAND_INS.items():
        path = folder / spec
        torch.manual_seed(0)
        config = tf.AutoConfig.from_pretrained(path)
        getattr(tf, head).from_config(config).save_pretrained(path)


def load_for_benchmark(spec: str, device: str) -> tuple[Any, str]:
    """The embedded model, or its stand-in under ``ATTRLAB_STAND_INS``; and how to label it."""
    from attrlab.attribution.models import load

    folder = Path(os.environ.get("ATTRLAB_STAND_INS", "/nonexistent")) / spec
    if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
        adapter = load(str(folder), device=device)
        adapter.model_id = f"{spec} (random weights)"
        return adapter, adapter.model_id
    return load(spec, device=device), spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("export", "build"))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    (export if args.step == "export" else build)(args.folder)


if __name__ == "__main__":
    main()
