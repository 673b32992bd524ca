"""The proxy's learning of a turn, off the request's cycle (issue 16: proxy latency).

A Starlette background task runs inside the request's ASGI cycle: uvicorn reads the next
request on that keep-alive connection only once it has finished, so a client that sends its
next turn at once waited for the previous turn's learning (`Memory.add`: transcript, facts,
journal) before its context block was even started: the proxy's overhead at 100k turns was
bimodal, ~20 or ~65 ms. The learner takes the turns from a queue on one thread of its own,
in the order the answers came (a conversation's turns are recorded in order), and starts
the next one only once no context block is being built, or after `QUIET_WAIT` seconds, so
that the CPU-bound parts of requests and of learning overlap less on a small machine.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("memory_dag.service.learner")

#: The longest a turn's learning waits for context blocks being built to finish.
QUIET_WAIT = 0.5


class Learner:
    """One thread that runs learning jobs in order; `busy()` marks request work it yields to."""

    def __init__(self, quiet_wait: float = QUIET_WAIT) -> None:
        self.quiet_wait = quiet_wait
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._quiet = threading.Condition(self._lock)
        self._busy = 0

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` after the jobs submitted before it (never raises; failures are logged)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="memory-dag-learner", daemon=True
                )
                self._thread.start()
        self._jobs.put(job)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Mark request work (a context block) the next job should not compete with."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                if not self._busy:
                    self._quiet.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every job submitted so far has run; False on timeout."""
        done = threading.Event()
        self.submit(done.set)
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Run the jobs still queued (up to `timeout` seconds), then stop the thread."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return
        self._jobs.put(None)
        thread.join(timeout)
        with self._lock:
            self._thread = None

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._wait_quiet()
            try:
                job()
            except Exception:  # a background job has nobody to answer: log it
                log.exception("a learning job failed")

    def _wait_quiet(self) -> None:
        deadline = time.monotonic() + self.quiet_wait
        with self._lock:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._quiet.wait(left):
                    return
