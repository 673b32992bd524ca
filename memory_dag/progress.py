"""Progress of the stages while they run, for whoever shows it: the CLI's `rich` display.

Stages say what they are doing through `stage(name)` and `advance(n)`; nothing is shown
unless a display is open (`show_progress()`, which the CLI opens on a terminal), so the
library, the tests and the Dagster UI (which shows metadata instead) pay nothing for it. The
same calls serve `memory-dag ingest` with and without Dagster: its assets run in-process.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_display: Any = None  # a rich.progress.Progress while one is shown
_running = threading.local()  # `task`: the stage this thread runs (the FTS build has its own)


@contextmanager
def show_progress() -> Iterator[None]:
    """Show every stage with a spinner, its counts and elapsed time on stderr until the block
    ends; each finished stage stays as one line."""
    global _display
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    display = Progress(
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=False,
    )
    with display:
        _display = display
        try:
            yield
        finally:
            _display = None


@contextmanager
def stage(name: str, total: int | None = None, unit: str = "") -> Iterator[None]:
    """The stage `name` runs inside this block (`total` items of `unit`, when known)."""
    display = _display
    if display is None:
        yield
        return
    task = display.add_task(name, total=total, unit=unit)
    outer = getattr(_running, "task", None)
    _running.task = task
    try:
        yield
    finally:
        _running.task = outer
        done = display.tasks[task].total or display.tasks[task].completed or 1
        display.update(task, total=done, completed=done)


def tracked(name: str) -> Callable[[F], F]:
    """Decorate a stage function: it runs as the stage `name` (see `stage`)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with stage(name):
                return function(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


def set_total(total: int, unit: str = "") -> None:
    """How many items the running stage has, once it knows."""
    display, task = _display, getattr(_running, "task", None)
    if display is not None and task is not None:
        display.update(task, total=total, **({"unit": unit} if unit else {}))


def advance(amount: int = 1) -> None:
    """`amount` more items of the running stage are done."""
    display, task = _display, getattr(_running, "task", None)
    if display is not None and task is not None and amount:
        display.advance(task, amount)
