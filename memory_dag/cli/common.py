"""What every `memory-dag` command group shares: settings from the common flags, the
caller's scope from `--user` / `--agent` / `--conversation` / `--session`, refusals, JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from memory_dag.config import Settings
from memory_dag.memories.categories import AccessDenied
from memory_dag.scope import Scope, UnknownCategory

#: Exit status of a request the scope boundary refuses (as `memory-dag query` always did).
REFUSED = 2


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from --workspace / --db / --index-dir, then MEMORY_DAG_* variables."""
    return Settings.load(workspace=args.workspace, db_path=args.db, index_dir=args.index_dir)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def add_scope_flags(parser: argparse.ArgumentParser, *, agent: bool = True) -> None:
    """`--user` (and `--agent`): who the command acts for (`memory_dag/scope.py`)."""
    parser.add_argument("--user", help="the user the caller acts for (multi-user stores need it)")
    if agent:
        parser.add_argument("--agent", help="whose category allowlist applies (categories.yaml)")


def scope_from_args(args: argparse.Namespace) -> Scope:
    """The caller's scope from whichever of --user, --agent, --conversation, --session it has."""
    conversation = getattr(args, "conversation", None)
    return Scope.of(
        user_id=getattr(args, "user", None),
        agent=getattr(args, "agent", None),
        conversation_id=conversation if isinstance(conversation, str) else None,
        run_id=getattr(args, "session", None),
    )


def refused(command: str, action: Callable[[], int]) -> int:
    """Run a command; a request outside its scope is a message and exit status 2."""
    try:
        return action()
    except (AccessDenied, UnknownCategory) as error:
        print(f"memory-dag {command}: rejected: {error}", file=sys.stderr)
        return REFUSED
