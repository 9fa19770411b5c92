"""Small helpers for the integration tests: publish, read a topic, run a worker."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from kafka import KafkaConsumer, KafkaProducer

from contracts import topics
from contracts.codec import encode_sample
from contracts.config import Config
from vigil.kafka_admin import ensure_topics

VIGIL = [sys.executable, "-m", "vigil.cli"]


def publish(cfg: Config, samples: list[dict[str, Any]], raw: list[bytes] | None = None) -> None:
    """Send samples (and optional raw bytes) to the samples topic, keyed by job."""
    ensure_topics(cfg)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    name = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    for s in samples:
        producer.send(name, key=s["job"].encode(), value=encode_sample(s))
    for value in raw or []:
        producer.send(name, key=b"poison", value=value)
    producer.flush()
    producer.close()


def read_topic(cfg: Config, name: str, until: Any, timeout: float,
               worker: subprocess.Popen[bytes] | None = None) -> list[bytes]:
    """Values of ``name`` from the start until ``until(values)`` is true or time runs out."""
    consumer = KafkaConsumer(topics.topic(name, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=500)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until(values):
            if worker is not None and worker.poll() is not None:
                break
            values.extend(record.value for record in consumer)
    finally:
        consumer.close()
    return values


def start_worker(env: dict[str, str], log_path: str) -> subprocess.Popen[bytes]:
    """`vigil worker` in a subprocess, logging to a file."""
    with open(log_path, "ab") as log:
        return subprocess.Popen([*VIGIL, "worker"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
