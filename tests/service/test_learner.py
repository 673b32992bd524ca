"""The proxy's learner: turns learned in the order answered, on one thread, after any context
block being built, never lost when the service stops."""

from __future__ import annotations

import threading
import time

import pytest

from memory_dag.service.learner import Learner


def test_jobs_run_in_order_on_one_thread_and_a_failure_stops_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    learner = Learner()
    done: list[tuple[int, int]] = []

    def job(n: int) -> None:
        time.sleep(0.001 * (5 - n))  # later jobs are quicker: order comes from the queue
        done.append((n, threading.get_ident()))

    def failing() -> None:
        raise RuntimeError("boom")

    for n in range(3):
        learner.submit(lambda n=n: job(n))
    learner.submit(failing)
    learner.submit(lambda: job(3))
    assert learner.drain(timeout=10)
    assert [n for n, _ in done] == [0, 1, 2, 3]
    assert len({thread for _, thread in done}) == 1 != threading.get_ident()
    assert "a learning job failed" in caplog.text
    learner.close()


def test_a_job_waits_for_the_context_block_being_built() -> None:
    learner = Learner(quiet_wait=5.0)
    ran = threading.Event()
    with learner.busy():
        learner.submit(ran.set)
        assert not ran.wait(0.2)  # held back while a block is built
    assert ran.wait(5)  # and run as soon as it is done


def test_a_job_waits_no_longer_than_quiet_wait() -> None:
    learner = Learner(quiet_wait=0.1)
    ran = threading.Event()
    with learner.busy():
        learner.submit(ran.set)
        assert ran.wait(5)  # the requests never let up: it runs anyway


def test_close_runs_what_is_queued() -> None:
    learner = Learner()
    done: list[int] = []
    for n in range(5):
        learner.submit(lambda n=n: (time.sleep(0.01), done.append(n)))
    learner.close(timeout=10)
    assert done == [0, 1, 2, 3, 4]
