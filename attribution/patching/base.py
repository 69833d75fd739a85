"""
What every patching estimator shares: the problem, the components, the runs and their hooks.

A :class:`PatchingProblem` holds a clean input, a corrupted one (the same token length: IOI with
the second name swapped) or Gaussian noise on chosen tokens' embeddings (causal tracing, Meng et
al. 2022, https://arxiv.org/abs/2202.05262), and a target, usually a contrast (" Mary" rather
than " John"), read as ``target.score(target.outputs(adapter, ...))``.

Components (:data:`COMPONENTS`) are where an activation is read and written, per layer: the
residual stream entering each block, the attention and MLP outputs (each per position), and each
attention head's output at the output projection's input (over all positions, or per
position; under grouped-query attention the query heads, with the key/value head each shares).

Two directions (:data:`DIRECTIONS`): denoising runs the corrupted input with clean activations
patched in, noising the clean input with corrupted ones. Every result is read on one scale,
``(patched − corrupted) / (clean − corrupted)``: 0 is the corrupted score, 1 the clean one; the
raw scores are kept beside it.

Every hook here is registered on an :class:`~contextlib.ExitStack` and removed when its
``with`` block ends, normally or by an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from attrlab.attribution.answers import Answer, answer_inputs, answer_request, prompt_inputs
from attrlab.attribution.compat import register_attention
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.layers.analysis import ModelParts, checked_target
from attrlab.attribution.methods._routing import eager_attention, route_attention, route_of
from attrlab.attribution.models.base import Adapter, TextInputs, text_adapter
from attrlab.attribution.perturb import repeated
from attrlab.attribution.target import AnswerTarget, ContrastTarget, Target

__all__ = [
    "COLUMNS",
    "COMPONENTS",
    "DIRECTIONS",
    "MAX_SEEDS",
    "Activations",
    "Component",
    "GaussianNoise",
    "PatchingProblem",
    "Pattern",
    "Run",
    "Runs",
    "Scale",
    "check_components",
    "check_directions",
    "edited",
    "noised",
    "patching_problem",
    "recorded",
    "recorded_patterns",
    "scale_of",
    "site_masks",
    "site_sums",
    "table",
]

#: Most noise draws a causal-tracing corruption averages over.
MAX_SEEDS = 64


@dataclass(frozen=True)
class Component:
    """
    A kind of activation that is patched, one site at a time.

    Attributes:
        name: Its ``component`` in the tables.
        description: What it is, for people.
        per_head: Sites are heads (the output projection's input, split by head).
        per_position: Sites are token positions (with ``per_head``: a head at a position).
    """

    name: str
    description: str
    per_head: bool
    per_position: bool


#: Every component, in table order.
COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component("residual", "the residual stream entering each block, per position", False, True),
        Component("attention", "the attention output of each block, per position", False, True),
        Component("mlp", "the MLP output of each block, per position", False, True),
        Component("head", "each attention head's output at every position", True, False),
        Component("head_position", "each attention head's output at one position", True, True),
    )
}

#: ``denoising``: clean activations into the corrupted run; ``noising``: the reverse.
DIRECTIONS = ("denoising", "noising")

#: Columns of a patching table: one row per estimator, direction, component and site. ``head``
#: and ``kv_head`` are null on whole-layer components, ``position`` and ``token`` on ``head``.
COLUMNS = (
    "estimator",
    "direction",
    "component",
    "layer",
    "head",
    "kv_head",
    "position",
    "token",
    "effect",
    "patched",
    "normalised",
)


@dataclass(frozen=True)
class GaussianNoise:
    """
    Causal tracing's corruption: Gaussian noise on the token embeddings at ``positions``.

    Meng et al. 2022 (https://arxiv.org/abs/2202.05262): noise of standard deviation ``scale``
    times that of the embeddings (here the standard deviation of all entries of the model's
    token-embedding matrix), one draw per seed; every score of the corrupted run is the mean
    over the draws. Draw ``i`` comes from a generator seeded with ``seed + i``.

    Attributes:
        positions: Token positions whose embeddings are corrupted (the subject's tokens).
        seeds: How many draws are averaged.
        scale: Noise standard deviation in units of the embeddings' standard deviation.
        seed: Seed of the first draw.
    """

    positions: tuple[int, ...]
    seeds: int = 10
    scale: float = 3.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.positions or len(set(self.positions)) != len(self.positions):
            raise InvalidParameterError(
                f"noise needs at least one token position, each once; got {self.positions!r}"
            )
        if not 1 <= self.seeds <= MAX_SEEDS:
            raise InvalidParameterError(f"noise takes 1 to {MAX_SEEDS} seeds; got {self.seeds}")
        if not self.scale > 0:
            raise InvalidParameterError(f"the noise scale must be positive; got {self.scale}")

    def draws(self, adapter: Adapter, tokens: int) -> torch.Tensor:
        """
        The noise added to the token embeddings: ``(seeds, tokens, D)``, zero off ``positions``.

        Raises:
            InvalidInputError: a position outside the input.
        """
        outside = [p for p in self.positions if not 0 <= p < tokens]
        if outside:
            raise InvalidInputError(
                f"noise position(s) {outside} are outside the input's {tokens} tokens "
                f"(0..{tokens - 1})"
            )
        weight = adapter.token_embedding_module().weight
        assert isinstance(weight, torch.Tensor)
        std = float(weight.detach().double().std())
        noise = torch.zeros(self.seeds, tokens, weight.shape[1], dtype=torch.float64)
        for draw in range(self.seeds):
            generator = torch.Generator().manual_seed(self.seed + draw)
            values = torch.randn(len(self.positions), weight.shape[1], generator=generator)
            noise[draw, list(self.positions)] = values.double() * self.scale * std
        return noise.to(device=weight.device, dtype=weight.dtype)


@dataclass(frozen=True)
class PatchingProblem:
    """
    A clean input, its corruption and the target read on both.

    Exactly one of ``corrupted`` (another input of the same token length) and ``noise``
    (:class:`GaussianNoise` on the clean input) is given.
    """

    clean: TextInputs
    target: Target
    corrupted: TextInputs | None = None
    noise: GaussianNoise | None = None

    def check(self, adapter: Adapter) -> None:
        """
        Refuse a problem patching cannot pair position by position, naming what differs.

        Raises:
            InvalidInputError: both or neither corruption, token lengths or answers that
                differ, a target the inputs do not hold, noise outside the input.
            UnsupportedMethodError: a contrast whose alternative needs a sequence of its own.
        """
        if (self.corrupted is None) == (self.noise is None):
            raise InvalidInputError(
                "give a corrupted input or Gaussian noise on the clean one, exactly one of them"
            )
        checked_target(adapter, self.clean, self.target)
        clean_length = int(self.clean.input_ids.shape[1])
        if self.corrupted is not None:
            corrupted_length = int(self.corrupted.input_ids.shape[1])
            if corrupted_length != clean_length:
                raise InvalidInputError(
                    f"the clean input has {clean_length} tokens and the corrupted one "
                    f"{corrupted_length}: patching pairs their positions, so both need the same "
                    "length (swap a word for one of as many tokens)"
                )
            if self.corrupted.answer_length != self.clean.answer_length:
                raise InvalidInputError(
                    "the clean and corrupted inputs hold answers of different lengths: build "
                    "both with the same answer (patching_problem)"
                )
        else:
            assert self.noise is not None
            self.noise.draws(adapter, clean_length)  # the range check


def patching_problem(
    adapter: Adapter,
    clean: str,
    corrupted: str | None = None,
    answer: str | None = None,
    contrast: str | None = None,
    noise: GaussianNoise | None = None,
) -> PatchingProblem:
    """
    The problem of two prompts (or one and noise) and an answer, as every front end builds it.

    The target is ``answer`` (default: the model's next token after ``clean``), or ``answer``
    rather than ``contrast``; both prompts are followed by the same answer tokens.

    Raises:
        InvalidInputError: as :func:`~attribution.answers.answer_request` and
            :meth:`PatchingProblem.check`.
    """
    clean_inputs, target = answer_request(adapter, clean, answer=answer, contrast=contrast)
    corrupted_inputs = None
    if corrupted is not None:
        held = target.answer if isinstance(target, ContrastTarget) else target
        assert isinstance(held, AnswerTarget)
        prompt = prompt_inputs(adapter, corrupted)
        corrupted_inputs = answer_inputs(adapter, prompt, Answer(held.tokens, held.label))
    problem = PatchingProblem(clean_inputs, target, corrupted_inputs, noise)
    problem.check(adapter)
    return problem


def check_components(components: Sequence[str] | None) -> list[str]:
    """
    The components asked for (all by default), each once.

    Raises:
        InvalidParameterError: an unknown name.
    """
    chosen = list(COMPONENTS) if components is None else list(dict.fromkeys(components))
    unknown = [c for c in chosen if c not in COMPONENTS]
    if unknown or not chosen:
        raise InvalidParameterError(
            f"unknown component(s) {', '.join(map(repr, unknown)) or '(none given)'}; choose "
            f"from {', '.join(COMPONENTS)}"
        )
    return chosen


def check_directions(directions: Sequence[str] | None) -> list[str]:
    """
    The directions asked for (both by default), each once.

    Raises:
        InvalidParameterError: an unknown name.
    """
    chosen = list(DIRECTIONS) if directions is None else list(dict.fromkeys(directions))
    unknown = [d for d in chosen if d not in DIRECTIONS]
    if unknown or not chosen:
        raise InvalidParameterError(
            f"unknown direction(s) {', '.join(map(repr, unknown)) or '(none given)'}; choose "
            f"from {', '.join(DIRECTIONS)}"
        )
    return chosen


#: A site: a token position (``None``: every position) and a head (``None``: every feature).
Site = tuple[int | None, int | None]


@dataclass(frozen=True)
class Run:
    """
    One side of the problem: an input and, for the noised side, its noise draws.

    Attributes:
        inputs: The input (one row).
        noise: ``(rows, T, D)`` added to its token embeddings, or ``None`` (one row).
    """

    inputs: TextInputs
    noise: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        """How many forwards one pass of this side takes (the noise draws)."""
        return 1 if self.noise is None else int(self.noise.shape[0])

    def kwargs(self, rows: int) -> dict[str, torch.Tensor]:
        """The model's keywords for ``rows`` copies of the input."""
        return {k: repeated(v, rows) for k, v in self.inputs.model_kwargs().items()}


@dataclass
class Runs:
    """
    The model's parts and both sides of a problem, found once per report.

    Attributes:
        adapter: The model.
        parts: Its blocks, output projections and MLP outputs.
        problem: What is patched.
        clean: The clean side.
        corrupted: The corrupted side (the clean input with noise, or the corrupted input).
        tokens: The clean input's token texts (the ``token`` column).
    """

    adapter: Adapter
    parts: ModelParts
    problem: PatchingProblem
    clean: Run
    corrupted: Run
    tokens: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, adapter: Adapter, problem: PatchingProblem) -> Runs:
        """
        Check ``problem`` and find the model's parts.

        Raises:
            InvalidInputError, UnsupportedMethodError: as :meth:`PatchingProblem.check`, or a
                model without the parts patching reaches (not a transformer attrlab knows).
        """
        text_adapter(adapter)
        problem.check(adapter)
        parts = ModelParts.of(adapter)
        clean = Run(problem.clean)
        if problem.noise is not None:
            draws = problem.noise.draws(adapter, int(problem.clean.input_ids.shape[1]))
            corrupted = Run(problem.clean, draws)
        else:
            assert problem.corrupted is not None
            corrupted = Run(problem.corrupted)
        return cls(adapter, parts, problem, clean, corrupted, list(problem.clean.token_texts))

    @property
    def layers(self) -> int:
        """Transformer blocks."""
        return len(self.parts.blocks)

    @property
    def heads(self) -> int:
        """Query heads per block."""
        return self.parts.heads

    @property
    def length(self) -> int:
        """Tokens of each input."""
        return int(self.problem.clean.input_ids.shape[1])

    def sides(self, direction: str) -> tuple[Run, Run]:
        """``(destination, source)``: the run patched into, and the one patched from."""
        if direction == "denoising":
            return self.corrupted, self.clean
        return self.clean, self.corrupted

    def sites(self, component: str) -> list[Site]:
        """Every site of ``component`` in one layer, in table order."""
        kind = COMPONENTS[component]
        positions: list[int | None] = list(range(self.length)) if kind.per_position else [None]
        heads: list[int | None] = list(range(self.heads)) if kind.per_head else [None]
        return [(position, head) for head in heads for position in positions]

    def score(self, run: Run, rows: int | None = None) -> torch.Tensor:
        """The target's score of each row of ``run`` (with its noise), ``(rows,)``."""
        rows = run.rows if rows is None else rows
        target = self.problem.target
        with noised(self.adapter, run.noise):
            return target.score(target.outputs(self.adapter, **run.kwargs(rows)))

    def side_name(self, run: Run) -> str:
        """``"clean"`` or ``"corrupted"``: which side ``run`` is."""
        return "clean" if run is self.clean else "corrupted"

    def row(
        self,
        component: str,
        layer: int,
        site: Site,
        scale: Scale,
        effect: float,
        magnitude: bool = False,
    ) -> tuple:
        """
        One table row (without the estimator and direction) of an effect on the scale.

        ``magnitude``: the effect is an estimate of ``|effect|`` (AtP*): no patched score, and
        the normalised value is its share of ``|clean − corrupted|``.
        """
        position, head = site
        patched = float("nan") if magnitude else scale.destination + effect
        normalised = effect / abs(scale.gap) if magnitude else scale.normalise(patched)
        return (
            component,
            layer,
            head,
            None if head is None else self.adapter.kv_head(head),
            position,
            None if position is None else self.tokens[position],
            effect,
            patched,
            normalised,
        )


@dataclass(frozen=True)
class Scale:
    """
    The target's score on both sides, and the normalised scale built on them.

    Attributes:
        clean: Score of the clean input.
        corrupted: Score of the corrupted side (the mean over noise draws).
        destination: Score of the side patched into (the direction's baseline).
    """

    clean: float
    corrupted: float
    destination: float

    @property
    def gap(self) -> float:
        """``clean − corrupted``."""
        return self.clean - self.corrupted

    def normalise(self, score: float) -> float:
        """``(score − corrupted) / (clean − corrupted)``: 0 corrupted, 1 clean."""
        return (score - self.corrupted) / (self.clean - self.corrupted)


def scale_of(clean: float, corrupted: float, direction: str) -> Scale:
    """
    The normalised scale of one direction.

    Raises:
        InvalidInputError: the corruption does not change the target's score.
    """
    gap = clean - corrupted
    if not abs(gap) > 1e-6 * max(1.0, abs(clean)):
        raise InvalidInputError(
            f"the corruption leaves the target's score as it was ({clean:.6g} clean, "
            f"{corrupted:.6g} corrupted): there is nothing for patching to restore; corrupt "
            "the token the answer depends on"
        )
    return Scale(clean, corrupted, clean if direction == "noising" else corrupted)


@contextmanager
def noised(adapter: Adapter, noise: torch.Tensor | None) -> Iterator[None]:
    """
    ``noise`` ``(rows, T, D)`` added to the token embeddings of the passes inside.

    A batch of ``k·rows`` rows gets draw ``r % rows`` in row ``r``.
    """
    if noise is None:
        yield
        return

    def add(_m: nn.Module, _a: tuple, out: torch.Tensor) -> torch.Tensor:
        draws = noise.to(out.dtype)
        index = torch.arange(out.shape[0], device=out.device) % draws.shape[0]
        return out + draws[index]

    handle = adapter.token_embedding_module().register_forward_hook(add)
    try:
        yield
    finally:
        handle.remove()


#: ``(B, T, F)`` activation -> the activation the model goes on with.
Edit = Callable[[torch.Tensor], torch.Tensor]


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def edited(parts: ModelParts, component: str, layer: int, edit: Edit) -> Iterator[None]:
    """
    ``edit`` applied to ``component``'s activation ``(B, T, F)`` of ``layer`` in the passes inside.

    The residual stream at the block's input, the attention and MLP outputs at their last
    linear layer's output, heads at the output projection's input (``F`` = heads × head size).
    """
    with ExitStack() as stack:
        if component == "residual":

            def block_input(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
                hidden = edit(_hidden(args, kwargs))
                if args:
                    return (hidden, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": hidden}

            block = parts.blocks[layer]
            stack.callback(block.register_forward_pre_hook(block_input, with_kwargs=True).remove)
        elif COMPONENTS[component].per_head:

            def heads_input(_m: nn.Module, args: tuple) -> tuple:
                return (edit(args[0]), *args[1:])

            projection = parts.projections[layer]
            stack.callback(projection.register_forward_pre_hook(heads_input).remove)
        else:

            def output(_m: nn.Module, _a: tuple, out: Any) -> Any:
                if isinstance(out, torch.Tensor):
                    return edit(out)
                return (edit(out[0]), *out[1:])

            module = parts.projections[layer] if component == "attention" else parts.mlps[layer]
            stack.callback(module.register_forward_hook(output).remove)
        yield


#: ``(component, layer)`` -> an activation ``(rows, T, F)``.
Activations = dict[tuple[str, int], torch.Tensor]


@contextmanager
def recorded(
    parts: ModelParts, components: Sequence[str], keep_graph: bool = False
) -> Iterator[Activations]:
    """
    Every activation of ``components`` in every layer, kept during the pass inside.

    ``keep_graph``: the activations stay in the autograd graph (a gradient pass reads their
    gradients); one that does not require a gradient is made a leaf that does.
    """
    seen: Activations = {}
    with ExitStack() as stack:
        for component in dict.fromkeys(components):
            for layer in range(len(parts.blocks)):

                def keep(
                    x: torch.Tensor, key: tuple[str, int] = (component, layer)
                ) -> torch.Tensor:
                    if not keep_graph:
                        seen[key] = x.detach()
                        return x
                    if not x.requires_grad:
                        x = x.detach().requires_grad_(True)
                    seen[key] = x
                    return x

                stack.enter_context(edited(parts, component, layer, keep))
        yield seen


def site_masks(
    sites: Sequence[Site], length: int, features: int, heads: int, device: torch.device
) -> torch.Tensor:
    """Bool ``(len(sites), T, F)``: where each site's activation lies."""
    positions = torch.zeros(len(sites), length, dtype=torch.bool)
    columns = torch.zeros(len(sites), features, dtype=torch.bool)
    size = features // heads
    for row, (position, head) in enumerate(sites):
        positions[row, slice(None) if position is None else position] = True
        columns[row, slice(None) if head is None else slice(head * size, (head + 1) * size)] = True
    return (positions[:, :, None] & columns[:, None, :]).to(device)


def site_sums(values: torch.Tensor, sites: Sequence[Site], heads: int) -> torch.Tensor:
    """
    Per-element contributions ``(rows, T, F)`` summed over each site's part.

    Returns:
        ``(rows, len(sites))`` float64.
    """
    masks = site_masks(sites, values.shape[1], values.shape[2], heads, values.device)
    return torch.einsum("rtf,stf->rs", values.double(), masks.double())


def table(rows: Sequence[tuple]) -> pd.DataFrame:
    """The long table of :data:`COLUMNS`, heads and positions as nullable integers."""
    frame = pd.DataFrame.from_records(list(rows), columns=list(COLUMNS))
    for column in ("layer", "head", "kv_head", "position"):
        frame[column] = frame[column].astype("Int64")
    return frame


#: Name under which the pattern-recording attention is registered with transformers.
_RECORDING = "attrlab_patching_record"

#: Per layer: the attention pattern ``(rows, H, T, T)`` and values per query head ``(rows, H,
#: T, d)`` of a pass.
Pattern = dict[int, tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class _Route:
    eager: Callable[..., Any]
    layer: int
    into: Pattern


def _recording_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs
) -> Any:
    """The family's eager attention, keeping its pattern and values (repeated per query head)."""
    route: _Route = route_of(module, _RECORDING)
    output, weights = route.eager(module, query, key, value, *args, **kwargs)
    groups = weights.shape[1] // value.shape[1]  # grouped-query attention: one v per group
    route.into[route.layer] = (weights.detach(), value.detach().repeat_interleave(groups, dim=1))
    return output, weights


register_attention(_RECORDING, _recording_attention)


@contextmanager
def recorded_patterns(runs: Runs) -> Iterator[Pattern]:
    """Each layer's attention pattern and values during the passes inside."""
    seen: Pattern = {}
    with ExitStack() as stack:
        for layer, attention in enumerate(runs.adapter.attention_modules()):
            route = _Route(eager_attention(attention), layer, seen)
            stack.enter_context(route_attention(attention, _RECORDING, route))
        yield seen
