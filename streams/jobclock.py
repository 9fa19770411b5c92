"""Stage 1's side of the job-clock feedback (issue #46, docs/sharding.md): every
stage-1 worker reads ``vigil.jobclock`` whole and keeps each job's newest
``vigil.jobclock/1``; its shards place samples with it and seal bins by it.

Every stage-1 worker needs every job's clock (a job's shards are spread over the
samples partitions, so over workers), so the topic is not read in the worker's
consumer group, which would split its partitions between workers: a consumer of
its own, without a group, is given all of them (aiokafka's ``subscribe`` without a
``group_id``) and reads the compacted topic from its start at every start. One clock
a job is kept (the newest): a few hundred bytes a job.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.jobclock import decode_jobclock
from vigil_gpu_monitor.contracts.messages import JobClock

log = logging.getLogger(__name__)


class JobClockFeed:
    """The newest job clock of each job heard of (a stale one, behind the one held,
    is ignored: a compacted topic may hand an old value before a new one)."""

    def __init__(self) -> None:
        self.latest: dict[str, JobClock] = {}
        self.refused = 0
        self.taken = 0

    def take(self, raw: bytes | None) -> JobClock | None:
        """One message of the topic; the clock when it is new, None when it is
        stale, a tombstone or refused (counted, logged, never raised)."""
        if raw is None:
            return None
        try:
            clock = decode_jobclock(raw)
        except ContractError as exc:
            self.refused += 1
            log.warning("job clock refused: %s", exc)
            return None
        held = self.latest.get(clock["job"])
        if held is not None and held["shards"] == clock["shards"] and _older(clock, held):
            return None
        self.latest[clock["job"]] = clock
        self.taken += 1
        return clock

    def get(self, job: str) -> JobClock | None:
        """The job's newest clock (None: none heard)."""
        return self.latest.get(job)


def _older(new: JobClock, held: JobClock) -> bool:
    """Whether ``new`` is behind ``held`` (an earlier next bin, or the same bin and an
    earlier watermark)."""
    a = (new["next_bin"] if new["next_bin"] is not None else -(2 ** 62),
         new["max_ts"] if new["max_ts"] is not None else float("-inf"))
    b = (held["next_bin"] if held["next_bin"] is not None else -(2 ** 62),
         held["max_ts"] if held["max_ts"] is not None else float("-inf"))
    return a < b


async def read_jobclocks(feed: JobClockFeed, topic: str, bootstrap: str,
                         auth: dict[str, Any], stop: asyncio.Event | None = None,
                         retry_seconds: float = 5.0) -> None:
    """Read ``topic`` from its start into ``feed`` until cancelled (or ``stop`` is
    set). A broker away is waited for by the client, as the worker's own consumer
    does; a Kafka error that still comes out of it (no broker at start: aiokafka's
    ``start`` raises) is logged and the topic read again from its start
    ``retry_seconds`` later (the feed keeps each job's newest clock, so the clocks
    read twice change nothing). This runs as a Faust task, and an exception out of
    one would end the worker."""
    from aiokafka import AIOKafkaConsumer  # faust's Kafka client; imported where used
    from aiokafka.errors import KafkaError

    while stop is None or not stop.is_set():
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    client_id="vigil-jobclock", **auth)
        failed = False
        try:
            await consumer.start()
            while stop is None or not stop.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=1000)
                for records in batches.values():
                    for record in records:
                        feed.take(record.value)
        except KafkaError as exc:
            failed = True
            log.warning("reading the job clocks (%s) failed, read again from its start "
                        "in %g s: %r", topic, retry_seconds, exc)
        finally:
            await consumer.stop()
        if failed:
            await asyncio.sleep(retry_seconds)
