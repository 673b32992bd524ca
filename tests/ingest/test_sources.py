"""Discovery and reading of workspace files: what is ingested, and how bad input is recorded."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_dag.ingest.sources import (
    IngestError,
    ParsedFile,
    SourceFile,
    Turn,
    discover_files,
    hash_bytes,
    read_source,
    render_turn,
    transcript_users,
)
from tests.hostile_inputs import bad_turn, good_turn


def write(root: Path, rel_path: str, content: str | bytes) -> Path:
    path = root / rel_path
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def jsonl(*records: Any) -> str:
    """JSONL text; str records are written verbatim (for malformed lines)."""
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n"


def read(root: Path, rel_path: str) -> ParsedFile:
    """Read one workspace file through discovery, as the pipeline does."""
    files = {f.rel_path: f for f in discover_files(root)}
    return read_source(files[rel_path])


def reasons(parsed: ParsedFile) -> list[tuple[int | None, str]]:
    return [(e.line, e.reason) for e in parsed.errors]


# --- discovery -------------------------------------------------------------------------------


def test_discover_finds_each_kind_sorted_and_skips_hidden_deleted_and_other_files(
    tmp_path: Path,
) -> None:
    write(tmp_path, "MEMORY.md", "# Memory\n")
    write(tmp_path, "memory/projects/b.md", "b\n")
    write(tmp_path, "memory/a.md", "a\n")
    write(tmp_path, "memory/.draft.md", "hidden file\n")
    write(tmp_path, "memory/.obsidian/x.md", "hidden folder\n")
    write(tmp_path, "memory/notes.txt", "not markdown\n")
    write(tmp_path, "entries/c1/facts/f1.md", "fact\n")
    write(tmp_path, "entries/c1/turns/user/u1.md", "turn\n")
    write(tmp_path, "entries/c1/summaries/L1/s1.md", "summary\n")
    write(tmp_path, "entries/c1/deleted/facts/old.md", "deleted fact\n")
    write(tmp_path, "sessions/conv-1/s1.jsonl", "{}\n")
    write(tmp_path, "sessions/top.jsonl", "{}\n")
    write(tmp_path, "sessions/.tmp/partial.jsonl", "{}\n")
    write(tmp_path, "README.md", "not memory\n")

    files = discover_files(tmp_path)

    assert [(f.rel_path, f.source, f.kind) for f in files] == [
        ("MEMORY.md", "memory", "note"),
        ("entries/c1/facts/f1.md", "memory", "entry"),
        ("entries/c1/summaries/L1/s1.md", "memory", "entry"),
        ("entries/c1/turns/user/u1.md", "memory", "entry"),
        ("memory/a.md", "memory", "note"),
        ("memory/projects/b.md", "memory", "note"),
        ("sessions/conv-1/s1.jsonl", "sessions", "transcript"),
        ("sessions/top.jsonl", "sessions", "transcript"),
    ]
    assert all(f.path.is_absolute() and f.path == f.path.resolve() for f in files)


def test_discover_keeps_one_file_per_real_path(tmp_path: Path) -> None:
    write(tmp_path, "MEMORY.md", "# Memory\n")
    os.symlink(tmp_path / "MEMORY.md", tmp_path / "memory.md")  # same file, second name
    write(tmp_path, "memory/a.md", "a\n")
    os.symlink(tmp_path / "memory/a.md", tmp_path / "memory/z-link.md")

    files = discover_files(tmp_path)

    assert [f.rel_path for f in files] == ["MEMORY.md", "memory/a.md"]
    assert files[0].path == (tmp_path / "MEMORY.md").resolve()


def test_discover_missing_workspace_is_empty(tmp_path: Path) -> None:
    assert discover_files(tmp_path / "nope") == []


# --- transcripts -----------------------------------------------------------------------------


def test_transcript_accepts_both_line_shapes_and_keeps_ids_names_times(tmp_path: Path) -> None:
    write(
        tmp_path,
        "sessions/conv-26/s1.jsonl",
        jsonl(
            {"type": "session", "id": "s1", "started_at": "2026-11-01T19:00:00Z"},
            {
                "type": "message",
                "id": "m1",
                "created_at": "2026-11-01T19:00:00Z",
                "message": {
                    "role": "user",
                    "name": "Sam",
                    "content": [
                        {"type": "text", "text": "My wife is\n Anne."},
                        {"type": "image", "url": "x.png"},
                        {"type": "text", "text": "We live in   Lisbon."},
                    ],
                },
            },
            {"type": "tool", "name": "search", "input": {}},
            {"role": "system", "content": "You are a helpful assistant."},
            "",
            {"id": 7, "role": "assistant", "name": "Iris", "content": "Noted.", "created_at": 0},
            {"role": "USER", "content": "  I love pizza.  ", "created_at": "2026-11-01 20:30:00"},
            {"role": "assistant", "content": "Yum", "created_at": "2026-11-01T21:00:00+02:00"},
            {"role": "tool", "content": "tool output"},
            {"role": "assistant", "content": "   "},
        ),
    )

    parsed = read(tmp_path, "sessions/conv-26/s1.jsonl")

    # Headers, tool lines, system prompts and blank lines are not messages; an assistant
    # message without text is one, and says so.
    assert reasons(parsed) == [(10, "no text in 'content' (only whitespace)")]
    assert parsed.turns == [
        Turn(
            id="m1",
            session_id="s1",
            conversation_id="conv-26",
            role="user",
            speaker="Sam",
            content="My wife is Anne. We live in Lisbon.",
            event_time=datetime(2026, 11, 1, 19, 0, tzinfo=UTC),
            line=2,
        ),
        Turn(
            id="7",
            session_id="s1",
            conversation_id="conv-26",
            role="assistant",
            speaker="Iris",
            content="Noted.",
            event_time=datetime(1970, 1, 1, tzinfo=UTC),
            line=6,
        ),
        Turn(
            id="s1:7",
            session_id="s1",
            conversation_id="conv-26",
            role="user",
            speaker=None,
            content="I love pizza.",
            event_time=datetime(2026, 11, 1, 20, 30, tzinfo=UTC),
            line=7,
        ),
        Turn(
            id="s1:8",
            session_id="s1",
            conversation_id="conv-26",
            role="assistant",
            speaker=None,
            content="Yum",
            event_time=datetime(2026, 11, 1, 19, 0, tzinfo=UTC),
            line=8,
        ),
    ]
    assert all(t.event_time is None or t.event_time.tzinfo is UTC for t in parsed.turns)


def test_transcript_fields_beside_the_nested_message_are_used(tmp_path: Path) -> None:
    write(
        tmp_path,
        "sessions/s.jsonl",
        jsonl(
            {
                "type": "message",
                "name": "Sam",
                "role": "user",
                "content": "outer text is ignored when the message has content",
                "message": {"content": "inner text"},
            }
        ),
    )

    [turn] = read(tmp_path, "sessions/s.jsonl").turns

    assert (turn.role, turn.speaker, turn.content) == ("user", "Sam", "inner text")


def test_a_transcript_line_may_name_the_user_its_facts_belong_to(tmp_path: Path) -> None:
    write(
        tmp_path,
        "sessions/team/s.jsonl",
        jsonl(
            {"role": "user", "name": "Alice", "user_id": "u-alice", "content": "I love sushi"},
            {"type": "message", "message": {"role": "user", "content": "Me too", "user_id": 42}},
            {"role": "user", "content": "No user here", "user_id": "  "},
        ),
    )

    turns = read(tmp_path, "sessions/team/s.jsonl").turns

    assert [t.user_id for t in turns] == ["u-alice", "42", None]


@pytest.mark.parametrize(
    ("rel_path", "conversation_id"),
    [
        ("sessions/conv-26/s1.jsonl", "conv-26"),
        ("sessions/a/b/s1.jsonl", "a/b"),
        ("sessions/s1.jsonl", None),
    ],
)
def test_transcript_conversation_id_comes_from_folders(
    tmp_path: Path, rel_path: str, conversation_id: str | None
) -> None:
    write(tmp_path, rel_path, jsonl({"role": "user", "content": "hello"}))

    [turn] = read(tmp_path, rel_path).turns

    assert turn.conversation_id == conversation_id
    assert turn.session_id == "s1"


def test_malformed_lines_are_recorded_and_the_rest_is_ingested(tmp_path: Path) -> None:
    write(
        tmp_path,
        "sessions/s.jsonl",
        jsonl(
            {"role": "user", "content": "first"},
            '{"role": "user", "content": "broken',
            '["a", "list"]',
            {"content": "no role"},
            {"role": "assistant"},
            {"role": "user", "content": 42},
            {"role": "user", "content": "last", "created_at": "next tuesday"},
        ),
    )

    parsed = read(tmp_path, "sessions/s.jsonl")

    assert [(t.line, t.content, t.event_time) for t in parsed.turns] == [
        (1, "first", None),
        (7, "last", None),
    ]
    lines = [e.line for e in parsed.errors]
    assert lines == [2, 3, 4, 5, 6, 7]
    assert all(e.path == "sessions/s.jsonl" for e in parsed.errors)
    by_line = {e.line: e.reason for e in parsed.errors}
    assert by_line[2].startswith("invalid JSON")
    assert "not an object" in by_line[3]
    assert by_line[4] == "missing 'role'"
    assert by_line[5] == "missing 'content'"
    assert "'content' must be a string or a list" in by_line[6]
    assert "created_at" in by_line[7] and "kept" in by_line[7]


# --- Markdown --------------------------------------------------------------------------------


def test_front_matter_is_parsed_and_body_starts_after_it(tmp_path: Path) -> None:
    write(tmp_path, "memory/n.md", "---\ntitle: Trip\ntags: [a, b]\n---\n# Trip\nLisbon\n")

    parsed = read(tmp_path, "memory/n.md")

    assert parsed.errors == []
    assert parsed.front_matter == {"title": "Trip", "tags": ["a", "b"]}
    assert parsed.body_start_line == 5
    assert parsed.body == "# Trip\nLisbon\n"


def test_invalid_yaml_front_matter_is_recorded_and_body_kept(tmp_path: Path) -> None:
    write(tmp_path, "memory/n.md", "---\ntitle: ok\nbad: [unclosed\n---\nBody line\n")

    parsed = read(tmp_path, "memory/n.md")

    assert parsed.front_matter == {}
    assert parsed.body_start_line == 5
    assert parsed.body.startswith("Body line")
    [error] = parsed.errors
    assert error.path == "memory/n.md"
    assert error.reason.startswith("invalid YAML front matter")
    assert error.line is not None and 2 <= error.line <= 4


def test_front_matter_that_is_not_a_mapping_is_recorded(tmp_path: Path) -> None:
    write(tmp_path, "memory/n.md", "---\n- just\n- a list\n---\nBody\n")

    parsed = read(tmp_path, "memory/n.md")

    assert parsed.front_matter == {}
    assert parsed.body == "Body\n"
    assert reasons(parsed) == [(1, "front matter is a list, not a mapping")]


def test_crlf_line_endings_do_not_break_front_matter(tmp_path: Path) -> None:
    write(tmp_path, "memory/n.md", b"---\r\nid: x\r\n---\r\nBody\r\n")

    parsed = read(tmp_path, "memory/n.md")

    assert (parsed.front_matter, parsed.body_start_line, parsed.body) == ({"id": "x"}, 4, "Body\n")


def test_entry_conversation_id_comes_from_folder_unless_given(tmp_path: Path) -> None:
    write(
        tmp_path,
        "entries/conv-9/facts/f1.md",
        "---\nid: f1\nrole: memory\ncreated_at: 2026-11-01T09:00:00Z\n---\nSam's wife is Anne.\n",
    )
    write(tmp_path, "entries/conv-9/facts/f2.md", "---\nid: f2\nconversation_id: other\n---\nx\n")

    first = read(tmp_path, "entries/conv-9/facts/f1.md")
    second = read(tmp_path, "entries/conv-9/facts/f2.md")

    assert first.front_matter == {
        "id": "f1",
        "role": "memory",
        "created_at": datetime(2026, 11, 1, 9, 0, tzinfo=UTC),
        "conversation_id": "conv-9",
    }
    assert second.front_matter["conversation_id"] == "other"


# --- unreadable content ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty file"),
        (b"  \n\n\t\n", "empty file"),
        (b"# Notes\x00\x01\x02", "binary file"),
        (b"\xff\xfeh\x00i\x00\x00\xd8", "not valid utf-16 at byte 6"),
    ],
)
def test_bad_files_are_recorded_not_raised(tmp_path: Path, content: bytes, reason: str) -> None:
    write(tmp_path, "memory/bad.md", content)

    parsed = read(tmp_path, "memory/bad.md")

    assert parsed.errors == [IngestError("memory/bad.md", None, reason)]
    assert parsed.turns == []
    assert parsed.size == len(content)
    assert parsed.hash == hashlib.sha256(content).hexdigest()
    if reason != "empty file":
        assert parsed.text is None


def test_a_line_that_is_not_utf8_is_left_out_and_the_others_are_kept(tmp_path: Path) -> None:
    write(tmp_path, "memory/n.md", b"caf\xc3\xa9 ok\nthen \xff bad\r\nlast line\n")
    write(
        tmp_path,
        "sessions/s.jsonl",
        b'{"role": "user", "content": "good"}\n{"role": "user", "content": "bad \xff"}\n'
        b'{"role": "user", "content": "good again"}\n',
    )

    note = read(tmp_path, "memory/n.md")
    transcript = read(tmp_path, "sessions/s.jsonl")

    assert note.body == "caf\u00e9 ok\n\nlast line\n"  # line 2 left out, line numbers kept
    assert reasons(note) == [(2, "not valid UTF-8 at byte 5 of the line; line left out")]
    assert [(t.line, t.content) for t in transcript.turns] == [(1, "good"), (3, "good again")]
    assert reasons(transcript) == [(2, "not valid UTF-8 at byte 33 of the line; line left out")]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_text_is_read(tmp_path: Path, encoding: str) -> None:
    text = "# Caf\u00e9\nSam lives in Lisbon.\n"
    write(tmp_path, "memory/n.md", text.encode(encoding))

    parsed = read(tmp_path, "memory/n.md")

    assert (parsed.errors, parsed.body) == ([], text)


def test_vanished_file_is_recorded_not_raised(tmp_path: Path) -> None:
    file = SourceFile(tmp_path / "gone.md", "memory/gone.md", "memory", "note")

    parsed = read_source(file)

    assert parsed.text is None
    [error] = parsed.errors
    assert (error.path, error.line) == ("memory/gone.md", None)
    assert error.reason.startswith("cannot read file")


def test_hash_and_size_fingerprint_the_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "MEMORY.md", "Sam lives in Lisbon.\n")

    parsed = read(tmp_path, "MEMORY.md")

    assert parsed.hash == hash_bytes(path.read_bytes())
    assert parsed.hash != hash_bytes(b"Sam lives in Berlin.\n")
    assert (parsed.size, parsed.mtime) == (21, path.stat().st_mtime)


def test_render_turn_prefers_speaker_name_over_role() -> None:
    turn = Turn("t1", "s1", None, "user", "Sam", "I love pizza.", None, 1)

    assert render_turn(turn) == "Sam: I love pizza."
    assert render_turn(Turn("t2", "s1", None, "assistant", None, "Noted.", None, 2)) == (
        "Assistant: Noted."
    )


def test_sample_workspace_records_exactly_one_error() -> None:
    """The shipped sample data must ingest cleanly apart from its one deliberate bad line."""
    workspace = Path(__file__).resolve().parents[2] / "data" / "workspace"
    parsed = [read_source(f) for f in discover_files(workspace)]

    errors = [e for p in parsed for e in p.errors]
    assert [(e.path, e.line) for e in errors] == [("sessions/scratch.jsonl", 3)]
    turns = {p.file.rel_path: len(p.turns) for p in parsed if p.file.kind == "transcript"}
    assert turns == {
        "sessions/demo/2026-11-01.jsonl": 20,
        "sessions/demo/2026-11-08.jsonl": 20,
        "sessions/scratch.jsonl": 3,
    }


_USER_IDS = st.sampled_from(["sam", " ana ", "", "   ", 7, 0, True, 1.5, None, ["sam"], {"a": 1}])


@st.composite
def _line_with_user(draw: st.DrawFn) -> bytes:
    """A transcript line (good, bad or skipped), with a `user_id` of any type where it is an
    object, beside or inside a nested message."""
    raw = draw(
        st.one_of(
            good_turn("s").map(lambda line: line.raw),
            bad_turn().map(lambda line: line.raw),
            st.sampled_from([b'{"role": "system", "content": "x"}', b'{"type": "tool"}', b" "]),
        )
    )
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    if not isinstance(record, dict) or not draw(st.integers(0, 3)):
        return raw
    record["user_id"] = draw(_USER_IDS)
    if draw(st.booleans()):  # the nested form; its own user_id wins
        record = {"type": draw(st.sampled_from(["message", "note"])), "message": record}
        if draw(st.booleans()):
            record["user_id"] = draw(_USER_IDS)
    return json.dumps(record).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_line_with_user(), min_size=1, max_size=8))
def test_transcript_users_are_the_users_of_the_turns_read_source_keeps(
    lines: list[bytes], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Routing finds a conversation's users with `transcript_users`; it must agree with the
    turns the ingest keeps, line by line, whatever a line holds."""
    root = tmp_path_factory.mktemp("users")
    write(root, "sessions/c1/s1.jsonl", b"\n".join(lines))
    (file,) = discover_files(root)

    expected = {turn.user_id for turn in read_source(file).turns if turn.user_id}
    assert transcript_users(file) == expected


def test_transcript_users_of_a_file_that_cannot_be_read_are_none(tmp_path: Path) -> None:
    path = write(
        tmp_path, "sessions/c1/s1.jsonl", '{"role": "user", "content": "hi", "user_id": "sam"}'
    )
    (file,) = discover_files(tmp_path)
    assert transcript_users(file) == {"sam"}

    path.unlink()
    path.mkdir()  # no longer a regular file
    assert transcript_users(file) == set()
    assert read_source(file).turns == []
