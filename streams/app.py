"""The Faust application: consume samples, keep per-job engines, detect, publish.

Samples are keyed by job, so one job's engine lives on one worker. Every batch
passes the offset guard first (`streams.continuity`): the detectors see each
partition's offsets once and in order, and Faust never commits past one they did
not see, whatever a rebalance does to Faust's delivery. The agent runs
with concurrency 1 and works in batches (Faust's per-message cost is high, and
concurrency > 1 can commit past in-flight messages). Each batch: decode (bad
messages go to the dead-letter topic with their reason), fold samples into the
job's engine, advance event time, publish detections.

State: live engines stay in this process. An engine is checkpointed to the
changelogged ``engines`` table (compressed) whenever it publishes a detection,
every ``worker.checkpoint_steps`` evaluated steps, and all of them on a rebalance
before they are dropped; a worker that takes over a partition starts from the last
checkpoint (window data since then is missing for at most that many steps:
the detectors treat it as no reading). Detections are sent before the
checkpoint, so a crash can repeat a detection (same id and state: consumers and
the alerter treat it as a duplicate) but never lose one. The table lives in Faust's
memory store, rebuilt from the compacted changelog at start (measured in
bench/RESULTS.md "Table store"; Faust's RocksDB store cannot take writes made outside
its per-event context, as these checkpoints are). Faust's exactly-once
mode is not used: it is broken upstream (faust-streaming issues 517, 323, 440).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
from collections import defaultdict
from typing import Any

import faust

from contracts import topics
from contracts.codec import encode_detection
from contracts.config import Config
from contracts.errors import ContractError
from contracts.status import HEAT_METRICS, encode_status, feed_key, job_status, worker_status
from detectors.engine import JobEngine
from streams.continuity import Continuity
from streams.deadletter import deadletter_record
from streams.decode import decode_sample_fast
from streams.metrics import WorkerMetrics
from streams.state_codec import decode_state, encode_state

log = logging.getLogger(__name__)
CHANGELOG_MAX_BYTES = 32 << 20
WORKER_HEADER = "vigil-worker"


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


def build_app(cfg: Config, metrics: WorkerMetrics | None = None,
              replication_factor: int = 1) -> faust.App:
    """The configured Faust app with its topics, engine table, agent and lag timer;
    the topics Faust creates (the table's changelog) get ``replication_factor``."""
    metrics = metrics or WorkerMetrics()
    prefix = cfg.kafka.topic_prefix
    app = faust.App(
        cfg.worker.app_id,
        broker=f"kafka://{cfg.kafka_bootstrap}",
        store="memory://",
        datadir=cfg.worker.data_dir,
        topic_partitions=cfg.kafka.samples_partitions,
        topic_replication_factor=replication_factor,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        producer_acks=-1,
        producer_max_request_size=CHANGELOG_MAX_BYTES,
        broker_session_timeout=cfg.worker.session_timeout_seconds,
        broker_heartbeat_interval=max(0.5, cfg.worker.session_timeout_seconds / 10),
        broker_credentials=kafka_credentials(cfg),
    )
    samples_name = topics.topic(topics.SAMPLES, prefix)
    samples = app.topic(samples_name, key_type=bytes, value_type=bytes,
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
    live: dict[str, JobEngine] = {}
    since_checkpoint: dict[str, int] = {}  # evaluated steps since the job's last checkpoint
    # Which worker produced a detection, for operators and tests (a header: the body
    # stays exactly the contract's message).
    worker_id = f"{socket.gethostname()}-{os.getpid()}"
    origin = {WORKER_HEADER: worker_id.encode()}
    heat_due: set[str] = set()  # jobs evaluated since the last status
    totals = {"samples": 0, "deadletters": 0}
    lag_now: dict[str, int] = {}  # partition → lag, as the lag timer last saw it

    def engine_for(job: str) -> JobEngine:
        engine = live.get(job)
        if engine is None:
            engine = live[job] = JobEngine(job, cfg.detect, decode_state(table.get(job.encode())))
            metrics.jobs.set(len(live))
        return engine

    def checkpoint(engine: JobEngine) -> None:
        blob = encode_state(engine.to_state())
        metrics.checkpoint_bytes.observe(len(blob))
        table[engine.job.encode()] = blob

    async def _on_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        for engine in live.values():
            checkpoint(engine)
        live.clear()
        metrics.jobs.set(0)
        # Faust flushed its producer before this signal; the checkpoints just written
        # must reach the changelog before the next owner recovers the table from it.
        await app.producer.flush()
        await continuity.commit_processed()  # after the checkpoints: never ahead of them

    continuity = Continuity(app, samples_name, metrics)

    async def _on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        continuity.on_assigned()

    app.on_partitions_revoked.connect(_on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(_on_assigned)  # type: ignore[arg-type]

    @app.agent(samples, concurrency=1)
    async def process(stream: Any) -> None:
        async for events in stream.take_events(cfg.worker.batch_size,
                                               within=cfg.worker.batch_seconds):
            try:
                await handle_batch(events)
            except Exception:  # an agent that raises dies silently: count, log, go on
                metrics.errors.inc()
                log.exception("batch of %d samples failed", len(events))

    async def handle_batch(events: list[Any]) -> None:
        by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        newest_append = 0.0
        for event in await continuity.admit(events):
            msg = event.message
            newest_append = max(newest_append, msg.timestamp or 0.0)
            try:
                sample = decode_sample_fast(event.value)
            except ContractError as exc:
                metrics.deadletters.labels(exc.reason).inc()
                totals["deadletters"] += 1
                await deadletter.send(key=msg.key, value=deadletter_record(
                    event.value, exc.reason, exc.detail, msg.topic, msg.partition, msg.offset))
                continue
            metrics.samples.inc()
            totals["samples"] += 1
            if sample["job"]:
                by_job[sample["job"]].append(sample)
        for job, job_samples in by_job.items():
            engine = engine_for(job)
            late_before, step_before = engine.late, engine.next_bin
            found: list[dict[str, Any]] = []
            for sample in sorted(job_samples, key=lambda s: s["ts"]):
                found.extend(engine.ingest(sample))
            metrics.late.inc(engine.late - late_before)
            found.extend(engine.advance())
            for det in found:
                metrics.detections.labels(det["kind"], det["state"]).inc()
                if newest_append:
                    metrics.latency.observe(max(0.0, time.time() - newest_append))
                await detections.send(key=job.encode(), value=encode_detection(det),
                                      headers=origin)
            steps = (engine.next_bin or 0) - (step_before or 0)
            if steps:
                heat_due.add(job)
            due = since_checkpoint.get(job, 0) + steps
            if found or due >= cfg.worker.checkpoint_steps:
                checkpoint(engine)
                due = 0
            since_checkpoint[job] = due

    @app.timer(interval=1.0)
    async def watch_offsets() -> None:
        # An exception in a Faust timer ends the worker; an offset lookup that fails
        # (broker away, group rebalancing) is simply tried again on the next tick.
        try:
            await continuity.watch()
        except Exception as exc:
            log.warning("offset watch failed, retrying in 1 s: %r", exc)

    @app.timer(interval=5.0)
    async def report_lag() -> None:
        lag_now.clear()
        for tp in app.consumer.assignment():
            if tp.topic != samples_name:
                continue
            high = app.consumer.highwater(tp)
            position = await app.consumer.position(tp)
            if high is not None and position is not None:
                lag_now[str(tp.partition)] = max(0, high - position)
                metrics.lag.labels(str(tp.partition)).set(lag_now[str(tp.partition)])

    if cfg.worker.status_seconds > 0:
        @app.timer(interval=cfg.worker.status_seconds)
        async def publish_status() -> None:
            """Each evaluated job's heat and this worker's health, for `vigil top`."""
            now = time.time()
            for job in sorted(heat_due):
                engine = live.get(job)
                if engine is not None:
                    msg = job_status(job, (engine.next_bin or 0) * cfg.detect.bin_seconds,
                                     worker_id, engine.heat(HEAT_METRICS), engine.late)
                    await status.send(key=feed_key(msg), value=encode_status(msg))
            heat_due.clear()
            msg = worker_status(worker_id, now, dict(lag_now), totals["samples"],
                                totals["deadletters"], len(live))
            await status.send(key=feed_key(msg), value=encode_status(msg))

    return app
