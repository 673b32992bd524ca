"""`memory-dag summarize | summary | export`: conversation summaries from the command line.

The same library functions the Dagster asset calls; `summarize` then runs the embed and index
stages so `memory-dag search` finds the new summaries at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from memory_dag.cli.common import (
    add_scope_flags,
    print_json,
    refused,
    scope_from_args,
    settings_from_args,
)


def cmd_summarize(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from memory_dag.index.build import refresh_search_index
    from memory_dag.summaries.conversation_summaries import conversation_ids
    from memory_dag.summaries.refresh import summarize_conversation
    from memory_dag.summaries.summarizer import SummarizationError

    settings = settings_from_args(args)
    runs = []
    failed = 0
    for conversation_id in args.conversation or conversation_ids(settings):
        try:
            run = summarize_conversation(settings, conversation_id, force=args.force)
        except SummarizationError as error:
            failed += 1
            print(f"{conversation_id}: summarization failed: {error}", file=sys.stderr)
            continue
        runs.append(run)
        if not args.json:
            print(run.line())
    if runs and not args.no_index and any(run.status != "unchanged" for run in runs):
        for report in refresh_search_index(settings):
            if not args.json:
                print(report.line(), file=sys.stderr)
    if args.json:
        print_json([asdict(run) for run in runs])
    return 1 if failed else 0


def cmd_summary(args: argparse.Namespace) -> int:
    from memory_dag.summaries.conversation_summaries import summary_tree

    nodes = summary_tree(args.conversation, settings_from_args(args), include_retired=args.history)
    if not args.tree and not args.history:
        nodes = [node for node in nodes if node.is_final]
    if args.json:
        print_json([node.model_dump() for node in nodes])
        return 0 if nodes else 1
    if not nodes:
        print(f"no summary for {args.conversation!r} (run `memory-dag summarize` first)")
        return 1
    for node in nodes:
        state = "" if node.active else f", retired {node.valid_until:%Y-%m-%d %H:%M}"
        print(
            f"## {node.id}  [{node.summary_level.value}, {node.input_tokens} -> "
            f"{node.output_tokens} tokens, ratio {node.compression_ratio:.3f}{state}]"
        )
        print(node.content + "\n")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    return refused("export", lambda: _export(args))


def _export(args: argparse.Namespace) -> int:
    from memory_dag.summaries.export import export_store

    try:
        report = export_store(
            settings_from_args(args),
            Path(args.target),
            conversations=args.conversation,
            facts=args.facts,
            turns=args.turns,
            commit=not args.no_commit,
            scope=scope_from_args(args),
        )
    except ValueError as error:  # a path that would leave the target folder
        print(f"memory-dag: {error}", file=sys.stderr)
        return 2
    if args.json:
        print_json(report.__dict__)
        return 0
    print(
        f"exported {len(report.conversations)} conversation(s) to {report.target}: "
        f"{len(report.written)} written, {report.unchanged} unchanged, "
        f"{len(report.removed)} removed"
    )
    if report.commit:
        print(f"committed {report.commit[:12]}")
    for conversation in report.refused:
        print(f"memory-dag: refused conversation {conversation}", file=sys.stderr)
    return 1 if report.refused else 0


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add this group's subcommands (`commands` is the parser's subparsers object)."""
    summarize = commands.add_parser(
        "summarize", parents=[common], help="summarize conversations (adaptive L1/L2/L3)"
    )
    summarize.add_argument(
        "--conversation", action="append", help="only this conversation (repeatable)"
    )
    summarize.add_argument("--force", action="store_true", help="even when nothing changed")
    summarize.add_argument(
        "--no-index", action="store_true", help="skip embedding and indexing the new summaries"
    )
    summarize.set_defaults(func=cmd_summarize)

    summary = commands.add_parser(
        "summary", parents=[common], help="show a conversation's final summary"
    )
    summary.add_argument("conversation")
    summary.add_argument("--tree", action="store_true", help="every L1/L2/L3 node")
    summary.add_argument("--history", action="store_true", help="retired trees too")
    summary.set_defaults(func=cmd_summary)

    export = commands.add_parser(
        "export", parents=[common], help="write summaries as Markdown (entries/ layout)"
    )
    export.add_argument("target", help="folder; committed when it is a git repository")
    export.add_argument(
        "--conversation", action="append", help="only this conversation (repeatable)"
    )
    export.add_argument("--facts", action="store_true", help="facts too")
    export.add_argument("--turns", action="store_true", help="transcript turns too")
    export.add_argument("--no-commit", action="store_true", help="do not git commit")
    add_scope_flags(export)
    export.set_defaults(func=cmd_export)
