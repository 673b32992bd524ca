"""Absolute paths of the store's files, resolved once per process.

The read path keys its per-process caches (index, overlay, searcher, snapshots) by resolved
folder; `Path.resolve` walks every component with `lstat` and cost ~2.5 ms a search (19
calls) under load. A store's folders do not move under a running process, so the answer is
kept per (working directory, path).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_resolved: dict[tuple[str, str], Path] = {}
_lock = threading.Lock()
#: Cleared when it grows past this (paths built from user input would otherwise pile up).
_LIMIT = 4096


def resolved(path: str | os.PathLike[str]) -> Path:
    """`Path(path).resolve()`, remembered for the process's current working directory."""
    key = (os.getcwd(), os.fspath(path))
    found = _resolved.get(key)
    if found is None:
        found = Path(path).resolve()
        with _lock:
            if len(_resolved) >= _LIMIT:
                _resolved.clear()
            _resolved[key] = found
    return found
