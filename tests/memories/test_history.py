"""Revision counters of the change log on a real store: read ahead in one query or one by one,
a conversation's changes are numbered on from what the store holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_dag.memories.history import HistoryLog
from memory_dag.store.connection import open_store


def committed(log: HistoryLog, changes: list[str | None]) -> list[int]:
    """Log one change for each conversation in order, write them and commit; the revisions."""
    log.con.execute("BEGIN TRANSACTION")
    revisions = [log.log_change(conversation, None, "created") for conversation in changes]
    log.flush()
    log.con.execute("COMMIT")
    return revisions


@pytest.mark.parametrize("read_ahead", [False, True])
def test_revisions_continue_from_the_store_whether_read_ahead_or_not(
    tmp_path: Path, read_ahead: bool
) -> None:
    with open_store(tmp_path / "memory.duckdb") as con:
        log = HistoryLog(con, "test", guard=lambda: None)
        assert committed(log, ["conv-a", "conv-a", None]) == [1, 2, 1]
        con.execute("BEGIN TRANSACTION")
        if read_ahead:  # conv-b is new; None is the shared conversation ("")
            log.load_revisions(["conv-a", "conv-b", None, "conv-a"])
        revisions = [log.log_change(c, None, "created") for c in ["conv-b", "conv-a", None]]
        log.flush()
        con.execute("COMMIT")
        stored = con.execute(
            "SELECT conversation_id, rev FROM conversation_revisions ORDER BY conversation_id"
        ).fetchall()
    assert revisions == [1, 3, 2]
    assert stored == [("", 2), ("conv-a", 3), ("conv-b", 1)]
