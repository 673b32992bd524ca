"""Hostile workspaces: one bad file or line never stops the rest, nothing leaves the workspace.

Each of the causes that once failed a whole ingest (issue 14) is one case below, beside a good
note and a good transcript that must be ingested all the same; a property test then draws
many hostile workspaces (tests/hostile_inputs.py) and checks the rule on each.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from memory_dag.config import Settings
from memory_dag.index.search import search
from memory_dag.ingest.chunks import build_chunks
from memory_dag.ingest.files import sync_files
from memory_dag.ingest.limits import MAX_LINE_CHARS
from memory_dag.ingest.sources import discover_files, read_source
from memory_dag.pipeline import run_all
from memory_dag.store.connection import open_store
from tests.hostile_inputs import check_ingest, hostile_workspace

GOOD_NOTE = "The deploy pipeline runs on Fridays."
GOOD_TURN = "I adopted a cat named Miso."


def _alias_bomb(levels: int) -> str:
    names = "abcdefghi"
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        name, previous = names[level], names[level - 1]
        lines.append(f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines)


def _note(text: str) -> Callable[[Path], str]:
    def write(workspace: Path) -> str:
        (workspace / "memory").mkdir(exist_ok=True)
        (workspace / "memory" / "bad.md").write_text(text, encoding="utf-8")
        return "memory/bad.md"

    return write


def _transcript(*lines: str) -> Callable[[Path], str]:
    def write(workspace: Path) -> str:
        (workspace / "sessions").mkdir(exist_ok=True)
        (workspace / "sessions" / "bad.jsonl").write_text("\n".join(lines) + "\n")
        return "sessions/bad.jsonl"

    return write


def _symlink_loop(workspace: Path) -> str:
    (workspace / "memory").mkdir(exist_ok=True)
    os.symlink(workspace / "memory" / "b.md", workspace / "memory" / "a.md")
    os.symlink(workspace / "memory" / "a.md", workspace / "memory" / "b.md")
    return "memory/a.md"


def _deep_json(workspace: Path) -> str:
    deep = '{"role": "user", "content": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return _transcript(json.dumps({"role": "user", "content": "kept"}), deep)(workspace)


#: Causes that each made `memory-dag ingest` fail as a whole (issue 14), and the error they get.
CAUSES: dict[str, tuple[Callable[[Path], str], str]] = {
    "symlink loop": (_symlink_loop, "symlink loop"),
    "invalid date": (
        _note("---\nupdated: 2024-13-45\n---\nBody\n"),
        "'2024-13-45' is not a valid date; kept as text",
    ),
    "front matter 5,000 deep": (
        _note("---\na: " + "[" * 5000 + "]" * 5000 + "\n---\nBody\n"),
        "front matter nested deeper than 64 levels; ignored",
    ),
    "JSON line 100,000 deep": (_deep_json, "JSON nested deeper than 64 levels"),
    "id equal to another line's fallback id": (
        _transcript(
            json.dumps({"role": "user", "content": "first", "id": "bad:2"}),
            json.dumps({"role": "user", "content": "second"}),
        ),
        "duplicate turn id 'bad:2'; kept as 'bad:2~2'",
    ),
    "date at the start of the range": (
        _note("---\ncreated_at: 0001-01-01T00:00:00+05:00\n---\nBody\n"),
        "is not a time between 0001-01-02 and 9999-12-30; the note keeps no time",
    ),
    "date at the end of the range": (
        _note("---\ncreated_at: 9999-12-31T23:59:59-05:00\n---\nBody\n"),
        "is not a time between 0001-01-02 and 9999-12-30; the note keeps no time",
    ),
    "YAML alias bomb": (
        _note(f"---\n{_alias_bomb(9)}\n---\nBody\n"),
        "front matter expands to more than 10,000 values (YAML aliases); ignored",
    ),
    "YAML alias bomb one level less": (
        _note(f"---\n{_alias_bomb(8)}\n---\nBody\n"),
        "front matter expands to more than 10,000 values (YAML aliases); ignored",
    ),
    "YAML alias loop": (
        _note("---\nx: &a [*a]\n---\nBody\n"),
        "front matter contains itself (a YAML alias loop); ignored",
    ),
    "surrogate escape in a JSON line": (
        _transcript('{"role": "user", "content": "a \\ud800 b"}'),
        "JSON has an unpaired surrogate escape",
    ),
    "surrogate escape in front matter": (
        _note('---\ntitle: "a \\ud800"\n---\nBody\n'),
        "front matter has an unpaired surrogate escape",
    ),
}


@pytest.fixture
def good_workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    (workspace / "sessions").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text(GOOD_NOTE + "\n", encoding="utf-8")
    (workspace / "sessions" / "good.jsonl").write_text(
        json.dumps({"role": "user", "content": GOOD_TURN}) + "\n", encoding="utf-8"
    )
    return workspace


def _ingest(settings: Settings) -> dict[str, object]:
    """The two stages that used to fail, then what the store holds."""
    sync_files(settings)
    build_chunks(settings)
    with open_store(settings.db_path, read_only=True) as con:
        return {
            "chunks": {t for (t,) in con.execute("SELECT text FROM chunks").fetchall()},
            "errors": con.execute("SELECT path, line, reason FROM ingest_errors").fetchall(),
            "pending": con.execute(
                "SELECT count(*) FROM files WHERE chunked_hash IS DISTINCT FROM hash"
            ).fetchone()[0],
        }


@pytest.mark.parametrize("cause", list(CAUSES))
def test_one_bad_file_is_one_error_row_and_every_other_file_is_kept(
    cause: str, good_workspace: Path, tmp_path: Path
) -> None:
    build, reason = CAUSES[cause]
    bad_path = build(good_workspace)
    settings = Settings(workspace=good_workspace, db_path=tmp_path / "memory.duckdb")

    first = _ingest(settings)
    again = _ingest(settings)  # the same workspace: nothing fails, nothing is pending

    assert GOOD_NOTE in first["chunks"]
    assert f"User: {GOOD_TURN}" in first["chunks"]
    assert any(path == bad_path and reason in why for path, _, why in first["errors"]), first[
        "errors"
    ]
    assert again == first
    assert first["pending"] == 0


def test_the_alias_bomb_stores_no_expanded_value(good_workspace: Path, tmp_path: Path) -> None:
    _note(f"---\n{_alias_bomb(8)}\nid: kept-out\n---\nBody\n")(good_workspace)
    settings = Settings(workspace=good_workspace, db_path=tmp_path / "memory.duckdb")

    sync_files(settings)

    with open_store(settings.db_path, read_only=True) as con:
        [(front_matter, body)] = con.execute(
            "SELECT front_matter, body FROM notes WHERE path = 'memory/bad.md'"
        ).fetchall()
    assert front_matter is None
    assert body == "Body\n"


def test_yaml_keys_stay_as_written_and_a_repeated_key_is_reported(tmp_path: Path) -> None:
    _note("---\n1: one\n'1': other\ntrue: yes\n'True': no\n---\nBody\n")(tmp_path)

    [file] = discover_files(tmp_path)
    parsed = read_source(file)

    assert parsed.front_matter == {"1": "other", "true": True, "True": False}
    assert [(e.line, e.reason) for e in parsed.errors] == [
        (3, "key '1' is given twice; the last is kept")
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"role": "user", "content": null}', "no text in 'content' (null)"),
        ('{"role": "user", "content": ""}', "no text in 'content' (an empty string)"),
        (
            '{"role": "user", "content": [{"type": "image", "url": "x.png"}]}',
            "no text in 'content' (parts: image)",
        ),
        ('{"role": "user", "content": []}', "no text in 'content' (an empty list)"),
        ('{"role": "user", "content": 42}', "'content' must be a string or a list of parts"),
    ],
)
def test_a_message_without_text_has_an_error_row(
    line: str, reason: str, good_workspace: Path, tmp_path: Path
) -> None:
    _transcript(json.dumps({"role": "user", "content": "kept"}), line)(good_workspace)
    settings = Settings(workspace=good_workspace, db_path=tmp_path / "memory.duckdb")

    result = _ingest(settings)

    assert "User: kept" in result["chunks"]
    assert [(p, n) for p, n, why in result["errors"] if why.startswith(reason)] == [
        ("sessions/bad.jsonl", 2)
    ]


def test_an_overlong_line_is_left_out_and_reported(good_workspace: Path, tmp_path: Path) -> None:
    long_turn = json.dumps({"role": "user", "content": "x" * MAX_LINE_CHARS})
    _transcript(long_turn, json.dumps({"role": "user", "content": "kept"}))(good_workspace)
    settings = Settings(workspace=good_workspace, db_path=tmp_path / "memory.duckdb")

    result = _ingest(settings)

    assert "User: kept" in result["chunks"]
    [(path, line, reason)] = [e for e in result["errors"] if e[0] == "sessions/bad.jsonl"]
    assert (path, line) == ("sessions/bad.jsonl", 1)
    assert f"over the limit of {MAX_LINE_CHARS:,}" in reason


# --- symlinks ----------------------------------------------------------------------------------


def test_a_symlink_out_of_the_workspace_is_refused_not_read(
    good_workspace: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "outside" / "passwd"
    secret.parent.mkdir()
    secret.write_text("root:x:0:0:the secret outside\n", encoding="utf-8")
    (good_workspace / "memory").mkdir()
    os.symlink(secret, good_workspace / "memory" / "passwd.md")
    settings = Settings(workspace=good_workspace, db_path=tmp_path / "memory.duckdb")

    run_all(settings)

    with open_store(settings.db_path, read_only=True) as con:
        texts = " ".join(t for (t,) in con.execute("SELECT text FROM chunks").fetchall())
        errors = con.execute("SELECT path, reason FROM ingest_errors").fetchall()
    assert "secret" not in texts
    assert GOOD_NOTE in texts
    assert errors == [("memory/passwd.md", f"symlink to {secret}, outside the workspace; not read")]
    assert all("secret" not in hit.snippet for hit in search("root secret", settings=settings))


def test_a_named_extra_root_lets_its_links_in(good_workspace: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared-notes"
    shared.mkdir()
    (shared / "team.md").write_text("The team meets on Mondays.\n", encoding="utf-8")
    (good_workspace / "memory").mkdir()
    os.symlink(shared / "team.md", good_workspace / "memory" / "team.md")
    settings = Settings(
        workspace=good_workspace,
        db_path=tmp_path / "memory.duckdb",
        workspace_extra_roots=[shared],
    )

    result = _ingest(settings)

    assert "The team meets on Mondays." in result["chunks"]
    assert result["errors"] == []


def test_a_link_fixed_later_is_read_then(good_workspace: Path, tmp_path: Path) -> None:
    (good_workspace / "memory").mkdir()
    link = good_workspace / "memory" / "a.md"
    os.symlink(link, link)  # a loop
    settings = Settings(workspace=good_workspace, db_path=tmp_path / "memory.duckdb")
    assert [reason for _, _, reason in _ingest(settings)["errors"]] == ["symlink loop"]

    link.unlink()
    (good_workspace / "memory" / "target.md").write_text("Fixed target.\n", encoding="utf-8")
    os.symlink(good_workspace / "memory" / "target.md", link)
    result = _ingest(settings)

    assert "Fixed target." in result["chunks"]
    assert result["errors"] == []


# --- the rule, on generated workspaces ---------------------------------------------------------


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(files=hostile_workspace())
def test_ingest_never_raises_keeps_every_good_line_and_reports_every_bad_one(
    tmp_path_factory: pytest.TempPathFactory, files: list
) -> None:
    outcome = check_ingest(tmp_path_factory.mktemp("hostile"), files)

    assert outcome.problems == []
    assert (outcome.failures, outcome.good_lost, outcome.bad_unreported) == (0, 0, 0)


# --- the safety nets: a failure nobody foresaw costs one file, once ------------------------------


def _poison(real: Callable, path: str) -> Callable:
    """`real`, failing whenever its first argument (the file or files it works on) mentions
    `path`: a bug on one file's input."""

    def call(*args: object, **kwargs: object) -> object:
        if path in repr(args[0]):
            raise RuntimeError(f"unforeseen failure on {path}")
        return real(*args, **kwargs)

    return call


@pytest.mark.parametrize(
    ("module", "function", "reason"),
    [
        ("memory_dag.ingest.files", "_note_row", "could not be stored: RuntimeError"),
        ("memory_dag.ingest.chunks", "note_chunk_rows", "could not be chunked: RuntimeError"),
        ("memory_dag.ingest.files", "read_source", "could not be read: RuntimeError"),
    ],
)
def test_a_failure_on_one_file_is_one_error_row_and_not_repeated(
    module: str,
    function: str,
    reason: str,
    good_workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (good_workspace / "memory").mkdir()
    (good_workspace / "memory" / "poison.md").write_text("Anything at all.\n", encoding="utf-8")
    target = importlib.import_module(module)
    monkeypatch.setattr(target, function, _poison(getattr(target, function), "poison.md"))
    settings = Settings(workspace=good_workspace, db_path=tmp_path / "memory.duckdb")

    first = _ingest(settings)
    again = _ingest(settings)

    assert GOOD_NOTE in first["chunks"] and f"User: {GOOD_TURN}" in first["chunks"]
    [(path, line, why)] = first["errors"]
    assert (path, line) == ("memory/poison.md", None) and why.startswith(reason)
    assert again == first and first["pending"] == 0
