"""Every offset reaches the detectors once, in order, or the commit stops before it.

Why this exists: during a consumer-group rebalance faust-streaming can hand the
agent a partition's messages out of order or not at all. Messages fetched under the
old generation are skipped by the stream *and acknowledged*, and a re-fetch after
the seek to the committed offset can be dropped by the consumer's read-offset
check; the acknowledgements then let Faust commit past samples nobody processed
(seen here: 4 workers joining at once lost one contiguous block of 438 samples of
one partition, offsets committed). See faust-streaming issues 216 and 221.

The guard does not depend on how Faust gets it wrong. Per partition it knows the
next offset the detectors must see (``expected``), anchored at the group's committed
offset after each assignment. A message at ``expected`` is processed and moves it on;
an older one was processed already (a replay) and is skipped; a newer one means
messages are missing, so it is skipped too and the caller seeks the consumer back
to ``expected`` (at most once per ``refetch_seconds``, again and again until it
arrives). A hole no later message reveals is found from the consumer's position
standing past ``expected`` without progress. Commits are clamped to
``expected``: nothing that did not reach the detectors is ever committed; and to
``floor``: nothing that is not yet in a job's checkpoint either, so a restarted
worker gets again every sample its checkpoints lack.
A gap that the log itself has (retention deleted the offsets) is accepted once
the caller checks the log start, and counted.

A partition is whatever key the caller gives it: the worker consumes two topics
(samples and step timings) and keys each partition by ``(topic, partition)``
(Faust's ``TP``), so each topic's offsets are guarded and clamped on their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    """What to do with one message."""

    PROCESS = "process"        # the next offset: hand it to the detectors
    REPLAYED = "replayed"      # processed before (a re-delivery): skip
    GAP = "gap"                # offsets before it are missing: skip, re-fetch from expected
    UNANCHORED = "unanchored"  # the committed offset is not known yet: anchor first


@dataclass
class _Partition:
    expected: int
    progressed_at: float
    anchored: int = -1  # the offset it was anchored at
    gap_seen: bool = False
    last_refetch: float = float("-inf")


class OffsetGuard:
    """Per-partition continuity of the offsets handed to the detectors."""

    def __init__(self, refetch_seconds: float = 1.0, stall_seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refetch_seconds = refetch_seconds
        self.stall_seconds = stall_seconds
        self._clock = clock
        self._parts: dict[Hashable, _Partition] = {}
        # partition → the lowest offset not yet in a checkpoint (None: all are)
        self.floor: Callable[[Any], int | None] | None = None

    def reset(self) -> None:
        """A new assignment: every partition must be anchored again before use."""
        self._parts.clear()

    def needs_anchor(self, partition: Hashable) -> bool:
        return partition not in self._parts

    def anchor(self, partition: Hashable, next_offset: int) -> None:
        """Start the partition at ``next_offset`` (the committed offset, or the log start)."""
        self._parts[partition] = _Partition(expected=next_offset, progressed_at=self._clock(),
                                            anchored=next_offset)

    def untouched_at(self, partition: Hashable) -> int | None:
        """The offset the partition was anchored at, while no message of it has been
        admitted since (None: one has, or it is not anchored): everything before it
        was handled by whoever committed it."""
        part = self._parts.get(partition)
        if part is None or part.expected != part.anchored:
            return None
        return part.expected

    def admit(self, partition: Hashable, offset: int) -> Verdict:
        """The verdict for one message; PROCESS moves the partition on by one."""
        part = self._parts.get(partition)
        if part is None:
            return Verdict.UNANCHORED
        if offset == part.expected:
            part.expected += 1
            part.gap_seen = False
            part.progressed_at = self._clock()
            return Verdict.PROCESS
        if offset < part.expected:
            return Verdict.REPLAYED
        part.gap_seen = True
        return Verdict.GAP

    def check_position(self, partition: Hashable, position: int | None) -> None:
        """Called periodically with the consumer's fetch position.

        A hole that no later message reveals (Faust jumped to the end of a partition
        that then stays quiet, or a re-fetch was dropped again) shows as a position
        past ``expected`` with no progress for ``stall_seconds``: it becomes a gap.
        """
        part = self._parts.get(partition)
        if part is None or position is None or position <= part.expected:
            return
        if self._clock() - part.progressed_at >= self.stall_seconds:
            part.gap_seen = True

    def partitions(self) -> list[Hashable]:
        """The anchored partitions, in the order they were anchored."""
        return list(self._parts)

    def refetch_due(self, partition: Hashable) -> int | None:
        """The offset to seek back to, if the partition has a gap and no recent seek."""
        part = self._parts.get(partition)
        if part is None or not part.gap_seen:
            return None
        now = self._clock()
        if now - part.last_refetch < self.refetch_seconds:
            return None
        part.last_refetch = now
        return part.expected

    def accept_log_start(self, partition: Hashable, log_start: int) -> int:
        """Skip offsets the log no longer has; returns how many were lost to retention."""
        part = self._parts.get(partition)
        if part is None or log_start <= part.expected:
            return 0
        lost = log_start - part.expected
        part.expected = log_start
        part.gap_seen = False
        return lost

    def commit_limit(self, partition: Hashable) -> int | None:
        """The highest offset that may be committed (None: commit nothing yet): what
        the detectors saw, and no further than ``floor`` allows (the first sample some
        job's engine folded in but has not checkpointed yet)."""
        part = self._parts.get(partition)
        if part is None:
            return None
        held = self.floor(partition) if self.floor is not None else None
        return part.expected if held is None else min(part.expected, held)
