"""
attrlab's attribution library: models, methods, layer/head analysis and metrics.

Pure PyTorch: nothing here imports a UI or web framework.
"""

from attribution.errors import AttrlabError
from attribution.explain import explain
from attribution.explanation import Explanation
from attribution.methods import available_methods, get_method
from attribution.models import load

__all__ = ["AttrlabError", "Explanation", "available_methods", "explain", "get_method", "load"]
