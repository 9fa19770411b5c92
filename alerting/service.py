"""`vigil alerter`: consume ``vigil.detections`` into Redis, committing after each batch.

Offsets are committed only once a batch is in Redis, so a crash replays it, and the
idempotent writes of ``LiveState`` make the replay harmless. A malformed detection
is logged and counted, never fatal.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

import redis
from kafka import KafkaConsumer

from alerting.state import LiveState
from contracts import topics
from contracts.codec import decode_detection
from contracts.config import Config
from contracts.errors import ContractError

log = logging.getLogger(__name__)


class Alerter:
    """One consume → apply → commit loop."""

    def __init__(self, cfg: Config, consumer: KafkaConsumer, state: LiveState) -> None:
        self.cfg = cfg
        self.consumer = consumer
        self.state = state
        self.applied = 0
        self.duplicates = 0
        self.invalid = 0
        self._stop = False

    def stop(self, *_: object) -> None:
        """Ask the loop to finish its batch and return."""
        self._stop = True

    def poll_once(self, timeout_ms: int = 1000) -> int:
        """Handle one poll's records; returns how many there were."""
        batches = self.consumer.poll(timeout_ms=timeout_ms, max_records=500)
        count = 0
        for records in batches.values():
            for record in records:
                count += 1
                try:
                    det = decode_detection(record.value)
                except ContractError as exc:
                    self.invalid += 1
                    log.warning("invalid detection at %s[%d]@%d: %s", record.topic,
                                record.partition, record.offset, exc)
                    continue
                if self.state.apply(det):
                    self.applied += 1
                else:
                    self.duplicates += 1
        if count:
            self.consumer.commit()
        return count

    def run(self, max_seconds: float | None = None) -> None:
        """Loop until ``stop()`` or ``max_seconds``."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while not self._stop and (deadline is None or time.monotonic() < deadline):
            self.poll_once()


def run_alerter(cfg: Config, max_seconds: float | None = None) -> int:
    """Build the consumer and Redis client from config and run until SIGTERM/SIGINT."""
    consumer = KafkaConsumer(
        topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
        bootstrap_servers=cfg.kafka_bootstrap, group_id=cfg.alerter.group_id,
        enable_auto_commit=False, auto_offset_reset="earliest")
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix,
                      cfg.redis.history_max)
    alerter = Alerter(cfg, consumer, state)

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        alerter.stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        alerter.run(max_seconds)
    finally:
        consumer.close()
        log.info("alerter stopped: %d applied, %d duplicates, %d invalid",
                 alerter.applied, alerter.duplicates, alerter.invalid)
    return 0
