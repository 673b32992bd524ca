"""Insights (seed 003 §3), every 4 hours.

* `insights`: per scope with new facts in the last 24 h and no insights run in the last 24 h,
  1-3 third-person insights of at most 280 characters, kind `insight`, category
  `relationship_dynamic`, importance 2. Needs an LLM: without one the job is skipped, and says
  why (rules cannot read trust or emotion from facts honestly).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from memory_dag.config import Settings
from memory_dag.llm import LLMError
from memory_dag.maintenance import common
from memory_dag.maintenance.common import DEFAULT_CONFIG, MaintenanceConfig
from memory_dag.memories.facts import validate_fact
from memory_dag.memories.writer import NewMemory
from memory_dag.reports import StageReport
from memory_dag.scope import OWNER_SQL, owner_of
from memory_dag.store.connection import fetch_dicts, open_store

INSIGHT_CATEGORY = "relationship_dynamic"

INSIGHTS_PROMPT = """\
From the recent activity of a user below, infer 1 to 3 insights about the user's emotions, \
trust, relationships, communication style or how the user's preferences are evolving.

Rules: third person; name people instead of using pronouns; never refer to the AI or the \
assistant; each insight at most 280 characters; only what the input supports. When nothing \
stands out answer {{"insights": []}}.

Latest activity:
{activity}

New facts:
{facts}

Recent conversation:
{snippet}

Answer with JSON only, no prose and no code fences:
{{"insights": [{{"summary": "...", "tags": ["..."], "importance": 2}}]}}
"""


class InsightItem(BaseModel):
    summary: str
    tags: list[str] = Field(default_factory=list)
    importance: int = 2


class InsightAnswer(BaseModel):
    insights: list[InsightItem] = Field(default_factory=list)


def insight_texts(answer: InsightAnswer) -> list[tuple[str, list[str]]]:
    """The valid insights of an answer (seed 003 §9's writing rules: third person, no pronoun
    without a referent, at most 280 characters), at most 3."""
    kept = []
    for item in answer.insights:
        text = validate_fact(item.summary)
        if text is not None:
            kept.append((text, [t.strip().lower() for t in item.tags if t.strip()]))
    return kept[:3]


def insights(
    settings: Settings, now: datetime, *, config: MaintenanceConfig = DEFAULT_CONFIG
) -> StageReport:
    """Seed 003 §3 theory-of-mind insights per scope with new facts, at most once per 24 h."""
    report = common.new_report("insights")
    with common.timed(report):
        llm = common.llm_client(settings)
        if llm is None:
            report.skipped = True
            report.notes.append(
                "skipped: insights need an LLM (no LLM configured); rules cannot infer trust, "
                "emotions or relationship dynamics honestly"
            )
            return report
        now = common.aware(now)
        since = now - timedelta(hours=config.insights_cooldown_hours)
        with open_store(settings.db_path) as con:
            new_facts = common.rows_by_scope(
                fetch_dicts(
                    con,
                    f"SELECT id, content, {OWNER_SQL} AS scope, created_at FROM facts "
                    "WHERE created_at > ? AND created_at <= ? ORDER BY created_at DESC, id",
                    [since, now],
                )
            )
            recent_runs = {
                row[0]
                for row in con.execute(
                    "SELECT json_extract_string(meta, '$.scope') FROM events "
                    "WHERE node = ? AND op = 'insights' AND status = 'ok' AND ts > ?",
                    [common.ACTOR, since],
                ).fetchall()
            }
            inputs = {
                scope: _insight_inputs(con, scope, rows[:3])
                for scope, rows in new_facts.items()
                if scope not in recent_runs
            }
        results: dict[str, list[tuple[str, list[str]]]] = {}
        failed: dict[str, str] = {}
        for scope, prompt in sorted(inputs.items()):
            try:
                answer = llm.complete_json(
                    [{"role": "user", "content": prompt}],
                    InsightAnswer,
                    max_tokens=config.insights_max_tokens,
                )
                results[scope] = insight_texts(answer)
            except LLMError as error:
                failed[scope] = str(error)
        created = 0
        with common.maintenance_writer(settings, common.aware(now)) as writer:
            for scope, found in results.items():
                user_id, conversation_id = owner_of(scope)
                source_ids = [f["id"] for f in new_facts[scope][:3]]
                for text, tags in found:
                    writer.add(
                        NewMemory(
                            content=text,
                            kind="insight",
                            conversation_id=conversation_id,
                            user_id=user_id,
                            source_role=common.ACTOR,
                            category=INSIGHT_CATEGORY,
                            importance=2,
                            event_time=now,
                            source_ids=source_ids,
                            tags=tags,
                        ),
                        meta={"job": "insights"},
                    )
                    created += 1
                writer.record_event(
                    common.ACTOR,
                    "insights",
                    "ok",
                    conversation_id=conversation_id,
                    detail=f"{len(found)} insights",
                    meta={"scope": scope, "created": len(found), "as_of": now.isoformat()},
                )
            for scope, error in failed.items():
                writer.record_event(
                    common.ACTOR,
                    "insights",
                    "error",
                    conversation_id=owner_of(scope)[1],
                    detail=error,
                    meta={"scope": scope},
                )
        skipped = len(new_facts) - len(inputs)
        if skipped:
            report.notes.append(f"{skipped} scopes had insights in the last 24 h: skipped")
        if failed:
            report.notes.append(f"LLM failed for {len(failed)} scopes (see events)")
        report.counts.update(examined=len(new_facts), created=created, llm_failures=len(failed))
        if created:
            common.refresh_index(settings, report)
    return report


def _insight_inputs(con: Any, scope: str, new_facts: list[dict[str, Any]]) -> str:
    """Seed 003 §3 input: <= 5 activity items, <= 3 new facts, <= 1,000 chars of conversation."""
    exclude = [f["id"] for f in new_facts]
    activity = con.execute(
        f"SELECT content FROM memories WHERE {common.ACTIVE_SQL} AND {OWNER_SQL} = ? "
        "AND kind IN ('fact', 'summary', 'reflection') AND id NOT IN (SELECT unnest(?::TEXT[])) "
        "ORDER BY created_at DESC, id LIMIT 5",
        [scope, exclude],
    ).fetchall()
    turns = con.execute(
        f"SELECT coalesce(speaker, source_role, '?'), content FROM memories "
        f"WHERE kind = 'episode' AND {common.ACTIVE_SQL} AND {OWNER_SQL} = ? "
        "ORDER BY coalesce(event_time, created_at) DESC, line DESC LIMIT 20",
        [scope],
    ).fetchall()
    snippet: list[str] = []
    size = 0
    for speaker, content in turns:
        line = f"{speaker}: {content}"
        if size + len(line) > 1000:
            break
        snippet.insert(0, line)
        size += len(line) + 1
    return INSIGHTS_PROMPT.format(
        activity="\n".join(f"- {row[0]}" for row in activity) or "(none)",
        facts="\n".join(f"- {f['content']}" for f in new_facts),
        snippet="\n".join(snippet) or "(none)",
    )
