"""Dagster's SQLite event log, storing a batch of one run's asset events in one transaction.

The summaries step materializes one partition per conversation: 200 events at 100k turns,
2,000 at 1M in the benchmark. Dagster's SQLite event log stores each event on its own: a new
database engine, a transaction and an fsync in the run's database, then the same in the
instance's index database, ~12-15 ms an event here (2.5-3.4 s of the 100k run's summaries
step, and ~24 s at 1M, came after its library work had ended). Dagster hands such events
over as one batch when `DAGSTER_EVENT_BATCH_SIZE` is set (`memory-dag ingest` and
`memory-dag ui` set it), and its Postgres event log stores a batch at once, while its SQLite
one stores it event by event. This class stores a batch of one run's materializations (or
observations) as the Postgres one does: the events in one transaction in each database, and
each asset's latest event once (the asset's row keeps only its latest). Any other batch is
stored event by event, as before.

`data/dagster_home/dagster.yaml` names it; without `base_dir`, the event logs live where
Dagster's default SQLite storage keeps them (`$DAGSTER_HOME/history/runs`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.events import DagsterEventType
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._serdes import ConfigurableClassData

#: The event types a batch may hold to be stored at once (all of one type, of one run).
BATCHED_TYPES = (DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_OBSERVATION)


class BatchedSqliteEventLogStorage(SqliteEventLogStorage):
    """`SqliteEventLogStorage` whose `store_event_batch` writes a batch in one transaction."""

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"base_dir": dg.Field(dg.StringSource, is_required=False)}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, Any]
    ) -> BatchedSqliteEventLogStorage:
        base_dir = config_value.get("base_dir") or default_base_dir()
        return cls(base_dir=base_dir, inst_data=inst_data)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        if not _one_run_one_type(events):
            super().store_event_batch(events)  # event by event
            return
        statements = [self.prepare_insert_event(event) for event in events]
        with self.run_connection(events[0].run_id) as conn:
            for statement in statements:
                conn.execute(statement)
        # Mirrored in the index database, whose own ids the tags and the asset rows refer to.
        with self.index_transaction() as conn:
            ids = [conn.execute(statement).inserted_primary_key[0] for statement in statements]
            self._store_asset_event_tags(conn, list(events), ids)
            latest: dict[dg.AssetKey | None, tuple[EventLogEntry, int]] = {}
            for event, event_id in zip(events, ids, strict=True):  # each asset's last
                latest[event.get_dagster_event().asset_key] = (event, event_id)
            for event, event_id in latest.values():
                self._store_asset_event(conn, event, event_id)


def open_instance(home: Path) -> dg.DagsterInstance:
    """The instance whose dagster.yaml is in `home`, loaded as `DAGSTER_HOME=home` loads it:
    this event log finds its folder under DAGSTER_HOME, which is set only while it loads."""
    from dagster._core.instance.ref import InstanceRef

    before = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    finally:
        if before is None:
            del os.environ["DAGSTER_HOME"]
        else:
            os.environ["DAGSTER_HOME"] = before


def default_base_dir() -> str:
    """Where Dagster's default SQLite event log lives: `$DAGSTER_HOME/history/runs`."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        raise ValueError(
            "BatchedSqliteEventLogStorage without `base_dir` keeps its event logs under "
            "$DAGSTER_HOME/history/runs, and DAGSTER_HOME is not set"
        )
    return os.path.join(home, "history", "runs")


def _one_run_one_type(events: Sequence[EventLogEntry]) -> bool:
    """Whether the batch is of one run and one of `BATCHED_TYPES`, each with an asset key."""
    if not events or len({event.run_id for event in events}) != 1:
        return False
    kinds = {event.dagster_event_type for event in events}
    if len(kinds) != 1 or kinds.pop() not in BATCHED_TYPES:
        return False
    return all(event.get_dagster_event().asset_key is not None for event in events)
