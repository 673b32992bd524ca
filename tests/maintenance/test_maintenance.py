"""The maintenance jobs against a real store whose clock is moved forward: the exact rows that
change, the history and change log they leave, and the index and entity links following."""

from __future__ import annotations

import itertools
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memory_dag.config import Settings
from memory_dag.embed.chunk_embeddings import embed_chunks
from memory_dag.embed.providers import get_provider
from memory_dag.index.build import build_search_index
from memory_dag.index.published import load_index
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.maintenance.common import MaintenanceConfig, day_start
from memory_dag.maintenance.consolidation import consolidate_pending
from memory_dag.maintenance.decay import decay
from memory_dag.maintenance.dedup import dedup_merge
from memory_dag.maintenance.dedup_pairs import lexical_overlap, numeric_step
from memory_dag.maintenance.enrichment import entity_enrichment
from memory_dag.maintenance.insights import insights
from memory_dag.maintenance.lifecycle import lifecycle
from memory_dag.maintenance.procedures import remember_procedure
from memory_dag.maintenance.reflection import reflection as weekly_reflection
from memory_dag.memories.agent_ops import restore
from memory_dag.memories.writer import MemoryWriter, NewMemory
from memory_dag.read.query import MemoryQuery, query_memory
from memory_dag.store.connection import fetch_dicts, open_store
from tests.openai_server import Reply, ScriptedOpenAIServer


@pytest.fixture
def store(tmp_path: Path) -> Settings:
    (tmp_path / "workspace").mkdir()
    return Settings(
        workspace=tmp_path / "workspace",
        db_path=tmp_path / "memory.duckdb",
        index_dir=tmp_path / "index",
    )


def with_llm(settings: Settings, server: ScriptedOpenAIServer) -> Settings:
    return settings.model_copy(
        update={"llm_base_url": server.base_url, "llm_model": "scripted-model", "llm_timeout": 5}
    )


#: Every test here reasons about days: memories are written at T0 (09:00) and the jobs run
#: from NOW (10:00 the same day), whatever the wall clock says (issue 13 item 9).
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
_written = itertools.count(1)


def add(settings: Settings, text: str, *, at: datetime | None = None, **fields: Any) -> str:
    """Write a memory the way the write path does (history, change log, entity links), at `at`
    (default: a second after the previous one, from T0: written in the order of the calls)."""
    fields.setdefault("conversation_id", "c1")
    at = at or T0 + timedelta(seconds=next(_written))
    with open_store(settings.db_path) as con:
        writer = MemoryWriter(con, get_provider(settings), actor="test", now=at)
        with writer.transaction():
            return writer.add(NewMemory(content=text, **fields))


