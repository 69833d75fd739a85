"""
Positional-encoding-aware LRP rules (PA-LRP; Bakish et al. 2025, https://arxiv.org/abs/2506.02138).

The input of a transformer is a set of (token, position) pairs, so relevance should reach both.

* Additive PE (BERT, RoBERTa, DistilBERT, GPT-2, ViT/DeiT): at ``x0 = E + P`` the proportional
  rule gives ``R_E = E/(E+P)·R`` and ``R_P = P/(E+P)·R``. In Gradient × Input form these are
  exactly ``E ⊙ g`` and ``P ⊙ g`` with ``g`` the gradient at ``x0``: the ε of the proportional
  rule is not needed because nothing is divided. ``E`` counts every non-positional part of the
  sum (word and token-type embeddings; ViT: patch embedding and CLS/distillation tokens).
  Plain AttnLRP propagates through the same graph and reports only ``R_E``.
* RoPE (LLaMA, Mistral, Qwen2/3, Gemma, Phi-3): ``q' = q⊙cos + rot(q)⊙sin`` (same for k). The
  sum gets the proportional rule (automatic for a sum), each product the uniform rule: ½ of
  its relevance to q, ½ to cos/sin. Every layer gets its own cos/sin leaf tensors; the
  positional score of position t is ``Σ_layers Σ_{cos,sin} |Σ_d R[t, d]|`` (the reference
  code's aggregation). Plain AttnLRP treats cos/sin as constants, so all relevance stays with q/k.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from attrlab.attribution.compat import family_function, set_family_function
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.methods.lrp.rules import scale_gradient
from attrlab.attribution.models.families import Layout, RotaryLayout
from attrlab.attribution.models.layouts import find_module, find_parameter

if TYPE_CHECKING:
    from attrlab.attribution.methods.lrp.patches import Recorder

__all__ = [
    "embedding_hooks",
    "embedding_split",
    "rotary_function",
    "rotary_hooks",
    "rotary_scores",
    "spread_patches",
]


def rotary_hooks(
    stack: ExitStack,
    attention: nn.Module,
    rotary: RotaryLayout,
    recorder: Recorder,
    index: int,
    pe_aware: bool,
) -> None:
    """
    Register one attention module's RoPE rules on ``stack`` (with :func:`rotary_function`).

    PA-LRP replaces the layer's ``(cos, sin)`` by fresh leaf tensors (recorded) whose gradient
    is halved: the uniform rule on ``q⊙cos`` and ``rot(q)⊙sin``, whose other half goes to q
    and k in the wrapped rotary function. Every layer also tells that function its index.
    """

    def enter(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        _ROTATION.layer = index
        if not pe_aware:
            return None
        if rotary.kwarg not in kwargs:
            raise UnsupportedMethodError(
                f"PA-LRP expected rotary '{rotary.kwarg}' = (cos, sin) in "
                f"{type(attention).__name__}'s arguments"
            )
        cos, sin = (t.detach().requires_grad_(True) for t in kwargs[rotary.kwarg])
        recorder.keep("rotary", index, (cos, sin))
        kwargs = {**kwargs, rotary.kwarg: (scale_gradient(cos, 0.5), scale_gradient(sin, 0.5))}
        return args, kwargs

    stack.callback(attention.register_forward_pre_hook(enter, with_kwargs=True).remove)


#: The layer whose attention is running, set by :func:`rotary_hooks` for the rotary function.
_ROTATION = threading.local()


def rotary_function(
    stack: ExitStack,
    attention: nn.Module,
    rotary: RotaryLayout,
    recorder: Recorder,
    pe_aware: bool,
    record: bool,
) -> None:
    """
    Wrap the family's rotary function for this thread while ``stack`` is open.

    The wrapper sees the unrotated q and k exactly as they are rotated, records them
    (``record``) and, for PA-LRP, halves the gradient of the rotated features: for partial
    rotary only the first ``cos.shape[-1]`` features are multiplied by cos/sin, the others
    pass through with all of their relevance. Calls from other threads (other models of the
    family) go to the original function unchanged.
    """
    family = type(attention)
    original = family_function(family, rotary.function)
    if original is None:
        raise UnsupportedMethodError(
            f"LRP expected the rotary function '{rotary.function}' beside {family.__name__}"
        )
    owner = threading.get_ident()

    def wrapped(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if threading.get_ident() != owner:
            return original(q, k, cos, sin, *args, **kwargs)
        if record:
            recorder.keep("unrotated", _ROTATION.layer, (q, k))
        if pe_aware:
            q, k = _halve_rotated(q, cos.shape[-1]), _halve_rotated(k, cos.shape[-1])
        return original(q, k, cos, sin, *args, **kwargs)

    set_family_function(family, rotary.function, wrapped)
    stack.callback(set_family_function, family, rotary.function, original)


def _halve_rotated(x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    if rotary_dim >= x.shape[-1]:
        return scale_gradient(x, 0.5)
    return torch.cat([scale_gradient(x[..., :rotary_dim], 0.5), x[..., rotary_dim:]], dim=-1)


def embedding_hooks(stack: ExitStack, model: nn.Module, layout: Layout, recorder: Recorder) -> None:
    """
    Record ``x0``, the token parts ``E`` and the positional embedding ``P`` during the forward.

    Text models also turn the word-embedding output into a leaf tensor, so the backward pass
    stops there (no weight gradients) and works even with frozen parameters.
    """
    if layout.input_embedding is not None:
        leaf = find_module(model, layout.input_embedding).register_forward_hook(
            lambda _m, _a, out: out.detach().requires_grad_(True)
        )
        stack.callback(leaf.remove)
    path, where = layout.embedding_sum
    module = find_module(model, path)
    if where == "input":
        hook = module.register_forward_pre_hook(lambda _m, args: _keep_sum(recorder, args[0]))
    else:
        hook = module.register_forward_hook(lambda _m, _a, out: _keep_sum(recorder, out))
    stack.callback(hook.remove)
    for part in layout.token_parts:
        hook = find_module(model, part).register_forward_hook(
            lambda _m, _a, out: recorder.token_parts.append(out.detach())
        )
        stack.callback(hook.remove)
    recorder.prefix_tokens = [find_parameter(model, p).detach() for p in layout.prefix_tokens]
    if layout.registers is not None:
        recorder.registers = find_parameter(model, layout.registers).detach()
    if layout.position is not None:
        path, kind = layout.position
        if kind == "parameter":
            recorder.position = find_parameter(model, path).detach()
        elif kind == "method":
            _record_method(stack, model, path, recorder)
        else:
            hook = find_module(model, path).register_forward_hook(
                lambda _m, _a, out: setattr(recorder, "position", out.detach())
            )
            stack.callback(hook.remove)


def _record_method(stack: ExitStack, model: nn.Module, path: str, recorder: Recorder) -> None:
    """Record what the method at ``path`` returns, by an instance attribute removed on exit."""
    owner_path, name = path.rsplit(".", 1)
    owner = find_module(model, owner_path)
    original = getattr(owner, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        recorder.position = out.detach()
        return out

    setattr(owner, name, recording)
    stack.callback(delattr, owner, name)  # the class's method shows through again


def _keep_sum(recorder: Recorder, tensor: torch.Tensor) -> None:
    recorder.embedding_sum = tensor


def embedding_split(
    recorder: Recorder, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """
    Per-position relevance ``(Σ_d E⊙g, Σ_d P⊙g or None, Σ_d x0⊙g)`` at the embedding sum.

    Each ``(B, T)``: one row per batch row.

    Raises:
        UnsupportedMethodError: if the recorded parts do not add up to ``x0`` (the layout
            does not describe this model).
    """
    if recorder.embedding_sum is None or not recorder.token_parts:
        raise UnsupportedMethodError(
            "LRP did not see the input embedding of this model (was it called with input ids?)"
        )
    x0 = recorder.embedding_sum.detach()
    parts = [_as_tokens(part) for part in recorder.token_parts]
    token = sum(parts[1:], parts[0])
    if recorder.prefix_tokens:
        prefix = [
            p.reshape(1, -1, p.shape[-1]).expand(token.shape[0], -1, -1)
            for p in recorder.prefix_tokens
        ]
        token = torch.cat([*prefix, token], dim=1)
    position = recorder.position
    if recorder.registers is not None and position is not None:
        registers = recorder.registers.reshape(1, -1, token.shape[-1]).expand(
            token.shape[0], -1, -1
        )
        token = torch.cat([token[:, :1], registers, token[:, 1:]], dim=1)
        no_position = torch.zeros_like(registers[:1])
        position = torch.cat([position[:, :1], no_position, position[:, 1:]], dim=1)
    rebuilt = token if position is None else token + position
    if rebuilt.shape != x0.shape or not torch.allclose(rebuilt, x0, rtol=1e-4, atol=1e-5):
        raise UnsupportedMethodError(
            "PA-LRP could not split the input embedding into token and positional parts "
            "for this model (its embedding layer differs from the known layout)"
        )
    token_relevance = (token * grad).sum(-1)
    position_relevance = None if position is None else (position * grad).sum(-1)
    return token_relevance, position_relevance, (x0 * grad).sum(-1)


def _as_tokens(part: torch.Tensor) -> torch.Tensor:
    """A patch convolution's ``(B, C, h, w)`` output as ``(B, h·w, C)`` tokens (CLIP)."""
    return part.flatten(2).transpose(1, 2) if part.dim() == 4 else part


