"""
Eviction scorers: each cached entry's importance, by the published key/value-cache policies.

A scorer turns one prefill (:class:`~attribution.eviction.cache.Prefill`) into a score per
layer, key/value head and evictable position, ``(layers, K, C)`` float64, higher for an entry
to keep. Where a method scores more coarsely (per layer: TOVA; per position: StreamingLLM, the
attributions) its score is repeated over the heads or layers; :attr:`Scorer.granularity` says
which. Query heads sharing a key/value head (grouped-query attention) are averaged, as kvpress
does. Positions a policy always keeps (SnapKV's observation window, Scissorhands' recent
tokens, StreamingLLM's sinks) score ``inf``.

What each scorer knows (:attr:`Scorer.awareness`): ``query-agnostic`` scores read the cache alone
(keys, values, positions); ``query-aware`` ones read the prompt's attention, which sees the
question when the prompt ends with one; ``answer-aware`` ones are attributions of the answer:
oracles that know what is asked, shown beside the policies, not deployable as they are.

Parameters are those of each paper's code: SnapKV's observation window (64 queries) and
average pooling (kernel 5), Scissorhands' history window (32 queries), StreamingLLM's 4 sinks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.eviction.cache import Prefill

__all__ = [
    "AWARENESS",
    "ORACLE_METHODS",
    "SCORERS",
    "SNAPKV_KERNEL",
    "SNAPKV_WINDOW",
    "STREAMING_SINKS",
    "Scorer",
    "by_position",
    "check_scorers",
    "policy_scorers",
    "policy_scores",
    "register_scorer",
    "snapkv",
]

#: What a scorer may read, from least to most.
AWARENESS = ("query-agnostic", "query-aware", "answer-aware")
#: StreamingLLM's attention sinks: the first tokens, always kept (Xiao et al. 2024).
STREAMING_SINKS = 4
#: SnapKV's observation window (the prompt's last queries) and pooling kernel (Li et al. 2024).
SNAPKV_WINDOW = 64
SNAPKV_KERNEL = 5
#: Scissorhands' history window: the last queries whose attention is counted (Liu et al. 2023).
SCISSORHANDS_WINDOW = 32


@dataclass(frozen=True)
class Scorer:
    """
    An eviction scorer.

    Attributes:
        name: Its name in tables and requests.
        description: What it computes, for people.
        source: The paper it comes from.
        awareness: One of :data:`AWARENESS`.
        granularity: ``head`` (per layer and key/value head), ``layer`` or ``position``.
        score: ``Prefill -> (layers, K, C)`` float64 (the policies); ``None`` for the
            attributions, which read the model and the answer (:mod:`~attribution.eviction.
            study`).
    """

    name: str
    description: str
    source: str
    awareness: str
    granularity: str
    score: Callable[[Prefill], torch.Tensor] | None = None

    def describe(self) -> dict[str, str]:
        """JSON-ready: name, description, source, awareness, granularity."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "awareness": self.awareness,
            "granularity": self.granularity,
        }


#: Every registered scorer by name, in registration order.
SCORERS: dict[str, Scorer] = {}


def register_scorer(scorer: Scorer) -> Scorer:
    """Add ``scorer`` to :data:`SCORERS` (front ends list it from then on)."""
    if scorer.awareness not in AWARENESS:
        raise ValueError(f"awareness is one of {AWARENESS}; got {scorer.awareness!r}")
    SCORERS[scorer.name] = scorer
    return scorer


def check_scorers(names: list[str] | tuple[str, ...]) -> list[Scorer]:
    """
    The scorers named, in order.

    Raises:
        InvalidParameterError: an unknown name, or none.
    """
    unknown = [n for n in names if n not in SCORERS]
    if unknown or not names:
        raise InvalidParameterError(
            f"unknown eviction scorer(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(SCORERS)}"
        )
    return [SCORERS[n] for n in dict.fromkeys(names)]


def policy_scorers() -> list[str]:
    """The scorers that read the cache and its prefill only (not the answer)."""
    return [s.name for s in SCORERS.values() if s.score is not None]


