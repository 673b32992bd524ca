"""The service for any ASGI server: `uvicorn memory_dag.service.asgi:app`.

Configured by the environment (`MEMORY_DAG_*`, `ServiceConfig.from_env`). An ASGI server may
listen anywhere, and this module cannot see where, so it refuses to build without API keys
(`MEMORY_DAG_API_KEYS`) unless `MEMORY_DAG_SERVE_OPEN=1` says it only listens locally.
"""

from __future__ import annotations

import os

from memory_dag.memory import Memory
from memory_dag.service.app import ServiceConfig, create_app
from memory_dag.service.identity import ServiceConfigError

config = ServiceConfig.from_env()
if config.api_keys_file is None and os.environ.get("MEMORY_DAG_SERVE_OPEN") != "1":
    raise ServiceConfigError(
        "set MEMORY_DAG_API_KEYS to a key file (or MEMORY_DAG_SERVE_OPEN=1 when the server "
        "only listens on a loopback address)"
    )
app = create_app(Memory(), config)
