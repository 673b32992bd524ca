"""CLI commands over the agent-facing memory operations and the write path.

`remember`, `correct`, `confirm`, `forget`, `restore`, `stats`, `entity`, `history`, `changes`,
`consent list|accept|reject` and `consolidate`: each calls the library function of the same
name in `memory_dag.memories` or `write_path`, so the CLI, an agent and the Dagster assets
share one code path. Writes publish the search index before returning, so the next
`memory-dag search` sees them. Each acts for the
scope of `--user`, `--agent`, `--conversation`, `--session` (`memory_dag/scope.py`); a refused
request exits with status 2, an impossible operation with 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from memory_dag.cli.common import (
    add_scope_flags,
    print_json,
    refused,
    scope_from_args,
    settings_from_args,
)
from memory_dag.memories import agent_ops, change_log, consent, lookups
from memory_dag.memories.writer import MemoryOpError


def _run(args: argparse.Namespace, action: Any) -> int:
    """Run one operation; an impossible operation is a message and exit status 1, a request
    outside the caller's scope status 2, never a traceback."""
    return refused(args.command, lambda: _operate(args, action))


def _operate(args: argparse.Namespace, action: Any) -> int:
    try:
        result = action(settings_from_args(args))
    except MemoryOpError as error:
        print(f"memory-dag: {error}", file=sys.stderr)
        return 1
    if args.json:
        print_json(_plain(result))
    else:
        print(args.render(result))
    return 0


