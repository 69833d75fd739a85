"""
The problem patching studies: a clean input, its corruption and the target read on both.

A :class:`PatchingProblem` holds a clean input, a corrupted one (the same token length: IOI with
the second name swapped; for a vision-language model the same prompt with a corrupted image,
:mod:`~attribution.patching.image`) or Gaussian noise on chosen tokens' embeddings (causal
tracing, Meng et al. 2022, https://arxiv.org/abs/2202.05262), and a target, usually a contrast
(" Mary" rather than " John"), read as ``target.score(target.outputs(adapter, ...))``.
:class:`Runs` is a checked problem on one model: its two sides and the model's parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.inputs.perturb import repeated
from attrlab.attribution.layers.analysis import ModelParts, checked_target
from attrlab.attribution.models.base import Adapter, TextInputs, text_adapter
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.patching.base import COMPONENTS, Scale, Site
from attrlab.attribution.patching.hooks import noised
from attrlab.attribution.request.answers import Answer, answer_inputs, answer_request, prompt_inputs
from attrlab.attribution.request.defaults import NOISE_SEEDS
from attrlab.attribution.request.target import Target, resolve_target
from attrlab.attribution.visual_tokens.answer import batched_kwargs

__all__ = [
    "MAX_SEEDS",
    "GaussianNoise",
    "PatchedInputs",
    "PatchingProblem",
    "Run",
    "Runs",
    "patching_problem",
]

#: What patching pairs position by position: a text, or an image and a prompt.
PatchedInputs = TextInputs | ImageTextInputs
#: The inputs of one problem, both sides alike.
PatchedT = TypeVar("PatchedT", TextInputs, ImageTextInputs)

#: Most noise draws a causal-tracing corruption averages over.
MAX_SEEDS = 64


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
    seeds: int = NOISE_SEEDS
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
class PatchingProblem(Generic[PatchedT]):
    """
    A clean input, its corruption and the target read on both.

    Exactly one of ``corrupted`` (another input of the same token length) and ``noise``
    (:class:`GaussianNoise` on the clean input) is given.
    """

    clean: PatchedT
    target: Target
    corrupted: PatchedT | None = None
    noise: GaussianNoise | None = None

    def check(self, adapter: Adapter) -> None:
        """
        Refuse a problem patching cannot pair position by position, naming what differs.

        Raises:
            InvalidInputError: both or neither corruption, token lengths or answers that
                differ, a target the inputs do not hold, noise outside the input or on visual
                tokens.
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
            if isinstance(self.clean, ImageTextInputs):
                visual = [p for p in self.noise.positions if bool(self.clean.visual_tokens[p])]
                if visual:  # the image's features replace those embeddings after the noise
                    raise InvalidInputError(
                        f"noise position(s) {visual} are visual tokens, whose embeddings the "
                        "image's features overwrite: corrupt the image instead "
                        "(attribution.patching.image)"
                    )


def patching_problem(
    adapter: Adapter,
    clean: str,
    corrupted: str | None = None,
    answer: str | None = None,
    contrast: str | None = None,
    noise: GaussianNoise | None = None,
    target: int | str | None = None,
) -> PatchingProblem[TextInputs]:
    """
    The problem of two inputs (or one and noise) and a target, as every front end builds it.

    On a decoder LM the target is ``answer`` (default: the model's next token after ``clean``),
    or ``answer`` rather than ``contrast``; both prompts are followed by the same answer
    tokens. On a text classifier (BERT, MiniLM zero-shot, ...) it is the class ``target``
    (an index or label; default: the clean input's top class), read as its logit.

    Raises:
        InvalidInputError: as :func:`~attribution.request.answers.answer_request` and
            :meth:`PatchingProblem.check`; an answer or contrast on a classifier, a class
            target on a decoder LM.
    """
    if adapter.family != "decoder-lm":
        return _classifier_problem(adapter, clean, corrupted, answer, contrast, noise, target)
    if target is not None:
        raise InvalidInputError(
            "a decoder LM's target is its answer (and contrast), not a class: give answer="
        )
    clean_inputs, record = answer_request(adapter, clean, answer=answer, contrast=contrast)
    corrupted_inputs = None
    if corrupted is not None:
        held = record.held_answer
        assert held is not None  # an answer request's target is an answer or a contrast
        prompt = prompt_inputs(adapter, corrupted)
        corrupted_inputs = answer_inputs(adapter, prompt, Answer(held.tokens, held.label))
    problem = PatchingProblem(clean_inputs, record, corrupted_inputs, noise)
    problem.check(adapter)
    return problem


def _text_inputs(adapter: Adapter, text: str) -> TextInputs:
    inputs = adapter.preprocess(text)
    assert isinstance(inputs, TextInputs)  # a text adapter's (checked by text_adapter)
    return inputs


def _classifier_problem(
    adapter: Adapter,
    clean: str,
    corrupted: str | None,
    answer: str | None,
    contrast: str | None,
    noise: GaussianNoise | None,
    target: int | str | None,
) -> PatchingProblem[TextInputs]:
    """A text classifier's problem: the class's logit on both inputs."""
    if answer is not None or contrast is not None:
        raise InvalidInputError(
            f"{adapter.model_id} is a classifier: its target is a class (target=), not an "
            "answer or a contrast, which are a decoder LM's"
        )
    text_adapter(adapter)  # refuses a model that takes no text
    clean_inputs = _text_inputs(adapter, clean)
    with torch.no_grad():
        logits = adapter.logits(**clean_inputs.model_kwargs())
    record = resolve_target(adapter, target, logits)
    corrupted_inputs = None if corrupted is None else _text_inputs(adapter, corrupted)
    problem = PatchingProblem(clean_inputs, record, corrupted_inputs, noise)
    problem.check(adapter)
    return problem


@dataclass(frozen=True)
class Run:
    """
    One side of the problem: an input and, for the noised side, its noise draws.

    Attributes:
        inputs: The input (one row).
        noise: ``(rows, T, D)`` added to its token embeddings, or ``None`` (one row).
    """

    inputs: PatchedInputs
    noise: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        """How many forwards one pass of this side takes (the noise draws)."""
        return 1 if self.noise is None else int(self.noise.shape[0])

    def kwargs(self, rows: int) -> dict[str, torch.Tensor]:
        """The model's keywords for ``rows`` copies of the input."""
        if isinstance(self.inputs, ImageTextInputs):  # Qwen2-VL's patches are not one row
            return batched_kwargs(self.inputs, rows)
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

    def score(self, run: Run, rows: range) -> torch.Tensor:
        """The target's score of ``rows`` of ``run`` (one per noise draw), ``(len(rows),)``."""
        noise = None if run.noise is None else run.noise[rows.start : rows.stop]
        target = self.problem.target
        with noised(self.adapter, noise):
            return target.score(target.outputs(self.adapter, **run.kwargs(len(rows))))

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
