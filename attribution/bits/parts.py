"""
The parts of a model that weight-only quantisation acts on, the quantiser, and its undo.

A *part* is a set of weight matrices quantised together: per block, the attention's
projections together (``attention``), the MLP's together (``mlp``) and each projection alone
(``projection``); the token embeddings (``embeddings``); the head (``head``: the unembedding,
or a classifier's layers after the blocks). A head tied to the embeddings is one matrix: the
``embeddings`` part then holds it and no ``head`` part is listed.

The quantiser is round-to-nearest, asymmetric (a scale and a zero point per group of weights,
the range stretched to hold 0, as torchao's ``MappingType.ASYMMETRIC``), per output channel or
group-wise along the input axis (:data:`GROUP_SIZE` weights a group), at any bit width: torchao's
affine primitives (``choose_qparams_affine``, ``quantize_affine``, ``dequantize_affine``), which
run on CPU and GPU alike, quantise and dequantise back into the weight's dtype (fake
quantisation: the forward is the model's own, with the rounded weights).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torchao.quantization.quant_primitives import (
    MappingType,
    choose_qparams_affine,
    dequantize_affine,
    quantize_affine,
)

from attrlab.attribution.alteration import altered
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.layouts import layout_for
from attrlab.attribution.request.defaults import GROUP_SIZE

__all__ = [
    "PART_KINDS",
    "QuantCache",
    "Scheme",
    "WeightPart",
    "fake_quantised",
    "quantisable_parts",
    "quantised",
]

#: The kinds of part, in table order.
PART_KINDS = ("attention", "mlp", "projection", "embeddings", "head")


@dataclass(frozen=True)
class Scheme:
    """
    A weight-only quantisation: ``bits`` per weight, per output channel or per group.

    Attributes:
        bits: Bit width (2 to 16).
        group_size: Weights per group along the input axis; ``None``: one group per output
            channel (a row of the weight).
    """

    bits: int
    group_size: int | None = GROUP_SIZE

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 16:
            raise InvalidParameterError(f"bit widths are 2 to 16; got {self.bits}")
        if self.group_size is not None and self.group_size < 1:
            raise InvalidParameterError(f"a group holds at least 1 weight; got {self.group_size}")

    @property
    def label(self) -> str:
        """``per_channel`` or ``group32``."""
        return "per_channel" if self.group_size is None else f"group{self.group_size}"


@dataclass(frozen=True)
class WeightPart:
    """
    Weight matrices quantised together.

    Attributes:
        name: ``layers.3.attention``, ``layers.3.self_attn.q_proj``, ``embeddings``, ``head``.
        kind: One of :data:`PART_KINDS`.
        layer: The block, for the parts inside one.
        modules: The dotted names of the modules whose ``weight`` is quantised.
        parameters: How many weights.
    """

    name: str
    kind: str
    layer: int | None
    modules: tuple[str, ...]
    parameters: int


def _matrix_modules(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """Linear layers, GPT-2's ``Conv1D`` and convolutions under ``module``, by dotted name."""
    return [
        (f"{prefix}.{name}" if prefix else name, m)
        for name, m in module.named_modules()
        if isinstance(m, nn.Linear | nn.Conv2d) or type(m).__name__ == "Conv1D"
    ]


def _size(model: nn.Module, names: Sequence[str]) -> int:
    return sum(model.get_submodule(n).get_parameter("weight").numel() for n in names)


