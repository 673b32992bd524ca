"""`memory-dag query | context`: the agent-facing read path from the command line.

memory-dag query --agent planner --categories tasks "deployment plan"
memory-dag context "what should I cook tonight?" --conversation demo --max-tokens 400
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from memory_dag.cli.common import REFUSED, print_json, settings_from_args
from memory_dag.memories.categories import AccessDenied
from memory_dag.scope import Scope


def cmd_query(args: argparse.Namespace) -> int:
    from memory_dag.read.query import MemoryQuery, query_memory

    try:
        request = MemoryQuery.model_validate(
            {
                "agent": args.agent,
                "query": args.query,
                "categories": _split(args.categories),
                "filters": dict(_pair(f) for f in args.filter),
                "top_k": args.top_k,
                "return": args.return_,
                "budget_tokens": args.budget_tokens,
                "threshold": args.threshold,
            }
        )
        response = query_memory(
            request,
            scope=Scope.of(user_id=args.user, conversation_id=args.conversation),
            settings=settings_from_args(args),
            config=_config(args),
        )
    except (AccessDenied, ValidationError, ValueError) as error:
        print(f"memory-dag query: rejected: {error}", file=sys.stderr)
        return REFUSED
    if args.json:
        print_json(response.model_dump(mode="json", by_alias=True))
        return 0
    if not response.results:
        print(f"no memories for {args.agent} in {', '.join(response.categories)}")
    for result in response.results:
        print(result.text)
    print(
        f"\n{len(response.results)} results, {response.tokens} tokens"
        + (
            f" (budget {response.budget_tokens}, {response.dropped} left out)"
            if args.budget_tokens
            else ""
        )
        + f"; relevance: {response.relevance_source}; stages: {', '.join(response.stages)}",
        file=sys.stderr,
    )
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    from memory_dag.read.context_block import build_context

    limits = {
        "max_tokens": args.max_tokens,
        "max_memories": args.max_memories,
        "min_score": args.min_score,
    }
    try:
        scope = Scope.of(user_id=args.user, agent=args.agent, conversation_id=args.conversation)
        block = build_context(
            args.message,
            scope,
            settings=settings_from_args(args),
            since_rev=args.since_rev,
            exclude_session=args.exclude_session,
            config=_config(args),
            **{name: value for name, value in limits.items() if value is not None},
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


def _config(args: argparse.Namespace) -> Any:
    from memory_dag.read.retriever import RetrievalConfig

    return RetrievalConfig(reranker_model=args.reranker)


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _pair(text: str) -> tuple[str, Any]:
    key, separator, value = text.partition("=")
    if not separator:
        raise ValueError(f"--filter takes KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add `query` and `context` (`commands` is the parser's subparsers object)."""
    query = commands.add_parser(
        "query", parents=[common], help="memory.query: what an agent may read, within a budget"
    )
    query.add_argument("query")
    query.add_argument("--agent", required=True, help="whose allowlist applies (categories.yaml)")
    query.add_argument("--categories", help="comma-separated; default: the agent's allowlist")
    query.add_argument("--user", help="the user the caller acts for: every read is scoped to it")
    query.add_argument(
        "--conversation", help="also read this conversation's shared memories (turns, notes)"
    )
    query.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="user_id, agent_id, run_id, actor_id, role, category, pinned, importance_min, "
        "importance_max, updated_after, updated_before (repeatable)",
    )
    query.add_argument("--top-k", type=int, default=5)
    query.add_argument("--return", dest="return_", choices=["bullets", "full"], default="bullets")
    query.add_argument("--budget-tokens", type=int, default=None)
    query.add_argument("--threshold", type=float, default=None, help="least relevance (0.35)")
    query.add_argument("--reranker", help="ONNX cross-encoder: hub name or local folder")
    query.set_defaults(func=cmd_query)

    context = commands.add_parser(
        "context", parents=[common], help="the memory block to inject before an agent's turn"
    )
    context.add_argument("message")
    context.add_argument("--conversation", required=True)
    context.add_argument("--max-tokens", type=int, help="budget of the block (500)")
    context.add_argument("--max-memories", type=int, help="ranked memories at most (5)")
    context.add_argument("--min-score", type=float, help="least relevance (0.3)")
    context.add_argument("--since-rev", type=int, default=None, help="revision seen last time")
    context.add_argument("--agent", help="restrict memories to this agent's allowlist")
    context.add_argument("--user", help="the user the caller acts for")
    context.add_argument("--exclude-session", help="leave out this session (the current one)")
    context.add_argument("--reranker", help="ONNX cross-encoder: hub name or local folder")
    context.set_defaults(func=cmd_context)
