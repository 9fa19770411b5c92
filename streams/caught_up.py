"""When each partition a worker reads was last wholly handled: everything the broker
held in it then had been through the detectors.

Stage 1 seals a quiet shard's bins by its job's watermark (``streams/stage1.py``): a
shard whose nodes all fell silent has no sample of its own to seal by. "Quiet" must
mean nothing of the shard waits in Kafka, not only that no batch of it came for a
while: a restarted worker with a backlog, slowed by a rebalance, its table's recovery
or a loaded machine, can go seconds between two batches of one shard, and a shard
that took the job's watermark then sealed bins its samples had not reached (its
nodes found silent, the rest of its backlog late). The CI run of 2026-11-27 saw
exactly that in ``tests/reliability/test_two_stage_crash.py``.

So every second the worker notes each assigned partition's high watermark (the
consumer's, from its last fetch response) beside the offset handled so far. Once
the handled offset reaches a high watermark noted at time ``t``, the partition was
wholly handled as of ``t`` less ``HIGHWATER_STALE_SECONDS`` (how old the consumer's
high watermark may be). A shard may take its job's watermark only when that moment
is after its own last batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

# how old the consumer's high watermark may be when read: its last fetch response,
# which waits at most fetch.max.wait.ms (aiokafka: 0.5 s) once nothing is buffered
HIGHWATER_STALE_SECONDS = 2.0
NOTED = 64  # high watermarks noted a partition, at most (the oldest go first)


class CaughtUp:
    """Per partition: the latest moment everything in it had been handled."""

    def __init__(self, stale_seconds: float = HIGHWATER_STALE_SECONDS) -> None:
        self.stale_seconds = stale_seconds
        self._noted: dict[Hashable, deque[tuple[float, int]]] = {}
        self._handled_as_of: dict[Hashable, float] = {}

    def note(self, partition: Hashable, highwater: int | None, handled: int | None,
             now: float) -> None:
        """The partition's high watermark as the consumer knows it at ``now``
        (monotonic), and the next offset the worker has not handled yet."""
        if highwater is None:
            return
        noted = self._noted.setdefault(partition, deque(maxlen=NOTED))
        if not noted or highwater > noted[-1][1]:
            noted.append((now - self.stale_seconds, highwater))
        if handled is None:
            return
        while noted and noted[0][1] <= handled:
            at, _ = noted.popleft()
            self._handled_as_of[partition] = max(at, self._handled_as_of.get(partition, at))

    def handled_as_of(self, partition: Hashable) -> float | None:
        """The latest moment (monotonic) the whole partition had been handled, None
        while it has not been seen so since it was assigned."""
        return self._handled_as_of.get(partition)

    def reset(self) -> None:
        """A new assignment: a partition handed back may have been read elsewhere."""
        self._noted.clear()
        self._handled_as_of.clear()
