"""Reliable delivery to one channel: its own thread and bounded queue, a rate limit,
jittered exponential backoff that honours ``Retry-After``, no retry on permanent
errors, a delivery log and a dead-letter for what could not be delivered.

A channel that is down only fills its own queue: the alerter, Redis state and the
other channels go on. When the queue is full the new message is dead-lettered
(counted, never dropped silently).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from vigil_gpu_monitor.alerting.channels import Channel, DeliveryError
from vigil_gpu_monitor.contracts.messages import Detection

log = logging.getLogger(__name__)

Outcome = Callable[[str, Detection, str, int, str], None]  # channel, det, result, tries, why


@dataclass(frozen=True)
class DeliveryPolicy:
    """Per-channel limits: messages per second, retries and their backoff."""

    rate_per_second: float = 1.0
    max_attempts: int = 6
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0
    give_up_after_seconds: float = 600.0
    queue_size: int = 10000


class ChannelWorker:
    """Delivers one channel's messages in order, in a background thread."""

    def __init__(self, channel: Channel, policy: DeliveryPolicy, on_outcome: Outcome,
                 rng: random.Random | None = None) -> None:
        self.channel = channel
        self.policy = policy
        self.on_outcome = on_outcome
        self._rng = rng or random.Random()
        self._queue: queue.Queue[Detection] = queue.Queue(policy.queue_size)
        self._stop = threading.Event()
        self._next_send = 0.0
        self._thread = threading.Thread(target=self._run, name=f"deliver-{channel.name}",
                                        daemon=True)
        self._thread.start()

    def submit(self, det: Detection) -> None:
        """Queue a detection; a full queue dead-letters it at once."""
        try:
            self._queue.put_nowait(det)
        except queue.Full:
            self.on_outcome(self.channel.name, det, "dead_letter", 0, "queue full")

    def pending(self) -> int:
        """Messages waiting (not counting the one being sent)."""
        return self._queue.qsize()

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the current message; what is still queued is dead-lettered."""
        self._stop.set()
        self._thread.join(timeout)
        while True:
            try:
                det = self._queue.get_nowait()
            except queue.Empty:
                return
            self.on_outcome(self.channel.name, det, "dead_letter", 0, "alerter stopping")

    def _wait(self, seconds: float) -> bool:
        """Sleep unless stopping; True when the sleep ran its course."""
        return not self._stop.wait(max(0.0, seconds))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                det = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self._deliver(det)

    def _deliver(self, det: Detection) -> None:
        p = self.policy
        started = time.monotonic()
        for attempt in range(1, p.max_attempts + 1):
            if not self._wait(self._next_send - time.monotonic()):
                self._requeue_or_dead(det)
                return
            self._next_send = time.monotonic() + 1.0 / p.rate_per_second
            try:
                self.channel.send(det)
            except DeliveryError as exc:
                if exc.permanent:
                    self.on_outcome(self.channel.name, det, "dead_letter", attempt, str(exc))
                    return
                backoff = min(p.max_backoff_seconds, p.backoff_seconds * 2 ** (attempt - 1))
                delay = max(exc.retry_after or 0.0, backoff * self._rng.uniform(0.5, 1.0))
                out_of_time = time.monotonic() + delay - started > p.give_up_after_seconds
                if attempt == p.max_attempts or out_of_time:
                    self.on_outcome(self.channel.name, det, "dead_letter", attempt, str(exc))
                    return
                self.on_outcome(self.channel.name, det, "retry", attempt, str(exc))
                if not self._wait(delay):
                    self._requeue_or_dead(det)
                    return
                continue
            except Exception as exc:  # a bug in a channel must not kill its thread
                log.exception("channel %s failed", self.channel.name)
                self.on_outcome(self.channel.name, det, "dead_letter", attempt, repr(exc))
                return
            self.on_outcome(self.channel.name, det, "delivered", attempt, "")
            return

    def _requeue_or_dead(self, det: Detection) -> None:
        self.on_outcome(self.channel.name, det, "dead_letter", 0, "alerter stopping")
