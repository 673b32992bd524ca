"""Hostile workspaces for the ingest property test and `benchmarks/hostile.py`.

A hypothesis strategy draws workspaces of notes, entries and transcripts in which good lines
sit beside hostile ones (broken or deep JSON, alias bombs, impossible dates, bad bytes, UTF-16,
symlink loops and links out of the workspace, ...). `check_ingest` writes one, runs the whole
ingest twice and counts what the rule forbids: an ingest that raises, a good line that is not
in the store, a bad line or file without an `ingest_errors` row. `sql_escapes` lists what a
user at `memory-dag sql` tries in order to reach files.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from memory_dag.config import Settings
from memory_dag.ingest.limits import MAX_LINE_CHARS, MAX_NESTING_DEPTH
from memory_dag.pipeline import run_all
from memory_dag.store.connection import open_store

# --- what a workspace is made of ---------------------------------------------------------------


@dataclass
class Line:
    """One line of a file: its bytes, and what the store must show for it."""

    raw: bytes
    good: bool  # must be in the store (a turn, or a line of a note's body)
    bad: bool  # must have an error row at its line
    text: str = ""  # the turn's content or the note line, for good lines


@dataclass
class FileSpec:
    """A file to write: `lines` (a head of front matter lines may come first), or a link."""

    rel_path: str
    kind: str  # "transcript", "note", "binary", "loop", "outside", "broken-link", "bad-name"
    lines: list[Line] = field(default_factory=list)
    head: list[bytes] = field(default_factory=list)  # front matter lines, "---" included
    bad_head: bool = False  # the front matter must have an error row
    encoding: str = "utf-8"

    @property
    def bad_file(self) -> bool:
        return self.kind in ("binary", "loop", "outside", "broken-link", "bad-name")

    @property
    def error_path(self) -> str:
        if self.kind == "bad-name":
            return self.rel_path.replace("\udcff", "\ufffd")
        return self.rel_path


_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")),
    min_size=1,
    max_size=60,
).filter(lambda text: text.strip() and text.strip() != "---")


def _json(value: object, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8")


@st.composite
def good_turn(draw: st.DrawFn, stem: str) -> Line:
    text = draw(_TEXT)
    record: dict[str, object] = {"role": draw(st.sampled_from(["user", "assistant", "USER"]))}
    if draw(st.booleans()):
        record["content"] = text
    else:
        record["content"] = [{"type": "text", "text": text}, {"type": "image", "url": "x.png"}]
    turn_id = draw(st.sampled_from([None, None, "a", "b", f"{stem}:2", f"{stem}:3", ""]))
    if turn_id is not None:
        record["id"] = turn_id
    if draw(st.booleans()):
        record["name"] = draw(_TEXT)
    record["created_at"] = draw(
        st.sampled_from(
            [
                "2026-11-01T10:00:00Z",
                "0001-01-01T00:00:00+05:00",  # kept without a time, with an error row
                "9999-12-31T23:59:59-05:00",
                "2024-13-45",
                1e30,
                0,
                None,
            ]
        )
    )
    return Line(
        _json(record, draw(st.booleans())), good=True, bad=False, text=" ".join(text.split())
    )


def _deep(depth: int) -> bytes:
    return b'{"role": "user", "content": "deep", "x": ' + b"[" * depth + b"]" * depth + b"}"


@st.composite
def bad_turn(draw: st.DrawFn) -> Line:
    text = draw(_TEXT)
    choice = draw(st.integers(0, 16))
    raw = [
        lambda: b'{"role": "user", "content": "broken',
        lambda: draw(st.sampled_from([b"[1, 2]", b'"text"', b"42", b"null", b"true"])),
        lambda: _deep(draw(st.integers(MAX_NESTING_DEPTH + 1, 200_000))),
        lambda: _json({"content": text}, True),
        lambda: _json({"role": "user"}, True),
        lambda: _json({"role": 5, "content": text}, True),
        lambda: _json(
            {"role": "user", "content": draw(st.sampled_from([42, {"a": 1}, 1.5]))}, True
        ),
        lambda: _json({"role": "user", "content": None}, True),
        lambda: _json({"role": "assistant", "content": draw(st.sampled_from(["", "   "]))}, True),
        lambda: _json({"role": "user", "content": [{"type": "image", "url": "x"}]}, True),
        lambda: _json({"role": "user", "content": []}, True),
        lambda: _json({"role": "user", "content": [{"type": "text"}, {"text": 1}]}, True),
        lambda: _json({"role": "user", "content": text}, False).replace(
            b'"content"', b'"cont\xffent"'
        ),
        lambda: b'{"role": "user", "content": "a\\ud800b"}',
        lambda: b'{"role": "user", "content": "x", "name": "\\udfff"}',
        lambda: _json({"role": "user", "content": "x" * (MAX_LINE_CHARS + 1)}, True),
        lambda: b"\xc3\x28 not utf-8",
    ][choice]()
    return Line(raw, good=False, bad=True)


_IGNORED_TURNS = [
    b'{"type": "session", "id": "s1"}',
    b'{"role": "system", "content": "You are helpful."}',
    b'{"type": "tool", "name": "search"}',
    b"",
    b"   ",
]


@st.composite
def transcript(draw: st.DrawFn, rel_path: str) -> FileSpec:
    stem = Path(rel_path).stem
    lines: list[Line] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["good", "good", "bad", "ignored"]))
        if kind == "good":
            lines.append(draw(good_turn(stem)))
        elif kind == "bad":
            lines.append(draw(bad_turn()))
        else:
            lines.append(Line(draw(st.sampled_from(_IGNORED_TURNS)), good=False, bad=False))
    return FileSpec(rel_path, "transcript", lines)


def _alias_bomb(levels: int) -> list[bytes]:
    names = "abcdefghijkl"
    lines = [b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        name, previous = names[level], names[level - 1]
        lines.append(f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]".encode())
    return lines


@st.composite
def front_matter(draw: st.DrawFn) -> tuple[list[bytes], bool]:
    """(YAML lines between the `---` lines, whether they must yield an error row)."""
    good = [
        [b"title: Trip", b"tags: [a, b]"],
        [b"id: f1", b"role: memory", b"created_at: 2026-11-01T09:00:00Z"],
        [b"created_at: 2026-11-01", b"conversation_id: conv-1"],
        [],
    ]
    depth = draw(st.integers(MAX_NESTING_DEPTH + 1, 5000))
    bad = [
        _alias_bomb(draw(st.integers(5, 10))),
        [b"x: &a [*a]"],
        [b"a: " + b"[" * depth + b"]" * depth],
        [b"updated: 2024-13-45"],
        [b"1: one", b"'1': other"],
        [
            b"created_at: "
            + draw(
                st.sampled_from(
                    [b"0001-01-01T00:00:00+05:00", b"9999-12-31T23:59:59-05:00", b"not a date"]
                )
            )
        ],
        [b"x: '" + b"y" * 70_000 + b"'"],
        [b"bad: [unclosed"],
        [b"- just", b"- a list"],
        [b'x: "a\\ud800"'],
        [b"conversation_id: " + draw(st.sampled_from([b"../../escaped", b"/abs/path", b"a//b"]))],
        [b"? [1, 2]", b": complex key"],
    ]
    if draw(st.booleans()):
        return draw(st.sampled_from(good)), False
    return draw(st.sampled_from(bad)), True


@st.composite
def note(draw: st.DrawFn, rel_path: str) -> FileSpec:
    head: list[bytes] = []
    bad_head = False
    if draw(st.booleans()):
        yaml_lines, bad_head = draw(front_matter())
        head = [b"---", *yaml_lines, b"---"]
    lines: list[Line] = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["good", "good", "good", "bad"]))
        if kind == "good":
            text = draw(_TEXT)
            lines.append(Line(text.encode(), good=True, bad=False, text=text))
        elif draw(st.booleans()):
            lines.append(Line(b"caf\xe9 latin-1, not utf-8", good=False, bad=True))
        else:
            lines.append(Line(b"x" * (MAX_LINE_CHARS + 1), good=False, bad=True))
    encoding = "utf-8"
    if not any(line.bad for line in lines) and draw(st.integers(0, 4)) == 0:
        encoding = draw(st.sampled_from(["utf-16", "utf-32"]))  # with a byte order mark
    return FileSpec(rel_path, "note", lines, head, bad_head, encoding)


@st.composite
def hostile_workspace(draw: st.DrawFn) -> list[FileSpec]:
    """1-5 files: notes, entries, transcripts and whole-file hostiles, distinct paths."""
    files: list[FileSpec] = []
    for number in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["transcript", "transcript", "note", "entry", "whole"]))
        if kind == "transcript":
            folder = draw(st.sampled_from(["sessions", "sessions/conv-1", "sessions/a/b"]))
            files.append(draw(transcript(f"{folder}/s{number}.jsonl")))
        elif kind == "note":
            files.append(draw(note(f"memory/n{number}.md")))
        elif kind == "entry":
            files.append(draw(note(f"entries/conv-1/facts/f{number}.md")))
        else:
            whole = draw(st.sampled_from(["binary", "loop", "outside", "broken-link", "bad-name"]))
            name = f"memory/w{number}\udcff.md" if whole == "bad-name" else f"memory/w{number}.md"
            files.append(FileSpec(name, whole))
    return files


# --- writing and checking ----------------------------------------------------------------------


def write_workspace(root: Path, files: list[FileSpec]) -> Path:
    """Write the files under root/workspace (links may point to root/outside)."""
    workspace = root / "workspace"
    workspace.mkdir(parents=True)
    outside = root / "outside.md"
    outside.write_text("a secret outside the workspace\n", encoding="utf-8")
    for spec in files:
        path = workspace / spec.rel_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if spec.kind == "loop":
            os.symlink(path.name, path)
        elif spec.kind == "outside":
            os.symlink(outside, path)
        elif spec.kind == "broken-link":
            os.symlink(workspace / "missing.md", path)
        elif spec.kind == "binary":
            path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
        elif spec.kind == "bad-name":
            path.write_bytes(b"a note with a name that is not UTF-8\n")
        else:
            data = b"\n".join([*spec.head, *(line.raw for line in spec.lines)]) + b"\n"
            if spec.encoding != "utf-8":
                data = data.decode("utf-8").encode(spec.encoding)
            path.write_bytes(data)
    return workspace


@dataclass
class Outcome:
    """What one hostile workspace did to ingest (every count but the first should be 0)."""

    inputs: int = 0  # hostile lines and files in the workspace
    failures: int = 0  # ingest runs that raised
    good_lost: int = 0  # good lines missing from episodes / notes / chunks
    bad_unreported: int = 0  # bad lines or files without an ingest_errors row
    problems: list[str] = field(default_factory=list)


def check_ingest(root: Path, files: list[FileSpec]) -> Outcome:
    """Ingest a hostile workspace twice (the second run must change nothing) and count."""
    workspace = write_workspace(root, files)
    settings = Settings(workspace=workspace, db_path=root / "memory.duckdb")
    outcome = Outcome()
    for _ in range(2):
        try:
            run_all(settings)
        except Exception:
            outcome.failures += 1
            outcome.problems.append(traceback.format_exc(limit=-3))
            return outcome
    with open_store(settings.db_path, read_only=True) as con:
        episodes = set(con.execute("SELECT path, line, content FROM episodes").fetchall())
        notes = {
            path: (body, start)
            for path, body, start in con.execute(
                "SELECT path, body, body_start_line FROM notes"
            ).fetchall()
        }
        chunks: dict[str, str] = {}
        for path, text in con.execute("SELECT path, text FROM chunks").fetchall():
            chunks[path] = chunks.get(path, "") + "\n" + text
        errors = con.execute("SELECT path, line FROM ingest_errors").fetchall()
    error_lines = set(errors)
    error_paths = {path for path, _ in errors}

    def lost(spec: FileSpec, line: Line, number: int) -> None:
        outcome.good_lost += 1
        outcome.problems.append(f"good line lost: {spec.rel_path}:{number} {line.raw[:80]!r}")

    def unreported(what: str) -> None:
        outcome.bad_unreported += 1
        outcome.problems.append(f"no error row: {what}")

    for spec in files:
        if spec.bad_file:
            outcome.inputs += 1
            if spec.error_path not in error_paths:
                unreported(f"{spec.kind} file {spec.error_path}")
            continue
        if spec.bad_head:
            outcome.inputs += 1
            if spec.rel_path not in error_paths:
                unreported(f"front matter of {spec.rel_path}: {spec.head[1][:60]!r}")
        first = len(spec.head) + 1
        for number, line in enumerate(spec.lines, start=first):
            outcome.inputs += line.bad
            if line.bad and (spec.rel_path, number) not in error_lines:
                unreported(f"{spec.rel_path}:{number} {line.raw[:80]!r}")
            if not line.good:
                continue
            searchable = line.text in chunks.get(spec.rel_path, "")
            if spec.kind == "transcript":
                stored = (spec.rel_path, number, line.text) in episodes
            else:
                body, start = notes.get(spec.rel_path, ("", 1))
                body_lines = body.split("\n")
                at = number - start
                stored = 0 <= at < len(body_lines) and body_lines[at] == line.text
            if not (stored and searchable):
                lost(spec, line, number)
    return outcome


# --- SQL ------------------------------------------------------------------------------------------


def sql_escapes(settings: Settings, tmp_path: Path) -> list[str]:
    """What a user at `memory-dag sql` tried on the way out of the store (issue 14); each must
    fail. `tmp_path/secret.txt` is written for them to try to read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret\n")
    return [
        f"SELECT content FROM read_text('{secret}')",
        "SELECT content FROM read_text('/etc/hostname')",
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM read_blob('{secret}')",
        f"SELECT * FROM glob('{tmp_path}/**')",
        "SELECT * FROM glob('/root/**')",
        f"COPY (SELECT 'v-gone') TO '{settings.index_dir}/CURRENT'",
        f"COPY (SELECT 1 AS x) TO '{settings.db_path}'",
        f"COPY chunks TO '{tmp_path}/leak.csv'",
        f"EXPORT DATABASE '{tmp_path}/exported'",
        f"ATTACH '{tmp_path}/other.duckdb' AS other",
        f"ATTACH '{settings.db_path}' AS store2",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "RESET enable_external_access",
        "SET lock_configuration = false",
        f"SET enable_external_access = true; SELECT * FROM read_text('{secret}')",
        "SET allowed_directories = ['/']",
        "DELETE FROM chunks",
        "DROP TABLE chunks",
    ]
