"""Publish samples to Kafka without ever blocking the sampling loop or losing data
quietly.

``BufferedPublisher.publish`` validates, encodes and appends to a bounded buffer;
when the buffer is full the *oldest* sample is dropped and counted. A sender
thread owns the kafka-python producer (whose constructor blocks up to 30 s when no
broker answers, and whose own buffer is unbounded in 3.x): it keeps at most
``max_in_flight`` samples in the producer, and removes a sample from the buffer only
when Kafka acknowledged it (acks=all). So while the buffer has room nothing is lost
across a broker outage, and when it has not, ``dropped`` says exactly how much was.

**Order across failures.** A worker reads a node's samples that arrive older than
its newest as late, so a publisher must not let newer samples overtake older ones.
A producer breaks that order when it fails a sample: kafka-python expires a batch
that waited out its delivery timeout while the batches after it, younger, still go
out once the broker is back (seen against a broker that took 25 s to load 5,900
partitions after a restart: the middle of a run arrived after its end, and the
worker called five nodes silent). And kafka-python 3.0.12's idempotent producer
(its default) can stall after such a restart: its batches stay queued, never sent
and never expired, though the partition's leader is known again (it lost its
producer id and never asks for another: ``contracts.config.KAFKA_PYTHON_PRODUCER``,
which the producers here start from, turns idempotence off for that; the watch
below stays for any other stall). So one retriable failure (a timeout, the broker
away; a sample refused for good, by an ACL say, goes back alone), or a sample
unanswered for ``stall_seconds`` (twice the delivery timeout, which bounds every
answer of a working producer), puts *every* sample in flight back, in the order they
were first taken; the producer is force-closed and a new one sends them before
anything newer. The old
producer's late answers are ignored, so ``published`` counts each sample once (any
it did deliver reach Kafka twice: the worker drops duplicates), and ``errors``
counts each failure that sent the samples back once. A younger batch the broker took
before the failure was noticed cannot be called back: the order is kept for what a
failure returns (in the restarts seen, nothing got through before the expiry).

With a ``Signer`` (``identity.node_key``), each record carries the node's proof of
its exact value bytes in its headers (``contracts.identity``), computed as it is
sent, so samples from the spool are signed too.

With a ``DiskSpool``, the oldest samples overflow from memory to disk instead of
being dropped; the sender drains the spool (older) before memory, and on close
whatever Kafka did not take is spilled to disk, so the next start sends it. Drops
then happen only when the spool is full too (its oldest segment, counted).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.partitioner import Partitioner

from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import KAFKA_PYTHON_PRODUCER
from vigil_gpu_monitor.contracts.identity import Signer
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.contracts.partition import shard_partition
from vigil_gpu_monitor.contracts.shards import shard_key
from vigil_gpu_monitor.producers.spool import DiskSpool

log = logging.getLogger(__name__)
Shards = Callable[[str], int]  # job → its shard count (docs/sharding.md)
Item = tuple[float, bytes, bytes]  # (when it was buffered, key, value)


def sample_key(sample: Sample, shards: Shards | None) -> bytes:
    """The record key: the job id, or ``job#k/K`` for a job split in K shards."""
    return shard_key(sample["job"], sample["node"],
                     shards(sample["job"]) if shards and sample["job"] else 1).encode()


class ShardPartitioner(Partitioner):
    """``contracts.partition.shard_partition`` as kafka-python's partitioner: a
    sharded job's shards on distinct partitions, every other key where Kafka's
    default partitioner sends it (the workers' Faust producer uses the same rule)."""

    def partition(self, topic: str, key: Any, serialized_key: bytes | None, value: Any,
                  serialized_value: bytes | None, cluster: Any) -> int:
        if topic not in cluster.topics():
            raise ValueError(f"topic {topic} not found in the cluster's metadata")
        return shard_partition(serialized_key, sorted(cluster.partitions_for_topic(topic)),
                               list(cluster.available_partitions_for_topic(topic)))


