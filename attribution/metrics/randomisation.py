"""
Model-parameter randomisation test (Adebayo et al. 2018, https://arxiv.org/abs/1810.03292).

The model's layers are re-initialised one at a time from the top down (cascading: each step
keeps the previous steps' random weights) and the map is recomputed after each step. A map
that explains the model must change as the model is destroyed; one that stays correlated with
the original (an edge detector, a constant) does not depend on what the model learned. The
similarity is Spearman's ρ between the original and the randomised map, signed and of absolute
values (the paper reports both). The model's own weights are back after each step, also on
error: the random ones wait in a copy between steps, so the model is altered only while a
step runs.

Layers are the transformer blocks of the model's family layout, with what comes after them (norm,
head; a tied LM head too) first and what comes before them (embeddings) last; for other
models, the parameterised children of the model, containers (``Sequential``, ``ModuleList``)
opened up. A re-initialised parameter is
drawn from a normal distribution with the parameter's own mean and standard deviation (seeded):
its scale stays, what was learned goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from torch import nn

from attrlab.attribution.alteration import altered
from attrlab.attribution.models.base import Adapter

__all__ = ["cascading_units", "randomisation_check"]


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _children(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    units = []
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, nn.Sequential | nn.ModuleList):
            units += _children(child, path + ".")
        elif _has_parameters(child):
            units.append((path, child))
    return units


def _holder(parameters: list[nn.Parameter]) -> nn.Module:
    """A module viewing ``parameters`` (the same tensors, randomised in place)."""
    holder = nn.Module()
    holder.held = nn.ParameterList(parameters)
    return holder


def cascading_units(adapter: Adapter) -> list[tuple[str, nn.Module]]:
    """
    The model's layers in the order they are randomised: output side first.

    For a transformer: everything after its blocks (final norm, pooler, classifier, and the LM
    head even where it is tied to the token embeddings), then the blocks from the last, then
    everything before them (token, position and patch embeddings, CLS tokens).
    """
    model = adapter.model
    if adapter.layout is None:
        return list(reversed(_children(model, "")))
    blocks = adapter.blocks()
    inside = {id(p) for block in blocks for p in block.parameters()}
    named = list(model.named_parameters())
    positions = [i for i, (_, p) in enumerate(named) if id(p) in inside]
    head = adapter.unembedding()
    output = [p for _, p in named[positions[-1] + 1 :]]
    taken = {id(p) for p in output}
    for p in head.parameters() if head is not None else ():
        if id(p) not in taken:  # a tied LM head is listed with the embeddings
            output.append(p)
            taken.add(id(p))
    before = [p for _, p in named[: positions[0]] if id(p) not in taken]
    units = [("output (after the blocks)", _holder(output))] if output else []
    units += [(f"block {i}", b) for i, b in reversed(list(enumerate(blocks)))]
    if before:
        units.append(("embeddings (before the blocks)", _holder(before)))
    return units


def _randomise(module: nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for parameter in module.parameters():
            mean = float(parameter.mean())
            std = float(parameter.std()) if parameter.numel() > 1 else 0.0
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.copy_((mean + std * noise).to(parameter.dtype))


def _values(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``model``, a tied one once."""
    return [*model.named_parameters(), *model.named_buffers()]


def _swap(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Exchange the values of ``model``'s parameters and buffers with ``values`` (no copy)."""
    for name, tensor in _values(model):
        tensor.data, values[name] = values[name], tensor.data


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(spearmanr(a, b)[0])


def randomisation_check(
    adapter: Adapter,
    explain_map: Callable[[Adapter], np.ndarray],
    seed: int = 0,
    original: np.ndarray | None = None,
) -> pd.DataFrame:
    """
    Spearman's ρ between ``explain_map(adapter)`` and the same map after each cascading step.

    ``original``: the map of the intact model when already computed.

    Returns:
        One row per step: ``step`` (0 = nothing randomised), ``layer`` (the unit randomised at
        that step), ``spearman`` and ``spearman_abs``.
    """
    if original is None:
        original = explain_map(adapter)
    original = np.asarray(original, dtype=np.float64).ravel()
    rows: list[tuple[Any, ...]] = [(0, "none", 1.0, 1.0)]
    generator = torch.Generator().manual_seed(seed)
    model = adapter.model
    # The steps' random weights live in this copy between steps, the model's own meanwhile:
    # the model is altered only while a step runs, so light reads go between the steps.
    randomised = {name: t.detach().clone() for name, t in _values(model)}
    for step, (name, unit) in enumerate(cascading_units(adapter), start=1):
        with altered(model):
            _swap(model, randomised)
            try:
                _randomise(unit, generator)
                recomputed = np.asarray(explain_map(adapter), dtype=np.float64).ravel()
            finally:
                _swap(model, randomised)
        signed = _spearman(original, recomputed)
        absolute = _spearman(np.abs(original), np.abs(recomputed))
        rows.append((step, name, signed, absolute))
    return pd.DataFrame.from_records(rows, columns=["step", "layer", "spearman", "spearman_abs"])