def rotary_scores(
    recorder: Recorder, grads: dict[str, torch.Tensor]
) -> tuple[np.ndarray, list[float], float]:
    """
    RoPE positional relevance from the per-layer cos/sin leaves.

    Returns:
        Positional score per position (``Σ_layers Σ_{cos,sin} |Σ_d R|``), the per-layer sum of
        that score over positions, and the signed total (what enters conservation).
    """
    scores: torch.Tensor | None = None
    per_layer: list[float] = []
    signed = 0.0
    for index in sorted(recorder.rotary):
        layer = torch.zeros(0, dtype=torch.float64)
        for slot, leaf in enumerate(recorder.rotary[index]):
            grad = grads.get(f"rotary.{index}.{slot}")
            relevance = torch.zeros(leaf.shape[-2]) if grad is None else (leaf * grad).sum(-1)[0]
            relevance = relevance.detach().double().cpu()
            signed += float(relevance.sum())
            layer = relevance.abs() if slot == 0 else layer + relevance.abs()
        per_layer.append(float(layer.sum()))
        scores = layer if scores is None else scores + layer
    if scores is None:
        raise UnsupportedMethodError("no rotary position embedding was recorded")
    return scores.numpy(), per_layer, signed


def spread_patches(
    values: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]
) -> np.ndarray:
    """Spread one value per patch uniformly over the patch's pixels: ``(gh·gw,) -> (H, W)``."""
    rows, cols = grid
    patch_h, patch_w = size[0] // rows, size[1] // cols
    per_pixel = values.detach().double().cpu().reshape(rows, cols) / (patch_h * patch_w)
    block = torch.ones(patch_h, patch_w, dtype=per_pixel.dtype)
    return torch.kron(per_pixel, block).numpy()