def sql(settings: Settings, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    with open_store(settings.db_path) as con:
        return fetch_dicts(con, query, params)


def row(settings: Settings, memory_id: str) -> dict[str, Any]:
    return sql(settings, "SELECT * FROM memories WHERE id = ?", [memory_id])[0]


def changes(settings: Settings, memory_id: str) -> list[str]:
    rows = sql(
        settings, "SELECT event FROM change_log WHERE memory_id = ? ORDER BY rev", [memory_id]
    )
    return [r["event"] for r in rows]


def history(settings: Settings, memory_id: str) -> list[dict[str, Any]]:
    rows = sql(
        settings,
        "SELECT event, old_ref, new_ref, actor, meta FROM history WHERE memory_id = ? ORDER BY ts",
        [memory_id],
    )
    for r in rows:
        r["meta"] = json.loads(r["meta"])
    return rows


def links(settings: Settings, memory_id: str) -> set[str]:
    rows = sql(settings, "SELECT entity_id FROM memory_entities WHERE memory_id = ?", [memory_id])
    return {r["entity_id"] for r in rows}


def indexed(settings: Settings) -> set[str]:
    return set(load_index(Path(settings.index_dir)).rows["id"])


def publish(settings: Settings) -> None:
    embed_chunks(settings)
    build_search_index(settings)


# --------------------------------------------------------------------------- decay


def test_decay_follows_the_formula_once_a_day_and_from_the_last_access(store: Settings) -> None:
    fading = add(store, "The user plays the guitar on weekends.")
    confirmed = add(store, "The user is allergic to peanuts.", decay_rate=0.0)
    created = row(store, fading)["created_at"]
    start = NOW

    first = start + timedelta(days=10, hours=5)
    report = decay(store, first)
    as_of = day_start(first)
    expected = math.exp(-0.1 * (as_of - created).total_seconds() / 86400)
    assert row(store, fading)["confidence"] == pytest.approx(expected, rel=1e-9)
    assert report.counts["decayed"] == 1 and report.counts["soft_deleted"] == 0
    assert row(store, confirmed)["confidence"] == 1.0  # decay_rate 0 never decays

    # Same day, later: nothing more, not even a history row.
    again = decay(store, first + timedelta(hours=6))
    assert again.counts["decayed"] == 0
    assert row(store, fading)["confidence"] == pytest.approx(expected, rel=1e-9)
    assert len(sql(store, "SELECT * FROM history WHERE event = 'DECAY'")) == 1

    # Decaying in several steps gives the confidence of one step over the whole time.
    decay(store, start + timedelta(days=13))
    final = start + timedelta(days=17)
    decay(store, final)
    total_days = (day_start(final) - created).total_seconds() / 86400
    assert row(store, fading)["confidence"] == pytest.approx(math.exp(-0.1 * total_days), rel=1e-9)

    # An access moves the reference: only the time since the access counts.
    before = row(store, fading)["confidence"]
    accessed = day_start(final) + timedelta(days=2)
    sql(store, "UPDATE memories SET last_accessed = ? WHERE id = ?", [accessed, fading])
    later = start + timedelta(days=21)
    decay(store, later)
    days = (day_start(later) - accessed).total_seconds() / 86400
    assert row(store, fading)["confidence"] == pytest.approx(before * math.exp(-0.1 * days))
    assert row(store, confirmed)["confidence"] == 1.0
    job_rows = sql(store, "SELECT meta FROM history WHERE event = 'DECAY' ORDER BY ts")
    assert [json.loads(r["meta"])["decayed"] for r in job_rows] == [1, 1, 1, 1]


def test_decay_below_threshold_soft_deletes_and_the_index_and_links_follow(
    store: Settings,
) -> None:
    fact = add(store, "The user's sister Priya lives in Toronto.")
    kept = add(store, "The user is allergic to peanuts.", decay_rate=0.0)
    publish(store)
    entity_ids = links(store, fact)
    assert entity_ids and fact in indexed(store)
    mentions = {
        r["id"]: r["mention_count"] for r in sql(store, "SELECT id, mention_count FROM entities")
    }

    now = NOW + timedelta(days=35)
    report = decay(store, now)

    assert report.counts["soft_deleted"] == 1
    gone = row(store, fact)
    assert gone["state"] == "soft_deleted"
    assert gone["valid_until"] == now
    assert gone["purge_at"] == now + timedelta(days=30)
    assert gone["confidence"] < 0.05
    assert links(store, fact) == set()
    for entity_id in entity_ids:
        remaining = sql(store, "SELECT mention_count FROM entities WHERE id = ?", [entity_id])
        assert remaining[0]["mention_count"] == mentions[entity_id] - 1
    assert fact not in indexed(store) and kept in indexed(store)
    event = history(store, fact)[-1]
    assert event["event"] == "DECAY" and event["actor"] == "maintenance"
    assert event["meta"]["confidence"] < 0.05 and sorted(event["meta"]["entity_ids"]) == sorted(
        entity_ids
    )
    assert changes(store, fact) == ["created", "soft_deleted"]

    # Re-running the same day changes nothing more.
    assert decay(store, now + timedelta(hours=1)).counts["soft_deleted"] == 0
    assert changes(store, fact) == ["created", "soft_deleted"]

    restore(store, fact, now=now + timedelta(hours=1))
    assert row(store, fact)["state"] == "active" and fact in indexed(store)
    assert changes(store, fact) == ["created", "soft_deleted", "restored"]
    # A restore is a use: links come back and the next night does not decay it away again.
    assert links(store, fact) == set(entity_ids)
    assert row(store, fact)["confidence"] == 1.0
    assert decay(store, now + timedelta(days=1)).counts["soft_deleted"] == 0
    assert row(store, fact)["state"] == "active"


# --------------------------------------------------------------------------- lifecycle


def test_ttl_after_60_days_then_purge_30_days_later(store: Settings) -> None:
    stale = add(store, "The user's sister Priya lives in Toronto.")
    important = add(store, "The user has type 1 diabetes.", importance=4)
    pinned = add(store, "The user likes green tea.")
    used = add(store, "The user plays chess on Sundays.")
    sql(store, "UPDATE memories SET pinned = true WHERE id = ?", [pinned])
    start = NOW
    sql(
        store,
        "UPDATE memories SET last_accessed = ? WHERE id = ?",
        [start + timedelta(days=50), used],
    )
    sql(
        store,
        "INSERT INTO relations (id, from_id, to_id, strength) VALUES ('rel_test', ?, ?, 0.8)",
        [stale, used],
    )
    publish(store)
    assert {stale, important, pinned, used} <= indexed(store)

    early = lifecycle(store, start + timedelta(days=59))
    assert early.counts["soft_deleted"] == 0

    ttl_time = start + timedelta(days=61)
    report = lifecycle(store, ttl_time)
    assert report.counts["soft_deleted"] == report.counts["expired"] == 1
    expired = row(store, stale)
    assert expired["state"] == "soft_deleted"
    assert expired["purge_at"] == ttl_time + timedelta(days=30)
    assert [row(store, i)["state"] for i in (important, pinned, used)] == ["active"] * 3
    assert stale not in indexed(store) and links(store, stale) == set()
    assert history(store, stale)[-1]["event"] == "TTL"
    assert changes(store, stale) == ["created", "soft_deleted"]

    rerun = lifecycle(store, ttl_time + timedelta(hours=2))
    assert rerun.counts["soft_deleted"] == rerun.counts["purged"] == 0
    assert changes(store, stale) == ["created", "soft_deleted"]

    not_yet = lifecycle(store, ttl_time + timedelta(days=29))
    assert not_yet.counts["purged"] == 0 and row(store, stale)["state"] == "soft_deleted"

    purged = lifecycle(store, ttl_time + timedelta(days=31))
    assert purged.counts["purged"] == 1
    assert sql(store, "SELECT id FROM memories WHERE id = ?", [stale]) == []
    assert sql(store, "SELECT id FROM relations WHERE 'rel_test' = id") == []
    assert [h["event"] for h in history(store, stale)] == ["ADD", "TTL", "PURGE"]
    assert changes(store, stale) == ["created", "soft_deleted", "deleted"]
    # accessed on day 50, so 42 days ago: still within its 60 days
    assert row(store, used)["state"] == "active"


def test_restore_of_a_ttl_soft_delete_survives_the_next_nights(store: Settings) -> None:
    """Issue 13 item 8: a restore is an access at the restore's time, so the next night's
    TTL and decay start from it instead of expiring the memory again."""
    fact = add(store, "The user went to Lisbon in May.")
    publish(store)
    expired_at = NOW + timedelta(days=61)
    lifecycle(store, expired_at)
    assert fact not in indexed(store)

    restore(store, fact, now=expired_at + timedelta(hours=8))

    restored = row(store, fact)
    assert restored["state"] == "active" and restored["purge_at"] is None
    assert restored["last_accessed"] == expired_at + timedelta(hours=8, microseconds=1)
    assert fact in indexed(store)
    assert [h["event"] for h in history(store, fact)] == ["ADD", "TTL", "RESTORE"]
    assert changes(store, fact) == ["created", "soft_deleted", "restored"]
    for night in (1, 2, 30):
        lifecycle(store, expired_at + timedelta(days=night))
        decay(store, expired_at + timedelta(days=night, minutes=30))
        assert row(store, fact)["state"] == "active", night


def test_eviction_keeps_a_conversation_within_max_entries(store: Settings) -> None:
    facts = [add(store, f"The user visited city number {n} last year.") for n in range(5)]
    sql(store, "UPDATE memories SET pinned = true WHERE id = ?", [facts[1]])
    summary = add(store, "Dana talked about travel.", kind="summary", decay_rate=0.0)
    other = add(store, "The user likes tea.", conversation_id="c2")
    config = MaintenanceConfig(max_entries=4)

    report = lifecycle(store, NOW, config=config)

    # 6 active in c1, 4 allowed: the two oldest evictable facts go (the pinned one is skipped).
    assert report.counts["evicted"] == 2
    states = {i: row(store, i)["state"] for i in [*facts, summary, other]}
    assert [states[i] for i in facts] == [
        "soft_deleted",
        "active",
        "soft_deleted",
        "active",
        "active",
    ]
    assert states[summary] == states[other] == "active"
    assert history(store, facts[0])[-1]["event"] == "EVICT"
    assert lifecycle(store, NOW, config=config).counts["evicted"] == 0


# --------------------------------------------------------------------------- dedup / merge


def test_merging_near_duplicates_keeps_one_fact_listing_both_sources(store: Settings) -> None:
    older = add(store, "The user adopted a cat named Miso.", source_ids=["ep_1"], importance=3)
    newer = add(store, "The user has a cat called Miso.", source_ids=["ep_2"])
    unrelated = add(store, "The user works as a nurse in Boston.", source_ids=["ep_3"])
    publish(store)
    now = NOW

    report = dedup_merge(store, now)

    assert report.counts["merged"] == 1
    survivor, loser = row(store, newer), row(store, older)
    assert survivor["state"] == "active" and loser["state"] == "soft_deleted"
    assert set(survivor["source_ids"]) == {"ep_1", "ep_2", older}
    assert survivor["importance"] == 3  # the merged fact keeps the higher importance
    assert loser["replaced_by"] == newer and loser["purge_at"] is None
    assert row(store, unrelated)["state"] == "active"
    active = sql(store, "SELECT id FROM facts WHERE content LIKE '%Miso%'")
    assert [r["id"] for r in active] == [newer]
    merge = history(store, newer)[-1]
    assert (merge["event"], merge["old_ref"], merge["new_ref"]) == ("MERGE", older, newer)
    assert history(store, older)[-1]["event"] == "MERGE"
    assert changes(store, newer) == ["created", "merged"]
    assert changes(store, older) == ["created"]
    assert older not in indexed(store) and newer in indexed(store)
    assert links(store, older) == set() and links(store, newer)

    # Same day again: the judged pairs are remembered, nothing is judged or merged twice.
    rerun = dedup_merge(store, now + timedelta(hours=1))
    assert rerun.counts["merged"] == 0 and rerun.counts["judged"] == 0


def test_a_fact_merged_twice_in_one_run_carries_every_source(
    store: Settings, openai_server: ScriptedOpenAIServer
) -> None:
    first = add(store, "The user adopted a cat named Miso.", source_ids=["ep_1"])
    second = add(store, "The user has a cat called Miso.", source_ids=["ep_2"])
    third = add(store, "The user has a cat named Miso.", source_ids=["ep_3"])
    # Three pairs in one batch, all the same fact: the newest absorbs both others in turn.
    openai_server.push(Reply.json([{"pair": i, "same": True} for i in range(3)]))

    report = dedup_merge(with_llm(store, openai_server), NOW)

    assert report.counts["merged"] == 2
    active = sql(store, "SELECT id, source_ids FROM facts")
    assert len(active) == 1 and active[0]["id"] == third
    assert {"ep_1", "ep_2", "ep_3"} <= set(active[0]["source_ids"])
    assert {row(store, i)["replaced_by"] for i in (first, second)} == {third}
    assert changes(store, third) == ["created", "merged", "merged"]


def test_merge_judged_by_the_llm_in_one_batch(
    store: Settings, openai_server: ScriptedOpenAIServer
) -> None:
    # The rules see two different facts here (cosine 0.85): the model says they are one.
    older = add(store, "The user prefers green tea over coffee.", source_ids=["ep_1"])
    newer = add(store, "The user likes green tea more than coffee.", source_ids=["ep_2"])
    settings = with_llm(store, openai_server)
    merged_text = "The user prefers green tea to coffee."
    openai_server.push(Reply.json([{"pair": 0, "same": True, "text": merged_text}]))

    report = dedup_merge(settings, NOW)

    assert report.counts["merged"] == 1 and report.counts["llm_batches"] == 1
    prompt = openai_server.chat_requests[0]["body"]["messages"][0]["content"]
    assert "prefers green tea over coffee." in prompt and "more than coffee." in prompt
    survivor = row(store, newer)
    assert survivor["content"] == merged_text
    assert set(survivor["source_ids"]) == {"ep_1", "ep_2", older}
    assert (
        history(store, newer)[-1]["meta"]["old_text"]
        == "The user likes green tea more than coffee."
    )
    search = sql(store, "SELECT text FROM search_documents WHERE id = ?", [newer])
    assert search[0]["text"] == merged_text


def test_a_failed_llm_batch_falls_back_to_the_rules(
    store: Settings, openai_server: ScriptedOpenAIServer
) -> None:
    older = add(store, "The user adopted a cat named Miso.")
    newer = add(store, "The user has a cat called Miso.")
    openai_server.push(Reply.status(400))

    report = dedup_merge(with_llm(store, openai_server), NOW)

    assert report.counts["llm_failures"] == 1 and report.counts["merged"] == 1
    assert row(store, older)["replaced_by"] == newer


def test_dedup_judges_at_most_the_daily_cap_per_scope(store: Settings) -> None:
    first = [
        add(store, "The user adopted a cat named Miso."),
        add(store, "The user has a cat called Miso."),
    ]
    second = [
        add(store, "The user adopted a dog named Rex."),
        add(store, "The user has a dog called Rex."),
    ]
    config = MaintenanceConfig(dedup_pairs_per_scope_per_day=1)
    now = NOW

    day_one = dedup_merge(store, now, config=config)
    assert (day_one.counts["judged"], day_one.counts["merged"], day_one.counts["capped"]) == (
        1,
        1,
        1,
    )
    same_day = dedup_merge(store, now + timedelta(hours=2), config=config)
    assert same_day.counts["judged"] == 0 and same_day.counts["done_today"] == 1
    next_day = dedup_merge(store, now + timedelta(days=1), config=config)
    assert next_day.counts["merged"] == 1
    states = [row(store, i)["state"] for i in [*first, *second]]
    assert states == ["soft_deleted", "active", "soft_deleted", "active"]
    fingerprints = sql(store, "SELECT fingerprint, verdict FROM merge_fingerprints")
    assert len(fingerprints) == 2 and all(
        f["fingerprint"].startswith("conversation:c1|") for f in fingerprints
    )


def test_prefilters_need_a_lexical_overlap_or_a_numeric_step() -> None:
    assert numeric_step("The user has 2 kids.", "The user has 3 kids.")
    assert not numeric_step("The user has 2 kids.", "The user has 2 kids.")
    assert not numeric_step("The user ran 5 km.", "The user has 3 kids.")
    assert (
        lexical_overlap("The user adopted a cat named Miso.", "The user has a cat called Miso.")
        >= 0.3
    )
    assert lexical_overlap("The user likes tea.", "The user plays chess.") == 0.0


# --------------------------------------------------------------------------- reflection


def test_weekly_reflection_needs_three_facts_and_runs_once_per_six_days(store: Settings) -> None:
    facts = [
        add(store, "The user started training for a marathon."),
        add(store, "The user runs 10 km every Tuesday."),
    ]
    now = NOW
    too_few = weekly_reflection(store, now)
    assert too_few.counts["created"] == 0 and "2 facts this week" in too_few.notes[0]

    facts.append(add(store, "The user bought new running shoes."))
    report = weekly_reflection(store, now + timedelta(minutes=1))
    assert report.counts["created"] == 1
    reflection = sql(store, "SELECT * FROM memories WHERE kind = 'reflection'")[0]
    assert reflection["tags"] == ["weekly"] and reflection["decay_rate"] == 0.0
    assert set(reflection["source_ids"]) == set(facts)
    assert json.loads(reflection["attributes"])["method"] == "extractive"
    assert "marathon" in reflection["content"]
    assert reflection["id"] in indexed(store)
    assert changes(store, reflection["id"]) == ["created"]

    assert weekly_reflection(store, now + timedelta(days=3)).counts["created"] == 0
    assert weekly_reflection(store, now + timedelta(days=6, minutes=2)).counts["created"] == 1


def test_reflection_by_the_llm_reads_the_weeks_facts_and_turns(
    store: Settings, openai_server: ScriptedOpenAIServer
) -> None:
    for text in ("The user moved to Lisbon.", "The user learns Portuguese.", "The user surfs."):
        add(store, text)
    add(store, "Obrigado! I finally found a flat.", kind="episode", speaker="Dana", decay_rate=0.0)
    openai_server.push(Reply.text("Dana settled into Lisbon this week: a flat, Portuguese, surf."))

    report = weekly_reflection(with_llm(store, openai_server), NOW)

    assert report.counts["created"] == 1
    prompt = openai_server.chat_requests[0]["body"]["messages"][0]["content"]
    assert "The user learns Portuguese." in prompt and "Dana: Obrigado!" in prompt
    reflection = sql(store, "SELECT content, attributes FROM memories WHERE kind = 'reflection'")[0]
    assert reflection["content"].startswith("Dana settled into Lisbon")
    assert json.loads(reflection["attributes"])["method"] == "llm"


# --------------------------------------------------------------------------- insights


def test_insights_without_an_llm_are_skipped_and_say_why(store: Settings) -> None:
    add(store, "The user apologised for being late again.")
    report = insights(store, NOW)
    assert report.skipped and "need an LLM" in report.notes[0]
    assert sql(store, "SELECT id FROM memories WHERE kind = 'insight'") == []


def test_insights_from_recent_activity_at_most_once_a_day(
    store: Settings, openai_server: ScriptedOpenAIServer
) -> None:
    add(store, "The user apologised for being late again.")
    add(store, "The user thanked the assistant for the honest feedback.")
    settings = with_llm(store, openai_server)
    too_long = "x" * 281
    openai_server.push(
        Reply.json(
            {
                "insights": [
                    {"summary": "The user values honest feedback.", "tags": ["trust"]},
                    {"summary": too_long, "tags": []},
                ]
            }
        )
    )
    now = NOW

    report = insights(settings, now)

    assert report.counts["created"] == 1
    insight = sql(store, "SELECT * FROM memories WHERE kind = 'insight'")[0]
    assert insight["content"] == "The user values honest feedback."
    assert (insight["category"], insight["importance"], insight["pinned"]) == (
        "relationship_dynamic",
        2,
        False,
    )
    assert insight["id"] in indexed(store)
    prompt = openai_server.chat_requests[0]["body"]
    assert prompt["max_tokens"] == 220 and prompt["temperature"] == 0.0
    assert "apologised for being late" in prompt["messages"][0]["content"]

    again = insights(settings, now + timedelta(hours=3))
    assert again.counts["created"] == 0 and len(openai_server.chat_requests) == 1


# --------------------------------------------------------------------------- others


def test_procedures_are_stored_and_left_out_of_default_retrieval(store: Settings) -> None:
    add(store, "The user deploys the blog on Fridays.")
    procedure = remember_procedure(
        store,
        ["Run the tests", "Build the site", "Deploy the blog with rsync"],
        title="Deploy the blog",
    )
    stored = row(store, procedure)
    assert stored["kind"] == "procedural" and stored["category"] == "procedural"
    assert stored["content"] == (
        "Deploy the blog:\n1. Run the tests\n2. Build the site\n3. Deploy the blog with rsync"
    )
    assert procedure in indexed(store)

    default = query_memory(
        MemoryQuery(agent="executor", query="deploy the blog", threshold=0.0), settings=store
    )
    assert procedure not in {r.id for r in default.results}
    asked = query_memory(
        MemoryQuery(
            agent="executor", query="deploy the blog", categories=["procedural"], threshold=0.0
        ),
        settings=store,
    )
    assert [r.id for r in asked.results] == [procedure]


def test_entity_enrichment_is_skipped_without_an_accurate_extractor(store: Settings) -> None:
    add(store, "The user met Ana at the conference.")
    report = entity_enrichment(store, NOW)
    assert report.skipped and "spaCy" in report.notes[0]
    assert sql(store, "SELECT id FROM memories WHERE attributes->>'enriched_at' IS NOT NULL") == []


def test_entity_enrichment_relinks_sparse_memories_up_to_the_nightly_limit(
    store: Settings,
) -> None:
    many = add(store, "Ana met Ben and Caro at the Lisbon office of Acme Corp.")
    older = add(store, "The user likes tea.")
    newer = add(store, "The user met Ana yesterday.")
    assert len(links(store, many)) > 2 and len(links(store, newer)) <= 2
    config = MaintenanceConfig(enrichment_limit=1)
    now = NOW

    def enriched() -> list[str]:
        rows = sql(
            store,
            "SELECT id, attributes->>'enriched_at' AS stamp FROM memories WHERE stamp IS NOT NULL",
        )
        assert all(r["stamp"] == now.isoformat() for r in rows)
        return sorted(r["id"] for r in rows)

    first = entity_enrichment(store, now, config=config, accurate_available=lambda: True)
    assert first.counts["examined"] == 1 and enriched() == [newer]  # newest first, 1 a night
    assert links(store, newer)  # linked again, not lost
    entity_enrichment(store, now, config=config, accurate_available=lambda: True)
    assert enriched() == sorted([newer, older])
    last = entity_enrichment(store, now, config=config, accurate_available=lambda: True)
    assert last.counts["examined"] == 0 and enriched() == sorted([newer, older])


def test_nightly_consolidation_takes_every_pending_session(settings: Settings) -> None:
    sync_files(settings)
    build_chunks(settings)

    report = consolidate_pending(settings, NOW)

    pending = sql(
        settings, "SELECT path FROM sessions_consolidations WHERE consolidated_at IS NULL"
    )
    assert pending == [] and report.counts["sessions_consolidated"] == 3
    facts = sql(settings, "SELECT id, content FROM facts")
    assert any("Miso" in f["content"] for f in facts)
    assert {f["id"] for f in facts} <= indexed(settings)
    assert consolidate_pending(settings, NOW).counts["created"] == 0
