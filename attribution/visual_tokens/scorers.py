"""
Visual-token scorers: each visual token's importance to the answer, by the published criteria.

A scorer turns one image, prompt and answer (:class:`Scoring`) into one score per visual token,
``(N,)`` float64 in the order of :attr:`~attribution.models.vlm.ImageTextInputs.regions`, higher
for a token to keep. What each one knows (:attr:`VisualScorer.awareness`, eviction's labels):
``query-agnostic`` scores read the image alone, ``query-aware`` ones the prompt's attention or
hidden states (the prompt holds the question), ``answer-aware`` ones the answer: oracles shown
beside the policies, not deployable as they are.

The attention scorers read block :attr:`Scoring.attention_layer`'s attention probabilities
inside the family's eager attention, averaged over its heads; the prompt's *instruction* is its
text after the last visual token, up to the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from attrlab.attribution.alteration import altered
from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.eviction.scorers import AWARENESS
from attrlab.attribution.explain import explain
from attrlab.attribution.layers.hooks import block_io
from attrlab.attribution.methods.registry import get_method
from attrlab.attribution.models.layouts import layout_for
from attrlab.attribution.models.vlm import ImageTextInputs, VisionLanguageAdapter
from attrlab.attribution.request.target import AnswerTarget
from attrlab.attribution.visual_tokens.answer import answer_scores, batched_kwargs, prompt_end
from attrlab.attribution.visual_tokens.removal import (
    dropped_rows,
    reading_attention,
    visual_attention,
)

__all__ = [
    "VISUAL_SCORERS",
    "VTC_CLS_LAYERS",
    "Scoring",
    "VisualScorer",
    "check_visual_scorers",
    "exact_effects",
    "instruction_positions",
    "register_visual_scorer",
]

#: VTC-CLS: the encoder layers whose [CLS] attention is averaged (the last ones feeding the
#: visual tokens).
VTC_CLS_LAYERS = 4
#: Rows per forward of the exact effects.
_CHUNK = 32


@dataclass
class Scoring:
    """
    One image, prompt and answer to score, and what scoring it has read so far.

    Attributes:
        adapter: The vision-language model.
        inputs: The image and prompt followed by the answer (``answer_length`` tokens).
        attention_layer: The block whose attention the attention scorers read (FastV reads
            block ``K − 1``'s to drop from block ``K``; its paper's ``K = 2`` is block 1).
        layer: The block the tokens are dropped from (``0``: at the input), which the exact
            effects and AtP are of.
    """

    adapter: VisionLanguageAdapter
    inputs: ImageTextInputs
    attention_layer: int = 1
    layer: int = 0
    _read: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def prompt_reading(self) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """
        What the prompt scorers read, from one forward (kept for the others).

        Block :attr:`attention_layer`'s attention probabilities ``(H, T, T)``, and each
        block's attention and MLP inputs and outputs in turn (TransPrune's transitions).
        """
        if "prompt" not in self._read:
            model = self.adapter
            blocks = model.blocks()
            attentions = model.attention_modules()
            modules = [
                m for a, b in zip(attentions, blocks, strict=True) for m in (a, _mlp(model, b))
            ]
            with (
                altered(model.model),
                torch.no_grad(),
                visual_attention(model, read={self.attention_layer}) as reading,
                block_io(modules) as seen,
            ):
                model.model(**self.inputs.model_kwargs())
            self._read["prompt"] = (reading.probabilities[self.attention_layer][0], seen)
        return self._read["prompt"]


def _mlp(adapter: VisionLanguageAdapter, block: torch.nn.Module) -> torch.nn.Module:
    """A block's MLP (the module whose output is the MLP branch)."""
    path = layout_for(adapter).mlp_output
    if "." not in path:
        raise UnsupportedMethodError(f"no MLP module is known in model '{adapter.model_id}'")
    return block.get_submodule(path.rsplit(".", 1)[0])


def instruction_positions(inputs: ImageTextInputs) -> torch.Tensor:
    """The prompt's text after its last visual token, up to the answer: the instruction."""
    return torch.arange(int(inputs.visual_positions.max()) + 1, prompt_end(inputs))


