"""The CLI's note of what the Dagster instance already recorded about each store."""

from __future__ import annotations

from pathlib import Path

from memory_dag.cli.instance_findings import FINDINGS_FILE, InstanceFindings, instance_home


def test_remembers_per_store_and_forgets(tmp_path: Path) -> None:
    store = tmp_path / "a.duckdb"
    one, other = InstanceFindings(tmp_path, store), InstanceFindings(tmp_path, "b.duckdb")
    assert not one.knows("settled-1")
    one.remember("settled-1")
    other.remember("settled-9")
    assert one.knows("settled-1") and not one.knows("settled-2")
    assert InstanceFindings(tmp_path, tmp_path / "x" / ".." / "a.duckdb").knows("settled-1")
    one.forget()
    assert not one.knows("settled-1")
    assert other.knows("settled-9")  # another store's note is kept


def test_a_store_never_settled_is_never_known(tmp_path: Path) -> None:
    findings = InstanceFindings(tmp_path, "a.duckdb")
    findings.remember("")
    assert not findings.knows("")
    assert not (tmp_path / FINDINGS_FILE).exists()


def test_a_torn_or_foreign_note_knows_nothing_and_is_replaced(tmp_path: Path) -> None:
    findings = InstanceFindings(tmp_path, "a.duckdb")
    for broken in ('{"a": ', "[1, 2]", ""):
        (tmp_path / FINDINGS_FILE).write_text(broken)
        assert not findings.knows("settled-1")
    findings.remember("settled-1")
    assert findings.knows("settled-1")


def test_an_ephemeral_instance_remembers_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert instance_home(tmp_path) is None  # no data/dagster_home/dagster.yaml there
    findings = InstanceFindings(None, "a.duckdb")
    findings.remember("settled-1")
    assert not findings.knows("settled-1")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert instance_home(Path("/nowhere")) == tmp_path
