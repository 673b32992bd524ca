"""What the Dagster instance already knows about a store, kept beside it without Dagster.

`memory-dag ingest` with nothing to do records its finding in the instance (a runless
observation of `workspace_files`). Telling the instance the same thing again adds nothing but
Dagster's start-up (~1 s of imports and the instance, most of such a run), so the CLI remembers,
per store, the settled state the instance last heard about: from a run of the CLI that ended
well, or from an observation. A check that finds that same settled state leaves Dagster alone.

The note is a small JSON file in the instance's folder (`DAGSTER_HOME`), keyed by the store's
path. A run forgets the store's entry before it starts and writes it after it ended well, so a
run that died (and left its run record unfinished) sends the next check through Dagster, which
marks the dead run failed. A lost update between two concurrent commands costs one redundant
observation, nothing else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: The note's file name inside the instance's folder.
FINDINGS_FILE = "memory_dag_findings.json"


def instance_home(repo_root: Path) -> Path | None:
    """The folder of the instance the CLI records runs in (`DAGSTER_HOME`, else the
    checkout's `data/dagster_home` when it has a dagster.yaml); None: an ephemeral instance."""
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"])
    home = repo_root / "data" / "dagster_home"
    return home if (home / "dagster.yaml").exists() else None


class InstanceFindings:
    """Per store, the settled record (`graph_state.SETTLED_KEY`'s value) the instance last
    recorded; `home` None (an ephemeral instance) remembers nothing."""

    def __init__(self, home: Path | None, db_path: Path | str) -> None:
        self.path = home / FINDINGS_FILE if home is not None else None
        self.store = str(Path(db_path).resolve())

    def knows(self, settled: str) -> bool:
        """Whether the instance already recorded that the store settled on `settled`."""
        return bool(settled) and self._read().get(self.store) == settled

    def remember(self, settled: str) -> None:
        if settled:
            self._update(settled)

    def forget(self) -> None:
        self._update(None)

    def _read(self) -> dict[str, str]:
        if self.path is None:
            return {}
        try:
            known = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):  # no note yet, or a torn one: know nothing
            return {}
        return known if isinstance(known, dict) else {}

    def _update(self, settled: str | None) -> None:
        if self.path is None or not self.path.parent.is_dir():
            return
        known = self._read()
        if known.get(self.store) == settled:
            return
        if settled is None:
            known.pop(self.store, None)
        else:
            known[self.store] = settled
        partial = self.path.with_name(f".{FINDINGS_FILE}.{os.getpid()}")
        partial.write_text(json.dumps(known, sort_keys=True))
        os.replace(partial, self.path)  # readers see the old note or the new one
