"""A sensor's file state, kept in a file beside the store; the sensor's cursor names the file.

Dagster stores a sensor's cursor with every tick it evaluates, skipped ticks included (which
it keeps 7 days by default), and again in the sensor's own row. The sensors' state is every
workspace file's [size, mtime, hash]: ~140 bytes a file, 0.7 MB at 100k turns, 7 MB at 1M,
written every 5 s, so ~120,000 copies a week in Dagster's storage. So the state goes to
`<store>.sensors/<sensor>-<sha256>.json`, written once per version of it, and the cursor
holds only that digest (`{"state": "<sha256>"}`).

A tick that fails after the file is written leaves the cursor on the previous file, which is
kept until a later tick moves past it. A cursor whose file is gone (the folder deleted) reads
as no state: every file is new, as after a cursor reset, and the run keys (a fingerprint of
the files' hashes) keep that from running the same change twice. A cursor written before this
module, the state itself, is read as that state.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from memory_dag.config import Settings

#: The cursor's one key; its value is the digest of the state file's text.
CURSOR_KEY = "state"
_DIGEST = re.compile(r"[0-9a-f]{64}")
_SENSOR_NAME = re.compile(r"[a-z][a-z0-9_]*")
#: The state last read or written per (folder, sensor) and its digest: the code server
#: evaluates a sensor every few seconds, and need not read its own last write back (5 ms at
#: 5,000 files, ~50 ms at 1M turns) nor write an unchanged state again.
_LAST: dict[tuple[Path, str], tuple[str, dict[str, Any]]] = {}


def state_folder(settings: Settings) -> Path:
    """Beside the store, named after it, as DuckDB's `<store>.wal` and `<store>.tmp` are."""
    return Path(f"{settings.db_path}.sensors")


def load_state(folder: Path, sensor: str, cursor: str | None) -> dict[str, Any]:
    """The state `cursor` names ({} for no cursor, or a file that is gone)."""
    digest = _digest_of(cursor)
    if digest is None:  # no cursor, or one from before this module: the state itself
        return json.loads(cursor) if cursor else {}
    last = _LAST.get((folder, sensor))
    if last is not None and last[0] == digest:
        return last[1]
    try:
        state = json.loads(_state_file(folder, sensor, digest).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    _LAST[(folder, sensor)] = (digest, state)
    return state


def save_state(folder: Path, sensor: str, state: dict[str, Any], cursor: str | None) -> str:
    """The cursor for `state`, its file written if that version is new. `cursor` (the tick's
    previous one) keeps its file; the sensor's other files are removed."""
    last_digest, last_state = _LAST.get((folder, sensor), (None, None))
    if (
        last_digest is not None
        and cursor == _cursor(last_digest)
        and last_state == state
        and _state_file(folder, sensor, last_digest).exists()  # deleted since: written again
    ):
        return cursor  # nothing to write, not even to serialize
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    target = _state_file(folder, sensor, digest)
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)  # whole or not at all
    keep = {target.name}
    previous = _digest_of(cursor)
    if previous is not None:
        keep.add(_state_file(folder, sensor, previous).name)
    for old in folder.glob(f"{sensor}-*.json"):
        if old.name not in keep:
            old.unlink(missing_ok=True)
    _LAST[(folder, sensor)] = (digest, state)
    return _cursor(digest)


def _cursor(digest: str) -> str:
    return json.dumps({CURSOR_KEY: digest})


def _digest_of(cursor: str | None) -> str | None:
    """The digest a cursor of this module holds (None for no cursor or one from before)."""
    if not cursor:
        return None
    held = json.loads(cursor)
    digest = held.get(CURSOR_KEY) if isinstance(held, dict) else None
    return digest if isinstance(digest, str) else None


def _state_file(folder: Path, sensor: str, digest: str) -> Path:
    """`folder/<sensor>-<digest>.json`; a cursor set by hand in the UI is checked first."""
    if not _SENSOR_NAME.fullmatch(sensor):
        raise ValueError(f"not a sensor name: {sensor!r}")
    if not _DIGEST.fullmatch(digest):
        raise ValueError(
            f"the cursor names no state file ({digest[:80]!r} is not a sha256 digest): "
            "reset the sensor's cursor"
        )
    return folder / f"{sensor}-{digest}.json"
