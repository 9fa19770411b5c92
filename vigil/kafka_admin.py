"""Create Vigil's topics when they are missing (kafka-python admin client)."""

from __future__ import annotations

import logging

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from contracts import topics
from contracts.config import Config

log = logging.getLogger(__name__)


def ensure_topics(cfg: Config) -> None:
    """Create samples, detections, dead-letter, alerts, actions and status topics if absent."""
    wanted = {
        topics.SAMPLES: cfg.kafka.samples_partitions,
        topics.DETECTIONS: cfg.kafka.detections_partitions,
        topics.DEADLETTER: 1,
        topics.ALERTS: cfg.kafka.detections_partitions,
        topics.ACTIONS: 1,
        topics.STATUS: 1,
    }
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap, client_id="vigil-admin",
                             **cfg.kafka_client)
    try:
        existing = set(admin.list_topics())
        configs = {topics.SAMPLES: {
            "retention.ms": str(int(cfg.kafka.samples_retention_hours * 3600e3))},
            topics.STATUS: {"cleanup.policy": "compact,delete", "retention.ms": "3600000"},
            # a dead letter carries the refused message (up to 1 MiB, base64) and its reason
            topics.DEADLETTER: {"max.message.bytes": str(4 << 20)}}
        new = [NewTopic(topics.topic(name, cfg.kafka.topic_prefix), parts, 1,
                        topic_configs=configs.get(name, {}))
               for name, parts in wanted.items()
               if topics.topic(name, cfg.kafka.topic_prefix) not in existing]
        if new:
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
            log.info("created topics %s", [t.name for t in new])
    finally:
        admin.close()
