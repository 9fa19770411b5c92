"""Small helpers for the integration tests: publish, read a topic, run a worker."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
from kafka import KafkaConsumer, KafkaProducer

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

VIGIL = [sys.executable, "-m", "vigil_gpu_monitor"]


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


def publish_trace(cfg: Config, messages: list[dict[str, Any]],
                  raw_steps: list[bytes] | None = None) -> None:
    """Send a trace's samples to the samples topic and its step batches
    (``vigil.step/1``) to the steps topic, each keyed by job, in the trace's order, as
    node agents do; then optional raw bytes to the steps topic."""
    from vigil_gpu_monitor.contracts import STEP_SCHEMA
    from vigil_gpu_monitor.contracts.steps import encode_steps

    ensure_topics(cfg)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    samples = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    steps = topics.topic(topics.STEPS, cfg.kafka.topic_prefix)
    for m in messages:
        if m["schema"] == STEP_SCHEMA:
            producer.send(steps, key=m["job"].encode(), value=encode_steps(m))
        else:
            producer.send(samples, key=m["job"].encode(), value=encode_sample(m))
    for value in raw_steps or []:
        producer.send(steps, key=b"poison", value=value)
    producer.flush()
    producer.close()


def read_topic(cfg: Config, name: str, until: Any, timeout: float,
               worker: subprocess.Popen[bytes] | None = None) -> list[bytes]:
    """Values of ``name`` from the start until ``until(values)`` is true or time runs out."""
    consumer = KafkaConsumer(topics.topic(name, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=500,
                             **cfg.kafka_client)
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


def log_excerpt(path: str | Path, tail: int = 3000) -> str:
    """What a failed test shows of a worker's log: the first ERROR, CRITICAL or
    traceback with the 40 lines after it (a crash's cause, long scrolled out of
    the tail by the stop that follows it), then the log's last ``tail`` characters."""
    text = Path(path).read_text(errors="replace") if Path(path).exists() else ""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines)
                  if "[ERROR]" in line or "[CRITICAL]" in line or " ERROR " in line
                  or line.startswith("Traceback")), None)
    head = "" if first is None else "\n".join(lines[first:first + 40])[:4000] + "\n[...]\n"
    return f"--- {Path(path).name}\n{head}{text[-tail:]}"


def start_worker(env: dict[str, str], log_path: str | Path,
                 stage: int | None = None) -> subprocess.Popen[bytes]:
    """`vigil worker` (``stage``: `vigil worker --stage 1|2`, a sharded job's) in a
    subprocess, logging to a file."""
    staged = [] if stage is None else ["--stage", str(stage)]
    with open(log_path, "ab") as log:
        return subprocess.Popen([*VIGIL, "worker", *staged], env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def pipeline_through(env: dict[str, str], node: str, gpu: str, start: float,
                     log_path: Path) -> list[tuple[str | None, str | None]]:
    """Agent publisher → `vigil worker` → `vigil alerter` → Redis with the Kafka settings
    of ``env``: one 4-node job whose GPU ``gpu`` of ``node`` slows down. Returns the
    (node, gpu) of the incidents open in Redis; asserts the publisher lost nothing and
    the worker's detections name that GPU alone."""
    from vigil_gpu_monitor.alerting.state import LiveState
    from vigil_gpu_monitor.producers.publisher import BufferedPublisher
    from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

    cfg = load(env=env)
    ensure_topics(cfg)
    job = JobSpec(f"{node[0]}-job", [f"{node[0]}{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("slow_gpu", job.name, node, gpu, start + 40)])
    agent = BufferedPublisher(cfg.kafka_bootstrap,
                              topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                              **cfg.kafka_client)
    for sample in Simulator(cluster, start, seed=5).samples(130):
        agent.publish(sample)
    assert agent.close(timeout=60) and agent.dropped == 0 and not agent.errors
    worker = start_worker(env, str(log_path))
    try:
        consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                                 bootstrap_servers=cfg.kafka_bootstrap,
                                 auto_offset_reset="earliest", consumer_timeout_ms=1000,
                                 **cfg.kafka_client)
        found: list[dict[str, Any]] = []
        for _ in range(150):
            found.extend(decode_detection(r.value) for r in consumer)
            if found or worker.poll() is not None:
                break
        consumer.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert [(d["node"], d["gpu"]) for d in found if d["state"] == "firing"] == [(node, gpu)], (
        log_excerpt(log_path))
    subprocess.run([*VIGIL, "alerter", "--max-seconds", "15"], env=env, check=True, timeout=90)
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    return [(d["node"], d["gpu"]) for d in state.open_incidents()]


def refused(cfg: Config) -> bool:
    """Whether the brokers refuse a client with ``cfg``'s security settings (its
    bootstrap gives up within 5 s instead of the default 30 s)."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap, bootstrap_timeout_ms=5000,
                         **cfg.kafka_client).close()
    except KafkaError:
        return True
    return False
