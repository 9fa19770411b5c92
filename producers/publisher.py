"""Publish samples to Kafka with kafka-python: keyed by job, compressed, acks=all."""

from __future__ import annotations

import logging
from typing import Any

from kafka import KafkaProducer

from contracts.codec import encode_sample

log = logging.getLogger(__name__)


class KafkaPublisher:
    """Sends validated samples; counts what was sent and what failed."""

    def __init__(self, bootstrap: str, topic: str, **client: Any) -> None:
        self.topic = topic
        self.sent = 0
        self.failed = 0
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", compression_type="gzip",
            linger_ms=20, batch_size=256 * 1024, max_request_size=4 << 20, **client)

    def _on_error(self, exc: BaseException) -> None:
        self.failed += 1
        log.warning("publish failed: %s", exc)

    def publish(self, sample: dict[str, Any]) -> None:
        """Queue one sample (validated first: nothing off-contract leaves the node)."""
        future = self._producer.send(self.topic, key=sample["job"].encode(),
                                     value=encode_sample(sample))
        future.add_errback(self._on_error)
        self.sent += 1

    def close(self, timeout: float = 30.0) -> None:
        """Flush everything queued, then close the connection."""
        self._producer.flush(timeout=timeout)
        self._producer.close(timeout=timeout)
