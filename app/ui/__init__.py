"""
The web page: a text, a prompt's next token or an image, explained by methods side by side.

Each map comes with how far it can be trusted; other tabs show which layers and heads carried
the prediction, evaluate methods, and batch-explain a dataset. One module per tab
(:mod:`~app.ui.explain`, :mod:`~app.ui.layers`, :mod:`~app.ui.evaluate`, :mod:`~app.ui.batch`)
over what they share: how a request runs (:mod:`~app.ui.runner`), the fields' readers
(:mod:`~app.ui.shared`) and the page's files (:mod:`~app.ui.files`); :mod:`~app.ui.page`
assembles them. No module here imports this package's ``__init__``: the names below are for
callers outside it.
"""

from attrlab.app.ui.files import page_folder, received_file, received_input, upload_folder
from attrlab.app.ui.link import share_query
from attrlab.app.ui.page import build_ui
from attrlab.app.ui.runner import PageRunner
from attrlab.app.ui.shared import label_list, labels_for, method_entries, read_target, sample_labels

__all__ = [
    "PageRunner",
    "build_ui",
    "label_list",
    "labels_for",
    "method_entries",
    "page_folder",
    "read_target",
    "received_file",
    "received_input",
    "sample_labels",
    "share_query",
    "upload_folder",
]
