"""Faust glue for `streams.offsets.OffsetGuard`: anchoring, re-fetching, clamped commits.

Three hooks, on each topic the worker consumes (samples and step timings), every
partition keyed by its ``TP`` (topic, partition):

- before a batch is handled, partitions without an anchor get one: the group's
  committed offset (an OffsetFetch from a side consumer that never joins the
  group), or the log start when nothing was committed;
- after the batch, and every second from a timer (a hole may show no later
  message), a partition that showed a gap is sought back to its expected
  offset through Faust's own ``Consumer.seek_wait`` (which also resets Faust's read
  offset, so the re-fetched messages are not dropped again); when the log itself
  starts after the expected offset, the loss is counted and accepted;
- Faust's ``Consumer._new_offset`` (what it would commit for a partition) is
  replaced for these topics by the guard's limit, and Faust's acknowledgement
  lists are trimmed below it so they stay bounded; when partitions are revoked the
  guard's limits are committed directly (``Consumer._commit``), since Faust drops a
  revoked partition's acknowledgements before its last commit.

The last hook uses private Faust attributes; faust-streaming is pinned exactly and
`tests/streams/test_continuity.py` checks they exist on the installed version.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Iterable
from contextlib import asynccontextmanager
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from faust.types import TP

from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.offsets import OffsetGuard, Verdict

log = logging.getLogger(__name__)


class Continuity:
    """Keeps the consumed topics' offsets continuous between Faust and the detectors."""

    def __init__(self, app: Any, topics: str | Collection[str], metrics: WorkerMetrics,
                 guard: OffsetGuard | None = None) -> None:
        self.app = app
        self.topics = frozenset([topics] if isinstance(topics, str) else topics)
        self.metrics = metrics
        self.guard = guard or OffsetGuard()
        self._clamped = False

    # -- anchoring -----------------------------------------------------------

    @asynccontextmanager
    async def _side_client(self) -> AsyncIterator[AIOKafkaConsumer]:
        """A started consumer that only asks for offsets: it never joins the group.

        Used once per partition per assignment (and per hole), so a short-lived client
        is cheaper than a long-lived one whose lifecycle Faust does not manage.
        """
        conf = self.app.conf
        client = AIOKafkaConsumer(
            bootstrap_servers=[f"{u.host}:{u.port or 9092}" for u in conf.broker],
            group_id=conf.id, enable_auto_commit=False, client_id=f"{conf.id}-offsets",
            **credentials_to_aiokafka_auth(conf.broker_credentials))
        await client.start()
        try:
            yield client
        finally:
            await client.stop()

    async def anchor(self, partitions: Iterable[TP]) -> None:
        """Anchor each partition at the group's committed offset (else the log start)."""
        async with self._side_client() as client:
            for part in sorted(set(partitions)):
                tp = TopicPartition(part.topic, part.partition)
                committed = await client.committed(tp)
                if committed is None:
                    committed = (await client.beginning_offsets([tp]))[tp]
                self.guard.anchor(part, committed)
                log.info("%s partition %d anchored at offset %d", part.topic, part.partition,
                         committed)

    async def _log_start(self, part: TP) -> int:
        async with self._side_client() as client:
            tp = TopicPartition(part.topic, part.partition)
            return int((await client.beginning_offsets([tp]))[tp])

    # -- per batch -----------------------------------------------------------

    async def admit(self, events: list[Any]) -> list[Any]:
        """The events the detectors may see, in order; seeks back over any gap."""
        unanchored = {_tp(e.message) for e in events
                      if self.guard.needs_anchor(_tp(e.message))}
        if unanchored:
            await self.anchor(unanchored)
        admitted: list[Any] = []
        gaps: set[TP] = set()
        for event in events:
            msg = event.message
            verdict = self.guard.admit(_tp(msg), msg.offset)
            if verdict is Verdict.PROCESS:
                admitted.append(event)
                continue
            self.metrics.offsets.labels(verdict.value).inc()
            if verdict is Verdict.GAP:
                gaps.add(_tp(msg))
        for part in sorted(gaps):
            await self._refetch(part)
        return admitted

    async def watch(self) -> None:
        """Periodic: anchor every assigned partition, re-seek partitions whose hole
        persists, and find holes no message shows (Faust can drop every message of a
        partition it fetched, so a partition may never appear in a batch at all)."""
        assigned = sorted(TP(tp.topic, tp.partition) for tp in self.app.consumer.assignment()
                          if tp.topic in self.topics)
        unanchored = [p for p in assigned if self.guard.needs_anchor(p)]
        if unanchored:
            await self.anchor(unanchored)
        for part in assigned:
            position = await self.app.consumer.position(part)
            self.guard.check_position(part, position)
            await self._refetch(part)

    async def _refetch(self, part: TP) -> None:
        offset = self.guard.refetch_due(part)
        if offset is None:
            return
        log_start = await self._log_start(part)
        lost = self.guard.accept_log_start(part, log_start)
        if lost:
            self.metrics.offsets.labels("lost_to_retention").inc(lost)
            log.warning("%s partition %d: %d offsets before %d are gone from the log "
                        "(retention); continuing from the log start", part.topic,
                        part.partition, lost, log_start)
            offset = log_start
        self.metrics.offsets.labels("refetch").inc()
        log.warning("%s partition %d: messages from offset %d did not arrive in order; "
                    "seeking back to re-read them", part.topic, part.partition, offset)
        # seek_wait runs in the consumer's own thread; Consumer.seek would touch aiokafka
        # from this one and race its fetcher.
        await self.app.consumer.seek_wait({part: offset})

    # -- commits ---------------------------------------------------------------

    async def commit_processed(self) -> None:
        """Commit exactly what the detectors saw, for every anchored partition.

        Called when partitions are revoked: Faust forgets a revoked partition's
        acknowledgements before its own last commit, so without this the next owner
        would start from the previous periodic commit and redo up to a commit
        interval of samples (harmless duplicates, but wasted work in every rebalance).
        """
        offsets = {TP(*cast(TP, p)): limit for p in self.guard.partitions()
                   if (limit := self.guard.commit_limit(p))}
        if offsets:
            await self.app.consumer._commit(offsets)

    def on_assigned(self) -> None:
        """A new assignment: re-anchor everything; make sure commits are clamped."""
        self.guard.reset()
        if not self._clamped:
            clamp_commits(self.app.consumer, self.topics, self.guard)
            self._clamped = True


def _tp(msg: Any) -> TP:
    """A delivered message's partition as the guard keys it."""
    return TP(msg.topic, msg.partition)


def clamp_commits(consumer: Any, topics: str | Collection[str], guard: OffsetGuard) -> None:
    """Make ``consumer`` commit, on ``topics``, only offsets the guard says were processed
    (the guard keyed by ``TP``)."""
    original = consumer._new_offset
    clamped = frozenset([topics] if isinstance(topics, str) else topics)

    def new_offset(tp: Any) -> int | None:
        if tp.topic not in clamped:
            return original(tp)
        limit = guard.commit_limit(TP(tp.topic, tp.partition))
        acked = consumer._acked[tp]
        if acked:
            index = consumer._acked_index[tp]
            below = [o for o in acked if limit is None or o < limit]
            if below:
                index.difference_update(below)
                acked[:] = [o for o in acked if limit is not None and o >= limit]
        return limit

    consumer._new_offset = new_offset
