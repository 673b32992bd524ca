"""What every `memory-dag` command group shares: settings from the common flags, the
caller's scope from `--user` / `--agent` / `--conversation` / `--session`, refusals, JSON
output, and how a command ends: a missing store, a held lock or a DuckDB error is one line on
stderr (exit 2, 2, 1), SIGINT/SIGTERM a message (exit 130/143), never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import duckdb

from memory_dag.config import Settings
from memory_dag.memories.categories import AccessDenied
from memory_dag.scope import Scope, UnknownCategory
from memory_dag.store.connection import StoreLockedError
from memory_dag.store.shards import RouteRequired, ShardLayoutError, settings_for

#: Exit status of a request the scope boundary refuses (as `memory-dag query` always did).
REFUSED = 2


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from --workspace / --db / --index-dir, then MEMORY_DAG_* variables; in a
    sharded store (MEMORY_DAG_SHARDS > 1), those of the shard holding --user / --conversation.

    Commands that build stores (`creates_store`: ingest, reshard, ...) get the whole store's."""
    settings = Settings.load(workspace=args.workspace, db_path=args.db, index_dir=args.index_dir)
    if getattr(args, "creates_store", False):
        return settings
    conversation = getattr(args, "conversation", None)
    return settings_for(
        settings,
        user_id=getattr(args, "user", None),
        conversation_id=conversation if isinstance(conversation, str) else None,
    )


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def add_scope_flags(
    parser: argparse.ArgumentParser,
    *,
    agent: bool = True,
    run: bool = True,
    conversation: bool = False,
) -> None:
    """The scope flags (`memory_dag/scope.py`), named as `Memory`'s and the REST API's
    parameters: `--user` (user_id), `--agent` (agent_id: whose allowlist applies), `--run`
    (run_id: one session; `--session` is its old name) and `--conversation`."""
    parser.add_argument("--user", help="the user the caller acts for (multi-user stores need it)")
    if agent:
        parser.add_argument("--agent", help="whose category allowlist applies (categories.yaml)")
    if run:
        parser.add_argument("--run", "--session", dest="run", help="one session (run) only")
    if conversation:
        parser.add_argument("--conversation", help="the conversation (its shared memories too)")


def add_limit_flags(
    parser: argparse.ArgumentParser,
    *,
    limit: int | None,
    min_score: str | None = None,
    max_tokens: str | None = None,
    old: dict[str, str] | None = None,
) -> None:
    """`--limit` (results), `--min-score` (least relevance) and `--max-tokens` (budget): one
    name for each everywhere (`min_score`, `max_tokens`: the default to show, None: no such
    flag); `old` maps an earlier flag name, kept working, to its dest."""
    shown = f" (default {limit})" if limit is not None else ""
    parser.add_argument("--limit", type=int, default=limit, help=f"results at most{shown}")
    if min_score is not None:
        parser.add_argument(
            "--min-score", type=float, default=None, help=f"least relevance ({min_score})"
        )
    if max_tokens is not None:
        parser.add_argument(
            "--max-tokens", type=int, default=None, help=f"token budget ({max_tokens})"
        )
    for flag, dest in (old or {}).items():
        parser.add_argument(flag, dest=dest, type=type_of(dest), help=argparse.SUPPRESS)


def type_of(dest: str) -> type:
    return float if dest == "min_score" else int


def scope_from_args(args: argparse.Namespace) -> Scope:
    """The caller's scope from whichever of --user, --agent, --conversation, --run it has."""
    conversation = getattr(args, "conversation", None)
    return Scope.of(
        user_id=getattr(args, "user", None),
        agent=getattr(args, "agent", None),
        conversation_id=conversation if isinstance(conversation, str) else None,
        run_id=getattr(args, "run", None),
    )


def scope_kwargs(args: argparse.Namespace, *, run: bool = True) -> dict[str, Any]:
    """`Memory`'s scope parameters from the flags."""
    values = {
        "user_id": getattr(args, "user", None),
        "agent_id": getattr(args, "agent", None),
        "conversation_id": getattr(args, "conversation", None),
    }
    if run:
        values["run_id"] = getattr(args, "run", None)
    return values


def memory_from_args(args: argparse.Namespace) -> Any:
    """`Memory` over the store the flags name (`--reranker` when the command has one)."""
    from memory_dag.memory import Memory
    from memory_dag.read.retriever import RetrievalConfig

    reranker = getattr(args, "reranker", None)
    retrieval = RetrievalConfig(reranker_model=reranker) if reranker else None
    return Memory(settings_from_args(args), retrieval=retrieval)


def key_value(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (an argparse type: a misused flag prints the command's usage)."""
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def refused(command: str, action: Callable[[], int]) -> int:
    """Run a command; a request outside its scope is a message and exit status 2, an
    impossible operation (an unknown id, an invalid text) a message and exit status 1."""
    from memory_dag.memories.writer import MemoryOpError

    try:
        return action()
    except (AccessDenied, UnknownCategory) as error:
        print(f"memory-dag {command}: rejected: {error}", file=sys.stderr)
        return REFUSED
    except MemoryOpError as error:
        print(f"memory-dag {command}: {error}", file=sys.stderr)
        return 1


def require_store(args: argparse.Namespace) -> None:
    """Every command but the ones that build a store (`creates_store`) needs one: no silent
    empty answers, and no queue folders or empty stores made beside a mistyped --db."""
    if not hasattr(args, "db") or getattr(args, "creates_store", False):
        return
    db_path = settings_from_args(args).db_path
    if not Path(db_path).exists():
        raise FileNotFoundError(f"no memory store at {db_path}: run `memory-dag ingest` first")


def report_error(error: Exception) -> int | None:
    """Print the one line a known error deserves and return the exit status; None otherwise."""
    if isinstance(error, RouteRequired | ShardLayoutError):
        print(f"memory-dag: {error}", file=sys.stderr)
        return 2
    if isinstance(error, FileNotFoundError):
        print(f"memory-dag: {error}", file=sys.stderr)
        return 2
    locked = _cause(error, StoreLockedError)
    if locked is not None:
        print(f"memory-dag: {locked}; try again when it has finished", file=sys.stderr)
        return 2
    if isinstance(error, duckdb.Error):
        print(f"memory-dag: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return None


def _cause(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """`error` or the first exception of type `kind` it was raised from (Dagster wraps them)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = (
            getattr(current, "user_exception", None) or current.__cause__ or current.__context__
        )
    return None


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the CLI; `signal_name` says which."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def stop_on_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread; returns the old handlers."""

    def stop(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    return {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def signal_exit_code(signal_name: str) -> int:
    """128 + the signal's number, as shells report a process a signal stopped."""
    return 128 + int(getattr(signal, signal_name, signal.SIGINT))


def exit_now(signal_name: str) -> NoReturn:
    """Leave at once (a worker thread may still be inside DuckDB), saying what happened."""
    print(
        f"memory-dag: stopped by {signal_name}; the store keeps its last committed state "
        "(run `memory-dag ingest` again to finish)",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(signal_exit_code(signal_name))


class LazyModule:
    """A module imported when one of its names is first used (command modules are all
    imported to build the parser; most commands need few of the libraries they name)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name), attribute)
