"""`collection.collection_paused`: the garbage collector paused around a stage's bulk work,
and left as it was found."""

from __future__ import annotations

import gc

import pytest

from memory_dag.collection import collection_paused


def test_collection_paused_restores_the_collector_as_it_found_it() -> None:
    """It pauses the collector, and leaves it as it was: running, or stopped by the caller
    (even when the work raises)."""
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_paused():
        assert not gc.isenabled()
        raise RuntimeError("read failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
