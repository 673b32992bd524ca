"""What gets ingested from a workspace folder, and how each file is read.

Layout of a workspace:

- memory notes: `MEMORY.md`, `memory.md` and `memory/**/*.md` (the agent's durable notes);
- entries: `entries/<conversation_id>/{facts,turns/user,turns/assistant,summaries/L1..L3}/*.md`
  (the agent-cli layout; `entries/<conversation_id>/deleted/` is ignored);
- transcripts: `sessions/**/*.jsonl`, one file per session.

Reading never raises for bad content: every problem becomes an `IngestError` with the file and
line, and every good part of the file is still kept, so one broken line cannot hide a session.
Input that would exhaust memory, time or the stack meets the limits in `limits.py`; symlinks
that lead outside the workspace (and its allowed extra roots) are refused, not read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

import yaml

from memory_dag.ids import path_part_problem
from memory_dag.ingest.decoding import decode_text, is_utf8
from memory_dag.ingest.front_matter import FrontMatterRefused, load_front_matter
from memory_dag.ingest.json_lines import json_object
from memory_dag.ingest.limits import (
    EARLIEST_TIME,
    LATEST_TIME,
)

SourceKind = Literal["note", "entry", "transcript"]
SourceName = Literal["memory", "sessions"]

#: Roles kept from transcripts; system prompts and tool output are not memories of the user.
KEPT_ROLES = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file to ingest. `rel_path` is the stable key; `path` is where the bytes really are.

    `refused` says why the file must not be read (a symlink loop, a link leading outside the
    workspace, a name that is not UTF-8); such a file becomes one error row.
    """

    path: Path
    rel_path: str
    source: SourceName
    kind: SourceKind
    refused: str | None = None

    @property
    def fingerprint(self) -> str | None:
        """The content hash of a refused file: its reason, so a fixed link is read again."""
        return hash_bytes(f"refused\x00{self.refused}".encode()) if self.refused else None


