"""`memory-dag eval locomo`: the LoCoMo reader, the distinct-turn ranking, and recall@k checked
against a hand computation over the same searches."""

from __future__ import annotations

import json
import os
import statistics
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memory_dag.cli.main import main
from memory_dag.config import ENV_PREFIX, Settings
from memory_dag.eval.locomo import (
    CATEGORIES,
    evaluate_locomo,
    parse_locomo_date,
    questions,
    ranked_turns,
    write_workspace,
)
from memory_dag.index.search import Searcher, SearchFilters

KS = [1, 2, 5]
CONVERSATION = "locomo-conv-7"  # conversation_id() of conv-7.json

SESSION_1 = [
    ("Caroline", "D1:1", "Hey Mel! I went to a pottery workshop yesterday and made a bowl."),
    ("Melanie", "D1:2", "That sounds fun! I spent the weekend hiking near the glacier."),
    ("Caroline", "D1:3", "My adoption agency interview is scheduled for next Tuesday."),
    ("Melanie", "D1:4", "Good luck with the interview, I am sure it goes well."),
    ("Caroline", "D1:5", "Thanks! I also started learning the violin this spring."),
]
SESSION_2 = [
    ("Melanie", "D2:1", "The adoption agency approved Caroline's application last week!"),
    ("Caroline", "D2:2", "Yes! I also painted a mural of sunflowers in the kitchen."),
    ("Melanie", "D2:3", "Look what I saw on my evening walk."),
    ("Caroline", "D2:4", "Beautiful. My violin teacher says I am improving quickly."),
]
PHOTO = {
    "img_url": ["https://example.org/photo.jpg"],
    "blip_caption": "a photo of a lighthouse at sunset",
    "query": "lighthouse sunset",
}
QA: list[dict[str, Any]] = [
    {
        "question": "What did Caroline make at the pottery workshop?",
        "answer": "a bowl",
        "evidence": ["D1:1"],
        "category": 4,
    },
    {
        "question": "How did Caroline's adoption process go from interview to approval?",
        "answer": "interviewed, then approved",
        "evidence": ["D1:3; D2:1"],
        "category": 1,
    },
    {
        "question": "When did Caroline start learning the violin?",
        "answer": "spring 2023",
        "evidence": ["D1:5"],
        "category": 2,
    },
    {
        "question": "What did Melanie see on her evening walk, a lighthouse?",
        "answer": "a lighthouse at sunset",
        "evidence": ["D2:3"],
        "category": 3,
    },
    {
        "question": "What did Melanie paint in the kitchen?",
        "adversarial_answer": "sunflowers",
        "evidence": ["D2:2"],
        "category": 5,
    },
    {"question": "What is Caroline's favourite colour?", "answer": "?", "category": 4},
]