@dataclass(frozen=True)
class VisualScorer:
    """
    A visual-token scorer.

    Attributes:
        name: Its name in tables and requests.
        description: What it computes, for people.
        source: The paper it comes from.
        awareness: One of eviction's :data:`~attribution.eviction.scorers.AWARENESS`.
        score: :class:`Scoring` -> ``(N,)`` float64, higher to keep.
        unsupported: Why it does not apply to a model (``None``: it applies to every one).
    """

    name: str
    description: str
    source: str
    awareness: str
    score: Callable[[Scoring], np.ndarray]
    unsupported: Callable[[VisionLanguageAdapter], str | None] | None = None

    @property
    def needs_answer(self) -> bool:
        """It reads the answer (an oracle)."""
        return self.awareness == "answer-aware"

    def applies_to(self, adapter: VisionLanguageAdapter) -> str | None:
        """``None`` where it scores ``adapter``, else why not."""
        return None if self.unsupported is None else self.unsupported(adapter)

    def describe(self) -> dict[str, Any]:
        """JSON-ready: name, description, source, awareness, whether it needs the answer."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "awareness": self.awareness,
            "needs_answer": self.needs_answer,
        }


#: Every registered visual-token scorer by name, in registration order.
VISUAL_SCORERS: dict[str, VisualScorer] = {}


def register_visual_scorer(scorer: VisualScorer) -> VisualScorer:
    """
    Add ``scorer`` to :data:`VISUAL_SCORERS`.

    Raises:
        ValueError: an unknown awareness, or a name registered already.
    """
    if scorer.awareness not in AWARENESS:
        raise ValueError(f"awareness is one of {AWARENESS}; got {scorer.awareness!r}")
    if scorer.name in VISUAL_SCORERS:
        raise ValueError(f"a visual-token scorer named {scorer.name!r} is registered already")
    VISUAL_SCORERS[scorer.name] = scorer
    return scorer


def check_visual_scorers(names: list[str] | tuple[str, ...]) -> list[VisualScorer]:
    """
    The scorers named, in order (each once).

    Raises:
        InvalidParameterError: an unknown name, or none.
    """
    unknown = [n for n in names if n not in VISUAL_SCORERS]
    if unknown or not names:
        raise InvalidParameterError(
            f"unknown visual-token scorer(s) {', '.join(unknown) or '(none given)'}; choose "
            f"from {', '.join(VISUAL_SCORERS)}"
        )
    return [VISUAL_SCORERS[n] for n in dict.fromkeys(names)]


def _visual_columns(scoring: Scoring, rows: torch.Tensor) -> np.ndarray:
    """``rows`` ``(H, Q, T)`` of attention -> the mean over heads and queries at visual keys."""
    visual = scoring.inputs.visual_positions.cpu()
    return rows.double().cpu().mean((0, 1))[visual].numpy()


def _fastv_last(scoring: Scoring) -> np.ndarray:
    probabilities, _ = scoring.prompt_reading()
    last = prompt_end(scoring.inputs) - 1
    return _visual_columns(scoring, probabilities[:, last : last + 1])


def _fastv_text(scoring: Scoring) -> np.ndarray:
    probabilities, _ = scoring.prompt_reading()
    return _visual_columns(scoring, probabilities[:, instruction_positions(scoring.inputs)])


def _transition(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """TransPrune's transition weight of one module per position ``(T,)`` (over the prompt)."""
    before, after = before.double(), after.double()
    ratio = after.norm(dim=-1) / before.norm(dim=-1)
    return ratio * torch.softmax(1.0 - F.cosine_similarity(before, after, dim=-1), dim=-1)


def _transprune(scoring: Scoring) -> np.ndarray:
    probabilities, seen = scoring.prompt_reading()
    if scoring.attention_layer < 1:
        raise InvalidParameterError("TransPrune accumulates transitions before its layer: use 1 on")
    end = prompt_end(scoring.inputs)
    visual = scoring.inputs.visual_positions.cpu()
    variation = torch.zeros(end, dtype=torch.float64)
    for before, after in seen[: 2 * scoring.attention_layer]:  # attention, MLP of each block
        variation += _transition(before[0, :end].cpu(), after[0, :end].cpu())
    ttv = variation[visual]
    iga = torch.as_tensor(
        _visual_columns(scoring, probabilities[:, instruction_positions(scoring.inputs)])
    )
    tiny = 1e-8  # the paper's code's guard against an all-zero sum
    return (ttv / (ttv.sum() + tiny) + iga / (iga.sum() + tiny)).numpy()


