"""A sensor's file state lives in a file beside the store; its cursor only names that file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory_dag.ingest import sensor_state
from memory_dag.ingest.sensor_state import load_state, save_state


def _state(files: int, version: int = 0) -> dict[str, list]:
    return {
        f"sessions/conv-{n % 50:03}/session-{n:05}.jsonl": [900 + n, 1.7e9 + version, f"{n:064x}"]
        for n in range(files)
    }


@pytest.fixture(autouse=True)
def fresh_process() -> Iterator[None]:
    """Each test starts as a new code server would: nothing read yet."""
    sensor_state._LAST.clear()
    yield
    sensor_state._LAST.clear()


def _files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_the_cursor_stays_small_and_names_the_state(tmp_path: Path) -> None:
    state = _state(5_000)
    cursor = save_state(tmp_path, "workspace_sensor", state, None)
    assert len(cursor) < 100  # the state itself would be ~0.6 MB
    assert len(json.dumps(state)) > 500_000
    sensor_state._LAST.clear()  # another process: read from the file
    assert load_state(tmp_path, "workspace_sensor", cursor) == state
    assert load_state(tmp_path, "workspace_sensor", None) == {}


def test_an_unchanged_state_writes_nothing(tmp_path: Path) -> None:
    cursor = save_state(tmp_path, "workspace_sensor", _state(100), None)
    (written,) = tmp_path.iterdir()
    before = written.stat().st_mtime_ns
    again = save_state(tmp_path, "workspace_sensor", _state(100), cursor)
    assert again == cursor and written.stat().st_mtime_ns == before
    assert _files(tmp_path) == [written.name]


def test_the_previous_cursor_keeps_its_file_for_a_tick_that_fails(tmp_path: Path) -> None:
    first = save_state(tmp_path, "workspace_sensor", _state(10, 1), None)
    second = save_state(tmp_path, "workspace_sensor", _state(10, 2), first)
    # Dagster keeps `first` when the tick that made `second` fails: it must still read.
    sensor_state._LAST.clear()
    assert load_state(tmp_path, "workspace_sensor", first) == _state(10, 1)
    third = save_state(tmp_path, "workspace_sensor", _state(10, 3), second)
    digests = {json.loads(c)["state"] for c in (second, third)}
    assert _files(tmp_path) == sorted(f"workspace_sensor-{d}.json" for d in digests)
    # Another sensor's files are its own.
    save_state(tmp_path, "sessions_sensor", {"a": [1, 2.0, "x"]}, None)
    assert len(_files(tmp_path)) == 3


def test_a_cursor_from_before_is_the_state_itself(tmp_path: Path) -> None:
    old = {"sessions/c/s.jsonl": [10, 1.5, "ab"], "state": [1, 2.0, "a file named state"]}
    assert load_state(tmp_path, "workspace_sensor", json.dumps(old)) == old
    shards = {"workspace": {"a.md": [1, 2.0, None]}, "shard-00": {}}
    assert load_state(tmp_path, "shard_workspace_sensor", json.dumps(shards)) == shards


def test_a_cursor_whose_file_is_gone_reads_as_no_state(tmp_path: Path) -> None:
    cursor = save_state(tmp_path, "workspace_sensor", _state(3), None)
    for path in tmp_path.iterdir():
        path.unlink()
    sensor_state._LAST.clear()
    assert load_state(tmp_path, "workspace_sensor", cursor) == {}


@pytest.mark.parametrize(
    "cursor",
    [
        json.dumps({"state": "../../../etc/passwd"}),
        json.dumps({"state": "0" * 63 + "/"}),
        json.dumps({"state": "A" * 64}),
    ],
)
def test_a_cursor_set_by_hand_never_reaches_the_filesystem(tmp_path: Path, cursor: str) -> None:
    with pytest.raises(ValueError, match="reset the sensor's cursor"):
        load_state(tmp_path / "sensors", "workspace_sensor", cursor)
    assert list(tmp_path.iterdir()) == []


def test_a_state_file_deleted_under_a_running_sensor_is_written_again(tmp_path: Path) -> None:
    cursor = save_state(tmp_path, "workspace_sensor", _state(3), None)
    for path in tmp_path.iterdir():
        path.unlink()
    assert save_state(tmp_path, "workspace_sensor", _state(3), cursor) == cursor
    sensor_state._LAST.clear()  # a restarted code server reads it back
    assert load_state(tmp_path, "workspace_sensor", cursor) == _state(3)
