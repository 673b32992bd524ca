"""Export summaries (and optionally facts and turns) as Markdown with YAML front matter.

The layout is agent-cli's (seed 000 §2.1, seed 001 §3.4), so people can read, diff and
version what the memory holds:

    entries/<conversation_id>/summaries/L1/chunk_<i>.md, L2/group_<i>.md, L3/final.md
    entries/<conversation_id>/facts/<timestamp>__<id>.md
    entries/<conversation_id>/turns/<user|assistant>/<timestamp>__<id>.md
    entries/<conversation_id>/deleted/summaries/L<n>/<name>__g<generation>.md   (retired trees)
    entries/<conversation_id>/deleted/facts/<timestamp>__<id>.md               (soft-deleted)

The export mirrors the store: running it twice writes nothing the second time, and a file it
wrote earlier whose row is gone or retired is removed (the retired row's own file lives under
`deleted/`). Files it did not write (no `generator: memory-dag` in their front matter) are never
touched. When the target folder is the root of a git repository, the exported paths are
committed (seed 000 §2.4).

What is exported is read through a `Scope` (`memory_dag/scope.py`): a user's export holds its
own facts, and the shared summaries and turns of the conversations it names; a scoped store
(memories of several users) is not exported without a user.

Conversation ids become folder names, so they are checked (`ids.path_part_problem`: no `..`,
no absolute path) and every path written or removed must resolve inside the target folder, even
through symlinks; a conversation whose id fails is refused and listed in the report.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from memory_dag.config import Settings
from memory_dag.ids import path_part_problem
from memory_dag.scope import Scope
from memory_dag.store.connection import fetch_dicts, open_store
from memory_dag.summaries.conversation_summaries import (
    StoredSummary,
    conversation_ids,
    summary_tree,
)

GENERATOR = "memory-dag"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: Folders of a conversation each part of the export owns; stale files are only removed there.
_SUMMARY_FOLDERS = ("summaries", "deleted/summaries")
_FACT_FOLDERS = ("facts", "deleted/facts")
_TURN_FOLDERS = ("turns",)


@dataclass
class ExportReport:
    """What an export wrote, removed and committed."""

    target: Path
    conversations: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)  # paths relative to target
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    commit: str | None = None  # the new commit's hash, when one was made
    refused: list[str] = field(default_factory=list)  # "<id>: why", ids that cannot be folders


def export_store(
    settings: Settings,
    target: Path,
    *,
    conversations: list[str] | None = None,
    facts: bool = False,
    turns: bool = False,
    commit: bool = True,
    scope: Scope | None = None,
) -> ExportReport:
    """Write the summaries (and facts, turns) of `conversations` (default: all, or the scope's)
    under `target`, as far as `scope` may read them."""
    target = Path(target)
    report = ExportReport(target=target)
    scope = scope or Scope()
    with open_store(settings.db_path, read_only=True) as con:
        scope.check_connection(con)
    named = conversations or ([scope.conversation_id] if scope.conversation_id else None)
    for conversation_id in named or conversation_ids(settings):
        # Naming a conversation is asking for its shared memories; otherwise only the user's.
        problem = path_part_problem(conversation_id)
        if problem is not None:
            report.refused.append(f"{conversation_id!r}: {problem}")
            continue
        reader = scope.in_conversation(conversation_id) if named else scope
        files = {
            _summary_path(node): _document(_summary_front_matter(node), node.content)
            for node in summary_tree(conversation_id, settings, include_retired=True)
            if reader.allows(_summary_row(node))
        }
        if facts or turns:
            with open_store(settings.db_path, read_only=True) as con:
                if facts:
                    files.update(_fact_files(con, conversation_id, reader))
                if turns:
                    files.update(_turn_files(con, conversation_id, reader))
        folder = target / "entries" / conversation_id
        owned = (
            _SUMMARY_FOLDERS + (_FACT_FOLDERS if facts else ()) + (_TURN_FOLDERS if turns else ())
        )
        _sync_folder(folder, files, owned, report)
        report.conversations.append(conversation_id)
    if commit and report.conversations and (target / ".git").exists():
        report.commit = git_commit(
            target,
            [f"entries/{c}" for c in report.conversations],
            f"memory-dag export: {len(report.conversations)} conversation(s)",
        )
    return report


def _sync_folder(
    folder: Path, files: dict[str, str], owned: tuple[str, ...], report: ExportReport
) -> None:
    """Write changed files, then remove stale ones this exporter wrote earlier in `owned`."""
    base = report.target
    for relative, text in files.items():
        path = _confined(base, folder / relative)
        if path.exists() and path.read_text(encoding="utf-8") == text:
            report.unchanged += 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path = _confined(base, path)  # again: a folder on the way may be a symlink
        path.write_text(text, encoding="utf-8")
        report.written.append(path.relative_to(base).as_posix())
    wanted = {folder / relative for relative in files}
    for subfolder in owned:
        root = folder / subfolder
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.md")):
            if path not in wanted and _inside(base, path) and _written_by_us(path):
                path.unlink()
                report.removed.append(path.relative_to(base).as_posix())


def _inside(base: Path, path: Path) -> bool:
    """True when `path` resolves (symlinks followed) inside `base`."""
    return path.resolve().is_relative_to(base.resolve())


def _confined(base: Path, path: Path) -> Path:
    """`path` if it resolves inside `base`; ValueError otherwise."""
    if not _inside(base, path):
        raise ValueError(f"export refused: {path} would be written outside {base}")
    return path


def _written_by_us(path: Path) -> bool:
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---\n"):
        return False
    front, _, _ = text[4:].partition("\n---\n")
    try:
        data = yaml.safe_load(front)
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and data.get("generator") == GENERATOR


def _document(front_matter: dict[str, Any], body: str) -> str:
    header = yaml.safe_dump(front_matter, sort_keys=False, allow_unicode=True, width=100)
    return f"---\n{header}---\n\n{body.strip()}\n"


# --- Summaries -----------------------------------------------------------------------------------


def _summary_row(node: StoredSummary) -> dict[str, Any]:
    """The columns of a summary the scope checks."""
    return {
        "kind": "summary",
        "user_id": None,
        "conversation_id": node.conversation_id,
        "attributes": {"source_categories": node.source_categories},
    }


def _summary_path(node: StoredSummary) -> str:
    if node.level == 1:
        name = f"chunk_{node.chunk_index}"
    elif node.level == 2:
        name = f"group_{node.group_index}"
    else:
        name = "final"
    if node.active:
        return f"summaries/L{node.level}/{name}.md"
    return f"deleted/summaries/L{node.level}/{name}__g{node.generation}.md"


def _summary_front_matter(node: StoredSummary) -> dict[str, Any]:
    """Seed 001 §3.3 fields for the node's level, plus where it sits in its tree."""
    data: dict[str, Any] = {
        "id": node.id,
        "conversation_id": node.conversation_id,
        "role": "summary",
        "summary_kind": f"L{node.level}",
        "level": node.level,
    }
    if node.level == 1:
        data["chunk_index"] = node.chunk_index
        data["parent_group"] = node.parent_group
    elif node.level == 2:
        data["group_index"] = node.group_index
    else:
        data["is_final"] = True
    data.update(
        summary_level=node.summary_level.value,
        input_tokens=node.input_tokens,
        output_tokens=node.output_tokens,
        compression_ratio=round(node.compression_ratio or 0.0, 4),
        method=node.method,
        generation=node.generation,
        created_at=_iso(node.created_at),
    )
    if not node.active:
        data["deleted_at"] = _iso(node.valid_until)
        data["replaced_by"] = node.replaced_by
    data["generator"] = GENERATOR
    return data


# --- Facts and turns -----------------------------------------------------------------------------


def _fact_files(con: Any, conversation_id: str, scope: Scope) -> dict[str, str]:
    rows = fetch_dicts(
        con,
        "SELECT id, kind, content, created_at, valid_until, replaced_by, category, importance, "
        "speaker, user_id, conversation_id, session_id, attributes FROM memories "
        "WHERE kind = 'fact' AND conversation_id = ?",
        [conversation_id],
    )
    rows = scope.filter(rows)
    files = {}
    for row in rows:
        folder = "facts" if row["valid_until"] is None else "deleted/facts"
        data = {
            "id": row["id"],
            "conversation_id": conversation_id,
            "role": "memory",
            "created_at": _iso(row["created_at"]),
            "category": row["category"],
            "importance": row["importance"],
            "speaker": row["speaker"],
        }
        if row["valid_until"] is not None:
            data["deleted_at"] = _iso(row["valid_until"])
            data["replaced_by"] = row["replaced_by"]
        data["generator"] = GENERATOR
        name = _file_name(row["created_at"], row["id"])
        files[f"{folder}/{name}"] = _document(data, row["content"])
    return files


def _turn_files(con: Any, conversation_id: str, scope: Scope) -> dict[str, str]:
    rows = fetch_dicts(
        con,
        "SELECT id, kind, turn_id, session_id, source_role AS role, speaker, content, "
        "event_time, path, user_id, conversation_id, category, attributes FROM memories "
        "WHERE kind = 'episode' AND conversation_id = ?",
        [conversation_id],
    )
    rows = scope.filter(rows)
    files = {}
    for row in rows:
        data = {
            "id": row["id"],
            "conversation_id": conversation_id,
            "role": row["role"],
            "speaker": row["speaker"],
            "session_id": row["session_id"],
            "turn_id": row["turn_id"],
            "created_at": _iso(row["event_time"]),
            "source": row["path"],
            "generator": GENERATOR,
        }
        name = _file_name(row["event_time"], row["id"])
        files[f"turns/{row['role']}/{name}"] = _document(data, row["content"])
    return files


def _file_name(moment: datetime | None, memory_id: str) -> str:
    stamp = moment.strftime("%Y%m%dT%H%M%SZ") if moment is not None else "undated"
    return f"{stamp}__{_UNSAFE.sub('_', memory_id)}.md"


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


# --- Git -----------------------------------------------------------------------------------------


def git_commit(repo: Path, paths: list[str], message: str) -> str | None:
    """Stage `paths` (additions, changes, removals) and commit only them; None if unchanged."""

    def git(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(repo), *args], check=check, capture_output=True, text=True
        )

    existing = [p for p in paths if (repo / p).exists()]
    if not existing:
        return None
    git("add", "-A", "--", *existing)
    if git("diff", "--cached", "--quiet", "--", *existing, check=False).returncode == 0:
        return None
    identity: list[str] = []
    if not git("config", "user.email", check=False).stdout.strip():
        identity = ["-c", f"user.name={GENERATOR}", "-c", f"user.email={GENERATOR}@localhost"]
    subprocess.run(
        ["git", "-C", str(repo), *identity, "commit", "-q", "-m", message, "--", *existing],
        check=True,
        capture_output=True,
        text=True,
    )
    return git("rev-parse", "HEAD").stdout.strip()
