"""The alerter's producer is replaced after a failed send (kafka-python 3.0.12's can
stall after a broker restart, and every later alert would wait behind it), without
waiting on a broker that is away: the new one is made with the old one's version."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError

from tests.alerting.test_delivery import det
from vigil_gpu_monitor.alerting.channels import DeliveryError, KafkaAlertsChannel
from vigil_gpu_monitor.alerting.service import RenewingProducer
from vigil_gpu_monitor.contracts.messages import Detection


class _Future:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def get(self, timeout: float | None = None) -> None:
        if self.error is not None:
            raise self.error


class _Producer:
    """A kafka-python producer as the alerter uses it; ``stuck`` ones never deliver,
    and their ``close`` raises as 3.0.12's does when it cannot flush."""

    def __init__(self, stuck: bool, **config: Any) -> None:
        self.stuck = stuck
        self.config = {"api_version": (3, 9), **config}
        self.sent: list[bytes] = []
        self.closed = False
        self._sender = self  # what the forced close reaches

    def send(self, topic: str, key: bytes, value: bytes) -> _Future:
        self.sent.append(value)
        return _Future(KafkaTimeoutError("Timeout waiting for future") if self.stuck else None)

    def close(self, timeout: float | None = None) -> None:
        if self.stuck:
            raise KafkaTimeoutError("Timeout waiting for future")
        self.closed = True

    def force_close(self) -> None:
        self.closed = True


def test_a_failed_alert_leaves_the_stuck_producer_for_a_new_one() -> None:
    made: list[tuple[_Producer, dict[str, Any]]] = []

    def make(**more: Any) -> _Producer:
        producer = _Producer(stuck=not made, **more)  # the first one is stuck
        made.append((producer, more))
        return producer

    channel = KafkaAlertsChannel(RenewingProducer(make), "alerts")
    alert: Detection = det(ident="inc-1")
    with pytest.raises(DeliveryError):
        channel.send(alert)  # the alerter retries it later ...
    channel.send(alert)  # ... through a new producer
    (first, _), (second, more) = made
    assert first.closed and len(first.sent) == 1 and len(second.sent) == 1
    assert more == {"api_version": (3, 9)}  # no bootstrap while the broker may be away
