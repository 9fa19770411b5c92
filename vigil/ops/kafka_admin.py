"""Create Vigil's topics when they are missing (kafka-python admin client), replicated.

Every topic is created with ``kafka.replication_factor`` replicas (0: the broker's
``default.replication.factor``) and ``min.insync.replicas`` (``kafka.min_insync_replicas``;
0: 2 with three or more replicas, else 1), so that with ``acks=all`` producers the loss
of one broker loses no sample, detection or engine checkpoint. A topic that already
exists with fewer replicas than that is refused with a clear error: the operator must
reassign its partitions (or lower the setting), not run on in a state where one
broker's loss loses data.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError, TopicAlreadyExistsError, UnknownBrokerIdError

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ConfigError

log = logging.getLogger(__name__)
ATTEMPTS = 5


@dataclass(frozen=True)
class Replication:
    """The replica count and min in-sync replicas every Vigil topic gets."""

    factor: int
    min_insync: int


def replication(cfg: Config, admin: KafkaAdminClient) -> Replication:
    """The configured replication, the broker's default where the setting is 0."""
    factor = cfg.kafka.replication_factor
    if factor < 0 or cfg.kafka.min_insync_replicas < 0:
        raise ConfigError("kafka.replication_factor and kafka.min_insync_replicas must be >= 0")
    if factor == 0:
        factor = _broker_default_replication(admin)
    min_insync = cfg.kafka.min_insync_replicas or (2 if factor >= 3 else 1)
    if min_insync > factor:
        raise ConfigError(f"kafka.min_insync_replicas {min_insync} exceeds the replication "
                          f"factor {factor}: no write could ever be acknowledged")
    return Replication(factor, min_insync)


def _broker_default_replication(admin: KafkaAdminClient) -> int:
    """The brokers' default.replication.factor. A broker's configs are answered by that
    broker only, and a fresh client may not know every broker yet: ask each in turn."""
    last: Exception | None = None
    for broker in admin.describe_cluster()["brokers"]:
        name = str(broker["broker_id"])
        try:
            found = admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, name,
                                configs=["default.replication.factor"])], config_filter="all")
            return int(found["broker"][name]["default.replication.factor"]["value"])
        except (KafkaError, KeyError) as exc:
            last = exc
    raise ConfigError(f"cannot read the brokers' default.replication.factor ({last}): "
                      "set kafka.replication_factor")


def ensure_topics(cfg: Config, attempts: int = ATTEMPTS) -> Replication:
    """Create samples, detections, dead-letter, alerts, actions, status, summaries and
    job-clock topics if
    absent; refuse under-replicated existing ones. Returns the replication used (the
    worker gives the same to Faust for its changelog topics).

    A cluster whose metadata is still settling (a broker just registered, a controller
    the client does not know yet) answers with a transient error: the whole step is
    tried again with a fresh client, ``attempts`` times, one second apart."""
    for _ in range(attempts - 1):
        try:
            return _ensure_topics(cfg)
        except (KafkaError, UnknownBrokerIdError) as exc:
            if not (exc.retriable or isinstance(exc, UnknownBrokerIdError)):
                raise
            log.info("Kafka metadata not settled (%r); trying again", exc)
            time.sleep(1.0)
    return _ensure_topics(cfg)  # the last try: its error is the caller's


