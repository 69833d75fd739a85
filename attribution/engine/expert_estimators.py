"""
Estimators of expert importance in mixture-of-experts blocks, from the experts' statistics.

Each reads :class:`~attribution.engine.experts.ExpertStatistics` of the dataset the curves are
measured on and gives one score per expert, layer by layer:

- ``routing_frequency``: the share of tokens that choose the expert (a frequency criterion of
  expert pruning, e.g. Lu et al. 2024, Not All Experts are Equal, arXiv:2402.14800);
- ``router_weight``: its mean router weight over every token;
- ``reap``: REAP's saliency, the router weight times the norm of the expert's output, averaged
  over the tokens routed to it (Lasby et al. 2025, REAP, arXiv:2510.13999);
- ``gate_taylor`` and ``gate_taylor_loss``: the first-order change of the target's
  log-probability (of the next-token loss) when the expert's weighted output is dropped:
  ``|Σ w · f(x) · ∂/∂y|`` per text, averaged.
"""

from __future__ import annotations

from attrlab.attribution.engine.estimators import (
    Estimator,
    per_layer_reading,
    register_estimator,
)

__all__: list[str] = []


_EXPERT = ("expert",)
_PASSES = "one forward over the dataset (shared by the expert estimators)"

for _estimator in (
    Estimator(
        "routing_frequency",
        _EXPERT,
        "the share of the texts' tokens that choose the expert among their top-k",
        "Lu et al. 2024, Not All Experts are Equal: Efficient Expert Pruning and Skipping "
        "for Mixture-of-Experts LLMs (arXiv:2402.14800)",
        per_layer_reading(lambda s: s.frequency),
        reads="statistics",
        title="Routing frequency",
        passes=_PASSES,
    ),
    Estimator(
        "router_weight",
        _EXPERT,
        "the expert's mean router weight over every token (0 where it is not chosen)",
        "Lu et al. 2024 (arXiv:2402.14800): routing scores as expert importance",
        per_layer_reading(lambda s: s.weight),
        reads="statistics",
        title="Mean router weight",
        passes=_PASSES,
    ),
    Estimator(
        "reap",
        _EXPERT,
        "router weight × ‖expert output‖₂, averaged over the tokens routed to the expert",
        "Lasby et al. 2025, REAP: Router-weighted Expert Activation Pruning (arXiv:2510.13999)",
        per_layer_reading(lambda s: s.reap),
        reads="statistics",
        title="REAP",
        passes=f"{_PASSES} + one expert pass per routed token",
    ),
    Estimator(
        "gate_taylor",
        _EXPERT,
        "|Σ w · f(x) · ∂ log p(target)/∂y| per text, averaged: dropping the expert, to first order",
        "Molchanov et al. 2019 (arXiv:1906.10771), on the expert's gated output",
        per_layer_reading(lambda s: s.first_order.get("target")),
        reads="statistics",
        title="Gate × gradient (target)",
        passes=f"{_PASSES} + one backward per text",
        needs=("target",),
    ),
    Estimator(
        "gate_taylor_loss",
        _EXPERT,
        "|Σ w · f(x) · ∂ loss/∂y| per text, averaged, of the mean next-token loss",
        "Molchanov et al. 2019 (arXiv:1906.10771), on the expert's gated output",
        per_layer_reading(lambda s: s.first_order.get("loss")),
        reads="statistics",
        title="Gate × gradient (loss)",
        passes=f"{_PASSES} + one backward per text",
        needs=("loss",),
        decoders_only=True,
    ),
):
    register_estimator(_estimator)
