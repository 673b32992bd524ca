"""`memory-dag search | query | context`: the read path from the command line, through `Memory`.

    memory-dag search "what does Sam like?" --user sam --limit 3
    memory-dag query "deployment plan" --agent planner --categories tasks --max-tokens 200
    memory-dag context "what should I cook tonight?" --conversation demo --max-tokens 400

One name per knob, as in `Memory` and the REST API: `--limit` (results; old names `--k`,
`--top-k`, `--max-memories` still work), `--min-score` (least relevance; `--threshold`),
`--max-tokens` (budget; `--budget-tokens`), and the scope flags `--user`, `--agent`, `--run`,
`--conversation`. Results show their ids.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from memory_dag.cli.common import (
    REFUSED,
    add_limit_flags,
    add_scope_flags,
    key_value,
    memory_from_args,
    print_json,
    refused,
    scope_kwargs,
)
from memory_dag.memories.categories import AccessDenied

KINDS = ["note", "entry", "transcript", "fact", "summary", "reflection", "insight", "procedural"]


def cmd_search(args: argparse.Namespace) -> int:
    return refused("search", lambda: _search(args))


def _search(args: argparse.Namespace) -> int:
    filters: dict[str, Any] = dict(args.filter)
    for key in ("kind", "source", "path"):
        if getattr(args, key) is not None:
            filters[key] = getattr(args, key)
    results = memory_from_args(args).search(
        args.query, **scope_kwargs(args), filters=filters, limit=args.limit,
        min_score=args.min_score,
    )  # fmt: skip
    if args.json:
        print_json(results.to_dict())
        return 0
    if not results.results:
        print("no results above the minimum score (try --min-score 0)")
    for rank, item in enumerate(results.results, 1):
        where = f" {item.path}:{item.start_line}" if item.path else ""
        label = item.category or item.kind
        flag = ", superseded" if item.superseded else ""
        print(f"{rank}. [{item.score:.3f}] {item.id} ({label}{flag}){where}")
        text = item.memory if len(item.memory) <= 300 else item.memory[:297] + "..."
        print("   " + text.replace("\n", "\n   "))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    try:
        response = memory_from_args(args).query(
            args.query,
            agent_id=args.agent,
            categories=_split(args.categories),
            filters={**dict(args.filter), **({"run_id": args.run} if args.run else {})},
            user_id=args.user,
            conversation_id=args.conversation,
            limit=args.limit,
            max_tokens=args.max_tokens,
            min_score=args.min_score,
            return_=args.return_,
        )
    except (AccessDenied, ValueError) as error:
        print(f"memory-dag query: rejected: {error}", file=sys.stderr)
        return REFUSED
    if args.json:
        print_json(response.to_dict())
        return 0
    if not response.results:
        print(f"no memories for {args.agent} in {', '.join(response.categories)}")
    for result in response.results:
        print(f"{result.id}  {result.text}")
    print(
        f"\n{len(response.results)} results, {response.tokens} tokens"
        + (
            f" (budget {response.budget_tokens}, {response.dropped} left out)"
            if args.max_tokens
            else ""
        )
        + f"; relevance: {response.relevance_source}; stages: {', '.join(response.stages)}",
        file=sys.stderr,
    )
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    try:
        block = memory_from_args(args).context(
            args.message,
            conversation_id=args.conversation,
            user_id=args.user,
            agent_id=args.agent,
            run_id=args.run,
            exclude_run_id=args.exclude_run,
            limit=args.limit,
            max_tokens=args.max_tokens,
            min_score=args.min_score,
            since_rev=args.since_rev,
        )
    except AccessDenied as error:
        print(f"memory-dag context: rejected: {error}", file=sys.stderr)
        return REFUSED
    if args.json:
        print_json(block.to_dict())
        return 0
    print(block.text)
    for note in block.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"\n{block.tokens}/{block.max_tokens} tokens, rev {block.rev}", file=sys.stderr)
    return 0


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value is not None else None


def _filter_flag(parser: argparse.ArgumentParser, keys: str) -> None:
    parser.add_argument(
        "--filter",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help=f"{keys} (repeatable)",
    )


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add `search`, `query` and `context` (`commands` is the parser's subparsers object)."""
    search = commands.add_parser("search", parents=[common], help="hybrid search")
    search.add_argument("query")
    add_scope_flags(search, conversation=True)
    add_limit_flags(search, limit=None, min_score="0.35", old={"--k": "limit"})
    search.add_argument("--kind", choices=KINDS)
    search.add_argument("--source", choices=["memory", "sessions", "memories"])
    search.add_argument("--path", help="a file, or a folder ending in /")
    _filter_flag(search, "kind, category, role, speaker, agent_id, importance_min, ...")
    search.set_defaults(func=cmd_search)

    query = commands.add_parser(
        "query", parents=[common], help="memory.query: what an agent may read, within a budget"
    )
    query.add_argument("query")
    query.add_argument("--agent", required=True, help="whose allowlist applies (categories.yaml)")
    query.add_argument("--categories", help="comma-separated; default: the agent's allowlist")
    query.add_argument("--user", help="the user the caller acts for: every read is scoped to it")
    query.add_argument("--run", "--session", dest="run", help="one session (run) only")
    query.add_argument(
        "--conversation", help="also read this conversation's shared memories (turns, notes)"
    )
    _filter_flag(
        query,
        "user_id, agent_id, run_id, actor_id, role, category, pinned, importance_min, "
        "importance_max, updated_after, updated_before",
    )
    add_limit_flags(
        query,
        limit=5,
        min_score="0.35",
        max_tokens="none",
        old={"--top-k": "limit", "--budget-tokens": "max_tokens", "--threshold": "min_score"},
    )
    query.add_argument("--return", dest="return_", choices=["bullets", "full"], default="bullets")
    query.add_argument("--reranker", help="ONNX cross-encoder: hub name or local folder")
    query.set_defaults(func=cmd_query)

    context = commands.add_parser(
        "context", parents=[common], help="the memory block to inject before an agent's turn"
    )
    context.add_argument("message")
    context.add_argument("--conversation", required=True)
    add_scope_flags(context)
    add_limit_flags(
        context, limit=None, min_score="0.3", max_tokens="500", old={"--max-memories": "limit"}
    )
    context.add_argument("--since-rev", type=int, default=None, help="revision seen last time")
    context.add_argument(
        "--exclude-run",
        "--exclude-session",
        dest="exclude_run",
        help="leave out this session (the current one)",
    )
    context.add_argument("--reranker", help="ONNX cross-encoder: hub name or local folder")
    context.set_defaults(func=cmd_context)
