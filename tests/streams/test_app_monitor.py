"""The worker's Monitor keeps what Faust's stalled-stream check reads, once a batch."""

from __future__ import annotations

import time
from types import SimpleNamespace

from faust.types import TP

from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.streams.app import PerBatchMonitor, build_app


def test_a_batch_marks_its_partitions_as_being_processed() -> None:
    app = build_app(load(env={}))
    monitor = app.monitor
    assert isinstance(monitor, PerBatchMonitor)  # the setting took
    busy, idle = TP("vigil.samples", 3), TP("vigil.samples", 5)
    before = time.monotonic()
    monitor.on_batch_in([SimpleNamespace(message=SimpleNamespace(tp=busy))] * 3)
    # Faust's consumer thread reads this per partition: a partition with a backlog
    # and no time here is logged as a stream that never started processing
    assert monitor.stream_inbound_time[busy] >= before
    assert idle not in monitor.stream_inbound_time
    # the per-event hooks stay off: the batch's note is the only one
    assert monitor.on_stream_event_in(idle, 0, None, None) is None
    assert idle not in monitor.stream_inbound_time
