"""The Faust application: consume samples and step timings, keep per-job engines,
detect, publish.

Samples (``vigil.samples``) and step timings (``vigil.steps``, ``vigil.step/1``) are
both keyed by job and have the same partition count, so one job's engine lives on one
worker: Faust's partition assignor puts co-subscribed topics with equal partition
counts in one co-partitioned group and gives partition *p* of each to the same
worker (``faust.assignor.PartitionAssignor._get_copartitioned_groups`` and
``CopartitionedAssignor``), as it does for the engine table's changelog. One stream
processor reads both topics (one Faust channel of two topics), so a job's samples
and timings are never folded concurrently. Every batch
passes the offset guard first (`streams.continuity`): the detectors see each
partition's offsets once and in order, and Faust never commits past one they did
not see, whatever a rebalance does to Faust's delivery. The stream processor (a
Faust "agent", unrelated to the node agent) runs with concurrency 1 and works in
batches (Faust's per-message cost is high, and concurrency > 1 can commit past
in-flight messages); what it does with a batch and on a rebalance is
``streams.processor.BatchProcessor``, testable without Kafka.

State: live engines stay in this process. An engine is checkpointed to the
changelogged ``engines`` table (compressed) whenever it publishes a detection,
every ``worker.checkpoint_steps`` evaluated steps, and all of them on a rebalance
before they are dropped. Commits never pass a sample that some job's checkpoint
lacks (``BatchProcessor.commit_floor``), and each checkpoint keeps the offsets its
engine folded in: a worker that takes over a partition starts from the last
checkpoint, gets again every sample since, and skips what a checkpoint already
holds, so it decides exactly what replay of the same samples decides (issue #28:
crash equals replay). Detections are sent before the checkpoint, so a crash can
repeat a detection (same id and state: consumers and the alerter treat it as a
duplicate) but never lose one. The table lives in Faust's
memory store, rebuilt from the compacted changelog at start (measured in
bench/RESULTS.md "Table store"; Faust's RocksDB store cannot take writes made outside
its per-event context, as these checkpoints are). Faust's exactly-once
mode is not used: it is broken upstream (faust-streaming issues 517, 323, 440).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any

import faust

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.partition import shard_partition
from vigil_gpu_monitor.contracts.status import encode_status, feed_key
from vigil_gpu_monitor.streams.align import AlignParams
from vigil_gpu_monitor.streams.continuity import Continuity
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import BatchProcessor
from vigil_gpu_monitor.streams.timers import guarded_timer

log = logging.getLogger(__name__)
QUIET_CHECKPOINT_SECONDS = 2.0  # a job with no batch this long is checkpointed
# ... and one with none this long (a job that ended) is dropped from memory: it comes
# back from its checkpoint if it sends again
IDLE_EVICT_SECONDS = 900.0
NEW_JOB_WAIT_SECONDS = 3.0  # a job new to this worker: its samples wait this for timings
CHANGELOG_MAX_BYTES = 32 << 20


class _FaustOutlets:
    """The processor's outlets as Faust topics."""

    def __init__(self, detections: Any, deadletter: Any) -> None:
        self._detections = detections
        self._deadletter = deadletter

    async def detection(self, key: bytes, value: bytes, headers: dict[str, bytes]) -> None:
        await self._detections.send(key=key, value=value, headers=headers)

    async def deadletter(self, key: bytes | None, value: bytes) -> None:
        await self._deadletter.send(key=key, value=value)


