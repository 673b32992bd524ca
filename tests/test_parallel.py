"""Worker processes give what one process gives (`memory_dag/parallel.py`), from scripts with
or without a main guard, and the progress display follows the stages (`memory_dag/progress.py`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memory_dag import progress
from memory_dag.memories.entities import extract_entities, extract_entities_batch
from memory_dag.parallel import process_map, process_map_iter

TEXTS = [
    f"My wife Anne{i} lives in Paris. Email me at a{i}@example.org on 8 May 2023, #tag{i % 7}"
    for i in range(2_500)
]


def lengths(texts: list[str]) -> list[int]:
    return [len(text) for text in texts]


def test_many_items_are_shared_by_workers_in_order() -> None:
    assert process_map(lengths, TEXTS) == lengths(TEXTS)
    assert process_map(lengths, TEXTS[:10]) == lengths(TEXTS[:10])  # in-process


def test_results_come_one_by_one_in_order() -> None:
    results = process_map_iter(lengths, TEXTS)
    assert next(results) == len(TEXTS[0])
    assert list(results) == lengths(TEXTS)[1:]
    assert list(process_map_iter(lengths, TEXTS[:10])) == lengths(TEXTS[:10])  # in-process


def lengths_but_not_bad(texts: list[str]) -> list[int]:
    if "bad" in texts:
        raise ValueError("a bad item")
    return lengths(texts)


def test_a_failing_slice_fails_where_its_results_would_come() -> None:
    """The results before the failing slice are the caller's; its error comes in their place."""
    items = [*TEXTS[:2_000], "bad", *TEXTS[2_000:]]
    results = process_map_iter(lengths_but_not_bad, items)
    assert [next(results) for _ in range(1_000)] == lengths(items[:1_000])
    with pytest.raises(ValueError, match="a bad item"):
        list(results)


def lengths_slowly(texts: list[str]) -> list[int]:
    time.sleep(1.0)
    return lengths(texts)


def test_closing_the_results_cancels_the_slices_not_started() -> None:
    """A stage that fails half-way leaves no work queued in the workers for the next one."""
    results = process_map_iter(lengths_slowly, TEXTS)  # 16 slices of 1 s on 2 workers
    assert next(results) == len(TEXTS[0])
    results.close()
    assert list(results) == []
    started = time.perf_counter()
    assert process_map(lengths, TEXTS) == lengths(TEXTS)
    assert time.perf_counter() - started < 8  # not behind the ~14 s of slices left


def test_a_script_without_a_main_guard_can_use_the_workers(tmp_path: Path) -> None:
    """multiprocessing would make each worker run such a script again (and start workers)."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from memory_dag.memories.entities import extract_entities_batch
            texts = {TEXTS!r}
            print(sum(len(found) for found in extract_entities_batch(texts)))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    expected = sum(len(extract_entities(text)) for text in TEXTS)
    assert int(done.stdout.strip()) == expected > 0


def test_the_batch_finds_the_mentions_one_text_at_a_time_finds() -> None:
    assert extract_entities_batch(TEXTS) == [extract_entities(text) for text in TEXTS]


def test_the_display_shows_each_stage_with_its_items() -> None:
    with progress.show_progress():
        display = progress._display
        with progress.stage("facts"):
            progress.set_total(4, "sessions")
            progress.advance(3)
            [task] = display.tasks
            assert (task.description, task.total, task.completed) == ("facts", 4, 3)
        with progress.stage("summaries"):
            pass
        assert [(t.description, t.finished) for t in display.tasks] == [
            ("facts", True),
            ("summaries", True),
        ]
    with progress.stage("entities"):  # nothing is shown, nothing fails
        progress.advance(1)
    assert progress._display is None


def _in_a_daemon(queue) -> None:  # a module-level target: multiprocessing pickles it by name
    texts = [f"text {number}" for number in range(5_000)]
    queue.put(process_map(lengths, texts) == lengths(texts))


def test_a_daemonic_process_works_in_process() -> None:
    """A Celery worker's run process is daemonic and may not start workers: same results."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_in_a_daemon, args=(queue,), daemon=True)
    child.start()
    assert queue.get(timeout=120) is True
    child.join(timeout=60)
    assert child.exitcode == 0


def test_released_workers_exit_and_the_next_map_starts_new_ones() -> None:
    """The index rebuild lets the idle workers go; a later stage still gets its results."""
    from memory_dag import parallel

    items = [f"text {n}" for n in range(parallel.MIN_ITEMS)]
    first = parallel.process_map(lengths, items)
    pool = parallel._pool
    workers = list((pool._processes or {}).values()) if pool is not None else []
    parallel.release_workers()
    assert parallel._pool is None
    assert all(not process.is_alive() for process in workers)
    assert parallel.process_map(lengths, items) == first == [len(item) for item in items]
    parallel.release_workers()
