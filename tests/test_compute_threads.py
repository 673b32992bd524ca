"""A `Memory` limits the process's BLAS pools to `compute_threads` (0: leaves them)."""

from __future__ import annotations

from pathlib import Path

from threadpoolctl import threadpool_info, threadpool_limits

from memory_dag import Memory, compute_threads
from memory_dag.config import Settings


def blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_a_memory_limits_blas_to_its_compute_threads(tmp_path: Path) -> None:
    with threadpool_limits(limits=2):  # whatever the test process had is restored after
        compute_threads._applied.clear()
        Memory(Settings(db_path=tmp_path / "memory.duckdb", compute_threads=0))
        assert blas_threads() == {2}
        Memory(Settings(db_path=tmp_path / "memory.duckdb"))
        assert blas_threads() == {1}
    compute_threads._applied.clear()
