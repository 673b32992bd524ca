"""The file-watching sensors are evaluated at every pass of Dagster's sensor daemon.

The daemon skips a sensor whose last tick is younger than its `minimum_interval_seconds`; a
pass comes every `MIN_INTERVAL_LOOP_TIME` (5 s) and may come round a few milliseconds early,
so an interval equal to the pass time makes every other pass skip it (10 s between ticks)."""

from __future__ import annotations

from dagster._daemon.sensor import MIN_INTERVAL_LOOP_TIME

from assets.shards import shard_workspace_sensor
from sensors.workspace import workspace_sensor


def test_file_sensors_ask_for_less_than_the_daemons_pass() -> None:
    for sensor in (workspace_sensor, shard_workspace_sensor):
        assert sensor.minimum_interval_seconds is not None
        assert sensor.minimum_interval_seconds < MIN_INTERVAL_LOOP_TIME, sensor.name
