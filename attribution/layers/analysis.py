"""
Per-layer and per-head measures of one prediction, as one long table.

Every measure that depends on what is explained reads a :class:`~attribution.request.target.Target`:
a class, a decoder's next token, or a decoder's answer or contrast on inputs holding that answer
(:mod:`attribution.request.answers`). "The target's log-probability" is ``log p`` of one output, or
``log p(answer)`` (its tokens' summed); for a contrast ``log p(A) − log p(B)``. "The target's
score" is one output's logit, or that log-probability for an answer or a contrast (for one token
each, the logit difference: the IOI measure). A contrast whose alternative needs a sequence of
its own (the two differ before their last token) is refused: every measure here reads both
answers from one forward.

Definitions (METHODS.md, "Layer and head importance"):

* ``block_influence``: ``1 − cos(h_in, h_out)`` of each block on the residual stream, averaged
  over visible tokens (ShortGPT, Men et al. 2024).
* ``skip``: the block's output replaced by its input; ``skip_logprob`` is the change of the
  target's log-probability, ``skip_kl`` the KL divergence ``KL(p ‖ p_skip)`` of the
  predictions at the positions the target reads (summed over an answer's steps).
* ``logit_lens`` (decoders): the residual after each block through the final norm and the
  unembedding: the target's probability (``lens_probability``) and rank (``lens_rank``, 1 =
  top) at the position the model predicts from (nostalgebraist 2020); for an answer or a
  contrast, its log-probability read so at each of its steps' positions (``lens_score``).
* ``lrp``: AttnLRP (PA-LRP where the model has positional encodings) of the target's score in
  logits (an answer's per-step logits summed, a contrast's logit difference) in one backward:
  relevance entering each block (``lrp_block``), through its attention and MLP branches
  (``lrp_attention``, ``lrp_mlp``), through each head (``head_lrp``: the output projection's
  input, split by head) and, with PA-LRP, on positions per layer (``positional_relevance``).
* ``gradient``: ``|∂ log p(target) / ∂ξ_h|`` at ``ξ = 1`` for a gate ``ξ_h`` on each head's
  output (Michel et al. 2019, https://arxiv.org/abs/1905.10650). Values are raw, so they
  compare across layers (the paper's per-layer ℓ2 normalisation serves pruning).
* ``ablation``: change of the target's score with the head zeroed (``ablation_zero``) or
  replaced by its mean over the sequence (``ablation_mean``); all heads of a layer in one batch.
* ``entropy``: attention entropy of each query normalised by the log of its visible keys
  (causal and sliding-window queries see fewer), averaged over queries seeing more than one.
* ``sink``: attention mass on the first token, averaged over queries.
* ``shortv`` (an image and a prompt holding an answer): ShortV's layer contribution, each block
  left out of the visual tokens (:mod:`attribution.visual_tokens.layers`): ``shortv_kl``,
  ``shortv_log_prob``, ``shortv_exact_match`` of the answer the input holds.

On a vision-language model the blocks are its language model's, the sequence its visual and
text tokens together; the vision tower runs once per forward (batched measures widen the batch
at the first block they change).

Query heads are reported; ``kv_head`` names the key/value head each shares (GQA).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import nn

from attrlab.attribution.alteration import altered
from attrlab.attribution.errors import (
    InvalidInputError,
    InvalidParameterError,
    UnsupportedMethodError,
)
from attrlab.attribution.explanation import LAYER_COLUMNS, layer_table
from attrlab.attribution.inputs.perturb import BatchRunner
from attrlab.attribution.layers.hooks import (
    ABLATIONS,
    ablate_heads,
    block_io,
    gate_heads,
    skip_blocks,
    widened,
)
from attrlab.attribution.methods.lrp.relevance import LRPResult, lrp
from attrlab.attribution.methods.lrp.settings import resolve_settings
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.families import Layout
from attrlab.attribution.models.layouts import layout_for
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.answers import check_answer_fits
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target, decoder_adapter
from attrlab.attribution.visual_tokens.layers import SHORTV_MEASURES, shortv_rows

__all__ = [
    "COLUMNS",
    "HEAD_ESTIMATORS",
    "MEASURES",
    "LayerReport",
    "Measure",
    "ModelParts",
    "analyze",
    "analyze_layers",
    "checked_target",
    "chosen_measures",
    "head_estimators",
    "head_projections",
    "left_out",
    "planned_passes",
]

#: Columns of the long table; ``head`` and ``kv_head`` are null on layer rows.
COLUMNS = LAYER_COLUMNS


@dataclass(frozen=True)
class Measure:
    """A group of measures computed together, and what it costs."""

    name: str
    #: The ``measure`` values of its rows.
    produces: tuple[str, ...]
    cost: str
    description: str
    #: The model families it applies to; ``None``: every family.
    families: frozenset[str] | None = None
    #: It reads the teacher-forced answer an image and a prompt hold (ShortV).
    image_answer: bool = False

    def applies_to(self, adapter: Adapter) -> bool:
        """Whether it applies to ``adapter``'s family."""
        return self.families is None or adapter.family in self.families

    def lacking(self, inputs: Inputs) -> str | None:
        """What ``inputs`` lack for it, in words, or ``None``."""
        if not self.image_answer:
            return None
        if not (isinstance(inputs, ImageTextInputs) and inputs.answer_length > 0):
            return (
                f"measure {self.name} reads an answer on an image and a prompt (give one: "
                "answer, or generate for the model's own)"
            )
        try:
            inputs.one_image(f"measure {self.name}")
        except UnsupportedMethodError as several:
            return str(several)
        return None


