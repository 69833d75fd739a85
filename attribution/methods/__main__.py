"""``python -m attrlab.attribution.methods``: write ``catalog.json`` from the method classes."""

from attrlab.attribution.methods.registry import write_catalog

print(write_catalog())