class PerBatchMonitor(faust.Monitor):
    """Faust's Monitor without its per-message bookkeeping. The Monitor (Faust's
    built-in sensor, chosen with the documented ``Monitor`` setting) counts and
    times every message and event for Faust's web page, which the worker does not
    serve; the worker's own Prometheus metrics count per batch. Commit, send and
    rebalance statistics stay (bench/RESULTS.md, "Faust's own per-event cost").

    Faust's check for a stalled stream (its consumer thread logs "Stream has not
    started processing" when a partition has a backlog and no event of it has
    entered the stream for ``stream_processing_timeout``) reads the time the Monitor
    notes per event. Without it, any backlog older than that read as a stalled
    stream, every few seconds (found in the soak at twice the worker's rate): the
    worker notes it once per batch instead (``on_batch_in``)."""

    def on_batch_in(self, events: Sequence[Any]) -> None:
        """The stream took these events: each one's partition is being processed now
        (what the per-event hook noted for Faust's stalled-stream check)."""
        now = time.monotonic()
        inbound = self.stream_inbound_time
        for event in events:
            inbound[event.message.tp] = now

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        """Not counted per message."""

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any,
                           event: Any) -> dict[str, Any] | None:
        """Not counted per event."""
        return None

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any,
                            state: dict[str, Any] | None = None) -> None:
        """Not timed per event."""

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        """Not timed per message."""


def kafka_credentials(cfg: Config) -> faust.types.auth.CredentialsT | None:
    """The configured Kafka security as Faust credentials (None for PLAINTEXT)."""
    k = cfg.kafka
    context = None
    if k.security_protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=k.ssl_cafile or None)
        if k.ssl_certfile:
            context.load_cert_chain(k.ssl_certfile, k.ssl_keyfile)
    if k.security_protocol.startswith("SASL_"):
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password.reveal() if k.sasl_password else "",
            mechanism=k.sasl_mechanism, ssl_context=context)
    if context is not None:
        return faust.SSLCredentials(context)
    return None



def faust_app(cfg: Config, app_id: str, datadir: str, partitions: int,
              replication_factor: int) -> faust.App:
    """A Faust app with Vigil's settings (the one-stage worker's and each stage's):
    tables in memory rebuilt from their changelogs, acks from every replica, the
    session and fetch sizes of ``worker``, one monitor call a batch, and the agents'
    partitioner (``contracts/partition.py``: a stage-1 shard's checkpoint lands on
    the changelog partition of the samples partition its shard is read from)."""
    return faust.App(
        app_id,
        broker=f"kafka://{cfg.kafka_bootstrap}",
        store="memory://",
        datadir=datadir,
        topic_partitions=partitions,
        topic_replication_factor=replication_factor,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        producer_acks=-1,
        producer_max_request_size=CHANGELOG_MAX_BYTES,
        broker_session_timeout=cfg.worker.session_timeout_seconds,
        broker_heartbeat_interval=max(0.5, cfg.worker.session_timeout_seconds / 10),
        broker_credentials=kafka_credentials(cfg),
        consumer_max_fetch_size=cfg.worker.fetch_bytes_per_partition,
        producer_partitioner=shard_partition,
        Monitor=PerBatchMonitor,
    )