#: Decoder LMs, a vision-language model's language model among them.
_DECODERS = frozenset({"decoder-lm", "vision-language"})
_FAMILY_WORDS = {"decoder-lm": "decoder LMs", "vision-language": "vision-language models"}


#: Every measure group, in the order they run; ``measures=`` picks by ``name``.
MEASURES: dict[str, Measure] = {
    m.name: m
    for m in (
        Measure(
            "block_influence",
            ("block_influence",),
            "1 forward (shared)",
            "1 − cos(h_in, h_out) per block on the residual stream",
        ),
        Measure(
            "entropy",
            ("entropy",),
            "1 forward (shared)",
            "attention entropy over log(visible keys)",
        ),
        Measure("sink", ("sink_share",), "1 forward (shared)", "mass on the first token"),
        Measure(
            "logit_lens",
            ("lens_probability", "lens_rank", "lens_score"),
            "1 forward (shared)",
            "target probability and rank (an answer's log-probability) from each block's residual",
            families=_DECODERS,
        ),
        Measure(
            "skip",
            ("skip_logprob", "skip_kl"),
            "1 forward of L+1 rows",
            "Δ log p(target) and KL when a block is bypassed",
        ),
        Measure(
            "gradient",
            ("head_gradient",),
            "1 forward + 1 backward",
            "|∂ log p / ∂ξ_h| at a head gate (Michel et al. 2019)",
        ),
        Measure(
            "lrp",
            ("lrp_block", "lrp_attention", "lrp_mlp", "head_lrp", "positional_relevance"),
            "1 forward + 1 backward",
            "AttnLRP / PA-LRP relevance per block, branch, head and position",
        ),
        Measure(
            "ablation",
            ("ablation_zero", "ablation_mean"),
            "L forwards, 2H+1 rows from the ablated block on",
            "Δ target score (a logit; an answer's log p) with a head zeroed or mean-ablated",
        ),
        Measure(
            "shortv",
            SHORTV_MEASURES,
            "1 forward of L+1 rows",
            "ShortV: KL, Δ log p and exact match of the answer with a block left out of the "
            "visual tokens (an image and a prompt with an answer)",
            families=frozenset({"vision-language"}),
            image_answer=True,
        ),
    )
}
#: Head measures that estimate importance; rankings compare their absolute values.
HEAD_ESTIMATORS = ("head_gradient", "ablation_zero", "ablation_mean", "head_lrp")