def _no_cls(adapter: VisionLanguageAdapter) -> str | None:
    if adapter.model_type != "llava":
        return (
            f"not applicable: VTC-CLS reads a vision tower's [CLS] token, and "
            f"'{adapter.model_type}' feeds the language model no CLIP tower with one (LLaVA 1.5 "
            "only here)"
        )
    return None


def _vtc_cls(scoring: Scoring) -> np.ndarray:
    model: Any = scoring.adapter.model
    config = model.config
    tower = model.model.vision_tower
    layers = getattr(tower, "vision_model", tower).encoder.layers  # transformers 4 nests it
    feature = config.vision_feature_layer
    if not isinstance(feature, int):
        raise UnsupportedMethodError("VTC-CLS reads one feature layer; this model takes several")
    last = feature % (len(layers) + 1)  # hidden state i is layer i − 1's output
    chosen = list(range(max(0, last - VTC_CLS_LAYERS), last))
    with (
        altered(model),
        torch.no_grad(),
        reading_attention([layers[i].self_attn for i in chosen]) as reading,
    ):
        tower(scoring.inputs.pixel_values)
    cls_rows = torch.stack([reading.probabilities[i][0, :, 0] for i in range(len(chosen))])
    scores = cls_rows.double().mean((0, 1))  # (1 + patches,): [CLS] first
    full = config.vision_feature_select_strategy == "full"
    return (scores if full else scores[1:]).cpu().numpy()


def _answer_log_prob(scoring: Scoring, **extra: Any) -> torch.Tensor:
    logits = scoring.adapter.model(**scoring.inputs.model_kwargs(), **extra).logits
    return answer_scores(logits, scoring.inputs)[0][0]


def _gradient_x_input(scoring: Scoring) -> np.ndarray:
    model = scoring.adapter
    first = model.blocks()[0]
    held: dict[str, torch.Tensor] = {}

    def leaf(_m: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        hidden = (args[0] if args else kwargs["hidden_states"]).detach().requires_grad_()
        held["input"] = hidden
        return (
            ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})
        )

    handle = first.register_forward_pre_hook(leaf, with_kwargs=True)
    try:
        with altered(model.model), torch.enable_grad():
            log_prob = _answer_log_prob(scoring)
            (gradient,) = torch.autograd.grad(log_prob, held["input"])
    finally:
        handle.remove()
    per_token = (gradient * held["input"]).double().sum(-1)[0]
    return per_token[scoring.inputs.visual_positions].detach().cpu().numpy()


def _attnlrp(scoring: Scoring) -> np.ndarray:
    inputs = scoring.inputs
    count = inputs.answer_length
    if count < 1:
        raise InvalidParameterError("AttnLRP scores visual tokens for an answer: give one")
    ids = tuple(int(i) for i in inputs.input_ids[0, -count:])
    labels = tuple(inputs.token_texts[-count:])
    target = AnswerTarget(ids, labels, "".join(labels), False)
    explanation = explain(scoring.adapter, "attnlrp", inputs, target)
    return np.asarray(explanation.maps["visual_tokens"], dtype=np.float64)


def _atp(scoring: Scoring) -> np.ndarray:
    model = scoring.adapter
    blocks = range(scoring.layer, model.num_layers)
    length = int(scoring.inputs.input_ids.shape[1])
    shape = (1, model.num_heads, length, length)
    leaves = [torch.zeros(shape, device=model.device, requires_grad=True) for _ in blocks]
    biases: list[torch.Tensor | None] = [None] * scoring.layer + list(leaves)
    with (
        altered(model.model),
        torch.enable_grad(),
        visual_attention(model, biases=biases, read=set(blocks)) as reading,
    ):
        log_prob = _answer_log_prob(scoring)
        gradients = torch.autograd.grad(log_prob, leaves)
    others = ~torch.eye(length, dtype=torch.bool, device=model.device)
    total = torch.zeros(length, dtype=torch.float64, device=model.device)
    for b, gradient in zip(blocks, gradients, strict=True):
        p = reading.probabilities[b][0].double()
        # dropping key j renormalises query i's row: the linear change of the answer is
        # ∂L/∂p · Δp = −g_ij / (1 − p_ij), g the gradient at the attention logit
        drop = gradient[0].double() / (1.0 - p).clamp_min(torch.finfo(torch.float64).eps)
        total += (drop * others).sum((0, 1))
    return total[scoring.inputs.visual_positions].cpu().numpy()


