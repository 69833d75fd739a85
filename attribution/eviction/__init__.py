"""
Key/value-cache eviction: which prompt entries a decoder can forget, each score checked by evicting.

:mod:`~attribution.eviction.cache` prefills a prompt once and reads the answer against caches
with entries evicted; :mod:`~attribution.eviction.scorers` holds the eviction scorers
(StreamingLLM, H2O, Scissorhands, SnapKV, TOVA, KNorm, VATP, CAOTE, and attributions as
oracles); :mod:`~attribution.eviction.study` measures each scorer's curve of the answer against
the share evicted, beside random evictions, and its agreement with leaving each token out;
:mod:`~attribution.eviction.request` is the study as the front ends ask for it. Exports are
imported on first use (the front ends' modules load no torch until a study runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.eviction.request import EvictionRequest, run_eviction
    from attrlab.attribution.eviction.study import EvictionStudy
    from attrlab.attribution.inputs.long_context import ContextTask, parse_tasks, read_tasks

__all__ = [
    "ContextTask",
    "EvictionRequest",
    "EvictionStudy",
    "parse_tasks",
    "read_tasks",
    "run_eviction",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "EvictionRequest": "attrlab.attribution.eviction.request",
        "run_eviction": "attrlab.attribution.eviction.request",
        "EvictionStudy": "attrlab.attribution.eviction.study",
        "ContextTask": "attrlab.attribution.inputs.long_context",
        "parse_tasks": "attrlab.attribution.inputs.long_context",
        "read_tasks": "attrlab.attribution.inputs.long_context",
    },
)
