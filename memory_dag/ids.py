"""Stable ids and content hashes: the same input gives the same id in every run.

Ids are derived from where a row comes from (file path, turn id, chunk number), so
re-ingesting a file reproduces them; content hashes key the embedding cache.
"""

from __future__ import annotations

import hashlib
import os


def digest(*parts: str) -> str:
    """sha1 hex of the parts joined by NUL (a separator no path or id contains)."""
    return hashlib.sha1("\x00".join(parts).encode("utf-8")).hexdigest()


def episode_id(path: str, turn_id: str) -> str:
    """Stable memory id of a transcript turn (turn ids are only unique within a file)."""
    return "ep_" + digest(path, turn_id)[:20]


def chunk_id(path: str, file_hash: str, number: int) -> str:
    """Id of the `number`-th chunk (0-based) of one version of a file."""
    return "ch_" + digest(path, file_hash, str(number))[:20]


def random_id(prefix: str) -> str:
    """`prefix` and 20 random hex digits (80 bits): the id of a row the write path makes.
    From `os.urandom` directly: `uuid4().hex[:20]` (76 random bits) builds a UUID object
    first, ~4x the time, and a consolidation makes several ids a fact."""
    return prefix + os.urandom(10).hex()


def text_hash(text: str) -> str:
    """sha256 hex of a text: the embedding cache key of a search text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: Longest id that may name a folder (conversation ids become `entries/<conversation_id>/`).
MAX_PATH_ID_CHARS = 200


def path_part_problem(value: str) -> str | None:
    """Why `value` cannot name a folder inside another one, or None when it can.

    Conversation ids may hold `/` (a transcript in `sessions/a/b/` belongs to `a/b`), but no
    part may be empty, `.` or `..`, and no id may be absolute, hold a backslash or a control
    character, or be longer than `MAX_PATH_ID_CHARS`: ids from users and front matter must not
    steer a write outside the folder it belongs in.
    """
    if not value:
        return "is empty"
    if len(value) > MAX_PATH_ID_CHARS:
        return f"is longer than {MAX_PATH_ID_CHARS} characters"
    if value.startswith("/"):
        return "is an absolute path"
    if "\\" in value or any(ord(char) < 32 or ord(char) == 127 for char in value):
        return "holds a backslash or a control character"
    if any(part in ("", ".", "..") for part in value.split("/")):
        return "has an empty, '.' or '..' path part"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def check_path_id(value: str, what: str) -> str:
    """`value` if it can name a folder (see `path_part_problem`), else ValueError naming `what`."""
    problem = path_part_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {value!r} cannot be used: it {problem}")
    return value
