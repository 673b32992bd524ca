"""Tenant shards: which store holds a user's rows, and where each shard's files live.

The embedded default is one shard: today's single store (`data/memory.duckdb`, its index
beside it), unchanged. With `MEMORY_DAG_SHARDS=N` (N > 1) the rows are split over N stores,
`data/shards/shard-00.duckdb` … (each with its index `shard-00.index/` and the workspace files
routed to it, `shard-00.workspace/`, beside it), and a shard is a complete store: every library
function runs on it unchanged through `shard_settings`.

The rule (stable, documented in docs/scale.md):

- Every row has a *route key*: the key its conversation was routed under when first seen
  (`routes.json`), else `user:<user_id>`, else `conversation:<conversation_id>`. A
  conversation is keyed by its user when its transcripts name exactly one, else by itself.
- `shard_of(key, n)` = the first 8 bytes of blake2b(key), big-endian, mod n. It depends on
  nothing but the key and n, so every process and machine agrees on it.
- Rows with no key (workspace notes that name no conversation) are shared: every shard holds
  a copy, so a shard answers every query of its users by itself.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from memory_dag.config import ENV_PREFIX, Settings

#: The environment variable that sets the number of shards (default 1: the single store).
SHARDS_ENV = ENV_PREFIX + "SHARDS"
#: The run tag that names a run's shard (the run queue limits runs per value of it).
SHARD_TAG = "memory-dag/shard"


class ShardLayoutError(RuntimeError):
    """The configured shard count does not match the stores on disk (re-shard, or fix the env)."""


def shard_of(key: str, shards: int) -> int:
    """The shard (0 … shards-1) that holds `key`'s rows: blake2b of the key, mod `shards`."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def user_key(user_id: str) -> str:
    return f"user:{user_id}"


def conversation_key(conversation_id: str) -> str:
    return f"conversation:{conversation_id}"


def route_key(
    user_id: str | None,
    conversation_id: str | None,
    routes: dict[str, str] | None = None,
) -> str | None:
    """The key a row (or a request) is routed by; None for shared rows (no user, no conversation).

    A conversation already routed (`routes`: conversation → key) keeps its key, so a memory
    written later into a known conversation lands beside its transcript.
    """
    if conversation_id and routes and conversation_id in routes:
        return routes[conversation_id]
    if user_id:
        return user_key(user_id)
    if conversation_id:
        return conversation_key(conversation_id)
    return None


def shard_key(shard: int) -> str:
    """The Dagster partition key and run tag value of a shard: `shard-00`, `shard-01`, …"""
    return f"shard-{shard:02d}"


def shard_number(key: str) -> int:
    """`shard-03` → 3; a clear error for anything else."""
    prefix, _, number = key.partition("-")
    if prefix != "shard" or not number.isdigit():
        raise ValueError(f"{key!r} is not a shard key (shard-00, shard-01, …)")
    return int(number)


def shards_root(settings: Settings) -> Path:
    """The folder of the shard stores: `shards/` beside the single store."""
    return Path(settings.db_path).parent / "shards"


def layout_file(settings: Settings) -> Path:
    return shards_root(settings) / "layout.json"


def routes_file(settings: Settings) -> Path:
    return shards_root(settings) / "routes.json"


def written_shard_count(settings: Settings) -> int:
    """The shard count the stores on disk were built with (1 when there is no shard folder)."""
    path = layout_file(settings)
    if not path.exists():
        return 1
    return int(json.loads(path.read_text())["shards"])


def is_shard_store(settings: Settings) -> bool:
    """True for the settings of one shard (`shards/shard-NN.duckdb`): a shard is not split again."""
    path = Path(settings.db_path)
    return path.parent.name == "shards" and path.stem.startswith("shard-")


def shard_count(settings: Settings) -> int:
    """`MEMORY_DAG_SHARDS` (default: what is on disk, else 1), checked against the disk.

    The settings of one shard count as one store."""
    if is_shard_store(settings):
        return 1
    on_disk = written_shard_count(settings)
    raw = os.environ.get(SHARDS_ENV, "").strip()
    if not raw:
        return on_disk
    if not raw.isdigit() or int(raw) < 1:
        raise ShardLayoutError(f"{SHARDS_ENV}={raw!r}: give a whole number of shards, 1 or more")
    wanted = int(raw)
    has_stores = layout_file(settings).exists() or Path(settings.db_path).exists()
    if wanted != on_disk and has_stores:
        raise ShardLayoutError(
            f"{SHARDS_ENV}={wanted} but the stores beside {settings.db_path} have {on_disk} "
            f"shard(s): run `memory-dag reshard --to {wanted}` to move the rows"
        )
    return wanted


def write_layout(settings: Settings, shards: int) -> None:
    """Record the shard count the stores were built with (atomically)."""
    write_json_atomically(layout_file(settings), {"shards": shards})


def shard_settings(settings: Settings, shard: int, shards: int) -> Settings:
    """The settings of one shard: the same settings, with that shard's store, index and
    workspace. With one shard, the settings themselves (today's single store)."""
    if shards == 1:
        return settings
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} does not exist (0 … {shards - 1})")
    root = shards_root(settings)
    name = shard_key(shard)
    return settings.model_copy(
        update={
            "db_path": root / f"{name}.duckdb",
            "index_dir": root / f"{name}.index",
            "workspace": root / f"{name}.workspace",
        }
    )


def all_shard_settings(settings: Settings, shards: int | None = None) -> list[Settings]:
    """Settings of every shard, in shard order."""
    count = shard_count(settings) if shards is None else shards
    return [shard_settings(settings, shard, count) for shard in range(count)]


def read_routes(settings: Settings) -> dict[str, str]:
    """conversation → route key, as first routed (empty before the first sharded ingest)."""
    path = routes_file(settings)
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text())["conversations"])


def write_routes(settings: Settings, routes: dict[str, str]) -> None:
    write_json_atomically(routes_file(settings), {"conversations": dict(sorted(routes.items()))})


class RouteRequired(LookupError):
    """A sharded store needs a user or a conversation to know which shard to read or write."""


def settings_for(
    settings: Settings, *, user_id: str | None = None, conversation_id: str | None = None
) -> Settings:
    """The settings of the shard that holds this user's (or conversation's) rows.

    With one shard, the settings themselves. With several, a request naming neither a user nor
    a conversation is refused (`RouteRequired`): it would have to read every shard.
    """
    shards = shard_count(settings)
    if shards == 1:
        return settings
    routes = read_routes(settings) if conversation_id else None  # a user's key needs none
    key = route_key(user_id, conversation_id, routes)
    if key is None:
        raise RouteRequired(
            f"the store has {shards} shards: name a user (--user) or a conversation "
            "(--conversation) so the request goes to the shard that holds it"
        )
    return shard_settings(settings, shard_of(key, shards), shards)


def write_json_atomically(path: Path, value: object) -> None:
    """Write JSON beside `path`, then rename over it: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(temporary, path)
