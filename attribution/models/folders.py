"""
A local model folder, read before any loader opens it: its config, and where its files lie.

Loaders (transformers, timm) open a folder's files by name and follow its links; a shard index
(``model.safetensors.index.json``) names further files, joined to the folder as given. A
server that serves folders under model roots checks every one of them first
(:func:`check_inside`). Messages name files by their place in the folder, never by where a link
leads.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attrlab.attribution.errors import InvalidInputError, ModelLoadError, parse_json

__all__ = ["CONFIG_FILE", "check_inside", "read_config", "resolves_inside"]

CONFIG_FILE = "config.json"
#: A shard index's suffix: its ``weight_map`` names the weight files loaded with it.
_SHARD_INDEX = ".index.json"
#: The most entries (files and folders, in all its tree) a model folder's check walks: a
#: model's are a few dozen, and each request for a folder that does not load walks it again.
MAX_FOLDER_ENTRIES = 10_000
#: The most bytes of a folder's JSON file (config, shard index) read: a large model's are KBs.
MAX_JSON_BYTES = 16 * 2**20


def resolves_inside(path: str | Path, roots: Sequence[Path]) -> bool:
    """Whether ``path``, its links followed, lies inside one of ``roots`` (False if no path)."""
    try:
        real = Path(os.path.realpath(path))
        return any(real.is_relative_to(os.path.realpath(root)) for root in roots)
    except (OSError, ValueError):  # a NUL byte, a name too long, a link loop
        return False


def check_inside(folder: Path, roots: Sequence[Path]) -> int:
    """
    Refuse a model folder that would have a loader read a file from outside ``roots``.

    Every entry of the folder's tree (a linked folder's entries too) and every file a shard
    index in it names must resolve inside one of ``roots``; links between folders inside the
    roots (a hub cache's snapshots) are fine. Every entry must be a folder or a regular file
    (a pipe would have a loader wait for ever, a device read without end); a link to nothing
    is left to the loader, which names what it misses.

    Returns:
        The bytes of the folder's regular files (a file linked twice counts twice).

    Raises:
        ModelLoadError: naming the first file that leads out, or cannot be read; or the
            folder holds more than :data:`MAX_FOLDER_ENTRIES` entries.
    """
    if not resolves_inside(folder, roots):
        raise ModelLoadError("the model folder lies outside the model roots")
    seen = {os.path.realpath(folder)}
    pending = [folder]
    walked = size = 0
    while pending:
        current = pending.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda entry: entry.name)
        except OSError as err:
            raise ModelLoadError(
                f"model folder file '{_name(current, folder)}' cannot be read ({err.strerror})"
            ) from None
        walked += len(entries)
        if walked > MAX_FOLDER_ENTRIES:
            raise ModelLoadError(
                f"the model folder holds more than {MAX_FOLDER_ENTRIES:,} files and folders; "
                "a model's are a few dozen"
            )
        for entry in entries:
            path = Path(entry.path)
            name = _name(path, folder)
            if not resolves_inside(path, roots):
                raise ModelLoadError(f"model folder file '{name}' links outside the model roots")
            kind, bytes_ = _kind(path)
            size += bytes_
            if kind is not None and not (stat.S_ISDIR(kind) or stat.S_ISREG(kind)):
                raise ModelLoadError(
                    f"model folder file '{name}' is not a regular file (a pipe, socket or device)"
                )
            if kind is not None and stat.S_ISDIR(kind):
                real = os.path.realpath(path)
                if real not in seen:  # a folder linked twice, or a loop, is walked once
                    seen.add(real)
                    pending.append(path)
            elif entry.name.endswith(_SHARD_INDEX):
                shards = _read_json(path, name).get("weight_map")
                if not isinstance(shards, dict):
                    raise ModelLoadError(f"model folder file '{name}' has no weight_map object")
                for shard in set(shards.values()):
                    if not (isinstance(shard, str) and resolves_inside(path.parent / shard, roots)):
                        raise ModelLoadError(
                            f"model folder file '{name}' names a weight file outside the model "
                            "roots"
                        )
    return size


def read_config(folder: Path) -> dict[str, Any]:
    """
    The folder's ``config.json``, checked before a loader reads it.

    Returns:
        The config: an object naming a ``model_type`` (transformers) or ``architecture`` (timm).

    Raises:
        ModelLoadError: naming the file, when it is missing, unreadable, not JSON, not an object,
            or names neither.
    """
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ModelLoadError(f"the model folder has no file '{CONFIG_FILE}'")
    config = _read_json(path, CONFIG_FILE)
    if not any(isinstance(config.get(key), str) for key in ("model_type", "architecture")):
        raise ModelLoadError(
            f"model folder file '{CONFIG_FILE}' names no model_type (a transformers model) "
            "nor architecture (a timm model)"
        )
    return config


def _read_json(path: Path, name: str) -> dict[str, Any]:
    """A folder file's JSON object, or a refusal naming the file."""
    what = f"model folder file '{name}'"
    try:
        if (size := path.stat().st_size) > MAX_JSON_BYTES:
            raise ModelLoadError(
                f"{what} is {size / 2**20:.0f} MiB; a model folder's JSON files are read up to "
                f"{MAX_JSON_BYTES // 2**20} MiB"
            )
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelLoadError(f"{what} is not UTF-8 text") from None
    except OSError as err:
        raise ModelLoadError(f"{what} cannot be read ({err.strerror})") from None
    try:
        value = parse_json(text, what)
    except InvalidInputError as err:
        raise ModelLoadError(str(err)) from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{what} is not a JSON object")
    return value


def _kind(path: Path) -> tuple[int | None, int]:
    """
    The file type bits of ``path``, its links followed, and its bytes if a regular file.

    The type is None for a link to nothing or a loop.
    """
    try:
        found = os.stat(path)  # a linked folder is walked like its own
    except OSError:  # its name was already checked: the loader names what it misses
        return None, 0
    return found.st_mode, found.st_size if stat.S_ISREG(found.st_mode) else 0


def _name(path: Path, folder: Path) -> str:
    """``path``'s place in the model folder (``"."`` for the folder itself)."""
    return path.relative_to(folder).as_posix()
