"""What the alerter keeps while Redis is unreachable, so that people are still told and
nothing is lost.

- ``backlog``: detections delivered from memory but not yet applied to Redis (oldest
  first); while it is not empty Redis is believed down, and the Kafka offsets of those
  batches are not committed.
- ``pending_writes``: delivery records and "who was told" marks Redis missed.
- ``to_consider``: detections remediation has not yet seen (it needs Redis).
- ``known``: the newest state of each recent incident, so duplicates are dropped
  without Redis (the same order ``LiveState.apply`` uses: later time, then resolved).

All of it is bounded: the backlog by ``REDIS_BACKLOG_MAX`` (then consumption pauses
and Kafka holds the rest), the writes by the same, ``known`` by
``KNOWN_INCIDENTS_MAX`` (oldest forgotten).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable

import redis

from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts.messages import Detection

log = logging.getLogger(__name__)
REDIS_BACKLOG_MAX = 50_000  # detections held while Redis is down; then consumption pauses
KNOWN_INCIDENTS_MAX = 100_000  # newest state per incident id, for dedupe without Redis


class RedisOutage:
    """The alerter's outage bookkeeping (see the module docstring)."""

    def __init__(self) -> None:
        self.backlog: deque[Detection] = deque()
        self.pending_writes: deque[Callable[[], None]] = deque(maxlen=REDIS_BACKLOG_MAX)
        self.to_consider: deque[Detection] = deque()
        self.known: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.errors = 0
        self.dropped_writes = 0

    @property
    def ongoing(self) -> bool:
        """Whether Redis is believed down (detections wait for it)."""
        return bool(self.backlog)

    @property
    def full(self) -> bool:
        """Whether consumption must pause until Redis returns."""
        return len(self.backlog) >= REDIS_BACKLOG_MAX

    @property
    def owed(self) -> bool:
        """Whether anything waits to be written or considered."""
        return bool(self.backlog or self.pending_writes or self.to_consider)

    def lost(self, exc: Exception) -> None:
        """A Redis call failed: count it, and say so now and then."""
        self.errors += 1
        if self.errors == 1 or self.errors % 100 == 0:
            log.warning("Redis unreachable (%s): delivering from memory, %d detections "
                        "held for Redis", type(exc).__name__, len(self.backlog))

    def remember(self, det: Detection) -> bool:
        """Record the newest state seen of an incident; False if ``det`` is not newer."""
        rank = (det["detected_at"], 1 if det["state"] == "resolved" else 0)
        known = self.known.get(det["id"])
        if known is not None and rank <= known:
            return False
        self.known[det["id"]] = rank
        self.known.move_to_end(det["id"])
        while len(self.known) > KNOWN_INCIDENTS_MAX:
            self.known.popitem(last=False)
        return True

    def write_or_defer(self, write: Callable[[], None]) -> None:
        """Run a Redis write now, or keep it for when Redis is back."""
        try:
            write()
        except redis.RedisError:
            if len(self.pending_writes) == REDIS_BACKLOG_MAX:
                self.dropped_writes += 1  # the oldest delivery record goes: say so
                log.warning("Redis still unreachable: %d delivery records not kept",
                            self.dropped_writes)
            self.pending_writes.append(write)

    def catch_up(self, state: LiveState) -> bool:
        """Write what Redis missed, oldest first; False at the first failure (the rest
        stays). Applied detections move to ``to_consider``."""
        try:
            while self.pending_writes:
                self.pending_writes[0]()
                self.pending_writes.popleft()
            while self.backlog:
                if state.apply(self.backlog[0]):
                    self.to_consider.append(self.backlog[0])
                self.backlog.popleft()
        except redis.RedisError:
            return False
        log.info("Redis is back: backlog written")
        return True