@dataclass
class ModelParts:
    """
    The blocks, attention output projections and MLP outputs of a model, found once.

    What the measures need to know about the model; activation patching and the pruning
    curves reach the same modules.
    """

    adapter: Adapter
    layout: Layout
    blocks: list[nn.Module]
    projections: list[nn.Module]
    mlps: list[nn.Module]
    heads: int
    lrp_result: LRPResult | None = None

    @classmethod
    def of(cls, adapter: Adapter) -> ModelParts:
        layout = layout_for(adapter)
        blocks = adapter.blocks()
        try:
            projections = [block.get_submodule(layout.attention_output) for block in blocks]
            mlps = [block.get_submodule(layout.mlp_output) for block in blocks]
        except AttributeError as err:  # a variant of the family with other module names
            raise UnsupportedMethodError(
                f"layer analysis cannot find its modules in model '{adapter.model_id}': {err}; "
                "its family's row in attribution/models/families.py needs these paths"
            ) from None
        if adapter.num_heads <= 0:
            raise UnsupportedMethodError(f"model '{adapter.model_id}' reports no attention heads")
        return cls(adapter, layout, blocks, projections, mlps, adapter.num_heads)

    def head_rows(self, layer: int) -> list[tuple[int, int, int]]:
        return [(layer, h, self.adapter.kv_head(h)) for h in range(self.heads)]


def chosen_measures(
    adapter: Adapter,
    measures: Collection[str] | None,
    inputs: Inputs | None = None,
) -> list[str]:
    """
    The measure groups ``measures`` names (``None``: all that apply to ``adapter``), checked.

    With ``inputs``, the default leaves out what they lack (ShortV without an answer on an
    image and a prompt: :func:`left_out` says so), and a named measure they lack is refused.

    Raises:
        InvalidParameterError: for unknown measures, or ones that do not apply to the model's
            family (the logit lens to an encoder, ShortV to a text model).
        InvalidInputError: a named measure that ``inputs`` lack what it reads for.
    """
    chosen = list(MEASURES) if measures is None else list(dict.fromkeys(measures))
    unknown = [m for m in chosen if m not in MEASURES]
    if unknown:
        raise InvalidParameterError(
            f"unknown measure(s) {', '.join(map(repr, unknown))}; choose from {', '.join(MEASURES)}"
        )
    if measures is None:
        return [
            m
            for m in chosen
            if MEASURES[m].applies_to(adapter)
            and (inputs is None or not MEASURES[m].lacking(inputs))
        ]
    refused = [m for m in chosen if not MEASURES[m].applies_to(adapter)]
    if refused:
        families = sorted({f for m in refused for f in MEASURES[m].families or ()})
        raise InvalidParameterError(
            f"measure(s) {', '.join(refused)} apply to "
            f"{' and '.join(_FAMILY_WORDS[f] for f in families)}; model "
            f"'{adapter.model_id}' is a {adapter.family}"
        )
    lacking = [
        reason for m in chosen if inputs is not None and (reason := MEASURES[m].lacking(inputs))
    ]
    if lacking:
        raise InvalidInputError("; ".join(lacking))
    return chosen


def left_out(adapter: Adapter, inputs: Inputs) -> list[str]:
    """Why the default measures leave out some that apply to ``adapter``, in words."""
    return [
        f"{reason}; its rows are left out"
        for m in chosen_measures(adapter, None)
        if (reason := MEASURES[m].lacking(inputs))
    ]


def _visible(inputs: Inputs, tokens: int) -> torch.Tensor:
    return inputs.visible_tokens(tokens).cpu()