@dataclass(frozen=True, slots=True)
class IngestError:
    """A problem found while reading a file; `path` is the workspace-relative path."""

    path: str
    line: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One user or assistant message of a transcript."""

    id: str
    session_id: str
    conversation_id: str | None
    role: str
    speaker: str | None
    content: str
    event_time: datetime | None
    line: int
    #: The user a line names (`user_id`): facts drawn from the turn are that user's.
    user_id: str | None = None


@dataclass(slots=True)
class ParsedFile:
    """Everything read from one file: fingerprint, text, front matter, turns and problems."""

    file: SourceFile
    hash: str
    size: int
    mtime: float
    text: str | None
    body_start_line: int = 1
    front_matter: dict[str, Any] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    errors: list[IngestError] = field(default_factory=list)

    @classmethod
    def unread(cls, file: SourceFile, reason: str, hash: str = "") -> ParsedFile:
        """A file whose content is not used, with one error row saying why."""
        return cls(
            file=file,
            hash=hash,
            size=0,
            mtime=0.0,
            text=None,
            errors=[IngestError(file.rel_path, None, reason)],
        )

    @property
    def body(self) -> str:
        """The Markdown text after the front matter; chunk it with first_line=body_start_line."""
        if self.text is None:
            return ""
        return "\n".join(self.text.split("\n")[self.body_start_line - 1 :])


# --- discovery -------------------------------------------------------------------------------


def discover_files(workspace: Path, extra_roots: Iterable[Path] = ()) -> list[SourceFile]:
    """All files to ingest under workspace, sorted by rel_path; [] if the folder does not exist.

    A file reachable under two names (symlink, hard link, or MEMORY.md/memory.md on a
    case-insensitive filesystem) is kept once, under the first name in this order: MEMORY.md,
    memory.md, memory/**, entries/**, sessions/** (each sorted). A symlink whose target is
    outside the workspace and outside every folder of `extra_roots`, or that loops, is listed
    as refused: it is never opened.
    """
    workspace = Path(workspace)
    if not workspace.is_dir():
        return []
    roots = [workspace.resolve(), *(Path(root).resolve() for root in extra_roots)]

    candidates: list[tuple[str, SourceName, SourceKind]] = []
    #: Regular files reached without any symlink, inside a root: (real path, identity).
    plain_files: dict[str, tuple[Path, tuple[int, int]]] = {}
    for name in ("MEMORY.md", "memory.md"):
        if (workspace / name).is_file() or (workspace / name).is_symlink():
            candidates.append((name, "memory", "note"))
    for rel_path in _walk(workspace, "memory", ".md", roots, plain_files):
        candidates.append((rel_path, "memory", "note"))
    for rel_path in _walk(workspace, "entries", ".md", roots, plain_files):
        parts = rel_path.split("/")
        if len(parts) > 3 and parts[2] == "deleted":  # entries/<cid>/deleted/...
            continue
        candidates.append((rel_path, "memory", "entry"))
    for rel_path in _walk(workspace, "sessions", ".jsonl", roots, plain_files):
        candidates.append((rel_path, "sessions", "transcript"))

    files: list[SourceFile] = []
    seen: set[tuple[int, int] | str] = set()
    for rel_path, source, kind in candidates:
        plain = plain_files.get(rel_path)
        if plain is not None and is_utf8(rel_path):  # no link on the way: nothing to resolve
            path, identity = plain
            if identity not in seen:
                seen.add(identity)
                files.append(SourceFile(path, rel_path, source, kind, None))
            continue
        path, refused = _real_path(workspace / rel_path, roots)
        if not is_utf8(rel_path):
            refused = "the file name is not valid UTF-8"
            rel_path = rel_path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        identity = rel_path if refused else _file_identity(path)
        if identity in seen:
            continue
        seen.add(identity)
        files.append(SourceFile(path, rel_path, source, kind, refused))
    return sorted(files, key=lambda file: file.rel_path)


def _real_path(link: Path, roots: list[Path]) -> tuple[Path, str | None]:
    """(where the bytes are, why they must not be read); a missing target is left to reading."""
    try:
        path = link.resolve(strict=True)
    except FileNotFoundError:
        return link.absolute(), None  # broken symlink or vanished file: reading reports it
    except RuntimeError:  # pathlib's "Symlink loop"
        return link.absolute(), "symlink loop"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return link.absolute(), "symlink loop"
        return link.absolute(), None
    if not any(path.is_relative_to(root) for root in roots):
        return link.absolute(), f"symlink to {path}, outside the workspace; not read"
    return path, None


def _walk(
    workspace: Path,
    folder: str,
    suffix: str,
    roots: list[Path] | None = None,
    plain: dict[str, tuple[Path, tuple[int, int]]] | None = None,
) -> Iterator[str]:
    """Posix paths (relative to workspace) of non-hidden files under folder ending in suffix.

    Symlinked folders are not followed (no loops, no escaping the workspace by accident);
    symlinked files are listed. Sockets, FIFOs and devices are skipped so reading cannot block.
    Regular files that are not links, under a folder whose real path is inside `roots`, go
    into `plain` with their real path and (device, inode): the directory entries already say
    so, and resolving 100k-turn workspaces' files one by one took seconds.
    """
    root = workspace / folder
    if not root.is_dir():
        return
    real_root = root.resolve()
    inside = roots is not None and any(real_root.is_relative_to(r) for r in roots)
    found: list[str] = []
    stack = [(str(root), f"{folder}/", str(real_root))]
    while stack:
        directory, prefix, real = stack.pop()
        try:
            entries = list(os.scandir(directory))
            device = os.stat(directory).st_dev
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, f"{prefix}{name}/", f"{real}/{name}"))
                    continue
                if not name.lower().endswith(suffix):
                    continue
                link = entry.is_symlink()
                if link and _is_special_file(Path(entry.path)):
                    continue
                if not link and not entry.is_file(follow_symlinks=False):
                    continue  # a socket, FIFO or device: reading could block
            except OSError:
                continue
            rel_path = f"{prefix}{name}"
            found.append(rel_path)
            if inside and not link and plain is not None:
                plain[rel_path] = (Path(f"{real}/{name}"), (device, entry.inode()))
    yield from sorted(found)


def _is_special_file(path: Path) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False  # broken symlink: listed, so reading it reports the problem
    return not stat.S_ISREG(mode)


def _file_identity(path: Path) -> tuple[int, int] | str:
    """(device, inode) so that every alias of one file compares equal; the path if stat fails."""
    try:
        info = os.stat(path)
    except OSError:
        return str(path)
    return (info.st_dev, info.st_ino)


# --- fingerprints ----------------------------------------------------------------------------


def file_stat(path: Path) -> tuple[int, float]:
    """(size in bytes, modification time) used to notice changed files cheaply; raises OSError."""
    info = os.stat(path)
    return info.st_size, info.st_mtime


def hash_bytes(data: bytes) -> str:
    """sha256 hex digest: the content fingerprint that decides whether a file is re-ingested."""
    return hashlib.sha256(data).hexdigest()


# --- reading ---------------------------------------------------------------------------------


def read_source(file: SourceFile) -> ParsedFile:
    """Read and parse one file. Never raises for bad content; problems land in `errors`."""
    if file.refused is not None:
        return ParsedFile.unread(file, file.refused, file.fingerprint or "")
    try:
        data, info = _read_bytes(file)
    except OSError as exc:
        return ParsedFile.unread(file, f"cannot read file: {exc.strerror or exc}")

    parsed = ParsedFile(
        file=file, hash=hash_bytes(data), size=len(data), mtime=info.st_mtime, text=None
    )
    # One line convention everywhere, so line numbers match what editors show.
    text, problems = decode_text(data)
    parsed.errors.extend(IngestError(file.rel_path, line, reason) for line, reason in problems)
    if text is None:
        return parsed
    parsed.text = text
    if not text.strip():
        if not parsed.errors:  # not when its only lines were left out for a reason
            parsed.errors.append(IngestError(file.rel_path, None, "empty file"))
        return parsed

    if file.kind == "transcript":
        _parse_transcript(parsed)
    else:
        _parse_front_matter(parsed)
        if file.kind == "entry" and "conversation_id" not in parsed.front_matter:
            conversation_id = _entry_conversation_id(file.rel_path)
            if conversation_id is not None:
                parsed.front_matter["conversation_id"] = conversation_id
    return parsed


def transcript_users(file: SourceFile) -> set[str]:
    """The users of the turns `read_source(file)` keeps from a transcript, found without
    building the turns (half the time): the shard sensor's routing reads every transcript of a
    new conversation for them. The same lines count: `_message_fields` decides for both."""
    if file.refused is not None:
        return set()
    try:
        data, _ = _read_bytes(file)
    except OSError:
        return set()
    text, _ = decode_text(data)
    users: set[str] = set()
    for raw in (text or "").split("\n"):
        if not raw.strip():
            continue
        try:
            message = _message_fields(json_object(raw))
            if message is None or not _content_text(message[0]["content"]).split():
                continue  # a line without a turn
        except ValueError:
            continue
        user = _user_of(message[0])
        if user is not None:
            users.add(user)
    return users


def _read_bytes(file: SourceFile) -> tuple[bytes, os.stat_result]:
    """The file's bytes and status; OSError when it cannot be read, or is no longer a file."""
    # O_NOFOLLOW: the path was resolved at discovery; a symlink swapped in since is refused.
    # O_NONBLOCK: a FIFO swapped in since cannot block the read.
    descriptor = os.open(file.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return handle.read(), info


def _entry_conversation_id(rel_path: str) -> str | None:
    """`entries/<conversation_id>/...` → conversation_id; None for a file directly in entries/."""
    parts = rel_path.split("/")
    return parts[1] if len(parts) >= 3 else None


def _parse_front_matter(parsed: ParsedFile) -> None:
    """Fill front_matter and body_start_line from a leading `---` ... `---` YAML block."""
    assert parsed.text is not None
    lines = parsed.text.split("\n")
    if lines[0].rstrip() != "---":
        return
    closing = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    path = parsed.file.rel_path
    if closing is None:
        parsed.errors.append(IngestError(path, 1, "front matter opened with --- is never closed"))
        return

    parsed.body_start_line = closing + 2  # 1-based line after the closing ---
    try:
        loaded = load_front_matter("\n".join(lines[1:closing]))
    except FrontMatterRefused as exc:
        parsed.errors.append(IngestError(path, exc.line + 2, exc.reason))
        return
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 2 if mark is not None else 1  # YAML starts on file line 2
        problem = getattr(exc, "problem", None) or "syntax error"
        parsed.errors.append(IngestError(path, line, f"invalid YAML front matter: {problem}"))
        return
    parsed.errors.extend(IngestError(path, line + 2, reason) for line, reason in loaded.problems)
    data = loaded.data
    if data is None:
        return
    if not isinstance(data, dict):
        reason = f"front matter is a {type(data).__name__}, not a mapping"
        parsed.errors.append(IngestError(path, 1, reason))
        return
    _check_front_matter_fields(data, lines[1:closing], parsed)
    parsed.front_matter = data


def _check_front_matter_fields(
    data: dict[str, Any], yaml_lines: list[str], parsed: ParsedFile
) -> None:
    """Report a `created_at` that is no usable time, and drop a `conversation_id` that cannot
    name a folder (exports write `entries/<conversation_id>/`)."""
    path = parsed.file.rel_path

    def line_of(key: str) -> int:
        found = (i for i, text in enumerate(yaml_lines) if text.startswith(f"{key}:"))
        return next(found, -1) + 2

    created_at = data.get("created_at")
    if created_at is not None and parse_event_time(created_at) is None:
        reason = (
            f"created_at {str(created_at)[:80]!r} is not a time between "
            f"{EARLIEST_TIME.date().isoformat()} and {LATEST_TIME.date().isoformat()}; "
            "the note keeps no time"
        )
        parsed.errors.append(IngestError(path, line_of("created_at"), reason))
    conversation_id = data.get("conversation_id")
    if conversation_id is not None:
        problem = path_part_problem(str(conversation_id))
        if problem is not None:
            del data["conversation_id"]
            reason = f"conversation_id {str(conversation_id)[:80]!r} {problem}; ignored"
            parsed.errors.append(IngestError(path, line_of("conversation_id"), reason))


def _parse_transcript(parsed: ParsedFile) -> None:
    """Turn every usable JSONL line into a Turn; record one error per malformed line."""
    assert parsed.text is not None
    rel_path = parsed.file.rel_path
    session_id = Path(rel_path).stem
    folders = rel_path.split("/")[1:-1]  # between sessions/ and the file name
    conversation_id = "/".join(folders) or None

    for number, raw in enumerate(parsed.text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json_object(raw)
            turn, problem = _turn_from_record(record, session_id, conversation_id, number)
        except ValueError as exc:
            parsed.errors.append(IngestError(rel_path, number, str(exc)))
            continue
        if problem is not None:
            parsed.errors.append(IngestError(rel_path, number, problem))
        if turn is not None:
            parsed.turns.append(turn)


def _turn_from_record(
    record: dict[str, Any], session_id: str, conversation_id: str | None, line: int
) -> tuple[Turn | None, str | None]:
    """(turn, problem) from one JSONL object; turn is None for lines that are silently skipped.

    `problem` is a non-fatal issue (the turn is still kept). Raises ValueError with the reason
    for lines that should be messages but are malformed.
    Accepts `{"type": "message", "message": {...}}` and flat `{"role": ..., "content": ...}`;
    fields may sit inside the nested message or beside it (the nested one wins).
    """
    message = _message_fields(record)
    if message is None:
        return None, None
    fields, role = message
    # Whitespace runs become one space (str.split's whitespace is exactly regex `\s`; 4x faster).
    content = " ".join(_content_text(fields["content"]).split())
    if not content:
        raise ValueError(f"no text in 'content' ({_describe_empty(fields['content'])})")

    event_time: datetime | None = None
    problem: str | None = None
    created_at = fields.get("created_at")
    if created_at is not None:
        event_time = parse_event_time(created_at)
        if event_time is None:
            problem = f"unparseable created_at {created_at!r}; turn kept without a time"

    turn_id = fields.get("id")
    name = fields.get("name")
    speaker = name.strip() if isinstance(name, str) and name.strip() else None
    user_id = _user_of(fields)
    turn = Turn(
        id=str(turn_id) if turn_id not in (None, "") else f"{session_id}:{line}",
        session_id=session_id,
        conversation_id=conversation_id,
        role=role,
        speaker=speaker,
        content=content,
        event_time=event_time,
        line=line,
        user_id=user_id,
    )
    return turn, problem


def _message_fields(record: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """(fields, lower-cased role) of a line that is a kept message; None for lines that are
    silently skipped (other types, other roles). Raises ValueError for a malformed message."""
    kind = record.get("type")
    if kind is not None and kind != "message":
        return None  # session headers, tool calls, ...
    message = record.get("message")
    fields = {**record, **message} if isinstance(message, dict) else record

    role = fields.get("role")
    if role is None:
        raise ValueError("missing 'role'")
    if not isinstance(role, str):
        raise ValueError(f"'role' must be a string, got {type(role).__name__}")
    role = role.strip().lower()
    if role not in KEPT_ROLES:
        return None
    if "content" not in fields:
        raise ValueError("missing 'content'")
    return fields, role


def _user_of(fields: dict[str, Any]) -> str | None:
    """The message's `user_id` as text (a string or a number), None when it names nobody."""
    user = fields.get("user_id")
    return str(user).strip() if isinstance(user, str | int) and str(user).strip() else None


def _describe_empty(content: Any) -> str:
    """What an empty content was, for its error row."""
    if content is None:
        return "null"
    if isinstance(content, list):
        kinds = sorted(
            {str(p.get("type")) if isinstance(p, dict) else type(p).__name__ for p in content}
        )
        return f"parts: {', '.join(kinds)}" if kinds else "an empty list"
    return "only whitespace" if content else "an empty string"


def _content_text(content: Any) -> str:
    """Text of a message content: a string, or the text parts of a list (images etc. ignored)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                texts.append(part["text"])
        return " ".join(texts)
    raise ValueError(f"'content' must be a string or a list of parts, got {type(content).__name__}")


def parse_event_time(value: Any) -> datetime | None:
    """A tz-aware UTC datetime from an ISO 8601 string, epoch seconds, a datetime or a date;
    None if unparseable or outside `EARLIEST_TIME`..`LATEST_TIME`.

    Naive times are taken as UTC (transcripts rarely say, and UTC keeps ordering stable).
    """
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            moment = datetime.fromtimestamp(value, tz=UTC)
        elif isinstance(value, datetime):
            moment = value
        elif isinstance(value, date):
            moment = datetime(value.year, value.month, value.day)
        elif isinstance(value, str):
            moment = datetime.fromisoformat(value.strip())
        else:
            return None
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return moment if EARLIEST_TIME <= moment <= LATEST_TIME else None


def render_turn(turn: Turn) -> str:
    """The one-line text of a turn used for chunking and search: `Speaker: content`."""
    return f"{turn.speaker or turn.role.capitalize()}: {turn.content}"