def exact_effects(scoring: Scoring) -> np.ndarray:
    """The drop of the answer's log-probability with each visual token dropped alone."""
    model, inputs = scoring.adapter, scoring.inputs
    count = int(inputs.visual_tokens.sum())
    rows: list[list[int]] = [[], *([i] for i in range(count))]
    found = []
    with altered(model.model), torch.no_grad():
        for start in range(0, len(rows), _CHUNK):
            chunk = rows[start : start + _CHUNK]
            with visual_attention(model, dropped_rows(inputs, chunk), scoring.layer):
                logits = model.model(**batched_kwargs(inputs, len(chunk))).logits
            found.append(answer_scores(logits, inputs)[0].cpu())
    log_probs = torch.cat(found).numpy()
    return log_probs[0] - log_probs[1:]


def _register() -> None:
    fastv = "Chen et al. 2024, FastV, arXiv:2403.06764"
    for scorer in (
        VisualScorer(
            "fastv",
            "attention from the prompt's last token to each visual token at the attention "
            "layer, averaged over heads",
            fastv,
            "query-aware",
            _fastv_last,
        ),
        VisualScorer(
            "fastv_text",
            "attention from the instruction (the prompt's text after the image) to each visual "
            "token at the attention layer, averaged over heads and instruction tokens",
            fastv,
            "query-aware",
            _fastv_text,
        ),
        VisualScorer(
            "vtc_cls",
            f"the vision tower's [CLS] attention to each patch, averaged over heads and the last "
            f"{VTC_CLS_LAYERS} encoder layers feeding the visual tokens",
            "Wang et al. 2024, VTC-CLS, arXiv:2412.05819",
            "query-agnostic",
            _vtc_cls,
            _no_cls,
        ),
        VisualScorer(
            "transprune",
            "token-transition variation (each attention and MLP module's output-to-input norm "
            "ratio times a softmax over the prompt of 1 − cos(input, output), summed over the "
            "blocks before the attention layer) plus instruction-guided attention (the "
            "instruction's attention at the attention layer), each normalised to sum 1",
            "Li et al. 2025, TransPrune, arXiv:2507.20630",
            "query-aware",
            _transprune,
        ),
        VisualScorer(
            "gradient_x_input",
            "gradient × input of the answer's log-probability at the first language-model "
            "block's input, summed over each visual token's features",
            "Shrikumar et al. 2016, arXiv:1605.01713",
            "answer-aware",
            _gradient_x_input,
        ),
        VisualScorer(
            "attnlrp",
            "AttnLRP relevance of the answer's logits at the first language-model block's "
            "input, summed over each visual token's features (the relevance stops at the "
            "visual tokens: the vision tower is not traversed)",
            "Achtibat et al. 2024, AttnLRP, arXiv:2402.05602",
            "answer-aware",
            _attnlrp,
            get_method("attnlrp").unsupported_reason,
        ),
        VisualScorer(
            "atp",
            "first-order effect of dropping each visual token: the gradient of the answer's "
            "log-probability at every attention probability it receives, times that "
            "probability's change when it is dropped (activation × gradient of the removal)",
            "AtP: Nanda 2023; Kramár et al. 2024, arXiv:2403.00745",
            "answer-aware",
            _atp,
        ),
        VisualScorer(
            "exact",
            "the drop of the answer's log-probability when the visual token alone is dropped "
            "(the exact effect the scorers are checked against)",
            "attrlab",
            "answer-aware",
            exact_effects,
        ),
    ):
        register_visual_scorer(scorer)


_register()
