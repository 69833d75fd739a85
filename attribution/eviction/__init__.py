"""
Key/value-cache eviction: which prompt entries a decoder can forget, each score checked by evicting.

:mod:`~attribution.eviction.cache` prefills a prompt once and reads the answer against caches
with entries evicted; :mod:`~attribution.eviction.scorers` holds the eviction scorers
(StreamingLLM, H2O, Scissorhands, SnapKV, TOVA, KNorm, VATP, CAOTE, and attributions as
oracles); :mod:`~attribution.eviction.study` measures each scorer's curve of the answer against
the share evicted, beside random evictions, and its agreement with leaving each token out.
"""
