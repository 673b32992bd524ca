"""Pure-Python work of a stage on every core: worker processes, for work the GIL serialises.

Parsing transcripts, entity extraction, rule-based fact extraction and extractive summaries
are Python, regular expressions and small numpy steps over independent items: threads would
wait on the GIL, so `process_map` hands slices of the items to worker processes and returns
the results in order, exactly what `fn(items)` gives (`process_slices`: one result a slice,
for results that are cheaper to hand back whole, such as an Arrow table; `process_map_iter`:
the results as the slices finish, so that the caller's own serial work on the first ones runs
while the workers compute the rest). Small batches and
one-core machines stay in-process, and so does a daemonic process (a Celery worker's run
process in a sharded deployment, deploy/local/): it may not start children, and its
deployment runs one per core already.

The workers are forked from a fresh server process ("forkserver": this process runs DuckDB's,
Polars' and Dagster's threads, which a plain `fork` would copy mid-flight) and kept for the
next stage. They import what they run by module name and never the caller's script, so a
script that calls the pipeline without an `if __name__ == "__main__":` guard works too.
"""

from __future__ import annotations

import atexit
import multiprocessing
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from memory_dag.embed.onnx_models import usable_cpus

T = TypeVar("T")
R = TypeVar("R")

#: Below this many items, work stays in this process (starting the workers costs ~1 s).
MIN_ITEMS = 2_000

_pool: ProcessPoolExecutor | None = None


def process_map(
    fn: Callable[[Sequence[T]], list[R]], items: Sequence[T], *, min_items: int = MIN_ITEMS
) -> list[R]:
    """`fn(items)`, computed slice by slice in worker processes when `items` are many.

    `fn` takes a slice and returns one result per item; it must be a module-level function
    (workers import it by name), and its items and results must pickle.
    """
    return [result for part in process_slices(fn, items, min_items=min_items) for result in part]


def process_slices(
    fn: Callable[[Sequence[T]], R],
    items: Sequence[T],
    *,
    min_items: int = MIN_ITEMS,
    max_slice: int | None = None,
) -> list[R]:
    """`fn` of consecutive slices of `items`, in worker processes when `items` are many: one
    result a slice, in order (`[fn(items)]` when they stay in this process).

    For results that cost less to hand back whole than item by item (an Arrow table of a
    slice's rows pickles in one piece; a table an item, at ~0.3 ms each, cost more than the
    work). `fn` must be a module-level function; its items and results must pickle.
    `max_slice`: at most this many items a slice, so that a worker holds no more at once (a
    worker keeps the memory its largest slice took).
    """
    workers = usable_cpus()
    if not _in_workers(items, min_items, workers):
        return [fn(items)]
    futures = _submit_slices(fn, items, workers, slices_per_worker=2, max_slice=max_slice)
    return [future.result() for future in futures]


#: `process_map_iter` cuts this many slices a worker: the first results come after about this
#: share of the work (each slice costs ~1-5 ms to hand over).
ITER_SLICES_PER_WORKER = 8


def process_map_iter(
    fn: Callable[[Sequence[T]], list[R]], items: Sequence[T], *, min_items: int = MIN_ITEMS
) -> InOrder[R]:
    """`process_map`'s results, one at a time and in order, as the workers finish each slice.

    A stage that must go through the results one by one in this process (resolving entities,
    reconciling facts: each depends on the ones before) starts on the first slice while the
    workers compute the rest, instead of leaving them idle until it is done. The slices are
    submitted when this is called, so the caller may do other work before it asks for the
    first result. Few items are computed in this process, at once.
    """
    workers = usable_cpus()
    if not _in_workers(items, min_items, workers):
        done: Future[list[R]] = Future()
        done.set_result(fn(items))
        return InOrder([done])
    return InOrder(_submit_slices(fn, items, workers, slices_per_worker=ITER_SLICES_PER_WORKER))


class InOrder(Iterator[R]):
    """The results of slices being computed, in order; `close()` cancels the slices not
    started, so a caller that stops early leaves no work behind in the workers."""

    def __init__(self, slices: list[Future[list[R]]]) -> None:
        self._slices = slices
        self._taken = 0
        self._current: Iterator[R] = iter(())

    def __next__(self) -> R:
        while True:
            for result in self._current:
                return result
            if self._taken == len(self._slices):
                raise StopIteration
            self._taken += 1
            try:
                self._current = iter(self._slices[self._taken - 1].result())
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        for future in self._slices[self._taken :]:
            future.cancel()
        self._taken = len(self._slices)
        self._current = iter(())


def _in_workers(items: Sequence[object], min_items: int, workers: int) -> bool:
    return len(items) >= min_items and workers >= 2 and not multiprocessing.current_process().daemon


def _submit_slices(
    fn: Callable[[Sequence[T]], R],
    items: Sequence[T],
    workers: int,
    *,
    slices_per_worker: int,
    max_slice: int | None = None,
) -> list[Future[R]]:
    """`fn` of each consecutive slice of `items`, submitted to the workers (several slices a
    worker even out uneven ones)."""
    size = -(-len(items) // (slices_per_worker * workers))
    size = min(size, max_slice or size)
    slices = [items[start : start + size] for start in range(0, len(items), size)]
    pool = _executor(workers)
    with _caller_script_hidden():  # workers start on the first submits
        return [pool.submit(fn, part) for part in slices]


def _executor(workers: int) -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        _pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
        atexit.register(_pool.shutdown, cancel_futures=True)
    return _pool


def release_workers() -> None:
    """Stop the worker processes (the next `process_map` starts them again, ~1 s). A stage
    that needs no workers and much memory calls it first: idle workers still hold what their
    last stage left them (a 1M-turn run's summaries: part of its peak during the index step)."""
    global _pool
    if _pool is not None:
        pool, _pool = _pool, None
        atexit.unregister(pool.shutdown)
        pool.shutdown(cancel_futures=True)


@contextmanager
def _caller_script_hidden() -> Iterator[None]:
    """While workers start, `__main__` is a blank module: multiprocessing would otherwise
    have each worker run the caller's script again (and, unguarded, start workers itself)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
