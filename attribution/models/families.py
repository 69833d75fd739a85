"""
Per-family facts kept as data: which adapter serves a Hugging Face ``model_type``.

Adding a family means adding a row here (and its module paths in ``layouts.py``), never an
``if`` on a model name inside a method.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAMILIES", "READOUTS", "family_of", "positional_encoding_of", "readout_of"]

#: model_type -> (adapter family, kind of positional encoding)
FAMILIES: dict[str, tuple[str, str | None]] = {
    "bert": ("text-classifier", "learned"),
    "roberta": ("text-classifier", "learned"),
    "xlm-roberta": ("text-classifier", "learned"),
    "electra": ("text-classifier", "learned"),
    "distilbert": ("text-classifier", "learned"),
    "deberta-v2": ("text-classifier", "relative"),
    "modernbert": ("text-classifier", "rope"),
    "gpt2": ("decoder-lm", "learned"),
    "llama": ("decoder-lm", "rope"),
    "mistral": ("decoder-lm", "rope"),
    "qwen2": ("decoder-lm", "rope"),
    "qwen3": ("decoder-lm", "rope"),
    "gemma": ("decoder-lm", "rope"),
    "gemma2": ("decoder-lm", "rope"),
    "gemma3_text": ("decoder-lm", "rope"),
    "phi3": ("decoder-lm", "rope"),
    "vit": ("vision-transformer", "learned"),
    "deit": ("vision-transformer", "learned"),
    "dinov2": ("vision-transformer", "learned"),
    "dinov2_with_registers": ("vision-transformer", "learned"),
    "clip": ("zero-shot-image", "learned"),
}

#: Classifier class -> which tokens its logits read, when not the CLS token alone: distilled
#: DeiT averages the CLS and distillation heads; DINOv2 reads CLS concatenated with the mean of
#: the patch tokens (registers excluded). Rollout and attention flow explain that readout.
READOUTS: dict[str, str] = {
    "DeiTForImageClassificationWithTeacher": "first_two",
    "Dinov2ForImageClassification": "first_and_patches",
    "Dinov2WithRegistersForImageClassification": "first_and_patches",
}


def family_of(config: Any) -> str | None:
    """Adapter family for a transformers config, or ``None`` if unsupported."""
    row = FAMILIES.get(getattr(config, "model_type", ""))
    return row[0] if row else None


def readout_of(model: Any) -> str:
    """The readout of a vision-transformer classifier (``"first"`` unless listed)."""
    return READOUTS.get(type(model).__name__, "first")


def positional_encoding_of(config: Any) -> str | None:
    """Kind of positional encoding a config uses (DistilBERT may be sinusoidal)."""
    if getattr(config, "sinusoidal_pos_embds", False):
        return "sinusoidal"
    row = FAMILIES.get(getattr(config, "model_type", ""))
    return row[1] if row else None
