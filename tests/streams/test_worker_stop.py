"""The worker's stop deadline: a stop that hangs ends the process, non-zero, by itself."""

from __future__ import annotations

import asyncio
import time

import faust
import pytest

from vigil_gpu_monitor.streams import worker as worker_module


def test_a_stop_that_outlives_its_deadline_exits_hard(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path) -> None:
    exits: list[int] = []
    monkeypatch.setattr(worker_module.os, "_exit", exits.append)
    app = faust.App("stop-test", broker="kafka://127.0.0.1:1", store="memory://",
                    datadir=str(tmp_path), web_enabled=False)
    loop = asyncio.new_event_loop()
    try:
        worker = worker_module._DeadlinedWorker(app, loop=loop, quiet=True)
        worker.stop_seconds = 0.2
        loop.run_until_complete(worker.on_stop())  # the stop begins, then "hangs"
        assert exits == []  # not before the deadline
        time.sleep(0.6)
    finally:
        loop.close()
    assert exits == [worker_module.EXIT_STOP_DEADLINE]