def by_position(scores: torch.Tensor) -> np.ndarray:
    """
    One score per position from ``(layers, K, C)``: the sum over layers and heads.

    Always-kept entries (``inf``) count as the highest finite score plus one, so that a
    window does not swamp the sum.
    """
    values = scores.double().clone()
    finite = torch.isfinite(values)
    top = float(values[finite].max()) if finite.any() else 0.0
    values[~finite] = top + 1.0
    return values.sum((0, 1)).numpy()


def _grouped(cache: Prefill, per_query_head: torch.Tensor) -> torch.Tensor:
    """``(H, …)`` per query head -> ``(K, …)`` per key/value head: the group's mean."""
    return per_query_head.reshape(cache.kv_heads, cache.groups, *per_query_head.shape[1:]).mean(1)


def _per_head(cache: Prefill, layer_scores: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([s[..., : cache.context] for s in layer_scores]).double()


def _window_kept(cache: Prefill, scores: torch.Tensor, window: int) -> torch.Tensor:
    """``scores`` with the last ``window`` prefilled positions (kept by the policy) at ``inf``."""
    start = max(cache.positions - window, 0)
    if start < cache.context:
        scores = scores.clone()
        scores[..., start:] = torch.inf
    return scores


def _rows(cache: Prefill, layer: int, window: int) -> torch.Tensor:
    """
    The last ``window`` prefilled queries' attention rows ``(H, w, P)`` of ``layer``.

    Raises:
        InvalidParameterError: a window wider than the prefill kept.
    """
    rows = cache.readings[layer].window
    wanted = min(window, cache.positions)
    if wanted > rows.shape[1]:
        raise InvalidParameterError(
            f"the prefill kept the last {rows.shape[1]} queries' attention; a window of "
            f"{window} needs a prefill with window={window}"
        )
    return rows[:, -wanted:]


def _streaming_llm(cache: Prefill) -> torch.Tensor:
    positions = torch.arange(cache.context, dtype=torch.float64)
    positions[:STREAMING_SINKS] = torch.inf  # the sinks stay; then the most recent
    return positions.expand(cache.layers, cache.kv_heads, -1).clone()


def _h2o(cache: Prefill) -> torch.Tensor:
    return _per_head(cache, [_grouped(cache, r.accumulated) for r in cache.readings])


def _scissorhands(cache: Prefill) -> torch.Tensor:
    layers = []
    for layer in range(cache.layers):
        rows = _rows(cache, layer, SCISSORHANDS_WINDOW)
        first = cache.positions - rows.shape[1]
        # a row's uniform share: query i attends i + 1 entries
        share = 1.0 / torch.arange(first + 1, cache.positions + 1, dtype=rows.dtype)
        layers.append(_grouped(cache, (rows >= share[None, :, None]).double().sum(1)))
    return _window_kept(cache, _per_head(cache, layers), SCISSORHANDS_WINDOW)


def snapkv(
    cache: Prefill, window: int = SNAPKV_WINDOW, kernel: int = SNAPKV_KERNEL
) -> torch.Tensor:
    """SnapKV's scores with an observation ``window`` and an average-pooling ``kernel``."""
    if window < 1 or kernel < 1 or kernel % 2 == 0:
        raise InvalidParameterError(
            f"SnapKV's window is at least 1 and its kernel odd; got {window} and {kernel}"
        )
    layers = []
    for layer in range(cache.layers):
        summed = _grouped(cache, _rows(cache, layer, window).sum(1))  # (K, P)
        pooled = F.avg_pool1d(summed[:, None], kernel, stride=1, padding=kernel // 2)[:, 0]
        layers.append(pooled)
    return _window_kept(cache, _per_head(cache, layers), window)


def _tova(cache: Prefill) -> torch.Tensor:
    last = [r.window[:, -1].mean(0) for r in cache.readings]  # every head of the layer
    return _per_head(cache, last)[:, None].expand(-1, cache.kv_heads, -1).clone()


def _knorm(cache: Prefill) -> torch.Tensor:
    return _per_head(cache, [-k.double().norm(dim=-1) for k in cache.keys])


def _vatp(cache: Prefill) -> torch.Tensor:
    value_norms = _per_head(cache, [v.double().abs().sum(-1) for v in cache.values])
    return _h2o(cache) * value_norms


def _caote(cache: Prefill) -> torch.Tensor:
    layers = []
    for layer, reading in enumerate(cache.readings):
        alpha = reading.window[:, -1].double()  # (H, P): the last query's attention
        output = reading.outputs[:, -1].double()  # (H, d)
        values = cache.values[layer].double().repeat_interleave(cache.groups, dim=0)  # (H, P, d)
        distance = (values - output[:, None]).norm(dim=-1)
        error = alpha / (1.0 - alpha).clamp_min(torch.finfo(torch.float64).eps) * distance
        layers.append(_grouped(cache, error))
    return _per_head(cache, layers)


def _register_policies() -> None:
    for scorer in (
        Scorer(
            "streaming_llm",
            f"keep the first {STREAMING_SINKS} tokens (attention sinks) and the most recent ones",
            "Xiao et al. 2024, StreamingLLM, arXiv:2309.17453",
            "query-agnostic",
            "position",
            _streaming_llm,
        ),
        Scorer(
            "h2o",
            "attention the entry received, summed over every prefilled query (heavy hitters)",
            "Zhang et al. 2023, H2O, arXiv:2306.14048",
            "query-aware",
            "head",
            _h2o,
        ),
        Scorer(
            "scissorhands",
            f"how many of the last {SCISSORHANDS_WINDOW} queries gave the entry at least their "
            "uniform share of attention (persistence of importance); those queries' own "
            "entries kept",
            "Liu et al. 2023, Scissorhands, arXiv:2305.17118",
            "query-aware",
            "head",
            _scissorhands,
        ),
        Scorer(
            "snapkv",
            f"attention from the last {SNAPKV_WINDOW} prompt queries (the observation window), "
            f"average-pooled over {SNAPKV_KERNEL} positions; the window kept",
            "Li et al. 2024, SnapKV, arXiv:2404.14469",
            "query-aware",
            "head",
            snapkv,
        ),
        Scorer(
            "tova",
            "the last prompt query's attention, averaged over the layer's heads",
            "Oren et al. 2024, TOVA, arXiv:2401.06104",
            "query-aware",
            "layer",
            _tova,
        ),
        Scorer(
            "knorm",
            "minus the key's L2 norm (low-norm keys draw attention)",
            "Devoto et al. 2024, arXiv:2406.11430",
            "query-agnostic",
            "head",
            _knorm,
        ),
        Scorer(
            "vatp",
            "accumulated attention (H2O) times the value's L1 norm",
            "Guo et al. 2024, arXiv:2406.12335",
            "query-aware",
            "head",
            _vatp,
        ),
        Scorer(
            "caote",
            "the change of the last query's attention output if the entry alone were evicted: "
            "α/(1 − α)·‖v − o‖",
            "Goel et al. 2025, CAOTE, arXiv:2504.14051",
            "query-aware",
            "head",
            _caote,
        ),
    ):
        register_scorer(scorer)


_register_policies()

#: The oracles that are attrlab's attribution methods, run on the whole prompt and answer.
ORACLE_METHODS = {
    "gradient_x_input": "gradient × input of the answer's score, per token",
    "attnlrp": "AttnLRP relevance of the answer's score, per token",
    "integrated_gradients": "integrated gradients of the answer's score, per token",
}

#: The oracles: they read the model and the answer (:mod:`~attribution.eviction.study`).
for _name, _description in {
    "exact_loo": "the drop of the answer's log-probability when the token alone is evicted "
    "from every layer (the exact effect the scorers are checked against)",
    "atp_kv": "first-order effect of evicting each entry: the gradient of the answer's "
    "log-probability with respect to the entry's attention logit",
    **ORACLE_METHODS,
}.items():
    register_scorer(
        Scorer(
            _name,
            _description,
            "AtP: Nanda 2023; Kramár et al. 2024" if _name == "atp_kv" else "attrlab",
            "answer-aware",
            "head" if _name == "atp_kv" else "position",
        )
    )


def policy_scores(cache: Prefill, names: Mapping[str, Scorer]) -> dict[str, torch.Tensor]:
    """Each policy scorer's ``(layers, K, C)`` scores on ``cache``."""
    return {name: s.score(cache) for name, s in names.items() if s.score is not None}
