"""Every cron string of the project, in one place. Times are in `TIMEZONE`."""

from __future__ import annotations

import os

#: IANA timezone of all schedules; set MEMORY_DAG_TIMEZONE to change it.
TIMEZONE = os.environ.get("MEMORY_DAG_TIMEZONE", "UTC")

CRONS: dict[str, str] = {
    # Periodic full sync of the workspace (the sensor handles changes between syncs).
    "full_sync": "0 * * * *",
}
