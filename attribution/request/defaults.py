"""
The numbers a study takes when a request leaves them out, for the library and every front end.

CLI flags, REST bodies, worker requests and the page's fields all read them here.

Plain numbers, importing nothing: ``attrlab --help`` reads them without loading torch.
"""

from __future__ import annotations

__all__ = [
    "EVALUATION_ORDERS",
    "EVALUATION_STEPS",
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
