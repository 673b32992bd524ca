"""Stable ids and content hashes: the same input gives the same id in every run.

Ids are derived from where a row comes from (file path, turn id, chunk number), so
re-ingesting a file reproduces them; content hashes key the embedding cache.
"""

from __future__ import annotations

import hashlib


def digest(*parts: str) -> str:
    """sha1 hex of the parts joined by NUL (a separator no path or id contains)."""
    return hashlib.sha1("\x00".join(parts).encode("utf-8")).hexdigest()


def episode_id(path: str, turn_id: str) -> str:
    """Stable memory id of a transcript turn (turn ids are only unique within a file)."""
    return "ep_" + digest(path, turn_id)[:20]


def chunk_id(path: str, file_hash: str, number: int) -> str:
    """Id of the `number`-th chunk (0-based) of one version of a file."""
    return "ch_" + digest(path, file_hash, str(number))[:20]


def text_hash(text: str) -> str:
    """sha256 hex of a text: the embedding cache key of a search text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
