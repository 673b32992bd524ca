"""`memory-dag serve` (the proxy, REST and MCP over HTTP) and `memory-dag mcp` (MCP on stdio).

memory-dag serve --port 8765                       # loopback, open (no keys)
MEMORY_DAG_API_KEYS=keys.yaml memory-dag serve --host 0.0.0.0
memory-dag mcp --agent supervisor --user alice     # for an MCP client that launches it
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from memory_dag.cli.common import memory_from_args


def cmd_serve(args: argparse.Namespace) -> int:
    from memory_dag.service.app import DEFAULT_PORT, ServiceConfig, serve
    from memory_dag.service.identity import ServiceConfigError

    try:
        config = ServiceConfig.from_env(
            host=args.host,
            upstream_base_url=args.upstream,
            api_keys_file=args.api_keys,
            max_body_bytes=args.max_body_bytes,
            idle_seconds=args.idle_seconds,
            open_agent=args.agent,
            open_user=args.user,
        )
        serve(memory_from_args(args), config, port=args.port or DEFAULT_PORT)
    except ServiceConfigError as error:
        print(f"memory-dag serve: {error}", file=sys.stderr)
        return 2
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from memory_dag.service.app import Service, ServiceConfig
    from memory_dag.service.identity import Identity
    from memory_dag.service.mcp import run_stdio

    if args.agent is not None:
        from memory_dag.memories.categories import load_categories

        load_categories().allowlist(args.agent)  # an unknown agent: one line, exit 2
    service = Service(memory_from_args(args), ServiceConfig(), None)
    run_stdio(service, Identity(args.agent, args.user))
    return 0


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add `serve` and `mcp` (`commands` is the parser's subparsers object)."""
    serving = commands.add_parser(
        "serve", parents=[common], help="the OpenAI-compatible proxy, REST API and MCP (HTTP)"
    )
    serving.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    serving.add_argument("--port", type=int, default=None, help="default 8765")
    serving.add_argument("--upstream", help="OpenAI-compatible base URL the proxy forwards to")
    serving.add_argument("--api-keys", help="YAML key file (MEMORY_DAG_API_KEYS)")
    serving.add_argument("--max-body-bytes", type=int, help="largest request body (4 MiB)")
    serving.add_argument("--idle-seconds", type=float, help="a new session after this (1800)")
    serving.add_argument("--agent", help="the agent of callers when no keys are configured")
    serving.add_argument("--user", help="the user of callers when no keys are configured")
    serving.set_defaults(func=cmd_serve, creates_store=True)

    stdio = commands.add_parser("mcp", parents=[common], help="the MCP tools over stdio")
    stdio.add_argument("--agent", help="whose allowlist the tools read with")
    stdio.add_argument("--user", help="the user the tools act for")
    stdio.set_defaults(func=cmd_mcp, creates_store=True)