def _shared_pass(
    model: ModelParts, inputs: Inputs, target: Target, chosen: list[str], run: RunContext
) -> list[tuple]:
    """Block influence, entropy, sink share and logit lens from one forward pass."""
    rows: list[tuple] = []
    with torch.no_grad(), block_io(model.blocks) as seen:
        attentions = model.adapter.attentions(**inputs.model_kwargs())
    run.count(forward=1)
    visible = _visible(inputs, seen[0][0].shape[1])
    if "block_influence" in chosen:
        for layer, (h_in, h_out) in enumerate(seen):
            cos = torch.nn.functional.cosine_similarity(h_in[0].double(), h_out[0].double(), dim=-1)
            rows.append(
                (layer, None, None, "block", "block_influence", float(1 - cos[visible].mean()))
            )
    if "entropy" in chosen or "sink" in chosen:
        for layer, attention in enumerate(attentions):
            entropy, sink = _entropy_and_sink(attention[0].double().cpu(), visible)
            for head, kv in ((h, model.adapter.kv_head(h)) for h in range(model.heads)):
                if "entropy" in chosen:
                    rows.append((layer, head, kv, "head", "entropy", float(entropy[head])))
                if "sink" in chosen:
                    rows.append((layer, head, kv, "head", "sink_share", float(sink[head])))
    if "logit_lens" in chosen:
        rows += _logit_lens(model, inputs, [out for _, out in seen], target)
    return rows


