"""A snapshot of everything a hook, patch or weight edit could leave behind on a model."""

from __future__ import annotations

from torch import nn


def model_state(model: nn.Module) -> list:
    """Hooks, modes, instance-level overrides and configs of every submodule, comparable."""
    return [
        (
            name,
            dict(m._forward_hooks),
            dict(m._forward_pre_hooks),
            dict(m._backward_hooks),
            m.training,
            sorted(k for k in vars(m) if k in ("forward", "__call__")),
            id(getattr(m, "config", None)),
            getattr(getattr(m, "config", None), "_attn_implementation", None),
        )
        for name, m in model.named_modules()
    ]
