"""
One patched forward, one backward: relevance of the target's score for AttnLRP and PA-LRP.

The backward starts from the target's score itself (gradient 1; :meth:`Target.score` of the
patched forward's logits), so ``x ⊙ grad`` at any tensor is its LRP relevance and the relevance
entering the last layer equals the score (for one output: its logit). The result
keeps token, positional and per-layer relevance separately; :func:`to_attribution` turns it
into what a method returns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.explanation import layer_table
from attrlab.attribution.methods.base import Attribution
from attrlab.attribution.methods.lrp.accounting import absorbed_by_biases
from attrlab.attribution.methods.lrp.patches import Recorder, transformer_lrp
from attrlab.attribution.methods.lrp.positional import (
    embedding_split,
    rotary_scores,
    spread_patches,
)
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.layouts import layout_for
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import lrp_conservation

__all__ = ["LRPResult", "lrp", "lrp_steps", "to_attribution"]


@dataclass
class LRPResult:
    """
    Relevance of one explained output (float64).

    Attributes:
        target_logit: The explained score (of the patched forward, equal to the model's; for
            one output its logit).
        scores: Token relevance ``Σ_d R_E`` per token (text) or pixel relevance (image, H×W).
        positional_scores: Positional relevance per token (text) or spread over each patch's
            pixels (image); signed for additive PE, the absolute-value score for RoPE.
            ``None`` when the model's positional encoding got no relevance (AttnLRP with RoPE).
        token_total: Sum of the content relevance at the input (tokens, or pixels plus the
            CLS/distillation tokens).
        positional_total: Signed sum of all positional relevance.
        prefix_relevance: Image models: content relevance of CLS/distillation tokens.
        prefix_positional: Image models: positional relevance of those tokens.
        embedding_relevance: Relevance at the embedding sum ``x0``.
        residual: Relevance entering each block's residual stream, then leaving the last one.
        residual_tokens: The same per token (float64, ``(tokens,)`` each, batch row 0): where
            in the sequence each layer's relevance sits; ``residual_tokens[i].sum()`` is
            ``residual[i]``.
        positional_per_layer: Positional relevance per layer (layer 0 = the embedding for
            additive PE; every block's cos/sin for RoPE).
        attention_balance: Per layer, when recorded: relevance on cos/sin (``"rotary"``), on
            the unrotated q/k (``"unrotated"``), on the q/k/v entering attention (``"query_key"``,
            ``"value"``) and on the attention output (``"output"``).
        probes: Relevance ``x ⊙ grad`` (float64, the tensor's shape, batch row 0) of each
            tensor asked for with ``probes`` (a module's input or output).
        bias_absorbed: What the layers with a bias kept (``account``; else ``None``).
    """

    target_logit: float
    scores: np.ndarray
    positional_scores: np.ndarray | None
    token_total: float
    positional_total: float
    prefix_relevance: float
    prefix_positional: float
    embedding_relevance: float
    residual: list[float]
    positional_per_layer: list[float]
    residual_tokens: list[np.ndarray] = field(default_factory=list)
    attention_balance: list[dict[str, float]] = field(default_factory=list)
    probes: dict[str, torch.Tensor] = field(default_factory=dict)
    bias_absorbed: float | None = None

    @property
    def softmax_absorbed(self) -> float:
        """What attention kept: its output's relevance minus what reached q, k and v."""
        return sum(
            layer["output"] - layer["value"] - layer["query_key"]
            for layer in self.attention_balance
        )


def lrp(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    pe_aware: bool,
    gamma_linear: float = 0.0,
    gamma_conv: float = 0.0,
    record: bool = False,
    attention_rule: str = "attnlrp",
    probes: Sequence[tuple[str, nn.Module, str]] = (),
    account: bool = False,
) -> LRPResult:
    """
    AttnLRP (``pe_aware=False``) or PA-LRP relevance of ``target``'s score for one input.

    The arguments are concrete (no family defaults here; see
    :func:`~attribution.methods.lrp.settings.resolve_settings`): ``gamma_linear`` /
    ``gamma_conv`` as in :func:`~attribution.methods.lrp.patches.transformer_lrp`,
    ``attention_rule`` a key of :data:`~attribution.methods.lrp.patches.ATTENTION_RULES`.
    ``probes`` names modules whose ``"input"`` or ``"output"`` relevance is also returned.
    ``account`` also measures where the relevance the input does not get went (attention,
    biases: :mod:`~attribution.methods.lrp.accounting`), in the same backward pass.

    An image and a prompt (:class:`~attribution.models.vlm.ImageTextInputs`): the relevance
    stops at the language model's first block input, where the visual features and the word
    embeddings are one sequence; the vision tower and the embedding layer get none.

    Raises:
        UnsupportedMethodError: For models without an LRP layout or with non-eager attention.
    """
    layout = layout_for(adapter)
    kwargs = dict(inputs.model_kwargs())
    pixels = None
    if inputs.attribution_layer(adapter) is None:  # pixels: the leaf of the backward pass
        dtype = next(adapter.model.parameters()).dtype
        pixels = inputs.attributed()[0].detach().to(dtype).requires_grad_(True)
        kwargs[inputs.forward_keys[0]] = pixels
    patches = transformer_lrp(
        adapter, layout, pe_aware, gamma_linear, gamma_conv, record or account, attention_rule
    )
    probed: dict[str, torch.Tensor] = {}
    with torch.enable_grad(), patches as recorder, ExitStack() as hooks:
        biases = hooks.enter_context(absorbed_by_biases(adapter.model)) if account else None
        for name, module, where in probes:
            hooks.enter_context(_probe(module, where, name, probed))
        score = _score(adapter, target, kwargs)
        named = {k: t for k, t in _graph_tensors(recorder, pixels).items() if t.requires_grad}
        named.update({f"probe.{k}": t for k, t in probed.items() if t.requires_grad})
        found = torch.autograd.grad(score, list(named.values()), allow_unused=True)
    grads = {k: g for k, g in zip(named, found, strict=True) if g is not None}
    if isinstance(inputs, ImageTextInputs) and pixels is not None:
        result = _at_block_input(recorder, grads, pixels, float(score.detach()))
    else:
        result = _assemble(adapter, recorder, grads, pixels, float(score.detach()), pe_aware)
    if biases is not None:
        result.bias_absorbed = biases.value
    for name, tensor in probed.items():
        grad = grads.get(f"probe.{name}")
        relevance = (
            torch.zeros_like(tensor, dtype=torch.float64)
            if grad is None
            else (tensor.detach().double() * grad.double())
        )
        result.probes[name] = relevance[0].cpu()
    return result


def lrp_steps(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    steps: Sequence[int],
    pe_aware: bool,
    gamma_linear: float = 0.0,
    gamma_conv: float = 0.0,
    attention_rule: str = "attnlrp",
) -> np.ndarray:
    """
    Token relevance of each of ``steps`` of ``target``: ``(len(steps), tokens)``, float64.

    Row ``r`` is what :func:`lrp` gives as ``scores`` for step ``steps[r]`` alone: one patched
    forward of the text, then one backward per step through the same graph (kept between
    them). A step's relevance needs its own backward (a row of the Jacobian), but the forward
    and its activations are shared: ``F + S·B`` rather than ``S·(F + B)``, and one input's
    activations in memory rather than ``S``. Arguments as :func:`lrp`'s.

    Raises:
        UnsupportedMethodError: as :func:`lrp`; or an image (no steps).
    """
    if isinstance(inputs, ImageTextInputs):
        return _steps_at_block_input(
            adapter, inputs, target, steps, pe_aware, gamma_linear, gamma_conv, attention_rule
        )
    if inputs.attribution_layer(adapter) is None:
        raise UnsupportedMethodError("per-step relevance is for a text's answer, not pixels")
    patches = transformer_lrp(
        adapter, layout_for(adapter), pe_aware, gamma_linear, gamma_conv, False, attention_rule
    )
    explained = target.in_logits()  # an answer's steps in logits: no LRP rule for log-softmax
    with torch.enable_grad(), patches as recorder:
        per_step = explained.step_scores(explained.outputs(adapter, **inputs.model_kwargs()))[0]
        if recorder.embedding_sum is None:
            raise UnsupportedMethodError("no relevance reached the input embedding of this model")
        if not per_step.requires_grad:
            raise UnsupportedMethodError(
                "the model's output does not depend on its input embedding"
            )
        last = len(steps) - 1
        grad = torch.cat(
            [
                torch.autograd.grad(per_step[k], recorder.embedding_sum, retain_graph=r < last)[0]
                for r, k in enumerate(steps)
            ]
        )
    token, _, _ = embedding_split(recorder, grad)
    return token.detach().double().cpu().numpy()


def _steps_at_block_input(
    adapter: Adapter,
    inputs: ImageTextInputs,
    target: Target,
    steps: Sequence[int],
    pe_aware: bool,
    gamma_linear: float,
    gamma_conv: float,
    attention_rule: str,
) -> np.ndarray:
    """:func:`lrp_steps` of an image and a prompt: relevance at the first block's input."""
    patches = transformer_lrp(
        adapter, layout_for(adapter), pe_aware, gamma_linear, gamma_conv, False, attention_rule
    )
    explained = target.in_logits()
    dtype = next(adapter.model.parameters()).dtype
    leaf = inputs.attributed()[0].detach().to(dtype).requires_grad_(True)
    kwargs = {**inputs.held_kwargs(), "block_input": leaf}
    with torch.enable_grad(), patches:
        per_step = explained.step_scores(explained.outputs(adapter, **kwargs))[0]
        last = len(steps) - 1
        grad = torch.cat(
            [
                torch.autograd.grad(per_step[k], leaf, retain_graph=r < last)[0]
                for r, k in enumerate(steps)
            ]
        )
    return (leaf.detach().double() * grad.double()).sum(-1).cpu().numpy()


def _at_block_input(
    recorder: Recorder, grads: dict[str, torch.Tensor], leaf: torch.Tensor, logit: float
) -> LRPResult:
    """
    The relevance of an image and a prompt at the first block's input (``leaf``).

    The first block's recorded input is the model's own, which ``leaf`` replaced: the
    residual stream starts at ``leaf`` instead.
    """
    if "pixels" not in grads:
        raise UnsupportedMethodError("no relevance reached the first block's input")
    scores = _token_relevance(leaf, grads["pixels"], leaf.shape[1])
    streams: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(leaf, grads["pixels"])]
    streams += [(h, grads.get(f"block.{i}")) for i, h in sorted(recorder.blocks.items()) if i]
    streams.append((recorder.last, grads.get("last")))
    residual_tokens = [_token_relevance(h, grad, leaf.shape[1]) for h, grad in streams]
    per_layer: list[float] = []
    positional_total = 0.0
    if recorder.rotary:  # what the rotary positions took, for the accounting
        _, per_layer, positional_total = rotary_scores(recorder, grads)
    return LRPResult(
        target_logit=logit,
        scores=scores,
        positional_scores=None,
        token_total=float(scores.sum()),
        positional_total=positional_total,
        prefix_relevance=0.0,
        prefix_positional=0.0,
        embedding_relevance=float(scores.sum()),
        residual=[float(r.sum()) for r in residual_tokens],
        positional_per_layer=per_layer,
        residual_tokens=residual_tokens,
        attention_balance=_attention_balance(recorder, grads),
    )


def _score(adapter: Adapter, target: Target, kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``target``'s score of the patched forward, summed over the batch rows: the seed."""
    # an answer's steps in logits: the softmax's normaliser has no LRP rule
    explained = target.in_logits()
    score = explained.score(explained.outputs(adapter, **kwargs)).sum()
    if not score.requires_grad:
        raise UnsupportedMethodError("the model's output does not depend on its input embedding")
    return score


@contextmanager
def _probe(
    module: nn.Module, where: str, name: str, into: dict[str, torch.Tensor]
) -> Iterator[None]:
    """
    Keep ``module``'s input (first argument) or output under ``name`` during the pass.

    The first call's (the forward's, should checkpointing rerun the module): see
    :class:`~attribution.methods.lrp.patches.Recorder`.
    """
    if where == "input":

        def keep_input(_m: nn.Module, args: tuple) -> None:
            into.setdefault(name, args[0])

        handle = module.register_forward_pre_hook(keep_input)
    else:

        def keep_output(_m: nn.Module, _a: tuple, out: Any) -> None:
            into.setdefault(name, out if isinstance(out, torch.Tensor) else out[0])

        handle = module.register_forward_hook(keep_output)
    try:
        yield
    finally:
        handle.remove()


def _graph_tensors(recorder: Recorder, pixels: torch.Tensor | None) -> dict[str, torch.Tensor]:
    tensors = {"embedding": recorder.embedding_sum}
    if pixels is not None:
        tensors["pixels"] = pixels
    tensors.update({f"block.{i}": h for i, h in recorder.blocks.items()})
    tensors["last"] = recorder.last
    for group in ("rotary", "unrotated", "attention"):
        for i, pair in getattr(recorder, group).items():
            tensors.update({f"{group}.{i}.{slot}": t for slot, t in enumerate(pair)})
    return {k: t for k, t in tensors.items() if isinstance(t, torch.Tensor)}


def _relevance(tensor: torch.Tensor | None, grad: torch.Tensor | None) -> float:
    if tensor is None or grad is None:
        return 0.0
    return float((tensor.detach().double() * grad.double()).sum())


def _token_relevance(
    tensor: torch.Tensor | None, grad: torch.Tensor | None, tokens: int
) -> np.ndarray:
    """``x ⊙ grad`` of a ``(B, T, D)`` tensor summed over ``D``, batch row 0 (zeros without)."""
    if tensor is None or grad is None:
        return np.zeros(tokens if tensor is None else tensor.shape[1])
    return (tensor[0].detach().double() * grad[0].double()).sum(-1).cpu().numpy()


def _assemble(
    adapter: Adapter,
    recorder: Recorder,
    grads: dict[str, torch.Tensor],
    pixels: torch.Tensor | None,
    logit: float,
    pe_aware: bool,
) -> LRPResult:
    if "embedding" not in grads:
        raise UnsupportedMethodError("no relevance reached the input embedding of this model")
    token_part, pos_part, sum_part = embedding_split(recorder, grads["embedding"])
    token, x0 = token_part[0].detach().double().cpu(), sum_part[0].detach().double().cpu()
    pos = None if pos_part is None else pos_part[0].detach().double().cpu()
    prefix = recorder.prefix_count
    streams: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [
        (h, grads.get(f"block.{i}")) for i, h in sorted(recorder.blocks.items())
    ]
    streams.append((recorder.last, grads.get("last")))
    tokens = grads["embedding"].shape[1]  # the stream's length should a tensor be missing
    residual_tokens = [_token_relevance(h, grad, tokens) for h, grad in streams]
    residual = [float(r.sum()) for r in residual_tokens]
    positional_scores, per_layer, pos_total = None, [], 0.0
    if pos is not None:
        positional_scores, per_layer, pos_total = pos.numpy(), [float(pos.sum())], float(pos.sum())
    if recorder.rotary:
        positional_scores, per_layer, pos_total = rotary_scores(recorder, grads)
    if pixels is not None:
        image = (pixels.detach().double() * grads["pixels"].double()).sum(1)[0].cpu().numpy()
        size = (image.shape[0], image.shape[1])
        if pos is not None:
            grid = getattr(adapter, "patch_grid", None) or _square_grid(len(pos) - prefix)
            positional_scores = spread_patches(pos[prefix:], grid, size)
        scores, prefix_relevance = image, float(token[:prefix].sum())
        prefix_positional = 0.0 if pos is None else float(pos[:prefix].sum())
        token_total = float(image.sum()) + prefix_relevance
    else:
        scores, prefix_relevance, prefix_positional = token.numpy(), 0.0, 0.0
        token_total = float(token.sum())
    return LRPResult(
        target_logit=logit,
        scores=scores,
        positional_scores=positional_scores if pe_aware else None,
        token_total=token_total,
        positional_total=pos_total,
        prefix_relevance=prefix_relevance,
        prefix_positional=prefix_positional,
        embedding_relevance=float(x0.sum()),
        residual=residual,
        positional_per_layer=per_layer,
        residual_tokens=residual_tokens,
        attention_balance=_attention_balance(recorder, grads),
    )


def _square_grid(patches: int) -> tuple[int, int]:
    side = round(patches**0.5)
    return side, side


def _attention_balance(
    recorder: Recorder, grads: dict[str, torch.Tensor]
) -> list[dict[str, float]]:
    def total(group: str, i: int, slots: tuple[int, ...]) -> float:
        tensors = getattr(recorder, group).get(i, ())
        return sum(
            _relevance(tensors[s], grads.get(f"{group}.{i}.{s}")) for s in slots if s < len(tensors)
        )

    return [
        {
            "rotary": total("rotary", i, (0, 1)),
            "unrotated": total("unrotated", i, (0, 1)),
            "query_key": total("attention", i, (0, 1)),
            "value": total("attention", i, (2,)),
            "output": total("attention", i, (3,)),
        }
        for i in sorted(recorder.attention)
    ]


def to_attribution(result: LRPResult, pe_aware: bool) -> Attribution:
    """
    Scores, per-layer table and metrics of one LRP run.

    ``metrics.conservation_error`` is ``|Σ input relevance − logit| / |logit|`` where the
    input relevance is the token share (AttnLRP) or token plus positional share (PA-LRP);
    ``metrics.convergence_delta`` is the signed ``Σ input relevance − logit``. A run with
    ``account`` also gives where the rest went (``positional_absorbed`` for AttnLRP,
    ``softmax_absorbed``, ``bias_absorbed``), ``unaccounted_relevance`` (the logit minus the
    input relevance and those parts) and the verdict on it
    (:func:`~attribution.verdicts.lrp_conservation`).
    """
    total = result.token_total + (result.positional_total if pe_aware else 0.0)
    metrics = {
        "conservation_error": abs(total - result.target_logit)
        / max(abs(result.target_logit), 1e-12),
        "convergence_delta": total - result.target_logit,
        "input_relevance": total,
        "token_relevance": result.token_total,
        "target_logit": result.target_logit,
    }
    rows = [
        (i, None, None, "block", "residual_relevance", r) for i, r in enumerate(result.residual)
    ]
    maps = {}
    if result.prefix_relevance or result.prefix_positional:
        metrics["cls_relevance"] = result.prefix_relevance
    if pe_aware:
        metrics["positional_relevance"] = result.positional_total
        if result.prefix_positional:
            metrics["cls_positional_relevance"] = result.prefix_positional
        rows += [
            (i, None, None, "position", "positional_relevance", r)
            for i, r in enumerate(result.positional_per_layer)
        ]
        if result.positional_scores is not None:
            maps["combined"] = result.scores + result.positional_scores
    verdicts = []
    if result.bias_absorbed is not None:
        parts = {
            "positional_absorbed": 0.0 if pe_aware else result.positional_total,
            "softmax_absorbed": result.softmax_absorbed,
            "bias_absorbed": result.bias_absorbed,
        }
        metrics.update(parts)
        metrics["unaccounted_relevance"] = result.target_logit - total - sum(parts.values())
        verdicts.append(lrp_conservation(metrics))
    return Attribution(
        scores=result.scores,
        positional_scores=result.positional_scores if pe_aware else None,
        layers=layer_table(rows),
        maps=maps,
        metrics=metrics,
        verdicts=verdicts,
    )
