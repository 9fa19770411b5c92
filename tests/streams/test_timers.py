"""A worker's timers never end it: Faust crashes the whole worker when a timer
raises, and a timer that asks the consumer where it stands meets Kafka errors in
normal running (a rebalance, a broker restart). CI saw a stage-2 worker crash this
way five seconds after it started."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
import pytest
from aiokafka.errors import IllegalStateError, KafkaConnectionError
from faust.types import TP

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.streams.app import build_app
from vigil_gpu_monitor.streams.jobclock import JobClockFeed, read_jobclocks
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.stage_app import build_stage_app
from vigil_gpu_monitor.streams.timers import guard_tick


def _errors(metrics: WorkerMetrics) -> float:
    return metrics.errors._value.get()  # type: ignore[attr-defined,no-any-return]


def test_a_kafka_error_is_a_warning_and_anything_else_an_error_counted() -> None:
    metrics = WorkerMetrics()

    async def revoked() -> None:
        raise IllegalStateError("Partition TopicPartition(topic='t', partition=3) "
                                "is not assigned")

    async def bug() -> None:
        raise KeyError("job")

    asyncio.run(guard_tick(revoked, metrics, "lag report", 5.0)())
    assert _errors(metrics) == 0
    asyncio.run(guard_tick(bug, metrics, "lag report", 5.0)())
    assert _errors(metrics) == 1
    with pytest.raises(KeyError):  # unguarded, the same tick raises: the worker ends
        asyncio.run(bug())


class _RevokingConsumer:
    """A consumer in the middle of a rebalance: it lists a partition, then says it
    is not assigned when asked where it stands (aiokafka's ``position``)."""

    def __init__(self, topic: str) -> None:
        self.tp = TP(topic, 3)
        self.asked = 0

    def assignment(self) -> set[TP]:
        return {self.tp}

    def highwater(self, tp: TP) -> int:
        return 120

    async def position(self, tp: TP) -> int:
        self.asked += 1
        raise IllegalStateError(f"Partition {tp} is not assigned")


def _ticks(app: faust.App) -> dict[str, Any]:
    """Each timer of ``app`` by name: the function a tick calls (under Faust's task
    wrapper and its timer loop, both ``functools.wraps``)."""
    return {task.__name__: task.__wrapped__.__wrapped__ for task in app._app_tasks
            if hasattr(getattr(task, "__wrapped__", None), "__wrapped__")}


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_every_timer_of_every_worker_survives_a_partition_revoked_under_it(
        stage: int, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load(env={})
    metrics = WorkerMetrics()
    app = (build_app(cfg, metrics) if stage == 0 else build_stage_app(cfg, stage, metrics))
    inbound = topics.SUMMARIES if stage == 2 else topics.SAMPLES
    consumer = _RevokingConsumer(topics.topic(inbound, cfg.kafka.topic_prefix))
    app.consumer = consumer
    ticks = _ticks(app)
    assert {"report_lag", "watch_offsets", "checkpoint_quiet"} <= set(ticks)
    if stage == 1:
        assert "seal_by_jobclock" in ticks
    with caplog.at_level(logging.WARNING):
        for tick in ticks.values():
            asyncio.run(tick())  # none raises
    assert consumer.asked >= 1  # the lag report did ask, and was refused
    assert "lag report failed" in caplog.text and "is not assigned" in caplog.text
    assert _errors(metrics) == 0, caplog.text  # a rebalance is no fault of ours


def test_the_job_clock_reader_outlives_a_broker_absent_at_its_start(
        caplog: pytest.LogCaptureFixture) -> None:
    """Stage 1's job-clock reader is a Faust task too; with no broker it logs and
    reads again, and ends when told to."""

    async def run() -> None:
        stop = asyncio.Event()
        reader = asyncio.create_task(read_jobclocks(JobClockFeed(), "vigil.jobclock",
                                                    "127.0.0.1:1", {}, stop, 0.05))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(reader, 10)

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert caplog.text.count("reading the job clocks") >= 2, caplog.text
    assert KafkaConnectionError.__name__ in caplog.text