class KafkaPublisher:
    """A plain synchronous-flush publisher (the simulator's fast path). ``client``:
    kafka-python producer settings, over the defaults below (a benchmark sets
    ``batch_size=1`` to send one record a batch, as a node's agent does)."""

    def __init__(self, bootstrap: str, topic: str, signer: Signer | None = None,
                 shards: Shards | None = None, **client: Any) -> None:
        self.topic = topic
        self.signer = signer
        self.shards = shards
        self.sent = 0
        self.failed = 0
        self._producer = KafkaProducer(**{
            "bootstrap_servers": bootstrap, "acks": "all", "compression_type": "gzip",
            "linger_ms": 20, "batch_size": 256 * 1024, "max_request_size": 1 << 20,
            "partitioner": ShardPartitioner(), **KAFKA_PYTHON_PRODUCER, **client})

    def _on_error(self, exc: BaseException) -> None:
        self.failed += 1
        log.warning("publish failed: %s", exc)

    def publish(self, sample: Sample) -> None:
        """Queue one sample (validated first: nothing off-contract leaves the node)."""
        value = encode_sample(sample)
        future = self._producer.send(self.topic, key=sample_key(sample, self.shards), value=value,
                                     headers=self.signer.headers(value) if self.signer else None)
        future.add_errback(self._on_error)
        self.sent += 1

    def close(self, timeout: float = 30.0) -> None:
        """Flush everything queued, then close the connection."""
        self._producer.flush(timeout=timeout)
        self._producer.close(timeout=timeout)


ProducerFactory = Callable[[], Any]


def _close(producer: Any, timeout: float) -> None:
    """Close a kafka-python producer, forcing it closed if it cannot flush in
    ``timeout``: kafka-python 3.0.12's ``close`` raises ``KafkaTimeoutError`` from
    its flush before it reaches its own force-close, which would leave its I/O thread
    running with what it holds."""
    try:
        producer.close(timeout=timeout)
    except KafkaError as exc:
        log.warning("the Kafka producer did not flush in %.0f s (%s): closing it "
                    "without waiting", timeout, exc)
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()


