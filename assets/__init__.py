"""Sample inputs and label files shipped with attrlab (read with importlib.resources)."""