def _ensure_topics(cfg: Config) -> Replication:
    """One try of ``ensure_topics`` with a fresh admin client."""
    wanted = {
        topics.SAMPLES: cfg.kafka.samples_partitions,
        # co-partitioned with the samples (same key, same count): one job's timings
        # reach the worker that holds its samples
        topics.STEPS: cfg.kafka.samples_partitions,
        topics.DETECTIONS: cfg.kafka.detections_partitions,
        topics.DEADLETTER: 1,
        topics.ALERTS: cfg.kafka.detections_partitions,
        topics.ACTIONS: 1,
        topics.STATUS: 1,
        topics.SUMMARIES: cfg.kafka.summaries_partitions,
        # every stage-1 worker reads all of it; one message a job a bin
        topics.JOBCLOCK: cfg.kafka.summaries_partitions,
    }
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap, client_id="vigil-admin",
                             **cfg.kafka_client)
    try:
        rep = replication(cfg, admin)
        existing = set(admin.list_topics())
        names = {name: topics.topic(name, cfg.kafka.topic_prefix) for name in wanted}
        retention = {"retention.ms": str(int(cfg.kafka.samples_retention_hours * 3600e3))}
        configs = {topics.SAMPLES: retention, topics.STEPS: retention,
            topics.STATUS: {"cleanup.policy": "compact,delete", "retention.ms": "3600000"},
            # a dead letter carries the refused message (up to 1 MiB, base64) and its reason
            topics.DEADLETTER: {"max.message.bytes": str(4 << 20)},
            # stage 2 reads each summary within seconds; a day covers any outage
            topics.SUMMARIES: {"retention.ms": str(24 * 3600 * 1000)},
            # the newest job clock per job is all a stage-1 worker reads at start: a
            # job's old ones are compacted away, a finished job's deleted after a day
            topics.JOBCLOCK: {"cleanup.policy": "compact,delete",
                              "retention.ms": str(24 * 3600 * 1000),
                              "segment.ms": str(3600 * 1000)}}
        new = {names[name]: {"num_partitions": parts, "replication_factor": rep.factor,
                             "configs": {**configs.get(name, {}),
                                         "min.insync.replicas": str(rep.min_insync)}}
               for name, parts in wanted.items() if names[name] not in existing}
        if new:
            try:
                admin.create_topics(new, wait_for_metadata=True)
            except TopicAlreadyExistsError:
                pass
            log.info("created topics %s with %d replicas (min.insync.replicas %d)",
                     sorted(new), rep.factor, rep.min_insync)
        # every topic, also one another process created meanwhile (already exists)
        check_replicas(admin, sorted(names.values()), rep.factor)
        check_copartitioned(admin, names[topics.SAMPLES], names[topics.STEPS])
    finally:
        admin.close()
    return rep


def check_replicas(admin: KafkaAdminClient, names: list[str], factor: int) -> None:
    """Refuse (``ConfigError``) if any partition of these topics has fewer replicas
    than ``factor``."""
    if not names:
        return
    short = []
    for topic in admin.describe_topics(names):
        fewest = min((len(p["replica_nodes"]) for p in topic["partitions"]), default=factor)
        if fewest < factor:
            short.append(f"{topic['name']} ({fewest})")
    if short:
        raise ConfigError(
            f"topics with fewer replicas than kafka.replication_factor {factor}: "
            f"{', '.join(short)}. One broker's loss would lose their data: add replicas "
            "with kafka-reassign-partitions.sh, or set kafka.replication_factor lower.")


def check_copartitioned(admin: KafkaAdminClient, samples: str, steps: str) -> None:
    """Refuse (``ConfigError``) a steps topic whose partition count is not the samples
    topic's: Faust then gives partition *p* of each to different workers, and a job's
    timings would reach a worker that does not hold its samples (``streams/app.py``)."""
    counts = {t["name"]: len(t["partitions"])
              for t in admin.describe_topics([samples, steps])}
    if counts.get(samples) != counts.get(steps):
        raise ConfigError(
            f"topic {steps} has {counts.get(steps)} partitions and {samples} "
            f"{counts.get(samples)}: a job's step timings would reach another worker than its "
            f"samples. Recreate {steps} with {counts.get(samples)} partitions (it holds only "
            "timings: deleting it loses at most their retention), or add partitions to it "
            "with kafka-topics.sh --alter --partitions.")


def delete_topics_starting(cfg: Config, prefixes: tuple[str, ...]) -> list[str]:
    """Delete every topic whose name starts with one of ``prefixes``; returns their
    names. For the throw-away topics of benchmarks and soak runs (their own prefix,
    their worker's changelog), which hold gigabytes once a run ends: at 10,200
    samples/s for ten minutes a samples topic holds ~31 GB. An empty prefix would
    match everything and is refused."""
    if not prefixes or not all(prefixes):
        raise ValueError("refusing to delete topics without a non-empty prefix")
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    try:
        names = sorted(t for t in admin.list_topics() if t.startswith(prefixes))
        if names:
            admin.delete_topics(names)
        return names
    finally:
        admin.close()