def wire_processor(app: faust.App, cfg: Config, metrics: WorkerMetrics,
                   processor: BatchProcessor, source: Any, inbound: tuple[str, ...],
                   status: Any, label: str) -> Continuity:
    """Run ``processor`` on ``source`` (a channel over the ``inbound`` topics, the
    first the one whose lag is reported) in ``app``: the offset guard, the
    revocation order, the batch agent with concurrency 1, and the offset, quiet
    checkpoint, lag and status timers. ``label`` prefixes its log lines (a stage)."""
    lag_now: dict[str, int] = {}  # partition → lag, as the lag timer last saw it
    continuity = Continuity(app, inbound, metrics)
    continuity.guard.floor = processor.commit_floor  # never commit past a checkpoint

    async def _on_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        # Faust flushed its producer before this signal; the checkpoints written now
        # must reach the changelog before the next owner recovers the table from it,
        # and the commit must never be ahead of them.
        await processor.on_revoked(app.producer.flush, continuity.commit_processed)

    async def _on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        continuity.on_assigned()

    app.on_partitions_revoked.connect(_on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(_on_assigned)  # type: ignore[arg-type]

    @app.agent(source, concurrency=1)
    async def process(stream: Any) -> None:
        """The Faust stream processor (Faust calls it an agent; not the node agent)."""
        async for events in stream.take_events(cfg.worker.batch_size,
                                               within=cfg.worker.batch_seconds):
            if isinstance(app.monitor, PerBatchMonitor):
                app.monitor.on_batch_in(events)
            try:
                await processor.handle(await continuity.admit(events))
            except Exception:  # a Faust agent that raises dies silently: count, log, go on
                metrics.errors.inc()
                log.exception("%sbatch of %d messages failed", label, len(events))

    timer = functools.partial(guarded_timer, app, metrics=metrics)

    @timer(1.0, what=f"{label}offset watch")
    async def watch_offsets() -> None:
        await continuity.watch()

    @timer(1.0, what=f"{label}quiet checkpoint")
    async def checkpoint_quiet() -> None:
        # a job that stopped sending must not hold the commit back (commit_floor), nor
        # wait on for a topic it no longer sends (streams.align)
        processor.checkpoint_quiet(QUIET_CHECKPOINT_SECONDS)
        processor.evict_idle(IDLE_EVICT_SECONDS)
        await processor.release_waiting()

    @timer(5.0, what=f"{label}lag report")
    async def report_lag() -> None:
        lag_now.clear()
        for tp in app.consumer.assignment():
            if tp.topic != inbound[0]:
                continue
            high = app.consumer.highwater(tp)
            position = await app.consumer.position(tp)  # raises if revoked meanwhile
            if high is not None and position is not None:
                lag_now[str(tp.partition)] = max(0, high - position)
                metrics.lag.labels(str(tp.partition)).set(lag_now[str(tp.partition)])

    if cfg.worker.status_seconds > 0:
        @timer(cfg.worker.status_seconds, what=f"{label}status")
        async def publish_status() -> None:
            """Each evaluated job's heat and this worker's health, for `vigil top`."""
            for msg in processor.status_messages(time.time(), lag_now):
                await status.send(key=feed_key(msg), value=encode_status(msg))

    return continuity



def build_app(cfg: Config, metrics: WorkerMetrics | None = None,
              replication_factor: int = 1) -> faust.App:
    """The configured Faust app with its topics, engine table, agent and lag timer;
    the topics Faust creates (the table's changelog) get ``replication_factor``."""
    metrics = metrics or WorkerMetrics()
    prefix = cfg.kafka.topic_prefix
    app = faust_app(cfg, cfg.worker.app_id, cfg.worker.data_dir,
                    cfg.kafka.samples_partitions, replication_factor)
    samples_name = topics.topic(topics.SAMPLES, prefix)
    steps_name = topics.topic(topics.STEPS, prefix)
    # one channel over both topics: one stream processor, batches of either
    samples = app.topic(samples_name, steps_name, key_type=bytes, value_type=bytes,
                        key_serializer="raw", value_serializer="raw",
                        partitions=cfg.kafka.samples_partitions)
    detections = app.topic(topics.topic(topics.DETECTIONS, prefix), key_serializer="raw",
                           value_serializer="raw", partitions=cfg.kafka.detections_partitions)
    deadletter = app.topic(topics.topic(topics.DEADLETTER, prefix), key_serializer="raw",
                           value_serializer="raw", partitions=1)
    status = app.topic(topics.topic(topics.STATUS, prefix), key_serializer="raw",
                       value_serializer="raw", partitions=1)
    # Faust derives a table's serializers from key_type/value_type (bytes = raw), and
    # recovery reads the changelog with those, not with a schema's.
    table = app.Table("engines", default=None, partitions=cfg.kafka.samples_partitions,
                      key_type=bytes, value_type=bytes, use_partitioner=True,
                      extra_topic_configs={"max.message.bytes": str(CHANGELOG_MAX_BYTES)})
    worker_id = f"{socket.gethostname()}-{os.getpid()}"
    processor = BatchProcessor(cfg, metrics, _FaustOutlets(detections, deadletter), table,
                               worker_id, AlignParams(slack=cfg.detect.grace_seconds,
                                                      first_wait_seconds=NEW_JOB_WAIT_SECONDS))
    wire_processor(app, cfg, metrics, processor, samples, (samples_name, steps_name),
                   status, "")
    return app
