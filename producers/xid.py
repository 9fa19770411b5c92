"""XID events waiting to be published, one per GPU per tick.

The contract carries one ``xid`` code per GPU per sample ("the XID seen during the
interval"). A GPU can raise several XIDs within one tick (NVML's event set queues
them; dcgm-exporter's count metrics can rise by more than one), so a source hands its
events to ``PendingXids`` and publishes them one a tick, oldest first, instead of
letting a later code overwrite an earlier one. The queue of each GPU is bounded:
an XID storm drops the oldest events, and every drop is counted and logged, never
silent.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

log = logging.getLogger(__name__)
MAX_PENDING = 32  # per GPU: half a minute of one-a-second publishing


class PendingXids:
    """Per-GPU FIFO queues of XID codes not yet published."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._queues: dict[str, deque[int]] = {}
        self.dropped: Counter[str] = Counter()

    def push(self, gpu: str, code: int) -> None:
        """Queue one XID event of ``gpu``."""
        queue = self._queues.setdefault(gpu, deque())
        if len(queue) >= self.max_pending:
            lost = queue.popleft()
            self.dropped[gpu] += 1
            log.warning("GPU %s: more than %d XID events pending, XID %d dropped unpublished",
                        gpu, self.max_pending, lost)
        queue.append(code)

    def pop(self, gpu: str) -> int:
        """The next XID code of ``gpu`` to publish, or 0 for none."""
        queue = self._queues.get(gpu)
        if not queue:
            return 0
        code = queue.popleft()
        if not queue:
            del self._queues[gpu]
        return code

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())
