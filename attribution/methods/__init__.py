"""Attribution methods. Each module registers one method; the list below is the registry."""

from attribution.methods import gradient_x_input, integrated_gradients  # noqa: F401  registers
from attribution.methods.base import Attribution, AttributionMethod
from attribution.methods.registry import available_methods, get_method, register

__all__ = ["Attribution", "AttributionMethod", "available_methods", "get_method", "register"]
