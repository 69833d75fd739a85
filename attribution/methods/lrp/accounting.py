"""
Where an LRP run's relevance goes, measured during its one backward pass.

AttnLRP does not hand the whole logit to the input: by the rules' design a bias keeps its share
of a linear layer's or a LayerNorm's relevance (with LRP-γ, its stabiliser too), attention's
softmax keeps what its linearisation (or the CP rule) does not pass to q, k and v, and AttnLRP
leaves the positional encodings' share out of its map. :func:`absorbed_by_biases` measures the
first at every layer with a bias, as its output's relevance minus what reaches its own input;
the relevance run measures the others. What no part accounts for is the check: rounding, or a
rule that loses relevance where it should not (``tests/test_conservation.py`` computes the same
balance independently, in float64).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from attrlab.attribution.methods.lrp.rules import with_backward

__all__ = ["BiasRelevance", "absorbed_by_biases", "has_bias"]


@dataclass
class BiasRelevance:
    """The relevance absorbed at the layers with a bias, summed as the backward pass goes."""

    total: torch.Tensor | None = None

    def add(self, relevance: torch.Tensor) -> None:
        """Add ``relevance`` (a float64 scalar tensor; kept on its device until read)."""
        self.total = relevance if self.total is None else self.total + relevance

    @property
    def value(self) -> float:
        """The sum so far (0 before any layer was reached)."""
        return 0.0 if self.total is None else float(self.total)


def has_bias(module: nn.Module) -> bool:
    """A linear layer, convolution (GPT-2's ``Conv1D`` too) or LayerNorm with a bias."""
    affine = isinstance(module, nn.Linear | nn.Conv2d | nn.LayerNorm)
    return (affine or type(module).__name__ == "Conv1D") and isinstance(
        getattr(module, "bias", None), torch.Tensor
    )


def _relevance(tensor: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return (tensor.double() * grad.double()).sum()


@contextmanager
def absorbed_by_biases(model: nn.Module) -> Iterator[BiasRelevance]:
    """
    Measure, while the block runs, what each layer with a bias keeps of its relevance.

    Each such layer's input is replaced by an alias (the same values) that only this layer
    reads, so the gradient there is the layer's own rule; the layer keeps
    ``Σ output ⊙ grad − Σ alias ⊙ grad``. Enter it after the LRP rules, whose hooks must see
    the alias and replace the output first. Hooks are removed on exit, also on error.

    The values read in the backward pass are saved tensors of an identity step
    (:func:`~attribution.methods.lrp.rules.with_backward`), not captured by a hook, so that
    gradient checkpointing can drop them after the forward; a recomputed block builds the
    same steps, whose backward never runs.
    """
    absorbed = BiasRelevance()

    def observed(x: torch.Tensor, sign: float) -> torch.Tensor:
        def vjp(grad: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            absorbed.add(sign * _relevance(values, grad))
            return grad

        return with_backward(x, x, vjp, x.detach())

    def alias(_module: nn.Module, args: tuple) -> tuple | None:
        if not args or not isinstance(args[0], torch.Tensor) or not args[0].requires_grad:
            return None
        return (observed(args[0], -1.0), *args[1:])

    def output(_module: nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            return observed(out, 1.0)
        return None

    with ExitStack() as stack:
        for module in model.modules():
            if has_bias(module):
                stack.callback(module.register_forward_pre_hook(alias).remove)
                stack.callback(module.register_forward_hook(output).remove)
        yield absorbed
