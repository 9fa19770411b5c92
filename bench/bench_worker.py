"""Worker throughput against a bare aiokafka consumer on the same topic, same run.

    .venv/bin/vigil up            # or VIGIL_KAFKA_BOOTSTRAP=... for another broker
    .venv/bin/python bench/bench_worker.py [--nodes 256] [--seconds 80]

Pre-loads ``nodes × seconds`` node-samples (8 GPUs each, 8-node jobs, one slow
GPU per job) into a fresh samples topic, then times (1) a bare aiokafka consumer
reading every message and (2) `vigil worker` consuming, windowing, detecting and
producing, from its first sample to its last, read from its /metrics endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import urllib.request
import uuid

from aiokafka import AIOKafkaConsumer

from contracts import topics
from contracts.config import load
from producers.publisher import KafkaPublisher
from producers.simulator import Cluster, Fault, JobSpec, Simulator
from vigil.kafka_admin import ensure_topics

START = 1_860_000_000.0


def _cluster(nodes: int) -> Cluster:
    jobs = [JobSpec(f"job-{j:04d}", [f"n{j:04d}-{i}" for i in range(8)])
            for j in range(max(1, nodes // 8))]
    return Cluster(jobs, [Fault("slow_gpu", j.name, j.nodes[1], "2", START + 20) for j in jobs])


async def _bare(bootstrap: str, topic: str, expected: int) -> float:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"bare-{uuid.uuid4().hex[:6]}")
    await consumer.start()
    count, first = 0, None
    try:
        while count < expected:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            for records in batch.values():
                if first is None and records:
                    first = time.monotonic()
                count += len(records)
    finally:
        await consumer.stop()
    return count / (time.monotonic() - (first or time.monotonic()))


def _metric(port: int, name: str) -> float:
    """Sum of every series of a counter on the worker's /metrics."""
    total = 0.0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            series = line.split("{", 1)[0].split(" ", 1)[0]
            if series in (name, name + "_total"):
                total += float(line.split()[-1])
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--seconds", type=int, default=80)
    parser.add_argument("--port", type=int, default=16066)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    env = dict(os.environ, VIGIL_KAFKA_TOPIC_PREFIX=f"bench{tag}.",
               VIGIL_WORKER_APP_ID=f"bench-{tag}", VIGIL_WORKER_WEB_PORT=str(args.port),
               VIGIL_WORKER_DATA_DIR=f".vigil/bench-{tag}")
    cfg = load(env=env)
    ensure_topics(cfg)
    topic = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    pub = KafkaPublisher(cfg.kafka_bootstrap, topic)
    for sample in Simulator(_cluster(args.nodes), START, seed=1).samples(args.seconds):
        pub.publish(sample)
    pub.close()
    total = pub.sent
    bare = asyncio.run(_bare(cfg.kafka_bootstrap, topic, total))
    worker = subprocess.Popen([sys.executable, "-m", "vigil.cli", "worker"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    try:
        deadline = time.monotonic() + 900
        done = 0.0
        while time.monotonic() < deadline and done < total:
            time.sleep(0.2)
            try:
                done = _metric(args.port, "vigil_worker_samples")
            except OSError:
                continue
            if first is None and done > 0:
                first, first_count = time.monotonic(), done
        elapsed = time.monotonic() - (first or time.monotonic())
        rate = (done - first_count) / elapsed if first and elapsed > 0 else 0.0
        detections = _metric(args.port, "vigil_worker_detections")
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    print(f"{total} node-samples ({total * 8} GPU-samples), {max(1, args.nodes // 8)} jobs")
    print(f"bare aiokafka consumer : {bare:8.0f} node-messages/s")
    print(f"vigil worker end to end: {rate:8.0f} node-messages/s "
          f"({rate * 8:.0f} GPU-samples/s), {rate / bare:.0%} of bare")
    print(f"detections published   : {detections:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
