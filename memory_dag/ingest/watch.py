"""Change detection for the workspace sensor: what is new, changed or deleted since last look.

The state is a dict `{rel_path: [size, mtime, sha256]}` kept by `sensor_state.py`. A
cheap `stat()` decides which files to hash; only a different hash is a change (a `touch`
is not). Files modified within `debounce_seconds` are left for the next look, so a file
being written is not ingested half-way (the watcher's debounce, seed 002: 1.5 s).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from memory_dag.ingest.sources import discover_files, file_stat, hash_bytes

S = TypeVar("S")

FileState = dict[str, list]  # rel_path -> [size, mtime, hash]


@dataclass
class WorkspaceChanges:
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    settling: list[str] = field(default_factory=list)  # modified too recently; next time
    #: Same content under a new size or mtime: nothing to re-read, but the store's stat is old.
    touched: list[str] = field(default_factory=list)
    #: Files the scan listed (the workspace's size, for reports).
    listed: int = 0

    @property
    def any(self) -> bool:
        return bool(self.new or self.changed or self.deleted)

    def summary(self) -> str:
        return f"{len(self.new)} new, {len(self.changed)} changed, {len(self.deleted)} deleted" + (
            f", {len(self.settling)} still being written" if self.settling else ""
        )


def scan_workspace(
    workspace: Path,
    previous: FileState,
    *,
    debounce_seconds: float = 1.5,
    now: float | None = None,
    extra_roots: Iterable[Path] = (),
    hash_new: bool = True,
) -> tuple[WorkspaceChanges, FileState]:
    """Compare the workspace with `previous`; return the changes and the state to remember.

    A refused file (a symlink loop, a link out of the workspace) is never opened: its
    fingerprint is its reason. `hash_new=False`: a file `previous` does not know is new
    whatever it holds, so it is not read (its hash in the state is None): for a caller that
    wants only the changes (a first ingest of 1M turns read ~0.5 GB to hash it, before the run
    that reads it again).
    """
    now = time.time() if now is None else now
    changes = WorkspaceChanges()
    state: FileState = {}
    for source_file in discover_files(workspace, extra_roots):
        key = source_file.rel_path
        before = previous.get(key)
        if source_file.fingerprint is not None:
            state[key] = [0, 0.0, source_file.fingerprint]
            if before is None:
                changes.new.append(key)
            elif before[2] != source_file.fingerprint:
                changes.changed.append(key)
            continue
        try:
            size, mtime = file_stat(source_file.path)
        except OSError:
            continue  # vanished between listing and stat: it will show as deleted next time
        if now - mtime < debounce_seconds:
            changes.settling.append(key)
            if before is not None:
                state[key] = before
            continue
        if before is not None and before[0] == size and before[1] == mtime:
            state[key] = before
            continue
        if before is None and not hash_new:
            state[key] = [size, mtime, None]
            changes.new.append(key)
            continue
        try:
            digest = hash_bytes(source_file.path.read_bytes())
        except OSError:
            continue
        state[key] = [size, mtime, digest]
        if before is None:
            changes.new.append(key)
        elif before[2] != digest:
            changes.changed.append(key)
        else:
            changes.touched.append(key)
    changes.listed = len(state) + len([key for key in changes.settling if key not in state])
    changes.deleted = sorted(set(previous) - set(state) - set(changes.settling))
    return changes, state


def rescan_once_settled(
    scan: Callable[[], S], *, settling: Callable[[S], bool], debounce_seconds: float
) -> S:
    """`scan()` for a sensor: when a file is still being written, wait out the debounce once
    and look again. Dagster's daemon evaluates a sensor every 5 s at best, so a file seen
    half-written would otherwise wait a whole interval; one still being written after the
    wait is left for the next tick. `scan` may cover many workspaces (the shard sensor's):
    one wait serves them all."""
    result = scan()
    if settling(result):
        time.sleep(debounce_seconds)
        result = scan()
    return result


def scan_settled(
    workspace: Path,
    previous: FileState,
    *,
    debounce_seconds: float,
    extra_roots: Iterable[Path] = (),
) -> tuple[WorkspaceChanges, FileState]:
    """`scan_workspace` of one workspace through `rescan_once_settled`."""
    return rescan_once_settled(
        lambda: scan_workspace(
            workspace, previous, debounce_seconds=debounce_seconds, extra_roots=extra_roots
        ),
        settling=lambda scanned: scanned[0].settling,
        debounce_seconds=debounce_seconds,
    )


def conversation_of(rel_path: str) -> str | None:
    """The conversation a workspace file belongs to, or None (notes, our exported summaries)."""
    parts = rel_path.split("/")
    if parts[0] == "sessions" and len(parts) >= 3:
        return "/".join(parts[1:-1])
    if parts[0] == "entries" and len(parts) >= 3 and parts[2] not in ("summaries", "deleted"):
        return parts[1]
    return None


def changed_conversations(changes: WorkspaceChanges) -> list[str]:
    """The conversations of the new, changed and deleted files."""
    paths = [*changes.new, *changes.changed, *changes.deleted]
    return sorted({c for c in map(conversation_of, paths) if c is not None})


def state_fingerprint(state: FileState) -> str:
    """Identifies one version of the whole workspace: the run key of the sensor's request."""
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(f"{key}\x00{state[key][2]}\n".encode())
    return digest.hexdigest()[:24]
