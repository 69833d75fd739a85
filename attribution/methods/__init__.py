"""Attribution methods. Each module registers one method; the tuple below is the registry."""

from importlib import import_module

from attribution.methods.base import Attribution, AttributionMethod
from attribution.methods.registry import available_methods, get_method, register

__all__ = ["Attribution", "AttributionMethod", "available_methods", "get_method", "register"]

#: Every method module, imported explicitly (each registers its class with ``@register``).
METHOD_MODULES = (
    "attention_flow",
    "attnlrp",
    "deeplift",
    "deeplift_shap",
    "gradcam",
    "gradient_x_input",
    "integrated_gradients",
    "layers",
    "occlusion",
    "pa_lrp",
    "rise",
    "rollout",
    "shap_method",
    "sobol",
)
for _module in METHOD_MODULES:
    import_module(f"{__name__}.{_module}")
