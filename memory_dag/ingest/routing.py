"""Ingest routing for a sharded store: each workspace file goes to the shard of its owner.

Each shard has a workspace folder of its own (`data/shards/shard-00.workspace/`) holding the
workspace files routed to it as hard links (the same bytes, no copy; a copy where the
filesystem cannot link), so every ingest stage runs on a shard unchanged. A transcript goes to
the shard of its conversation's route key (`store/shards.py`), fixed the first time the
conversation is seen and kept in `routes.json`; an entry or a note naming a conversation goes
with that conversation; a note naming none is shared and linked into every shard. Routing
reads the bytes only of conversations it has not seen; it is idempotent, and a file gone from
the workspace (or re-routed by a re-shard) is unlinked from the shard that no longer owns it.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from memory_dag.config import Settings
from memory_dag.ingest.sources import (
    SourceFile,
    discover_files,
    read_source,
    transcript_users,
)
from memory_dag.ingest.watch import FileState, WorkspaceChanges, rescan_once_settled, scan_workspace
from memory_dag.reports import StageReport, StageTimer
from memory_dag.store.shards import (
    all_shard_settings,
    conversation_key,
    layout_file,
    read_routes,
    shard_count,
    shard_key,
    shard_of,
    shard_settings,
    user_key,
    write_layout,
    write_routes,
)

#: The shard sensor's cursor entry for the workspace itself (the others are `shard-00` …).
WORKSPACE_CURSOR_KEY = "workspace"


def transcript_conversation(rel_path: str) -> str | None:
    """`sessions/<conversation>/<session>.jsonl` → conversation (as `sources.py` reads it)."""
    folders = rel_path.split("/")[1:-1]
    return "/".join(folders) or None


def _file_conversation(file: SourceFile, front_matter: dict | None) -> str | None:
    if file.kind == "transcript":
        return transcript_conversation(file.rel_path)
    if front_matter and isinstance(front_matter.get("conversation_id"), str):
        return front_matter["conversation_id"]
    parts = file.rel_path.split("/")
    if file.kind == "entry" and len(parts) > 2:
        return parts[1]
    return None


def _key_of_users(users: set[str], fallback: str | None) -> str | None:
    """One user: that user's key; none or several: the fallback (the conversation's key)."""
    return user_key(next(iter(users))) if len(users) == 1 else fallback


def plan_routes(settings: Settings, shards: int) -> tuple[dict[int, dict[str, Path]], StageReport]:
    """Which files each shard holds (rel_path → where the bytes are), updating `routes.json`."""
    report = StageReport("routing")
    routes = read_routes(settings)
    discovered = discover_files(settings.workspace, settings.workspace_extra_roots)
    refused = [f for f in discovered if f.refused is not None]
    readable = [f for f in discovered if f.refused is None]

    # Transcripts of conversations not yet routed: their users decide their key.
    users_by_conversation: dict[str, set[str]] = defaultdict(set)
    loose_keys: dict[str, str | None] = {}  # transcripts outside any conversation folder
    for file in readable:
        if file.kind != "transcript":
            continue
        conversation = transcript_conversation(file.rel_path)
        if conversation is not None and conversation in routes:
            continue
        users = transcript_users(file)
        if conversation is None:
            loose_keys[file.rel_path] = _key_of_users(users, None)
        else:
            users_by_conversation[conversation] |= users
    new_conversations = 0
    for conversation, users in users_by_conversation.items():
        routes[conversation] = str(_key_of_users(users, conversation_key(conversation)))
        new_conversations += 1

    placement: dict[int, dict[str, Path]] = {shard: {} for shard in range(shards)}
    shared = 0
    for file in readable:
        if file.kind == "transcript" and file.rel_path in loose_keys:
            key = loose_keys[file.rel_path]
        else:
            front = read_source(file).front_matter if file.kind != "transcript" else None
            conversation = _file_conversation(file, front)
            if conversation is not None and conversation not in routes:
                routes[conversation] = conversation_key(conversation)
                new_conversations += 1
            key = routes.get(conversation) if conversation is not None else None
        if key is None:
            shared += 1
            for files in placement.values():
                files[file.rel_path] = file.path
        else:
            placement[shard_of(key, shards)][file.rel_path] = file.path
    write_routes(settings, routes)
    report.counts = {
        "files": len(discovered),
        "shared_files": shared,
        "new_conversations": new_conversations,
        "conversations": len(routes),
        "refused": len(refused),
    }
    report.errors = [{"path": f.rel_path, "line": None, "reason": f.refused} for f in refused]
    return placement, report


def route_workspace(settings: Settings, shards: int | None = None) -> StageReport:
    """Link every workspace file into its shard's workspace; unlink what a shard no longer owns.

    Returns what it did; `report.notes` names the shards whose workspace changed.
    """
    count = shard_count(settings) if shards is None else shards
    if count == 1:
        report = StageReport("routing", skipped=True)
        report.notes.append("one shard: the workspace is ingested as it is")
        return report
    if not layout_file(settings).exists():
        write_layout(settings, count)  # the first sharded run: the disk now says N shards
    placement, report = plan_routes(settings, count)
    with StageTimer(report):
        linked = removed = 0
        changed: list[int] = []
        for shard, files in placement.items():
            root = Path(shard_settings(settings, shard, count).workspace)
            added = sum(_place(source, root / rel_path) for rel_path, source in files.items())
            dropped = _remove_others(root, set(files))
            linked += added
            removed += dropped
            if added or dropped:
                changed.append(shard)
        report.counts.update(
            {"linked": linked, "unlinked": removed, "shards_changed": len(changed)}
        )
        report.notes = [f"changed shards: {changed}"]
        report.preview = [{"shard": s, "files": len(placement[s])} for s in sorted(placement)]
    return report


def _place(source: Path, target: Path) -> bool:
    """Make `target` the same file as `source` (a hard link, else a copy); True if it changed."""
    try:
        source_stat = source.stat()
    except OSError:
        return False  # vanished since discovery: the next routing drops it
    try:
        target_stat = target.stat()
        same_inode = (target_stat.st_ino, target_stat.st_dev) == (
            source_stat.st_ino,
            source_stat.st_dev,
        )
        same_copy = (target_stat.st_size, target_stat.st_mtime) == (
            source_stat.st_size,
            source_stat.st_mtime,
        )
        if same_inode or (target_stat.st_nlink == 1 and same_copy):
            return False
    except FileNotFoundError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.routing")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
    except OSError:  # another filesystem, or links not allowed: copy (keeps the mtime)
        shutil.copy2(source, temporary)
    os.replace(temporary, target)
    return True


def _remove_others(root: Path, wanted: set[str]) -> int:
    """Unlink files under `root` that the shard no longer holds; prune empty folders."""
    if not root.exists():
        return 0
    removed = 0
    for path in sorted(root.rglob("*"), reverse=True):
        rel_path = path.relative_to(root).as_posix()
        if path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
        elif rel_path not in wanted:
            path.unlink()
            removed += 1
    return removed


@dataclass
class ShardChanges:
    """What one shard's ingest must pick up, and the shard workspace's state to remember."""

    changes: WorkspaceChanges
    state: FileState

    @property
    def changed_bytes(self) -> int:
        """Bytes of the new and changed files: how long the shard's run will take, roughly."""
        return sum(self.state[key][0] for key in self.changes.new + self.changes.changed)