def _entropy_and_sink(
    attention: torch.Tensor, visible: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Per head of ``(H, T, T)`` attention: normalised entropy and first-token share.

    The entropy is averaged over queries with more than one visible key, the share over all
    visible queries. A key is visible to a query when any head of the layer gives it weight:
    masked keys (causal, sliding window, padding) get exactly 0 in every head, while in fp16
    or bf16 one head's small weight can round to 0 on a key that is visible.
    """
    attention = attention[:, visible][:, :, visible]
    keys = (attention > 0).any(0).sum(-1).expand(attention.shape[:2])  # per head and query
    plogp = torch.where(attention > 0, attention * attention.log(), torch.zeros_like(attention))
    entropy = -plogp.sum(-1)
    several = keys > 1
    normalised = torch.where(several, entropy / keys.clamp_min(2).double().log(), 0.0)
    counted = several.sum(-1).clamp_min(1)
    return normalised.sum(-1) / counted, attention[..., 0].mean(-1)


def _logit_lens(
    model: ModelParts, inputs: Inputs, residuals: list[torch.Tensor], target: Target
) -> list[tuple]:
    """
    The target read from each block's residual.

    One output's probability and rank, else its log-probability (``lens_score``). Only the
    positions the target reads go through the unembedding: the last ``span`` ones, read as a
    sequence of their own (right-aligned, so offsets from the end hold).
    """
    adapter = model.adapter
    norm, unembed, cap = adapter.final_norm(), adapter.unembedding(), adapter.logit_softcap
    if unembed is None:
        raise UnsupportedMethodError(f"model '{adapter.model_id}' has no unembedding")
    mask = inputs.model_kwargs()["attention_mask"]
    last = int(DecoderLMAdapter.predicted_positions(mask)[0])
    span = max(target.read_offsets()) + 1
    window = {"attention_mask": torch.ones(1, span, dtype=mask.dtype, device=mask.device)}
    rows = []
    with torch.no_grad():
        for layer, residual in enumerate(residuals):
            logits = unembed(norm(residual[:, last + 1 - span : last + 1])).double()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            outputs = target.from_logits(adapter, logits, window)
            if target.named_output is None:
                score = float(target.log_probability(outputs)[0])
                rows.append((layer, None, None, "residual", "lens_score", score))
                continue
            probability = float(target.probability(outputs)[0])
            rank = int((outputs[0] > target.score(outputs)[0]).sum()) + 1
            rows.append((layer, None, None, "residual", "lens_probability", probability))
            rows.append((layer, None, None, "residual", "lens_rank", float(rank)))
    return rows


def _read(
    adapter: Adapter, target: Target, kwargs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    One forward: ``target``'s outputs, and the logits ``(B, P, C)`` of the predictions it reads.

    One output: the adapter's logits (a classifier's too), as one prediction. Otherwise a
    decoder's logits at each position of :meth:`Target.read_offsets`.
    """
    if target.named_output is not None:
        logits = adapter.logits(**kwargs)
        return logits, logits[:, None]
    logits = decoder_adapter(adapter).model(**kwargs).logits
    last = DecoderLMAdapter.predicted_positions(kwargs["attention_mask"])
    offsets = torch.tensor(target.read_offsets(), device=logits.device)
    rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
    return target.from_logits(adapter, logits, kwargs), logits[rows, last[:, None] - offsets]


def _skip(
    model: ModelParts, inputs: Inputs, target: Target, run: RunContext, tick: Callable[[], None]
) -> list[tuple]:
    tick()
    layers = len(model.blocks)
    kwargs = inputs.model_kwargs()

    def forward(start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        # row 0 unchanged, row 1 + i skips block start + i; one row up to block start
        with (
            widened(model.blocks[start], 1 + stop - start),
            skip_blocks(model.blocks[start:stop], range(1, stop - start + 1)),
        ):
            return _read(model.adapter, target, kwargs)

    rows = []
    runner = BatchRunner(model.adapter, run, layers, layers, report=False)
    for start, stop, (outputs, predicted) in runner.chunks(layers, forward):
        run.count(forward=1)  # the unchanged row
        logp = predicted.double().log_softmax(-1)
        logp_target = target.log_probability(outputs.double())
        for row, layer in enumerate(range(start, stop), start=1):
            kl = float((logp[0].exp() * (logp[0] - logp[row])).sum())
            change = float(logp_target[row] - logp_target[0])
            rows.append((layer, None, None, "block", "skip_logprob", change))
            rows.append((layer, None, None, "block", "skip_kl", kl))
    return rows


def _gradient(
    model: ModelParts, inputs: Inputs, target: Target, run: RunContext, tick: Callable[[], None]
) -> list[tuple]:
    tick()
    device = model.adapter.device
    gates = [torch.ones(model.heads, device=device, requires_grad=True) for _ in model.blocks]
    with torch.enable_grad(), gate_heads(model.projections, gates):
        outputs = target.outputs(model.adapter, **inputs.model_kwargs())
        logp = target.log_probability(outputs)[0]
        grads = torch.autograd.grad(logp, gates, allow_unused=True)
    run.count(forward=1, backward=1)
    rows = []
    for layer, grad in enumerate(grads):
        values = torch.zeros(model.heads) if grad is None else grad.abs()
        for _, head, kv in model.head_rows(layer):
            rows.append((layer, head, kv, "head", "head_gradient", float(values[head])))
    return rows


def _ablation(
    model: ModelParts, inputs: Inputs, target: Target, run: RunContext, tick: Callable[[], None]
) -> list[tuple]:
    heads = model.heads
    kwargs = inputs.model_kwargs()
    mask = kwargs.get("attention_mask")
    visible = None if mask is None else mask[0].bool()
    variants = [(head, kind) for kind in ABLATIONS for head in range(heads)]
    total = len(variants) * len(model.blocks)
    runner = BatchRunner(model.adapter, run, len(variants), total, report=False)
    rows = []
    for layer in range(len(model.blocks)):
        tick()

        def forward(start: int, stop: int, layer: int = layer) -> torch.Tensor:
            # row 0 unablated, then one ablated head per row; one row up to this block, all
            # rows from it on (the blocks before are unchanged)
            batch = [None, *variants[start:stop]]
            widen = ablate_heads(
                model.projections[layer], heads, batch, visible, widen_at=model.blocks[layer]
            )
            with widen:
                return target.score(target.outputs(model.adapter, **kwargs))

        change: dict[tuple[int, str], float] = {}
        for start, stop, scores in runner.chunks(len(variants), forward):
            run.count(forward=1)  # the unablated row
            values = scores.double()
            change.update(zip(variants[start:stop], (values[1:] - values[0]).tolist(), strict=True))
        for _, head, kv in model.head_rows(layer):
            rows.append((layer, head, kv, "head", "ablation_zero", change[head, "zero"]))
            rows.append((layer, head, kv, "head", "ablation_mean", change[head, "mean"]))
    return rows


def _lrp(
    model: ModelParts, inputs: Inputs, target: Target, run: RunContext, tick: Callable[[], None]
) -> list[tuple]:
    tick()
    adapter = model.adapter
    settings = resolve_settings(adapter)
    # PA-LRP's positions are a text's or an image's, not an image and a prompt's (pa_lrp)
    pe_aware = adapter.positional_encoding is not None and inputs.modality != "image-text"
    probes = []
    for layer, (projection, mlp) in enumerate(zip(model.projections, model.mlps, strict=True)):
        probes += [
            (f"heads.{layer}", projection, "input"),
            (f"attention.{layer}", projection, "output"),
            (f"mlp.{layer}", mlp, "output"),
        ]
    result = lrp(
        adapter,
        inputs,
        target,
        pe_aware,
        settings.gamma_linear,
        settings.gamma_conv,
        attention_rule=settings.attention_rule,
        probes=probes,
    )
    run.count(forward=1, backward=1)
    model.lrp_result = result
    rows: list[tuple] = []
    for layer in range(len(model.blocks)):
        rows.append((layer, None, None, "block", "lrp_block", result.residual[layer]))
        for branch in ("attention", "mlp"):
            value = float(result.probes[f"{branch}.{layer}"].sum())
            rows.append((layer, None, None, branch, f"lrp_{branch}", value))
        per_head = result.probes[f"heads.{layer}"]
        per_head = per_head.reshape(-1, model.heads, per_head.shape[-1] // model.heads).sum((0, 2))
        for _, head, kv in model.head_rows(layer):
            rows.append((layer, head, kv, "head", "head_lrp", float(per_head[head])))
    if pe_aware:
        rows += [
            (layer, None, None, "position", "positional_relevance", value)
            for layer, value in enumerate(result.positional_per_layer)
        ]
    return rows


def _shortv(
    model: ModelParts,
    inputs: Inputs,
    target: Target,
    run: RunContext,
    tick: Callable[[], None],
) -> list[tuple]:
    tick()
    rows = shortv_rows(model.adapter, inputs)
    run.count(forward=len(model.blocks) + 1)
    return rows


_RUNNERS = {
    "skip": _skip,
    "gradient": _gradient,
    "lrp": _lrp,
    "ablation": _ablation,
    "shortv": _shortv,
}


@dataclass
class LayerReport:
    """The long table, and the token relevance of the LRP pass when it ran."""

    table: pd.DataFrame
    lrp: LRPResult | None


#: Measure groups sharing one plain forward pass.
_SHARED = ("block_influence", "entropy", "sink", "logit_lens")


def planned_passes(
    adapter: Adapter,
    measures: Collection[str] | None = None,
    inputs: Inputs | None = None,
) -> tuple[int, int, int]:
    """
    ``(forward, backward, widest batch)`` of :func:`analyze` on ``inputs`` for ``measures``.

    Without ``inputs``, the default counts every measure that applies to ``adapter``.

    Raises:
        InvalidParameterError, InvalidInputError, UnsupportedMethodError: as :func:`analyze`.
    """
    chosen = chosen_measures(adapter, measures, inputs)
    model = ModelParts.of(adapter)
    layers, heads = len(model.blocks), model.heads
    forward = {
        "skip": layers + 1,
        "gradient": 1,
        "lrp": 1,
        "ablation": layers * (1 + 2 * heads),
        "shortv": layers + 1,
    }
    backward = {"gradient": 1, "lrp": 1}
    width = {"skip": layers + 1, "ablation": 1 + 2 * heads, "shortv": layers + 1}
    shared = int(bool(set(_SHARED) & set(chosen)))
    return (
        shared + sum(forward.get(name, 0) for name in chosen),
        sum(backward.get(name, 0) for name in chosen),
        max([1, *(width.get(name, 1) for name in chosen)]),
    )


def analyze(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    measures: Collection[str] | None = None,
    run: RunContext | None = None,
) -> LayerReport:
    """:func:`analyze_layers`, keeping the LRP pass's token relevance too."""
    run = run or RunContext()
    chosen = chosen_measures(adapter, measures, inputs)
    if measures is None:
        for reason in left_out(adapter, inputs):
            run.warn(reason)
    target = checked_target(adapter, inputs, target)
    model = ModelParts.of(adapter)
    layers = len(model.blocks)
    run.plan(planned_passes(adapter, chosen, inputs)[0], "the measures (ablation)")
    steps = 1 + sum(layers if name == "ablation" else 1 for name in chosen if name in _RUNNERS)
    done = iter(range(steps))

    def tick() -> None:
        run.step(next(done), steps)

    rows: list[tuple[Any, ...]] = []
    tick()
    # Each measure holds the model altered for its own hooks only: light reads go between.
    if set(_SHARED) & set(chosen):
        with altered(adapter.model):
            rows += _shared_pass(model, inputs, target, chosen, run)
    for name in chosen:
        if name in _RUNNERS:
            with altered(adapter.model):
                rows += _RUNNERS[name](model, inputs, target, run, tick)
    run.step(steps, steps)
    return LayerReport(layer_table(rows), model.lrp_result)


def analyze_layers(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    measures: Collection[str] | None = None,
    settings: RunSettings | None = None,
) -> pd.DataFrame:
    """
    The measures of :data:`MEASURES` (all that apply by default) for ``target`` on one input.

    ``target``: a :class:`~attribution.request.target.Target` (a class, a next token, or a
    decoder's answer or contrast on inputs holding that answer,
    :func:`attribution.request.answers.answer_request`). ``inputs``: a text, an image, or a
    vision-language model's image and prompt (``shortv`` then joins the default when they hold
    an answer).

    Returns:
        A long table with :data:`COLUMNS`: one row per layer (``head`` null) or per query head
        and measure.

    Raises:
        UnsupportedMethodError: For models without transformer blocks attrlab knows, or a
            contrast whose alternative needs a sequence of its own.
        InvalidParameterError: For unknown measures, or ones for other model families.
        InvalidInputError: A target whose answer the input does not hold; ``shortv`` named
            on an input without an answer on an image and a prompt.
    """
    return analyze(adapter, inputs, target, measures, RunContext.of(settings)).table


def checked_target(adapter: Adapter, inputs: Inputs, target: Target) -> Target:
    """``target``, checked to fit ``inputs`` and to be read from one forward."""
    check_answer_fits(inputs, target)
    if not target.shares_input:
        raise UnsupportedMethodError(
            f"the layer and head analysis reads both answers of {target.label} from one "
            "forward, but they differ before their last token, so the alternative needs a "
            "sequence of its own: analyse each answer on its own and compare"
        )
    return target


def head_projections(adapter: Adapter) -> tuple[list[nn.Module], int]:
    """
    Each block's attention output projection, where heads are reached, and heads per block.

    Raises:
        UnsupportedMethodError: For models without transformer blocks attrlab knows.
    """
    model = ModelParts.of(adapter)
    return model.projections, model.heads


def head_estimators(adapter: Adapter, measures: Collection[str] | None) -> list[str]:
    """The head estimators (:data:`HEAD_ESTIMATORS`) the chosen ``measures`` produce."""
    produced = {row for m in chosen_measures(adapter, measures) for row in MEASURES[m].produces}
    return [m for m in HEAD_ESTIMATORS if m in produced]
