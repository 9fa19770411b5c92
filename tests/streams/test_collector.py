"""The collector paused for a batch (``streams/collector.py``)."""

from __future__ import annotations

import gc

import pytest

from vigil_gpu_monitor.streams.collector import collector_paused


def test_the_collector_is_off_in_the_block_and_on_after_it_even_when_it_raises() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a batch that failed")
    assert gc.isenabled()


def test_a_collector_someone_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collection_a_block_made_due_runs_as_it_ends() -> None:
    young = gc.get_threshold()[0]
    with collector_paused():
        kept = [[] for _ in range(young * 5)]  # far past a young collection's threshold
        assert gc.get_count()[0] > young
    assert gc.get_count()[0] < young, "the young collection ran when the block ended"
    del kept
