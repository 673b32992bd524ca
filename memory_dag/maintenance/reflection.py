"""The weekly reflection, Sundays at 03:00 (seed 004).

* `reflection`: per scope, at most once per 6 days and only with >= 3 facts in the last 7 days,
  a `reflection` memory tagged `weekly` with `decay_rate` 0: the LLM's, else the week's 5 most
  important facts (extractive).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from memory_dag.config import Settings
from memory_dag.llm import LLMClient, LLMError
from memory_dag.maintenance import common
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.memories.writer import NewMemory
from memory_dag.reports import StageReport
from memory_dag.scope import OWNER_SQL, owner_of, read_as
from memory_dag.store.connection import fetch_dicts, open_store

REFLECTION_TAG = "weekly"
MAX_REFLECTION_CHARS = 1000

REFLECTION_PROMPT = """\
Write this week's reflection for a long-term memory: what stands out across the facts and \
conversation turns below (recurring themes, priorities, changes, open plans).

Rules: 2-4 sentences, third person, name people instead of using pronouns, neutral tone, at \
most 600 characters, only what the input says. Answer with the reflection text only.

Facts of the week:
{facts}

Conversation turns of the week:
{episodes}
"""


#: Facts an extractive reflection keeps: the week's most important ones.
EXTRACTIVE_FACTS = 5


def reflection_text(
    llm: LLMClient | None, facts: list[dict[str, Any]], episodes: list[dict[str, Any]]
) -> tuple[str, str]:
    """(text, method): the LLM's reflection, else the week's most important facts in the
    order they were learnt (importance, then recency, decides which)."""
    if llm is not None:
        prompt = REFLECTION_PROMPT.format(
            facts="\n".join(f"- {f['content']}" for f in facts),
            episodes="\n".join(
                f"- {e['speaker'] or e['role'] or '?'}: {e['content']}" for e in episodes
            )
            or "(none)",
        )
        try:
            answer = llm.complete([{"role": "user", "content": prompt}], max_tokens=300)
            text = " ".join(answer.split())
            if text:
                return text[:MAX_REFLECTION_CHARS], "llm"
        except LLMError:
            pass  # the extractive reflection below is the fallback
    ranked = sorted(facts, key=lambda f: (-f["importance"], -f["created_at"].timestamp(), f["id"]))
    kept = sorted(ranked[:EXTRACTIVE_FACTS], key=lambda f: (f["created_at"], f["id"]))
    text = " ".join(f["content"].strip() for f in kept)
    return text[:MAX_REFLECTION_CHARS], "extractive"


def reflection(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Seed 004 weekly reflection per scope: once per 6 days, with >= 3 facts of the week."""
    report = common.new_report("reflection")
    with common.timed(report):
        now = common.aware(now)
        since = now - timedelta(days=config.reflection_window_days)
        with open_store(settings.db_path) as con:
            facts = common.rows_by_scope(
                fetch_dicts(
                    con,
                    f"SELECT id, content, {OWNER_SQL} AS scope, created_at, importance, category "
                    "FROM facts WHERE created_at > ? AND created_at <= ? "
                    "ORDER BY created_at DESC, id",
                    [since, now],
                )
            )
            episodes = common.rows_by_scope(
                fetch_dicts(
                    con,
                    f"SELECT id, content, {OWNER_SQL} AS scope, speaker, "
                    "source_role AS role, coalesce(event_time, created_at) AS happened_at "
                    "FROM memories "
                    f"WHERE kind = 'episode' AND {common.ACTIVE_SQL} "
                    "AND coalesce(event_time, created_at) > ? "
                    "AND coalesce(event_time, created_at) <= ? ORDER BY happened_at DESC, id",
                    [since, now],
                )
            )
            last = dict(
                con.execute(
                    f"SELECT {OWNER_SQL}, max(created_at) FROM memories "
                    "WHERE kind = 'reflection' AND list_contains(tags, ?) GROUP BY 1",
                    [REFLECTION_TAG],
                ).fetchall()
            )
        llm = common.llm_client(settings)
        drafts: list[NewMemory] = []
        for scope, scope_facts in sorted(facts.items()):
            previous = last.get(scope)
            if previous is not None and now - previous < timedelta(days=config.reflection_min_days):
                report.notes.append(f"{scope}: skipped, last reflection {previous:%Y-%m-%d %H:%M}")
                continue
            if len(scope_facts) < config.reflection_min_facts:
                report.notes.append(f"{scope}: skipped, {len(scope_facts)} facts this week")
                continue
            used_facts = scope_facts[: config.reflection_max_inputs]
            used_episodes = episodes.get(scope, [])[: config.reflection_max_inputs]
            text, method = reflection_text(llm, used_facts, list(reversed(used_episodes)))
            user_id, conversation_id = owner_of(scope)
            drafts.append(
                NewMemory(
                    content=text,
                    kind="reflection",
                    conversation_id=conversation_id,
                    user_id=user_id,
                    source_role=common.ACTOR,
                    importance=3,
                    event_time=now,
                    source_ids=[f["id"] for f in used_facts],
                    tags=[REFLECTION_TAG],
                    decay_rate=0.0,
                    attributes={
                        # read only by scopes that may read all of it (memory_dag/scope.py)
                        "source_categories": sorted(
                            {read_as(f["category"]) for f in used_facts}
                            | ({read_as(None)} if used_episodes else set())
                        ),
                        "method": method,
                        "window_start": since.isoformat(),
                        "window_end": now.isoformat(),
                        "facts": len(used_facts),
                        "episodes": len(used_episodes),
                    },
                )
            )
        if drafts:
            with common.maintenance_writer(settings, common.aware(now)) as writer:
                ids = [writer.add(draft, meta={"job": "reflection"}) for draft in drafts]
            report.preview = [
                {"id": i, "content": d.content} for i, d in zip(ids, drafts, strict=True)
            ]
        report.counts.update(examined=len(facts), created=len(drafts))
        if drafts:
            common.refresh_index(settings, report)
    return report