def _plain(value: Any) -> Any:
    """JSON-ready: dataclasses (results, proposals) as dicts, lists of them as lists."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


# --------------------------------------------------------------------------- text output


def _write_line(result: agent_ops.WriteResult) -> str:
    line = f"{result.status} {result.memory_id}"
    if result.replaced_id:
        line += f" (replaces {result.replaced_id})"
    if result.revision is not None:
        line += f", revision {result.revision}"
    return line


def _stats_text(stats: dict[str, Any]) -> str:
    lines = ["kind         active  soft_deleted  latest"]
    for kind, row in stats["kinds"].items():
        lines.append(
            f"{kind:<12} {row['active']:>6}  {row['soft_deleted']:>12}  {row['latest_at']}"
        )
    latest = stats["latest"]
    if latest:
        lines.append(f"latest: {latest['kind']} {latest['id']} at {latest['created_at']}")
        lines.append(f"  {latest['content'][:200]}")
    sessions = stats["sessions"]
    lines.append(
        f"entities {stats['entities']} ({stats['entity_links']} links), relations "
        f"{stats['relations']}, sessions {sessions['consolidated']} consolidated / "
        f"{sessions['pending']} pending"
    )
    return "\n".join(lines)


def _entity_text(profiles: list[dict[str, Any]]) -> str:
    if not profiles:
        return "no entity with that name or alias"
    blocks = []
    for entity in profiles:
        aliases = f", aliases: {', '.join(entity['aliases'])}" if entity["aliases"] else ""
        counts = ", ".join(f"{n} {kind}s" for kind, n in entity["memory_counts"].items())
        lines = [
            f"{entity['canonical_name']} ({entity['type']}, {entity['id']}): "
            f"{entity['mention_count']} mentions{aliases}; active memories: {counts or 'none'}"
        ]
        for memory in entity["memories"]:
            when = f" {memory['event_time']:%Y-%m-%d}" if memory["event_time"] else ""
            lines.append(f"  - [{memory['kind']}{when}] {memory['content'][:160]} ({memory['id']})")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _history_text(record: dict[str, Any]) -> str:
    memory = record["memory"]
    lines = [
        f"{memory['id']} ({memory['kind']}, {memory['state']}): {memory['content']}",
        f"  sources: {', '.join(memory['source_ids']) or '-'}",
    ]
    if memory["supersedes"]:
        lines.append(f"  supersedes {memory['supersedes']}")
    if memory["replaced_by"]:
        lines.append(f"  replaced by {memory['replaced_by']}")
    for event in record["history"]:
        refs = " -> ".join(ref for ref in (event["old_ref"], event["new_ref"]) if ref)
        reason = event["meta"].get("reason") or event["meta"].get("op") or ""
        lines.append(
            f"{event['ts']:%Y-%m-%d %H:%M:%S}  {event['event']:<8} {event['actor'] or '-':<10} "
            f"{refs}  {reason}".rstrip()
        )
    return "\n".join(lines)


def _changes_text(delta: change_log.Delta) -> str:
    revisions = ", ".join(f"{c or '(none)'}: rev {r}" for c, r in sorted(delta.revisions.items()))
    header = delta.header or f"No memory updates since rev {delta.since}."
    return f"{header}\n({len(delta.changes)} changes; current {revisions or 'rev 0'})"


def _proposal_line(proposal: consent.Proposal) -> str:
    change = proposal.proposed_text or "(remove)"
    line = (
        f"{proposal.id} {proposal.status} {proposal.field} ({proposal.sensitivity}): "
        f"{proposal.current_text} -> {change}"
    )
    if proposal.status == "pending":
        line += f"  [{proposal.signals} signal(s), expires {proposal.expires_at:%Y-%m-%d}]"
    elif proposal.result_id:
        line += f"  [now {proposal.result_id}]"
    return line


def _proposals_text(proposals: list[consent.Proposal]) -> str:
    return "\n".join(_proposal_line(p) for p in proposals) or "no proposals waiting for consent"


def _reports_text(reports: list[Any]) -> str:
    return "\n".join(report.line() for report in reports)


# --------------------------------------------------------------------------- commands


def cmd_consolidate(args: argparse.Namespace) -> int:
    from memory_dag.memories.write_path import WriteReport
    from memory_dag.pipeline import run_all

    reports = run_all(settings_from_args(args), include_open=args.all)
    if args.json:
        print_json(
            {
                r.stage: {
                    "counts": r.counts,
                    "seconds": r.seconds,
                    "notes": r.notes,
                    **(
                        {"method": r.method, "timings": r.timings}
                        if isinstance(r, WriteReport)
                        else {}
                    ),
                }
                for r in reports
            }
        )
    else:
        print(_reports_text(reports))
        for report in reports:
            for note in report.notes if isinstance(report, WriteReport) else []:
                print(note)
    return 0


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add the memory commands (`commands` is the parser's subparsers object)."""

    def add(name: str, summary: str, action: Any, render: Any) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, parents=[common], help=summary)
        parser.set_defaults(func=lambda args: _run(args, lambda s: action(args, s)), render=render)
        add_scope_flags(parser)
        return parser

    remember = add(
        "remember",
        "store an explicit fact",
        lambda a, s: agent_ops.remember(
            s,
            a.text,
            scope=scope_from_args(a),
            speaker=a.speaker,
            category=a.category,
            importance=a.importance,
        ),
        _write_line,
    )
    remember.add_argument("text", help="1-2 sentences, at most 280 characters")
    remember.add_argument("--conversation")
    remember.add_argument("--session")
    remember.add_argument("--speaker")
    remember.add_argument("--category", help="default: guessed from the text")
    remember.add_argument("--importance", type=int, choices=range(1, 6))

    correct = add(
        "correct",
        "replace a memory with a corrected text",
        lambda a, s: agent_ops.correct(s, a.memory_id, a.text, scope=scope_from_args(a)),
        _write_line,
    )
    correct.add_argument("memory_id")
    correct.add_argument("text")

    for name, summary, operation in (
        ("confirm", "protect a memory from decay", agent_ops.confirm),
        ("forget", "soft-delete a memory (purged after 30 days)", agent_ops.forget),
        ("restore", "bring back a soft-deleted memory", agent_ops.restore),
    ):
        parser = add(
            name,
            summary,
            lambda a, s, op=operation: op(s, a.memory_id, scope=scope_from_args(a)),
            _write_line,
        )
        parser.add_argument("memory_id")

    add(
        "stats",
        "memory counts by kind",
        lambda a, s: lookups.stats(s, scope=scope_from_args(a)),
        _stats_text,
    )

    entity = add(
        "entity",
        "an entity's profile and linked memories",
        lambda a, s: lookups.entity_profile(s, a.name, limit=a.limit, scope=scope_from_args(a)),
        _entity_text,
    )
    entity.add_argument("name", help="canonical name or alias, any case")
    entity.add_argument("--limit", type=int, default=20, help="memories shown (default 20)")

    history = add(
        "history",
        "a memory's audit trail",
        lambda a, s: lookups.memory_history(s, a.memory_id, scope=scope_from_args(a)),
        _history_text,
    )
    history.add_argument("memory_id")

    changes = add(
        "changes",
        "memory updates since a revision (the delta header)",
        lambda a, s: change_log.changes(s, a.since, scope=scope_from_args(a)),
        _changes_text,
    )
    changes.add_argument("--since", type=int, default=0, help="revision already seen")
    changes.add_argument("--conversation", help="default: every conversation")

    proposals = commands.add_parser(
        "consent", help="changes to sensitive user fields waiting for consent (seed 003 §10)"
    )
    actions = proposals.add_subparsers(dest="consent_command", required=True)
    listing = actions.add_parser("list", parents=[common], help="proposed changes")
    listing.add_argument("--all", action="store_true", help="decided and expired ones too")
    add_scope_flags(listing)
    listing.set_defaults(
        func=lambda args: _run(
            args,
            lambda s: consent.list_proposals(
                s, scope=scope_from_args(args), status=None if args.all else "pending"
            ),
        ),
        render=_proposals_text,
    )
    for name, decision in (("accept", consent.accept), ("reject", consent.reject)):
        decide = actions.add_parser(
            name, parents=[common], help=f"{name} a proposed change (recorded in history)"
        )
        decide.add_argument("proposal_id")
        add_scope_flags(decide)
        decide.set_defaults(
            func=lambda args, decision=decision: _run(
                args, lambda s: decision(s, args.proposal_id, scope=scope_from_args(args))
            ),
            render=_proposal_line,
        )

    consolidate = commands.add_parser(
        "consolidate",
        parents=[common],
        help="ingest, turn closed sessions into facts, link entities, re-index (no Dagster)",
    )
    consolidate.add_argument(
        "--all", action="store_true", help="also consolidate each conversation's newest session"
    )
    consolidate.set_defaults(func=cmd_consolidate, creates_store=True)
