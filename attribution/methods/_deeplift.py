"""
The scope Captum's DeepLIFT runs in, and what it reports.

Rules for every nonlinearity attrlab knows, nothing left on the model afterwards, and a warning
where the summation-to-delta cannot hold.

Kept apart from the Captum glue (:mod:`attribution.methods._captum`): the transformer rules
import transformers' model code, which only DeepLIFT and DeepLIFT-SHAP need.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from attrlab.attribution.compat import deeplift_rules, rescale_rule
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.methods._deeplift_rules import (
    DeepLiftReport,
    transformer_deeplift_rules,
    treated_norm,
)
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.verdicts import Verdict, summation_to_delta

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter

__all__ = ["deeplift_eps", "deeplift_scope", "summation_verdict", "untreated_by_deeplift"]


#: Attributes Captum's DeepLIFT sets on hooked modules and deletes only on a full backward.
_DEEPLIFT_ATTRIBUTES = ("input", "output", "input_ref")
#: Where activation modules live (timm's own layers package holds convolutions and norms too, so
#: only its activation modules count).
_ACTIVATION_MODULES = (
    "torch.nn.modules.activation",
    "transformers.activations",
    "timm.layers.activations",
)
#: Activation-module classes that are not elementwise (they mix features or need their own rule).
_NOT_ELEMENTWISE = ("Softmax", "Softmin", "Softmax2d", "LogSoftmax", "GLU", "MultiheadAttention")
# Captum keeps its table of DeepLIFT rules in a module-level dict; the Rescale entries added for
# one run are removed after it, and runs that edit the table take turns.
_RULE_TABLE_LOCK = threading.Lock()
#: Normalisations dividing by statistics of their input (nonlinear); ``*Norm`` classes count too.
_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
#: Batch norm in eval mode is an affine map: DeepLIFT treats it exactly.
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@contextmanager
def deeplift_scope(model: nn.Module, adapter: Adapter | None = None) -> Iterator[DeepLiftReport]:
    """
    Run Captum DeepLIFT on ``model`` with rules for every nonlinearity attrlab knows.

    ``adapter`` (the one serving ``model``, if any) locates its attention modules and
    classification head.

    Elementwise activation modules get Captum's Rescale rule; norms, attention and cosine heads
    get :func:`~attribution.methods._deeplift_rules.transformer_deeplift_rules`, whose report
    is yielded. Nothing is left on the model, even when a forward fails: Captum removes its
    hooks itself but keeps the saved inputs/outputs it attached to nonlinear modules when the
    pass does not complete; they are deleted here. A module called twice in one forward (which
    DeepLIFT's rules cannot handle) becomes an :class:`UnsupportedMethodError`.
    """
    before = {id(m): {a for a in _DEEPLIFT_ATTRIBUTES if a in vars(m)} for m in model.modules()}
    with _RULE_TABLE_LOCK:  # read and edit the table under one lock: runs take turns
        added = sorted(
            (cls for cls in _elementwise_activations(model) if cls not in deeplift_rules),
            key=lambda cls: cls.__qualname__,
        )
        for cls in added:  # Captum's Rescale rule, which it applies only to ReLU, Tanh, ...
            deeplift_rules[cls] = rescale_rule
        try:
            with (
                warnings.catch_warnings(),
                transformer_deeplift_rules(model, adapter) as report,
            ):
                warnings.filterwarnings("ignore", message="Setting forward, backward hooks")
                yield report
        except RuntimeError as err:
            if "used more than once" not in str(err):
                raise
            raise UnsupportedMethodError(
                "DeepLIFT cannot explain this model: it calls one nonlinearity module more than "
                "once in a forward pass, so Captum cannot pair its inputs with its outputs"
            ) from None
        finally:
            for cls in added:
                deeplift_rules.pop(cls, None)
            for module in model.modules():
                for name in _DEEPLIFT_ATTRIBUTES:
                    if name in vars(module) and name not in before.get(id(module), ()):
                        delattr(module, name)


def _elementwise_activations(model: nn.Module) -> set[type[nn.Module]]:
    """Classes of ``model``'s elementwise activation modules (GELU, SiLU, ReLU6, Hardswish...)."""
    return {
        type(module)
        for module in model.modules()
        if type(module).__module__.startswith(_ACTIVATION_MODULES)
        and not list(module.children())
        and type(module).__name__ not in _NOT_ELEMENTWISE
    }


def untreated_by_deeplift(model: nn.Module, routed: Collection[int] = ()) -> list[str]:
    """
    Class names of the submodules whose nonlinearity DeepLIFT passes as a plain gradient.

    Found from module types: normalisation layers other than batch norm, ``nn.LayerNorm`` and
    RMSNorm (GroupNorm, channel-first LayerNorm variants), attention modules not routed through
    the attention rule (``routed``: ids of the modules that were, and of their parents) and
    activation modules that are not elementwise. Nonlinearities written as plain functions
    inside a forward cannot be seen here.
    """
    found = set()
    treated = _elementwise_activations(model)
    for module in model.modules():
        cls = type(module)
        if cls in deeplift_rules or cls in treated or treated_norm(module):
            continue
        is_attention = (
            isinstance(module, nn.MultiheadAttention) or "Attention" in cls.__name__
        ) and not any(id(inner) in routed for inner in module.modules())
        is_norm = isinstance(module, _NORMS) or (
            cls.__name__.endswith("Norm") and not isinstance(module, _BATCH_NORMS)
        )
        is_activation = cls.__module__.startswith(_ACTIVATION_MODULES) and not list(
            module.children()
        )
        if is_attention or is_norm or is_activation:
            found.add(cls.__name__)
    return sorted(found)


def deeplift_eps(model: nn.Module) -> float:
    """
    Captum's threshold under which ``Δx`` counts as zero, for ``model``'s precision.

    ``1e-10``, raised to the smallest normal number of a float16 model, where ``1e-10`` rounds
    to 0 and Captum's Rescale rule divides 0 by 0.
    """
    dtype = next(model.parameters()).dtype
    return max(1e-10, float(torch.finfo(dtype).tiny)) if dtype.is_floating_point else 1e-10


def summation_verdict(
    model: nn.Module,
    run: RunContext,
    scores: np.ndarray,
    metrics: dict[str, float],
    report: DeepLiftReport,
) -> Verdict:
    """
    Judge summation-to-delta (:func:`~attribution.verdicts.summation_to_delta`); warn why not.

    Warns when the delta cannot hold for ``model`` (operations without a rule, named) or
    visibly fails, and when the values are not finite.
    """
    if not (np.isfinite(scores).all() and np.isfinite(metrics["convergence_delta"])):
        run.warn(
            "DeepLIFT produced non-finite values (overflow or 0/0 in the model's precision); "
            "load the model in float32 for this method"
        )
    verdict = summation_to_delta(metrics)
    untreated = sorted(
        set(untreated_by_deeplift(model, report.routed_attention)) | report.untreated
    )
    if untreated:
        shown = ", ".join(untreated[:8]) + (" ..." if len(untreated) > 8 else "")
        run.warn(
            f"this model contains operations DeepLIFT has no rule for here ({shown}); "
            "gradients pass through them unchanged, so the attributions need not sum to "
            f"F(x) - F(baseline): the convergence delta is "
            f"{metrics['relative_convergence_delta']:.1%} of the logit difference"
        )
    elif verdict.status != "pass":
        run.warn(
            f"the convergence delta is {metrics['relative_convergence_delta']:.1%} of "
            "F(x) - F(baseline): a nonlinearity is not conserved (a max-pool whose maximum moves "
            "between input and baseline, or a function DeepLIFT cannot see)"
        )
    return verdict
