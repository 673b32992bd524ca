"""Sharded stores on the command line: `memory-dag shards` (where every shard is and what it
holds), `memory-dag reshard --to M`, and `memory-dag ingest` over every shard.

Every other command is routed by `--user` (or `--conversation`) to the shard that holds it
(`common.settings_from_args` → `store.shards.settings_for`).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

from memory_dag.cli.common import print_json, settings_from_args
from memory_dag.config import Settings
from memory_dag.store.shards import all_shard_settings, read_routes, shard_count, shard_key


def ingest_every_shard(args: argparse.Namespace, settings: Settings) -> int:
    """Route the workspace into the shards, then ingest each shard as a store of its own."""
    from memory_dag.cli.main import cmd_ingest
    from memory_dag.ingest.routing import route_workspace

    report = route_workspace(settings)
    if not args.json:
        print(report.line(), file=sys.stderr)
    status = 0
    for number, shard in enumerate(all_shard_settings(settings)):
        if not args.json:
            print(f"--- {shard_key(number)}: {shard.db_path}", file=sys.stderr)
        shard_args = copy.copy(args)
        shard_args.workspace = str(shard.workspace)
        shard_args.db = str(shard.db_path)
        shard_args.index_dir = str(shard.index_dir)
        status = max(status, cmd_ingest(shard_args))
    return status


def shard_table(settings: Settings) -> list[dict[str, Any]]:
    """One row per shard: its store, whether it exists, its size and its conversations."""
    routes = read_routes(settings)
    count = shard_count(settings)
    from memory_dag.store.shards import shard_of

    rows = []
    for number, shard in enumerate(all_shard_settings(settings, count)):
        path = Path(shard.db_path)
        rows.append(
            {
                "shard": shard_key(number),
                "db": str(path),
                "exists": path.exists(),
                "bytes": path.stat().st_size if path.exists() else 0,
                "conversations": sum(
                    1 for key in routes.values() if shard_of(key, count) == number
                ),
            }
        )
    return rows


def cmd_shards(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    rows = shard_table(settings)
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        state = f"{row['bytes']:>12,} bytes" if row["exists"] else "       (not built)"
        print(f"{row['shard']}  {state}  {row['conversations']:>6} conversations  {row['db']}")
    return 0


def cmd_reshard(args: argparse.Namespace) -> int:
    from memory_dag.store.reshard import reshard

    settings = settings_from_args(args)
    report = reshard(settings, args.to)
    if args.json:
        print_json({"counts": report.counts, "notes": report.notes, "seconds": report.seconds})
    else:
        print(report.line())
        for note in report.notes:
            print(note)
        if not report.skipped:
            print(f"set MEMORY_DAG_SHARDS={args.to} for every process that uses these stores")
    return 0


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    shards = commands.add_parser("shards", parents=[common], help="the shard stores and sizes")
    shards.set_defaults(func=cmd_shards, creates_store=True)
    move = commands.add_parser(
        "reshard", parents=[common], help="move every user's rows into M shards (N → M)"
    )
    move.add_argument("--to", type=int, required=True, help="the new number of shards")
    move.set_defaults(func=cmd_reshard, creates_store=True)
