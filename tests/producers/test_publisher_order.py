"""The publisher's sending order across failures, with a producer that fails on
command (the broker outage itself is tested against a real broker in
``tests/integration/test_publisher.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

from vigil_gpu_monitor.contracts import SAMPLE_SCHEMA
from vigil_gpu_monitor.contracts.codec import decode_sample
from vigil_gpu_monitor.producers.publisher import BufferedPublisher
from vigil_gpu_monitor.producers.spool import DiskSpool


class _Future:
    """kafka-python's FutureRecordMetadata as the publisher uses it: callbacks and
    errbacks that get their extra arguments first, then the value or the error."""

    def __init__(self, delivered: bool = False) -> None:
        self.delivered = delivered  # a future already done calls back at once
        self.callbacks: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.errbacks: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def add_callback(self, fn: Callable[..., None], *args: Any) -> None:
        if self.delivered:
            fn(*args, None)
        else:
            self.callbacks.append((fn, args))

    def add_errback(self, fn: Callable[..., None], *args: Any) -> None:
        self.errbacks.append((fn, args))


class _Producer:
    """Holds what it is sent, like a producer whose broker is away, until the test
    fails all of it (a delivery timeout) or lets it through."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: list[tuple[bytes, _Future]] = []
        self.delivered: list[bytes] = []
        self.up = False

    def send(self, _topic: str, key: bytes, value: bytes, headers: Any = None) -> _Future:
        with self.lock:
            if self.up:
                self.delivered.append(value)
                return _Future(delivered=True)
            future = _Future()
            self.held.append((value, future))
        return future

    def fail_all(self) -> None:
        with self.lock:
            held, self.held = self.held, []
        for _value, future in held:  # in the order they were sent, as a timeout fails them
            for fn, args in future.errbacks:
                fn(*args, KafkaTimeoutError("delivery timed out"))

    def fail_oldest(self, n: int) -> None:
        """The oldest ``n`` time out (one expired batch); the rest stay held."""
        with self.lock:
            failed, self.held = self.held[:n], self.held[n:]
        for _value, future in failed:
            for fn, args in future.errbacks:
                fn(*args, KafkaTimeoutError("delivery timed out"))

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held, []
            self.delivered.extend(value for value, _ in held)
        for _value, future in held:
            for fn, args in future.callbacks:
                fn(*args, None)

    def close(self, timeout: float = 0) -> None:
        pass


def _sample(i: int) -> dict[str, object]:
    return {"schema": SAMPLE_SCHEMA, "ts": 1_000_000.0 + i, "job": "j", "node": "n1",
            "gpus": {"0": {"sm_active": 0.5}}, "host": {}, "nics": {}}


