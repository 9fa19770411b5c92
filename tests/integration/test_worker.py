"""The stream worker against real Kafka: poison input and failover."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from kafka import KafkaConsumer

from tests.integration.kafka_helpers import log_excerpt, publish, read_topic, start_worker
from tests.integration.ports import free_port
from tests.integration.scrape import metric
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

pytestmark = pytest.mark.integration
START = 1_850_000_000.0

POISON: dict[str, bytes] = {
    "invalid_json": b'{"schema": "vigil.sample/1", "ts": ',
    "non_finite": json.dumps({"schema": "vigil.sample/1", "ts": float("nan"), "job": "j",
                              "node": "n", "gpus": {}, "host": {}, "nics": {}}).encode(),
    "unknown_schema": json.dumps({"schema": "vigil.sample/9", "ts": 1}).encode(),
    "unknown_metric": json.dumps({"schema": "vigil.sample/1", "ts": 1.0, "job": "j",
                                  "node": "n", "gpus": {"0": {"cmdline": 1}}, "host": {},
                                  "nics": {}}).encode(),
    "out_of_range": json.dumps({"schema": "vigil.sample/1", "ts": -1.0, "job": "j", "node": "n",
                                "gpus": {"0": {"sm_active": 0.5}}, "host": {},
                                "nics": {}}).encode(),
    "wrong_type": b'"just a string"',
    "too_large": b'{"pad": "' + b"x" * (600 << 10) + b'"}',
    "missing_field": json.dumps({"schema": "vigil.sample/1", "ts": 1.0}).encode(),
}


def _firing(values: list[bytes]) -> list[dict[str, Any]]:
    return [d for d in map(decode_detection, values) if d["state"] == "firing"]


def test_poison_is_dead_lettered_and_good_samples_still_detected(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    job = JobSpec("job-p", [f"n{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("slow_gpu", "job-p", "n1", "2", START + 40)])
    good = list(Simulator(cluster, START, seed=1).samples(130))
    half = len(good) // 2
    publish(isolated_cfg, good[:half], raw=list(POISON.values()))
    publish(isolated_cfg, good[half:], raw=list(POISON.values()))
    worker = start_worker(isolated_env, str(tmp_path / "worker.log"))
    try:
        dead = read_topic(isolated_cfg, topics.DEADLETTER, lambda v: len(v) >= 2 * len(POISON),
                          120, worker)
        dets = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 60, worker)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    records = [json.loads(v) for v in dead]
    assert Counter(r["reason"] for r in records) == Counter(
        {reason: 2 for reason in POISON}), log_excerpt(tmp_path / "worker.log")
    originals = {base64.b64decode(r["original_b64"]) for r in records}
    assert originals == set(POISON.values())
    assert all(r["source"]["topic"].endswith("vigil.samples") for r in records)
    assert [(d["job"], d["node"], d["gpu"]) for d in _firing(dets)] == [("job-p", "n1", "2")]


def test_killed_worker_is_replaced_without_losing_or_refiring(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    env = dict(isolated_env, VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="8")
    jobs = [JobSpec("job-a", [f"a{i}" for i in range(4)]),
            JobSpec("job-b", [f"b{i}" for i in range(4)])]
    faults = [Fault("slow_gpu", "job-a", "a2", "6", START + 40),
              Fault("node_silent", "job-b", "b3", None, START + 170)]
    samples = list(Simulator(Cluster(jobs, faults), START, seed=4).samples(260))
    cut = next(i for i, s in enumerate(samples) if s["ts"] >= START + 150)
    publish(isolated_cfg, samples[:cut])
    first = start_worker(env, str(tmp_path / "worker-1.log"))
    try:
        seen = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 150, first)
        assert _firing(seen), log_excerpt(tmp_path / "worker-1.log")
        publish(isolated_cfg, samples[cut:cut + 200])  # mid-stream ...
        first.send_signal(signal.SIGKILL)  # ... the worker dies without a goodbye
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    publish(isolated_cfg, samples[cut + 200:])
    second = start_worker(env, str(tmp_path / "worker-2.log"))
    try:
        values = read_topic(isolated_cfg, topics.DETECTIONS,
                            lambda v: any(d["kind"] == "node_silent" for d in _firing(v)),
                            180, second)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)
    firing = _firing(values)
    blamed = Counter((d["job"], d["kind"], d["node"], d["gpu"]) for d in firing)
    assert set(blamed) == {("job-a", "straggler", "a2", "6"),
                           ("job-b", "node_silent", "b3", None)}, (
        log_excerpt(tmp_path / "worker-2.log"))
    assert all(n == 1 for n in blamed.values()), f"an incident fired twice: {blamed}"
    assert len({d["id"] for d in firing}) == 2


def test_two_workers_split_jobs_and_each_job_has_one_author(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    jobs = [JobSpec(f"job-{k}", [f"j{k}n{i}" for i in range(4)]) for k in range(8)]
    faults = [Fault("slow_gpu", j.name, j.nodes[1], "4", START + 40) for j in jobs]
    env = dict(isolated_env, VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="10")
    workers = [start_worker(env, str(tmp_path / f"worker-{i}.log")) for i in range(2)]
    try:
        time.sleep(15)  # both join the group before data arrives
        publish(isolated_cfg, list(Simulator(Cluster(jobs, faults), START, seed=9).samples(130)))
        read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= len(jobs), 180)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=60)
    consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, isolated_cfg.kafka.topic_prefix),
                             bootstrap_servers=isolated_cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=2000)
    authors: dict[str, set[bytes]] = {}
    for record in consumer:
        det = decode_detection(record.value)
        authors.setdefault(det["job"], set()).update(
            v for k, v in record.headers if k == "vigil-worker")
    consumer.close()
    assert set(authors) == {j.name for j in jobs}
    assert all(len(a) == 1 for a in authors.values()), authors
    assert len(set().union(*authors.values())) == 2, "one worker did all the work"


@pytest.mark.parametrize("jump", ["2000", "end"])
def test_a_block_faust_skips_is_read_again_and_nothing_is_committed_past_it(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path, jump: str) -> None:
    """The consumer jumps ahead (as faust-streaming can in a rebalance): 2,000 samples
    mid-stream, or to the partition's end before anything reached the agent (no later
    message reveals that hole). The worker notices, seeks back, processes every
    sample once, and commits the partition's end only after that."""
    port = free_port()
    env = dict(isolated_env, VIGIL_WORKER_WEB_PORT=str(port))
    job = JobSpec("job-j", [f"n{i}" for i in range(8)])
    samples = list(Simulator(Cluster([job], [Fault("slow_gpu", "job-j", "n5", "3", START + 60)]),
                             START, seed=2).samples(900))
    publish(isolated_cfg, samples)
    log_path = tmp_path / "worker.log"
    with open(log_path, "ab") as log:
        worker = subprocess.Popen([sys.executable, "-m", "tests.integration.jumping_worker",
                                   jump], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and worker.poll() is None:
            try:
                if metric(port, "vigil_worker_samples_total") >= len(samples):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        time.sleep(2)  # anything beyond would be a double count
        done = metric(port, "vigil_worker_samples_total")
        refetches = metric(port, "vigil_worker_offset_events_total", outcome="refetch")
        dets = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(_firing(v)) >= 1, 60)
        # the end is committed once the job's checkpoint holds the last samples (it
        # is checkpointed after QUIET_CHECKPOINT_SECONDS without a batch): wait for
        # that here, not for the shutdown's, which may stop before its commit lands
        deadline = time.monotonic() + 30
        while (time.monotonic() < deadline and _committed(
                isolated_cfg, isolated_env["VIGIL_WORKER_APP_ID"]) < len(samples)):
            time.sleep(0.5)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    text = log_path.read_text()
    assert "JUMPED" in text, "the consumer never jumped: the test proved nothing\n" + text[-3000:]
    assert refetches >= 1, text[-3000:]
    assert done == len(samples), f"processed {done:.0f} of {len(samples)}\n" + text[-3000:]
    assert [(d["node"], d["gpu"]) for d in _firing(dets)] == [("n5", "3")]
    assert _committed(isolated_cfg, isolated_env["VIGIL_WORKER_APP_ID"]) == len(samples)


def _committed(cfg: Config, group: str) -> int:
    """The group's committed offsets over the samples topic's partitions, summed."""
    async def fetch() -> int:
        name = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
        client = AIOKafkaConsumer(bootstrap_servers=cfg.kafka_bootstrap, group_id=group,
                                  enable_auto_commit=False)
        await client.start()
        try:
            parts = client.partitions_for_topic(name) or set()
            if not parts:
                await client._client.force_metadata_update()
                parts = client.partitions_for_topic(name) or set()
            offsets = [await client.committed(TopicPartition(name, p)) for p in parts]
            return sum(o or 0 for o in offsets)
        finally:
            await client.stop()
    return asyncio.run(fetch())