class BufferedPublisher:
    """Bounded, never-blocking, loss-accounted publishing (see the module docstring)."""

    def __init__(self, bootstrap: str, topic: str, capacity: int = 100_000,
                 max_in_flight: int = 2000, producer_factory: ProducerFactory | None = None,
                 spool: DiskSpool | None = None, signer: Signer | None = None,
                 shards: Shards | None = None, stall_seconds: float | None = None,
                 **client: Any) -> None:
        self.topic = topic
        self.shards = shards  # a job split in shards is keyed job#k/K
        self.signer = signer  # signs each value as it is sent (spooled ones too)
        self.spool = spool
        self.capacity = capacity
        self.max_in_flight = max_in_flight
        self._factory = producer_factory or (lambda: KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", compression_type="gzip", linger_ms=50,
            batch_size=256 * 1024, request_timeout_ms=10_000, delivery_timeout_ms=30_000,
            max_block_ms=5_000, reconnect_backoff_max_ms=2_000,
            # a producer made while no broker answers gives up within close's wait for
            # the sender (kafka-python's default is 30 s), and is made again 1 s later
            bootstrap_timeout_ms=5_000,
            **{"partitioner": ShardPartitioner(), **KAFKA_PYTHON_PRODUCER, **client}))
        # twice the delivery timeout (the default factory's, or the one ``client`` sets)
        self.stall_seconds = stall_seconds if stall_seconds is not None else (
            2 * client.get("delivery_timeout_ms", 30_000) / 1000)
        self._buffer: deque[Item] = deque()
        self._retry: list[tuple[int, Item]] = []  # failed, by the order they were taken
        self._taken = itertools.count()
        # each send's own number → (when it was taken, its place in the sending order
        # and item): sent and not answered yet, oldest first (a dict keeps its
        # insertion order). An answer for a number not here is a late one from a
        # replaced producer.
        self._flights = itertools.count()
        self._flying: dict[int, tuple[float, tuple[int, Item]]] = {}
        self._replace = False  # a failure: the producer is to be replaced
        self._lock = threading.Condition()
        self.published = 0
        self._dropped = 0
        self.errors: Counter[str] = Counter()
        self.latencies: deque[float] = deque(maxlen=10_000)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vigil-publisher", daemon=True)
        self._thread.start()

    @property
    def buffered(self) -> int:
        """Samples not yet acknowledged (in memory, in flight or spooled)."""
        with self._lock:
            return self._held() + (len(self.spool) if self.spool else 0)

    @property
    def dropped(self) -> int:
        """Samples lost: from a full memory buffer, or from a full spool."""
        return self._dropped + (self.spool.dropped if self.spool else 0)

    def _held(self) -> int:
        """Samples held in memory: waiting, waiting again, or in flight."""
        return len(self._buffer) + len(self._retry) + len(self._flying)

    def _overflow(self, item: Item) -> None:
        """No room in memory for ``item``: spool it, or count it dropped."""
        if self.spool is not None:
            self.spool.append(item[1], item[2])
        else:
            self._dropped += 1

    def publish(self, sample: Sample) -> None:
        """Validate, encode and buffer; never blocks on Kafka."""
        self._append((time.monotonic(), sample_key(sample, self.shards), encode_sample(sample)))

    def _append(self, item: Item) -> None:
        """Buffer ``item``, making room by dropping (or spooling) the oldest held."""
        with self._lock:
            if self._held() >= self.capacity:
                if self._retry:  # the oldest held
                    self._overflow(heapq.heappop(self._retry)[1])
                elif self._buffer:
                    self._overflow(self._buffer.popleft())
                else:  # everything is in flight: the new sample is the one that cannot fit
                    self._overflow(item)
                    return
            self._buffer.append(item)
            self._lock.notify()

    def _take(self) -> tuple[int, Item]:
        """The next sample to send, with its place in the sending order: failed ones
        first, then spooled ones (older than any in memory), then the buffer's."""
        if self._retry:
            return heapq.heappop(self._retry)
        if self.spool is not None:
            record = self.spool.pop()
            if record is not None:
                return next(self._taken), (time.monotonic(), *record)
        return next(self._taken), self._buffer.popleft()

    def _waiting(self) -> bool:
        return bool(self._buffer) or bool(self._retry) or bool(
            self.spool is not None and len(self.spool))

    def _stalled(self) -> bool:
        """Whether the oldest sample in flight has waited ``stall_seconds`` unanswered."""
        oldest = next(iter(self._flying.values()), None)
        return oldest is not None and time.monotonic() - oldest[0] > self.stall_seconds

    def _put_back(self) -> None:
        """Under the lock: every sample in flight back to be sent first, in the order
        they were first taken, through a new producer."""
        for _at, taken in self._flying.values():
            heapq.heappush(self._retry, taken)
        self._flying.clear()
        self._replace = True
        self._lock.notify_all()

    def _run(self) -> None:
        producer = None
        while True:
            with self._lock:
                while not self._stop.is_set() and (
                        not self._waiting() or len(self._flying) >= self.max_in_flight):
                    if producer is not None and (self._replace or self._stalled()):
                        break
                    self._lock.wait(0.2)
                if self._stop.is_set():
                    break
                if producer is not None and self._stalled():
                    log.warning("the Kafka producer answered none of %d samples for %.0f s: "
                                "sending them again through a new one", len(self._flying),
                                self.stall_seconds)
                    self.errors["stalled"] += 1
                    self._put_back()
                replace, self._replace = self._replace and producer is not None, False
                if not replace:
                    taken = self._take()
                    flight = next(self._flights)
                    self._flying[flight] = (time.monotonic(), taken)
            if replace:
                _close(producer, 0)
                producer = None
                continue
            item = taken[1]
            if producer is None:
                try:
                    producer = self._factory()  # may block while no broker answers
                except KafkaError as exc:
                    self._failed(flight, exc)
                    self._stop.wait(1.0)
                    continue
                with self._lock:  # its wait starts now (the only sample in flight)
                    self._flying[flight] = (time.monotonic(), taken)
            try:
                future = producer.send(self.topic, key=item[1], value=item[2], headers=(
                    self.signer.headers(item[2]) if self.signer is not None else None))
            except KafkaError as exc:  # e.g. no metadata within max_block_ms
                self._failed(flight, exc)
                self._stop.wait(0.5)
                continue
            future.add_callback(self._acked, flight)
            future.add_errback(self._failed, flight)
        if producer is not None:
            _close(producer, 5)

    def _acked(self, flight: int, _meta: Any) -> None:
        with self._lock:
            sent = self._flying.pop(flight, None)
            if sent is None:
                return  # answered late by a replaced producer: already put back
            self.published += 1
            self.latencies.append(time.monotonic() - sent[1][1][0])
            self._lock.notify_all()

    def _failed(self, flight: int, exc: BaseException) -> None:
        with self._lock:
            sent = self._flying.get(flight)
            if sent is None:
                return  # answered late by a replaced producer: already put back
            self.errors[type(exc).__name__] += 1
            if getattr(exc, "retriable", False):  # a timeout, the broker away: order at stake
                self._put_back()
            else:  # refused for good (an ACL, a size): it alone waits to be sent again
                del self._flying[flight]
                heapq.heappush(self._retry, sent[1])
                self._lock.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything buffered is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._waiting() or self._flying:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.2))
        return True

    def close(self, timeout: float = 30.0) -> bool:
        """Flush (bounded by ``timeout``), then stop the sender; True if nothing was left.
        With a spool, what is left in memory, unanswered samples included, is written
        to it for the next start."""
        flushed = self.flush(timeout)
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self._thread.join(10)
        if self.spool is not None:
            with self._lock:
                self._put_back()  # unanswered: they may not have got through
                while self._retry:
                    item = heapq.heappop(self._retry)[1]
                    self.spool.append(item[1], item[2])
                while self._buffer:
                    item = self._buffer.popleft()
                    self.spool.append(item[1], item[2])
                self.spool.sync()
        return flushed