def _wait(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the sender did not get there"
        time.sleep(0.01)


def test_samples_failed_in_flight_are_sent_again_oldest_first() -> None:
    producer = _Producer()
    pub = BufferedPublisher("unused:9092", "samples", max_in_flight=8,
                            producer_factory=lambda: producer)
    for i in range(20):
        pub.publish(_sample(i))
    _wait(lambda: len(producer.held) == 8)  # the first eight in flight, then the outage
    for _ in range(2):  # failed once, and again
        producer.fail_all()
        _wait(lambda: len(producer.held) == 8)
        with producer.lock:
            again = [decode_sample(v)["ts"] - 1_000_000.0 for v, _ in producer.held]
        assert again == list(range(8))  # the same eight, oldest first
    producer.up = True
    producer.release()
    assert pub.flush(10)
    pub.close(1)
    assert [decode_sample(v)["ts"] - 1_000_000.0 for v in producer.delivered] == list(range(20))
    assert pub.errors["KafkaTimeoutError"] == 2 and pub.published == 20 and pub.dropped == 0


def test_a_full_buffer_drops_the_oldest_even_while_it_waits_to_be_sent_again() -> None:
    producer = _Producer()
    pub = BufferedPublisher("unused:9092", "samples", capacity=10, max_in_flight=4,
                            producer_factory=lambda: producer)
    for i in range(10):
        pub.publish(_sample(i))
    _wait(lambda: len(producer.held) == 4)
    producer.fail_all()  # 0-3 wait to be sent again ...
    _wait(lambda: len(producer.held) == 4)
    producer.fail_all()
    for i in range(10, 13):
        pub.publish(_sample(i))  # ... and the oldest held give way to the newest
    producer.up = True
    producer.release()
    assert pub.flush(10)
    pub.close(1)
    delivered = [decode_sample(v)["ts"] - 1_000_000.0 for v in producer.delivered]
    assert pub.dropped == 3 and len(delivered) == 10
    assert delivered == sorted(delivered) and delivered[-1] == 12


class _StalledProducer(_Producer):
    """A producer that holds what it is sent and never answers, as kafka-python
    3.0.12's did after a broker restart; it answers only when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.closed: list[float] = []

    def close(self, timeout: float = 0) -> None:
        self.closed.append(timeout)


def test_a_producer_that_never_answers_is_replaced_and_its_samples_sent_again() -> None:
    stalled, fresh = _StalledProducer(), _Producer()
    fresh.up = True
    made = iter([stalled, fresh])
    pub = BufferedPublisher("unused:9092", "samples", max_in_flight=4, stall_seconds=0.3,
                            producer_factory=lambda: next(made))
    for i in range(10):
        pub.publish(_sample(i))
    assert pub.flush(10)  # the stalled one is given up on, the fresh one takes all
    assert stalled.closed == [0] and pub.errors["stalled"] == 1
    assert [decode_sample(v)["ts"] - 1_000_000.0 for v in fresh.delivered] == list(range(10))
    stalled.release()  # a late answer from the abandoned producer counts nothing
    stalled.fail_all()
    pub.close(1)
    assert pub.published == 10 and pub.buffered == 0 and pub.dropped == 0
    assert pub.errors["KafkaTimeoutError"] == 0


def test_one_failure_sends_everything_in_flight_again_in_order_through_a_new_producer() -> None:
    """kafka-python expires its oldest batch while the younger ones still go out once
    the broker is back: put back alone, the oldest would arrive after them."""
    first, second = _Producer(), _Producer()
    second.up = True
    made = iter([first, second])
    pub = BufferedPublisher("unused:9092", "samples", max_in_flight=8,
                            producer_factory=lambda: next(made))
    for i in range(12):
        pub.publish(_sample(i))
    _wait(lambda: len(first.held) == 8)
    first.fail_oldest(3)
    assert pub.flush(10)
    first.up = True
    first.release()  # what the first still held gets through, late: counted nowhere
    pub.close(1)
    assert [decode_sample(v)["ts"] - 1_000_000.0 for v in second.delivered] == list(range(12))
    assert pub.published == 12 and pub.errors["KafkaTimeoutError"] == 1 and pub.buffered == 0


def test_samples_unanswered_at_close_go_to_the_spool(tmp_path: Path) -> None:
    """An agent stopped while its producer holds samples unanswered keeps them for its
    next start (they used to be forgotten: neither sent, spooled nor counted)."""
    held = _StalledProducer()
    pub = BufferedPublisher("unused:9092", "samples", max_in_flight=4,
                            producer_factory=lambda: held,
                            spool=DiskSpool(tmp_path / "spool"))
    for i in range(6):
        pub.publish(_sample(i))
    _wait(lambda: len(held.held) == 4)
    assert not pub.close(0.2)
    spool = DiskSpool(tmp_path / "spool")
    records = [spool.pop() for _ in range(len(spool))]
    assert [decode_sample(r[1])["ts"] - 1_000_000.0 for r in records if r] == list(range(6))


def test_a_sample_refused_for_good_goes_back_alone() -> None:
    """An error Kafka will not retry (an ACL) is no broken order: the producer stays,
    and the sample waits to be sent again while the others go on."""
    producer = _Producer()
    pub = BufferedPublisher("unused:9092", "samples", max_in_flight=4,
                            producer_factory=lambda: producer)
    for i in range(4):
        pub.publish(_sample(i))
    _wait(lambda: len(producer.held) == 4)
    with producer.lock:
        (_value, future), producer.held = producer.held[0], producer.held[1:]
    producer.up = True
    for fn, args in future.errbacks:
        fn(*args, TopicAuthorizationFailedError("denied"))
    producer.release()
    assert pub.flush(10)
    pub.close(1)
    assert pub.errors["TopicAuthorizationFailedError"] == 1 and pub.published == 4
    assert sorted(decode_sample(v)["ts"] - 1_000_000.0 for v in producer.delivered) == [0, 1, 2, 3]
