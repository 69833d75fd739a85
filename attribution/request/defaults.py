"""
The numbers a study takes when a request leaves them out, for the library and every front end.

CLI flags, REST bodies, worker requests and the page's fields all read them here.

Plain numbers, importing nothing: ``attrlab --help`` reads them without loading torch.
"""

from __future__ import annotations

__all__ = [
    "BITS_DRAWS",
    "BIT_WIDTHS",
    "BUDGETS",
    "EVALUATION_ORDERS",
    "EVALUATION_STEPS",
    "EVICTION_COUNT",
    "EVICTION_MAX_ITEMS",
    "EVICTION_MAX_TOKENS",
    "EVICTION_SPLITS",
    "EVICTION_TASK",
    "EVICTION_TASKS",
    "EVICTION_TASK_SIZES",
    "EVICTION_UNITS",
    "GROUP_SIZE",
    "KEEP_RATIOS",
    "LAYERS_TOP_K",
    "NOISE_SEEDS",
    "PATCHING_TOP_K",
    "PRUNING_DRAWS",
    "RECHECK_DRAWS",
    "TOP_FRACTION",
]

#: The layer analysis: heads compared by the estimators' top-k overlap and re-checked together.
LAYERS_TOP_K = 5
#: The heads' re-check: the most random head sets each estimator's top heads are judged against
#: (drawn five at first, more while a margin is unsettled: the rule of every verdict against
#: random draws).
RECHECK_DRAWS = 20
#: Activation patching: causal tracing's noise draws, and sites in the top-k overlap of an
#: estimator with exact patching.
NOISE_SEEDS, PATCHING_TOP_K = 10, 10
#: Pruning curves: the most random removal orders per unit kind (drawn five at first, more while
#: a ranking's area is unsettled against them).
PRUNING_DRAWS = 20
#: A check of methods: share of a map's elements in the top-k overlap of two methods.
TOP_FRACTION = 0.1
#: An evaluation of methods (the leaderboard): points per deletion / insertion curve, and the
#: most random orders per item its methods' maps are judged against (drawn until every margin
#: is settled; a short text's exact expectation where that costs no more), for the command line,
#: the page and the library alike.
EVALUATION_STEPS, EVALUATION_ORDERS = 50, 100
#: Bits per part: the widths of the sensitivity table and the allocations; the group size of
#: group-wise quantisation (SmolLM2's widths 576 and 1,536 and most models' are multiples of
#: 32; a last, shorter group is padded with zeros, which the asymmetric range holds anyway);
#: the average budgets in bits per weight; the most random allocations per budget (five at
#: first).
BIT_WIDTHS, GROUP_SIZE = (8, 4, 3, 2), 32
BUDGETS, BITS_DRAWS = (4.0, 3.0), 10
#: Key/value eviction (:mod:`attribution.eviction`): the generated tasks, the most items of one
#: study, a generated prompt's size in tokens (fewest, most), the units evicted, how a
#: ``kv_entry`` budget is split over the layers, the curves' keep ratios (the full cache
#: first), and what a request generates when it says nothing (plain values: a front end reads
#: them without loading torch).
EVICTION_TASKS = ("kv_retrieval", "needle", "variable_tracking")
EVICTION_MAX_ITEMS = 20
EVICTION_TASK_SIZES = (64, 4096)
EVICTION_UNITS = ("kv_entry", "kv_position")
EVICTION_SPLITS = ("uniform", "pyramid")
KEEP_RATIOS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05)
EVICTION_TASK, EVICTION_COUNT, EVICTION_MAX_TOKENS = "kv_retrieval", 3, 500