def quantisable_parts(adapter: Adapter, kinds: Sequence[str] | None = None) -> list[WeightPart]:
    """
    The parts of ``adapter``'s model of ``kinds`` (``None``: every kind), in table order.

    Raises:
        InvalidParameterError: an unknown kind.
        UnsupportedMethodError: a model whose blocks attrlab does not know.
    """
    chosen = PART_KINDS if kinds is None else tuple(dict.fromkeys(kinds))
    unknown = [k for k in chosen if k not in PART_KINDS]
    if unknown:
        raise InvalidParameterError(
            f"unknown part kind(s) {', '.join(unknown)}; choose from {', '.join(PART_KINDS)}"
        )
    model = adapter.model
    layout = layout_for(adapter)
    names = {id(m): n for n, m in model.named_modules()}
    attention_path = layout.attention_linears or layout.attention
    found: list[WeightPart] = []
    inside: set[str] = set()
    for layer, block in enumerate(adapter.blocks()):
        prefix = names[id(block)]
        matrices = [n for n, _ in _matrix_modules(block, prefix)]
        inside.update(matrices)
        attention = [n for n in matrices if n.startswith(f"{prefix}.{attention_path}.")]
        mlp = [n for n in matrices if n not in attention]
        for kind, members in (("attention", attention), ("mlp", mlp)):
            if kind in chosen and members:
                name = f"layers.{layer}.{kind}"
                found.append(WeightPart(name, kind, layer, tuple(members), _size(model, members)))
        if "projection" in chosen:
            found += [
                WeightPart(
                    f"layers.{layer}.{n.removeprefix(prefix + '.')}",
                    "projection",
                    layer,
                    (n,),
                    _size(model, [n]),
                )
                for n in matrices
            ]
    embedding = adapter.token_embedding_module()  # refused where the model has none
    embedding_name = names[id(embedding)]
    head = [
        (n, m)
        for n, m in _matrix_modules(model, "")
        if n not in inside and m.get_parameter("weight") is not embedding.get_parameter("weight")
    ]
    if "embeddings" in chosen:
        found.append(
            WeightPart(
                "embeddings", "embeddings", None, (embedding_name,), _size(model, [embedding_name])
            )
        )
    if "head" in chosen and head:
        members = [n for n, _ in head]
        found.append(WeightPart("head", "head", None, tuple(members), _size(model, members)))
    return found


def fake_quantised(weight: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """
    ``weight`` rounded to ``scheme`` and dequantised into its own dtype, by torchao.

    Rows are output channels (``(out, in)``, a convolution's filters flattened); GPT-2's
    ``Conv1D`` stores ``(in, out)``: pass it transposed.
    """
    matrix = weight.detach().reshape(weight.shape[0], -1).float()
    columns = matrix.shape[1]
    group = columns if scheme.group_size is None else scheme.group_size
    padded = -columns % group
    if padded:  # zeros: inside every asymmetric range, so no group's scale moves
        matrix = torch.nn.functional.pad(matrix, (0, padded))
    block = (1, group)
    low, high = 0, 2**scheme.bits - 1
    scale, zero = choose_qparams_affine(
        matrix, MappingType.ASYMMETRIC, block, torch.int32, quant_min=low, quant_max=high
    )
    codes = quantize_affine(matrix, block, scale, zero, torch.int32, low, high)
    restored = dequantize_affine(codes, block, scale, zero, torch.int32, low, high)
    return restored[:, :columns].reshape(weight.shape).to(weight.dtype)


def _stored_as_input_first(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D"


class QuantCache:
    """
    Each module's quantised weight per scheme, computed once (on the weight's device).

    The sensitivity table and the allocations reuse them: a module quantised at a width for
    one part (a projection, its attention) is the same tensor for every other.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._weights: dict[tuple[str, Scheme], torch.Tensor] = {}

    def weight(self, module_name: str, scheme: Scheme) -> torch.Tensor:
        """``module_name``'s weight quantised to ``scheme``."""
        key = (module_name, scheme)
        if key not in self._weights:
            module = self.model.get_submodule(module_name)
            weight = module.get_parameter("weight").detach()
            if _stored_as_input_first(module):
                self._weights[key] = fake_quantised(weight.T, scheme).T.contiguous()
            else:
                self._weights[key] = fake_quantised(weight, scheme)
        return self._weights[key]

    def __len__(self) -> int:
        return len(self._weights)


@contextmanager
def quantised(
    model: nn.Module, assignment: Mapping[WeightPart, Scheme], cache: QuantCache
) -> Iterator[None]:
    """
    Hold ``model`` with each part's weights replaced by their quantised copies.

    Each weight's storage is swapped for the cached copy and swapped back on exit (also on an
    error): the original tensors are never written, so the model is bit-identical afterwards.
    A module in two parts takes the last part's scheme.
    """
    schemes = {m: s for part, s in assignment.items() for m in part.modules}
    with altered(model), ExitStack() as stack, torch.no_grad():
        for name, scheme in schemes.items():
            parameter = model.get_submodule(name).get_parameter("weight")
            original = parameter.data
            parameter.data = cache.weight(name, scheme)

            def restore(parameter: nn.Parameter = parameter, data: torch.Tensor = original) -> None:
                parameter.data = data

            stack.callback(restore)
        yield
