"""CLI commands over `Memory` and the store's memory lookups.

The write side speaks `Memory`'s verbs (mem0's): `add` (old name `remember`), `update`
(`correct`), `delete` (`forget`), `restore`, `confirm`, and the reads `get`, `list`, `history`;
each calls the `Memory` method of the same name, as the service does, so a write is live
(durable and searchable when the command returns, whatever a pipeline is doing). `stats`,
`entity`, `changes`, `consent list|accept|reject` and `consolidate` call the library function
of the same name. Every command acts for the scope of `--user`, `--agent`, `--run`,
`--conversation` (`memory_dag/scope.py`); a refused request exits with status 2, an impossible
operation with 1. Every listing shows ids, so what one command printed feeds the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from memory_dag.cli.common import (
    LazyModule,
    add_limit_flags,
    add_scope_flags,
    memory_from_args,
    print_json,
    refused,
    scope_from_args,
    scope_kwargs,
    settings_from_args,
)

if TYPE_CHECKING:
    from memory_dag.memories import change_log, consent, lookups
else:  # imported when a command runs: `memory-dag ingest` needs none of the search stack
    change_log = LazyModule("memory_dag.memories.change_log")
    consent = LazyModule("memory_dag.memories.consent")
    lookups = LazyModule("memory_dag.memories.lookups")
from memory_dag.memory_results import (
    AddResult,
    ChangeResult,
    HistoryResult,
    MemoryItem,
    MemoryList,
    Result,
)


def _run(args: argparse.Namespace, action: Any) -> int:
    """Run one operation and print its result (JSON with `--json`, ids only with `-q`)."""
    return refused(args.command, lambda: _operate(args, action))


def _operate(args: argparse.Namespace, action: Any) -> int:
    result = action(args)
    if args.json:
        print_json(_plain(result))
    elif getattr(args, "quiet", False):
        print("\n".join(_ids(result)))
    else:
        print(args.render(result))
    return 0


def _plain(value: Any) -> Any:
    """JSON-ready: results as dicts, dataclasses (proposals, deltas) too, lists of them."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, Result):
        return value.to_dict()
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value  # type: ignore[arg-type]


def _ids(result: Any) -> list[str]:
    if isinstance(result, AddResult):
        return [event.id for event in result.results] or result.turns
    if isinstance(result, ChangeResult):
        return [result.id]
    return []


# --------------------------------------------------------------------------- text output


def _added_text(result: AddResult) -> str:
    lines = [f"{e.event:<7} {e.id}  {e.memory}" for e in result.results]
    if result.turns:
        where = f"conversation {result.conversation_id or '-'}, run {result.run_id}"
        lines.append(f"recorded {len(result.turns)} turn(s) ({where}): {', '.join(result.turns)}")
    if result.closed_run_id:
        lines.append(f"run {result.closed_run_id} closed (consolidated by the next pipeline run)")
    return "\n".join(lines) or "nothing to remember"


def _change_text(result: ChangeResult) -> str:
    line = f"{result.status} {result.id}"
    return line + (f" (replaces {result.replaced_id})" if result.replaced_id else "")


def _item_line(item: MemoryItem) -> str:
    label = item.category or item.role or item.kind
    state = "" if item.state == "active" else f" ({item.state})"
    return f"{item.id}  [{label}]{state} {item.memory}"


def _item_text(item: MemoryItem | None) -> str:
    if item is None:
        return "no such memory"
    fields = {
        "kind": item.kind,
        "user": item.user_id,
        "conversation": item.conversation_id,
        "run": item.run_id,
        "importance": item.importance,
        "created": item.created_at,
        "sources": ", ".join(item.source_ids) or None,
    }
    extra = ", ".join(f"{k} {v}" for k, v in fields.items() if v is not None)
    return f"{_item_line(item)}\n  {extra}"


def _list_text(listing: MemoryList) -> str:
    return "\n".join(_item_line(item) for item in listing.results) or "no memories"


