"""The BLAS and OpenMP thread pools of a process that serves reads (`Memory`, `memory-dag serve`).

A search multiplies a few thousand vectors by one query vector (and faiss searches its
index). With the default of one BLAS thread per core, a product that takes 0.1-1 ms alone
waited 10-25 ms at p95 for a thread the other processes on the 2-core machine held (measured
at load 5: a 20k x 256 product, p50 10 ms with 2 threads, 1 ms with one). The results are
the same bit for bit (each output is one thread's dot product either way), so a process
that serves reads keeps one thread per pool; `MEMORY_DAG_COMPUTE_THREADS=0` leaves the
pools as they are (a host application that wants its own), N > 1 sets N.
"""

from __future__ import annotations

import threading
from typing import Any

_applied: dict[int, Any] = {}
_lock = threading.Lock()


def limit_compute_threads(threads: int) -> None:
    """Limit the process's BLAS and OpenMP pools to `threads` (0: leave them), once per value.

    Process-wide on purpose: threadpoolctl changes the libraries' own settings. Libraries
    loaded later are not limited, so faiss (OpenMP, its own OpenBLAS) and NumPy are loaded
    first.
    """
    if threads <= 0:
        return
    with _lock:
        if threads in _applied and len(_applied) == 1:
            return
        import numpy  # noqa: F401
        from threadpoolctl import threadpool_limits

        from memory_dag.index.faiss_import import faiss  # noqa: F401  (its pools, once loaded)

        _applied.clear()
        _applied[threads] = threadpool_limits(limits=threads)
