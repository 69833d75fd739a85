"""
A folder of converted models under ``ATTRLAB_CACHE`` (default ``~/.cache/attrlab``).

Some embedded models ship in a slow-to-load form (SmolLM2 as a quantised GGUF file takes
seconds to dequantise); the converted weights are written here once and loaded from here after.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["cache_root", "converted", "remove_orphans"]

_DONE = ".complete"


def cache_root() -> Path:
    """``ATTRLAB_CACHE``, else ``~/.cache/attrlab``."""
    return Path(os.environ.get("ATTRLAB_CACHE") or Path.home() / ".cache" / "attrlab")


def converted(name: str, convert: Callable[[Path], None]) -> Path:
    """
    The folder ``name`` in the cache, made by ``convert(folder)`` if it is not there yet.

    ``convert`` writes into a private temporary folder that is renamed into place only when it
    is complete, so an interrupted conversion leaves nothing half-written and two processes
    converting at once both end up with one whole folder.
    """
    root = cache_root()
    target = root / name
    if (target / _DONE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    remove_orphans(root, name)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-{os.getpid()}-", dir=root))
    try:
        convert(staging)
        (staging / _DONE).touch()
        if target.exists() and not (target / _DONE).is_file():
            shutil.rmtree(target, ignore_errors=True)  # left by an older, interrupted layout
        try:
            staging.rename(target)
        except OSError:  # another process got there first
            if not (target / _DONE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def remove_orphans(root: Path, name: str) -> None:
    """
    Folders ``.NAME-PID-*`` in ``root`` whose process died (killed, out of memory) before cleanup.

    A conversion's staging folders here; a server's private offload folders too.
    """
    for folder in root.glob(f".{name}-*-*"):
        pid = folder.name.removeprefix(f".{name}-").split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: alive
        return True
    return True