def locomo_record() -> dict[str, Any]:
    def turns(rows: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
        return [{"speaker": s, "dia_id": d, "text": t} for s, d, t in rows]

    session_2 = turns(SESSION_2)
    session_2[2].update(PHOTO)
    return {
        "sample_id": "conv-7",
        "conversation": {
            "speaker_a": "Caroline",
            "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": turns(SESSION_1),
            "session_2_date_time": "7:05 am on 19 June, 2023",
            "session_2": session_2,
        },
        "qa": QA,
    }


@pytest.fixture(autouse=True)
def no_memory_dag_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


@pytest.fixture
def locomo_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "locomo"
    folder.mkdir()
    (folder / "conv-7.json").write_text(json.dumps(locomo_record()), encoding="utf-8")
    return folder


# --- reading the data (fast) ---------------------------------------------------------------


def test_parse_locomo_date() -> None:
    assert parse_locomo_date("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert parse_locomo_date("yesterday evening") is None
    assert parse_locomo_date("10:04 am on 2 Jun, 2023") == datetime(2023, 6, 2, 10, 4, tzinfo=UTC)
    assert parse_locomo_date("") is None
    assert parse_locomo_date(None) is None


def test_write_workspace_turns_sessions_into_transcripts(locomo_dir: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    counts = write_workspace(sorted(locomo_dir.glob("*.json")), workspace)
    assert counts == {"conversations": 1, "sessions": 2, "turns": 9}
    folder = workspace / "sessions" / CONVERSATION
    assert sorted(p.name for p in folder.iterdir()) == ["session_1.jsonl", "session_2.jsonl"]
    first = [json.loads(line) for line in (folder / "session_1.jsonl").read_text().splitlines()]
    assert first[0] == {
        "role": "user",
        "name": "Caroline",
        "id": "D1:1",
        "content": SESSION_1[0][2],
        "created_at": "2023-05-08T13:56:00+00:00",
    }
    assert [r["id"] for r in first] == [d for _, d, _ in SESSION_1]
    second = [json.loads(line) for line in (folder / "session_2.jsonl").read_text().splitlines()]
    assert second[0]["created_at"] == "2023-06-19T07:05:00+00:00"
    # A shared photo is kept as its caption and search words, as alt text would carry it.
    assert second[2]["content"] == (
        "Look what I saw on my evening walk. [shares a photo of a lighthouse at sunset] "
        "[lighthouse sunset]"
    )


def test_questions_skip_category_5_and_normalise_evidence(locomo_dir: Path) -> None:
    asked = list(questions(sorted(locomo_dir.glob("*.json"))))
    assert [(c, item["category"], evidence) for c, item, evidence in asked] == [
        (CONVERSATION, 4, ["D1:1"]),
        (CONVERSATION, 1, ["D1:3", "D2:1"]),  # "D1:3; D2:1" holds two turns
        (CONVERSATION, 2, ["D1:5"]),
        (CONVERSATION, 3, ["D2:3"]),
    ]  # category 5 (adversarial) and the question without evidence are not asked


# --- ranking: the first k distinct turns ---------------------------------------------------


def hit(*turn_ids: str) -> SimpleNamespace:
    return SimpleNamespace(turn_ids=list(turn_ids))


def test_ranked_turns_a_hit_uses_one_slot_per_turn() -> None:
    hits = [hit("D1:1", "D1:2", "D1:3"), hit("D1:2", "D1:4"), hit(), hit("D2:1")]
    assert ranked_turns(hits, 1) == ["D1:1"]
    assert ranked_turns(hits, 3) == ["D1:1", "D1:2", "D1:3"]  # the first hit fills k = 3
    assert ranked_turns(hits, 4) == ["D1:1", "D1:2", "D1:3", "D1:4"]  # D1:2 is not counted twice
    assert ranked_turns(hits, 10) == ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1"]
    assert ranked_turns([], 5) == []
    # So evidence in the third turn of the top hit is found at k = 3, not at k = 1.
    evidence = {"D1:3"}
    assert [len(set(ranked_turns(hits, k)) & evidence) for k in (1, 2, 3)] == [0, 0, 1]


# --- the evaluation, against a hand computation ----------------------------------------------


def recall_at(turns: list[str], evidence: list[str]) -> dict[int, float]:
    return {k: len(set(turns[:k]) & set(evidence)) / len(evidence) for k in KS}


def hand_computed(settings: Settings, store: Path, files: list[Path]) -> list[dict[str, Any]]:
    """Per question: recall@k by its definition (the first k *distinct turns* of the ranked
    hits), from the same searches over the kept store; and, to show the data tells them apart,
    two wrong definitions (k hits with all their turns; k turn slots counting repeats)."""
    searcher = Searcher(
        settings.model_copy(
            update={
                "workspace": store / "workspace",
                "db_path": store / "memory.duckdb",
                "index_dir": store / "index",
            }
        )
    )
    rows = []
    for conversation, item, evidence in questions(files):
        hits = searcher.search(
            item["question"],
            k=max(KS),
            filters=SearchFilters(conversation=conversation),
            min_score=0.0,
        )
        assert {h.conversation_id for h in hits} == {conversation}
        slots = [turn for one in hits for turn in one.turn_ids]
        distinct = list(dict.fromkeys(slots))
        by_hit = {
            k: len({t for one in hits[:k] for t in one.turn_ids} & set(evidence)) / len(evidence)
            for k in KS
        }
        rows.append(
            {
                "category": item["category"],
                "recall": recall_at(distinct, evidence),
                "by_hit": by_hit,
                "with_repeats": recall_at(slots, evidence),
                "turns_per_hit": max(len(one.turn_ids) for one in hits),
            }
        )
    return rows


def mean_recall(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {f"recall@{k}": round(statistics.fmean(r["recall"][k] for r in rows), 4) for k in KS}


@pytest.mark.parametrize("turns_per_chunk", [1, 3], ids=["turn-chunks", "3-turn-chunks"])
def test_evaluate_locomo_recall_is_the_hand_computed_recall(
    locomo_dir: Path, tmp_path: Path, turns_per_chunk: int
) -> None:
    settings = Settings(session_chunk_turns=turns_per_chunk)
    store = tmp_path / "store"
    report = evaluate_locomo(locomo_dir, ks=KS, store_dir=store, settings=settings)

    assert report["questions"] == 4  # category 5 and the evidence-less question excluded
    assert set(report["overall"]) == {"recall@1", "recall@2", "recall@5"}
    assert set(report["by_category"]) == set(CATEGORIES.values())
    assert report["corpus"] == {"conversations": 1, "sessions": 2, "turns": 9}
    assert report["by_conversation"][CONVERSATION]["questions"] == 4
    assert isinstance(report["ingest_seconds"], float) and report["ingest_seconds"] >= 0
    assert report["query_ms_p50"] > 0

    rows = hand_computed(settings, store, sorted(locomo_dir.glob("*.json")))
    assert report["overall"] == mean_recall(rows)
    assert report["by_category"] == {
        name: {**mean_recall([r for r in rows if r["category"] == number]), "questions": 1}
        for number, name in CATEGORIES.items()
    }
    assert report["by_conversation"][CONVERSATION] == {**mean_recall(rows), "questions": 4}

    if turns_per_chunk == 1:
        assert {r["turns_per_hit"] for r in rows} == {1}
        # Exact words find their turn first; the photo turn is found by its caption alone.
        recall_at_1 = {r["category"]: r["recall"][1] for r in rows}
        assert recall_at_1[4] == 1.0  # "pottery workshop"
        assert recall_at_1[3] == 1.0  # "lighthouse" is only in the photo's caption
    else:
        # Overlapping 3-turn hits: the distinct-turn definition gives other numbers than
        # counting hits or counting repeated turns, so the equality above pins it down.
        assert {r["turns_per_hit"] for r in rows} == {3}
        assert any(r["recall"] != r["by_hit"] for r in rows)
        assert any(r["recall"] != r["with_repeats"] for r in rows)


def test_a_reused_store_evaluates_like_a_fresh_one(locomo_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    evaluate_locomo(locomo_dir, ks=KS, store_dir=store)
    # The data changes: session 2 (the photo, the approval) is gone.
    record = locomo_record()
    del record["conversation"]["session_2"], record["conversation"]["session_2_date_time"]
    (locomo_dir / "conv-7.json").write_text(json.dumps(record), encoding="utf-8")

    fresh = evaluate_locomo(locomo_dir, ks=KS, store_dir=tmp_path / "fresh")
    assert fresh["corpus"] == {"conversations": 1, "sessions": 1, "turns": 5}
    assert fresh["by_category"]["open-domain"]["recall@5"] == 0.0  # its evidence is gone
    reused = evaluate_locomo(locomo_dir, ks=KS, store_dir=store)
    assert reused["corpus"] == fresh["corpus"]
    assert reused["overall"] == fresh["overall"]
    assert reused["by_category"] == fresh["by_category"]


def test_cli_eval_locomo_prints_the_report(
    locomo_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "locomo", str(locomo_dir), "--k", "1,2,5", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    report = evaluate_locomo(locomo_dir, ks=KS)
    timings = {"ingest_seconds", "query_ms_p50", "query_ms_p95"}
    assert set(printed) == set(report)
    assert {k: v for k, v in printed.items() if k not in timings} == {
        k: v for k, v in report.items() if k not in timings
    }
    assert printed["questions"] == 4
