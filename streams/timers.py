"""Faust timers that never end the worker.

Faust runs a timer as one of the app's tasks, and mode ends the whole service when a
task raises (``mode.Service._execute_task`` calls ``crash``): one exception in a
timer's tick stops the worker ("We experienced a crash! Reraising original
exception"). A timer that asks the consumer where it stands does meet exceptions in
normal running: during a rebalance a partition it just listed can be taken away
before the call returns (aiokafka's ``position`` raises ``IllegalStateError``), and a
broker restart fails any request. Seen in CI: a stage-2 worker that started beside a
stage 1 under load crashed five seconds in, most likely when its lag timer first ran
(its first exception was not in the part of the log CI kept).

``guarded_timer`` wraps a tick: a Kafka error is logged as a warning and the tick
runs again at the next interval; anything else is a fault of ours, counted in
``vigil_worker_batch_errors`` and logged with its traceback. Either way the worker
goes on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from aiokafka.errors import KafkaError

from vigil_gpu_monitor.streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)
Tick = Callable[[], Awaitable[None]]


def guard_tick(tick: Tick, metrics: WorkerMetrics, what: str, interval: float) -> Tick:
    """``tick`` made safe to run as a Faust timer (see the module's docstring)."""

    @functools.wraps(tick)
    async def guarded() -> None:
        try:
            await tick()
        except KafkaError as exc:
            log.warning("%s failed, tried again in %g s: %r", what, interval, exc)
        except Exception:
            metrics.errors.inc()
            log.exception("%s failed", what)

    return guarded


def guarded_timer(app: faust.App, interval: float, metrics: WorkerMetrics,
                  what: str) -> Callable[[Tick], Any]:
    """A decorator: ``@app.timer(interval)`` over ``guard_tick``. ``what`` names the
    tick in the log lines ("lag report")."""

    def register(tick: Tick) -> Any:
        return app.timer(interval=interval)(guard_tick(tick, metrics, what, interval))

    return register