def _history_text(record: HistoryResult) -> str:
    memory = record.memory
    lines = [
        f"{memory.id} ({memory.kind}, {memory.state}): {memory.memory}",
        f"  sources: {', '.join(memory.source_ids) or '-'}",
    ]
    for event in record.events:
        refs = " -> ".join(ref for ref in (event.old_ref, event.new_ref) if ref)
        reason = event.meta.get("reason") or event.meta.get("op") or ""
        pending = "  (live, not folded yet)" if event.pending else ""
        lines.append(
            f"{event.at:%Y-%m-%d %H:%M:%S}  {event.event:<8} {event.actor or '-':<10} "
            f"{refs}  {reason}{pending}".rstrip()
        )
    return "\n".join(lines)


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
            lines.append(f"  {memory['id']}  [{memory['kind']}{when}] {memory['content'][:160]}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _changes_text(delta: change_log.Delta) -> str:
    revisions = ", ".join(f"{c or '(none)'}: rev {r}" for c, r in sorted(delta.revisions.items()))
    header = delta.header or f"No memory updates since rev {delta.since}."
    listing = [
        f"rev {row['rev']:>4}  {row['event']:<12} {row['memory_id'] or '-'}  "
        f"{(row['content'] or '')[:100]}"
        for row in delta.changes
    ]
    return "\n".join(
        [header, *listing, f"({len(delta.changes)} changes; current {revisions or 'rev 0'})"]
    )


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


# --------------------------------------------------------------------------- commands


def _add(args: argparse.Namespace) -> AddResult:
    memory = memory_from_args(args)
    metadata = json.loads(args.metadata) if args.metadata else None
    if not isinstance(metadata, dict | None):
        raise ValueError("--metadata takes a JSON object")
    given: Any = args.text if args.role is None else [{"role": args.role, "content": args.text}]
    return memory.add(
        given,
        **scope_kwargs(args),
        metadata=metadata,
        infer=not args.no_infer,
        category=args.category,
        importance=args.importance,
    )


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
        print("\n".join(report.line() for report in reports))
        for report in reports:
            for note in report.notes if isinstance(report, WriteReport) else []:
                print(note)
    return 0


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add the memory commands (`commands` is the parser's subparsers object)."""

    def add(
        name: str,
        summary: str,
        action: Any,
        render: Any,
        *,
        aliases: tuple[str, ...] = (),
        run: bool = True,
        conversation: bool = True,
    ) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, parents=[common], help=summary, aliases=list(aliases))
        parser.set_defaults(func=lambda args: _run(args, action), render=render)
        add_scope_flags(parser, run=run, conversation=conversation)
        return parser

    adding = add(
        "add",
        "remember a text, or record a turn (--role) and learn its facts",
        _add,
        _added_text,
        aliases=("remember",),
    )
    adding.add_argument("text", help="a memory: 1-2 third-person sentences, at most 280 chars")
    adding.add_argument(
        "--role", choices=["user", "assistant"], help="record TEXT as a turn said by this role"
    )
    adding.add_argument("--no-infer", action="store_true", help="record the turn, extract nothing")
    adding.add_argument("--category", help="default: guessed from the text")
    adding.add_argument("--importance", type=int, choices=range(1, 6))
    adding.add_argument("--metadata", help="a JSON object kept with the memory")
    adding.add_argument("-q", "--quiet", action="store_true", help="print the ids only")

    updating = add(
        "update",
        "replace a memory with a corrected text: a new id",
        lambda a: memory_from_args(a).update(a.memory_id, a.text, **scope_kwargs(a, run=False)),
        _change_text,
        aliases=("correct",),
        run=False,
    )
    updating.add_argument("memory_id")
    updating.add_argument("text")
    updating.add_argument("-q", "--quiet", action="store_true", help="print the new id only")

    for name, summary, method, aliases in (
        ("delete", "forget a memory (purged in 30 days)", "delete", ("forget",)),
        ("restore", "bring back a forgotten memory", "restore", ()),
        ("confirm", "protect a memory from decay", "confirm", ()),
    ):  # fmt: skip
        parser = add(
            name,
            summary,
            lambda a, method=method: getattr(memory_from_args(a), method)(
                a.memory_id, **scope_kwargs(a, run=False)
            ),
            _change_text,
            aliases=aliases,
            run=False,
        )
        parser.add_argument("memory_id")

    getting = add(
        "get",
        "one memory by id",
        lambda a: memory_from_args(a).get(a.memory_id, **scope_kwargs(a, run=False)),
        _item_text,
        run=False,
    )
    getting.add_argument("memory_id")

    listing = add(
        "list",
        "the scope's active memories, newest first",
        lambda a: memory_from_args(a).get_all(**scope_kwargs(a), limit=a.limit),
        _list_text,
    )
    add_limit_flags(listing, limit=100)

    history = add(
        "history",
        "a memory's audit trail",
        lambda a: memory_from_args(a).history(a.memory_id, **scope_kwargs(a, run=False)),
        _history_text,
        run=False,
    )
    history.add_argument("memory_id")

    add(
        "stats",
        "memory counts by kind",
        lambda a: lookups.stats(settings_from_args(a), scope=scope_from_args(a)),
        _stats_text,
    )

    entity = add(
        "entity",
        "an entity's profile and linked memories",
        lambda a: lookups.entity_profile(
            settings_from_args(a), a.name, limit=a.limit, scope=scope_from_args(a)
        ),
        _entity_text,
    )
    entity.add_argument("name", help="canonical name or alias, any case")
    add_limit_flags(entity, limit=20)

    changes = add(
        "changes",
        "memory updates since a revision (the delta header), with ids",
        lambda a: change_log.changes(settings_from_args(a), a.since, scope=scope_from_args(a)),
        _changes_text,
    )
    changes.add_argument("--since", type=int, default=0, help="revision already seen")

    proposals = commands.add_parser(
        "consent", help="changes to sensitive user fields waiting for consent (seed 003 §10)"
    )
    actions = proposals.add_subparsers(dest="consent_command", required=True)
    waiting = actions.add_parser("list", parents=[common], help="proposed changes")
    waiting.add_argument("--all", action="store_true", help="decided and expired ones too")
    add_scope_flags(waiting, conversation=True)
    waiting.set_defaults(
        func=lambda args: _run(
            args,
            lambda a: consent.list_proposals(
                settings_from_args(a),
                scope=scope_from_args(a),
                status=None if a.all else "pending",
            ),
        ),
        render=_proposals_text,
    )
    for name in ("accept", "reject"):
        decide = actions.add_parser(
            name, parents=[common], help=f"{name} a proposed change (recorded in history)"
        )
        decide.add_argument("proposal_id")
        add_scope_flags(decide, conversation=True)
        decide.set_defaults(
            func=lambda args, name=name: _run(
                args,
                lambda a: getattr(consent, name)(
                    settings_from_args(a), a.proposal_id, scope=scope_from_args(a)
                ),
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