@dataclass
class ShardLook:
    """One look of the shard sensor: each shard's changes (by shard key) and the next cursor."""

    shards: dict[str, ShardChanges]
    cursor: dict[str, FileState]
    #: False when the workspace was unchanged and routing and the shard scans were skipped.
    routed: bool

    def changed_shards(self) -> list[str]:
        """The shards that need an ingest run, the most changed bytes first.

        Runs start in the order they are asked for, so the longest go first and short ones
        fill the last gaps: with two workers and eight shards of 4-9 s, asking in shard order
        once left one worker idle for the last 3.5 s (benchmarks/scale.py, 2026-11-27).
        """
        changed = [key for key, shard in self.shards.items() if shard.changes.any]
        return sorted(changed, key=lambda key: (-self.shards[key].changed_bytes, key))


def look_at_shards(
    settings: Settings, cursor: dict[str, FileState], *, debounce_seconds: float
) -> ShardLook:
    """Route the workspace into its shards and scan each shard's workspace (the shard sensor).

    Routing and the shard scans stat every file twice more than a scan of the workspace does:
    ~0.5 CPU s a look at 100k turns, every 5 s, on the cores the shards' runs need. A look that
    finds the workspace as it was (same files, sizes and times) and the same shards skips both:
    only routing writes the shard workspaces, so they are as the last look left them.
    """
    keys = [shard_key(number) for number in range(shard_count(settings))]
    workspace_changes, workspace_state = scan_workspace(
        Path(settings.workspace),
        cursor.get(WORKSPACE_CURSOR_KEY, {}),
        debounce_seconds=debounce_seconds,
        extra_roots=settings.workspace_extra_roots,
        hash_new=False,  # routing reads new files anyway; the shard scans hash them
    )
    unchanged = not (workspace_changes.any or workspace_changes.settling)
    if unchanged and set(cursor) == {WORKSPACE_CURSOR_KEY, *keys}:
        # A touched file (same bytes, new time) updates the workspace's entry only.
        return ShardLook({}, {**cursor, WORKSPACE_CURSOR_KEY: workspace_state}, routed=False)

    route_workspace(settings)

    def scan_shards() -> dict[str, ShardChanges]:
        return {
            key: ShardChanges(
                *scan_workspace(
                    Path(shard.workspace),
                    cursor.get(key, {}),
                    debounce_seconds=debounce_seconds,
                    extra_roots=shard.workspace_extra_roots,
                )
            )
            for key, shard in zip(keys, all_shard_settings(settings), strict=True)
        }

    shards = rescan_once_settled(
        scan_shards,
        settling=lambda scanned: any(shard.changes.settling for shard in scanned.values()),
        debounce_seconds=debounce_seconds,
    )
    next_cursor = {key: shard.state for key, shard in shards.items()}
    return ShardLook(shards, {WORKSPACE_CURSOR_KEY: workspace_state, **next_cursor}, routed=True)
