"""Worker throughput against a bare aiokafka consumer on the same topic, same run.

    .venv/bin/vigil up            # or VIGIL_KAFKA_BOOTSTRAP=... for another broker
    .venv/bin/python bench/bench_worker.py [--nodes 256] [--seconds 80] [--workers 1]
    .venv/bin/python bench/bench_worker.py --live 1000 --seconds 90   # latency at load

``--stage1`` runs the real ``vigil worker --stage 1`` (``streams/stage1.py``,
docs/sharding.md) in place of the one-stage worker: the samples are keyed
``job#k/K`` (``--shards K`` a job), each (job, shard) ingests and seals its bins and
sends its ``vigil.summary/2`` messages to the summaries topic (counted at the end),
checkpoints as the worker does; no detector runs (stage 2 is not started). With
``--floor``, its rate is set against a no-op Faust agent on the same topic in the
same run.

``--workers N`` runs N workers in one consumer group (they share the partitions) and
reports their combined rate. ``--live R`` publishes R node-samples/s in real time
instead of pre-loading, and reports the worker's detection latency (wall time from
the append of the sample that closed the evaluated window to the detection's send)
as p50/p99 from its histogram.

``--agent-batches`` pre-loads one record a batch, as nodes' agents send them (each
publishes one sample a second, so its batches hold one); by default the publisher
packs up to 256 KiB a batch. ``--compression none`` pre-loads uncompressed batches
(the agents' are gzip), to see what decompression costs the consumers.

Pre-loads ``nodes × seconds`` node-samples (8 GPUs each, 8-node jobs, one slow
GPU per job) into a fresh samples topic, then times (1) a bare aiokafka consumer
reading every message and (2) `vigil worker` consuming, windowing, detecting and
producing, from its first sample to its last, read from its /metrics endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.producers.publisher import KafkaPublisher
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import delete_topics_starting, ensure_topics

START = 1_860_000_000.0
# the straggler test first learns each GPU's normal (detectors/peer_streams.py): the
# fault starts after that, and a run must last long enough past it to find it
FAULT_AFTER = 90.0
# the mixed trace: 12 jobs of 2 to 16 nodes (96 nodes)
MIXED_SIZES = (2, 16, 4, 12, 6, 8, 3, 10, 14, 5, 8, 8)




def _publishing(args: argparse.Namespace) -> dict[str, Any]:
    """The pre-loading publisher's batch size and codec, from the options."""
    settings: dict[str, Any] = {"compression_type": None if args.compression == "none"
                                else args.compression}
    if args.agent_batches:
        settings["batch_size"] = 1  # a record over the batch size travels alone
    return settings


def _cluster(nodes: int, mixed: bool = False) -> Cluster:
    sizes = MIXED_SIZES if mixed else [8] * max(1, nodes // 8)
    jobs = [JobSpec(f"job-{j:04d}", [f"n{j:04d}-{i}" for i in range(size)])
            for j, size in enumerate(sizes)]
    return Cluster(jobs, [Fault("slow_gpu", j.name, j.nodes[1], "2", START + FAULT_AFTER)
                          for j in jobs])


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


async def _group_outcome(bootstrap: str, prefix: str, group: str) -> tuple[int, int, set[str]]:
    """(sum of the group's committed samples offsets, sum of the log ends, jobs with a
    firing detection on the detections topic)."""
    samples = topics.topic(topics.SAMPLES, prefix)
    client = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                              enable_auto_commit=False)
    await client.start()
    try:
        await client._client.force_metadata_update()
        tps = [TopicPartition(samples, p) for p in client.partitions_for_topic(samples) or ()]
        committed = sum([await client.committed(tp) or 0 for tp in tps])
        ends = sum((await client.end_offsets(tps)).values())
    finally:
        await client.stop()
    reader = AIOKafkaConsumer(topics.topic(topics.DETECTIONS, prefix), bootstrap_servers=bootstrap,
                              auto_offset_reset="earliest", enable_auto_commit=False)
    await reader.start()
    jobs: set[str] = set()
    try:
        while batch := await reader.getmany(timeout_ms=2000):
            for records in batch.values():
                jobs.update(d["job"] for d in map(decode_detection, (r.value for r in records))
                            if d["state"] == "firing")
    finally:
        await reader.stop()
    return committed, ends, jobs


def _end_offsets(cfg: Any, name: str) -> int:
    """Messages on a topic of this run (the sum of its partitions' log ends)."""
    async def ends() -> int:
        client = AIOKafkaConsumer(bootstrap_servers=cfg.kafka_bootstrap)
        await client.start()
        try:
            topic = topics.topic(name, cfg.kafka.topic_prefix)
            await client._client.force_metadata_update()
            tps = [TopicPartition(topic, p) for p in client.partitions_for_topic(topic) or ()]
            return sum((await client.end_offsets(tps)).values()) if tps else 0
        finally:
            await client.stop()
    return asyncio.run(ends())


def _samples(port: int) -> list[Any]:
    """Every sample on a worker's /metrics, read by prometheus_client's parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _histogram(port: int, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram on /metrics."""
    return [(float(s.labels["le"]), float(s.value)) for s in _samples(port)
            if s.name == name + "_bucket"]


def _quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Upper bound of the bucket holding quantile ``q`` (Prometheus-style, no interpolation)."""
    total = buckets[-1][1] if buckets else 0
    for bound, count in buckets:
        if total and count >= q * total:
            return bound
    return float("nan")


def _metric(port: int | list[Any], name: str, **labels: str) -> float:
    """Sum of every series of a counter or gauge on /metrics (or in samples already
    read from it) whose labels include ``labels``."""
    samples = _samples(port) if isinstance(port, int) else port
    return sum(float(s.value) for s in samples if s.name in (name, name + "_total")
               and all(s.labels.get(k) == v for k, v in labels.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--seconds", type=int, default=150)
    parser.add_argument("--mixed", action="store_true",
                        help="12 jobs of 2 to 16 nodes instead of 8-node jobs")
    parser.add_argument("--floor", action="store_true",
                        help="also time a no-op Faust agent draining the same topic")
    parser.add_argument("--profile", metavar="DIR",
                        help="run each worker under py-spy; raw stacks go to DIR")
    parser.add_argument("--port", type=int, default=16066)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--agent-batches", action="store_true",
                        help="pre-load one record a batch, as agents send them")
    parser.add_argument("--compression", choices=["gzip", "none"], default="gzip")
    parser.add_argument("--stage1", action="store_true",
                        help="run `vigil worker --stage 1` (summaries sent, no detector)")
    parser.add_argument("--shards", type=int, default=2,
                        help="with --stage1: stage-1 shards a job (samples keyed job#k/K)")
    parser.add_argument("--live", type=float, default=0.0,
                        help="publish this many node-samples/s in real time")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    env = dict(os.environ, VIGIL_KAFKA_TOPIC_PREFIX=f"bench{tag}.",
               VIGIL_WORKER_APP_ID=f"bench-{tag}", VIGIL_WORKER_DATA_DIR=f".vigil/bench-{tag}",
               VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="10")
    cfg = load(env=env)
    ensure_topics(cfg)
    topic = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    ports = [args.port + i for i in range(args.workers)]
    if args.live:
        return _live(cfg, env, topic, ports[0], args)
    cluster = _cluster(args.nodes, args.mixed)
    shards = args.shards if args.stage1 else 1
    pub = KafkaPublisher(cfg.kafka_bootstrap, topic, shards=lambda job: shards,
                         **_publishing(args))
    for sample in Simulator(cluster, START, seed=1).samples(args.seconds):
        pub.publish(sample)
    pub.close(timeout=600)  # one record a batch, uncompressed: minutes
    total = pub.sent
    bare = asyncio.run(_bare(cfg.kafka_bootstrap, topic, total))
    # the floor as Faust ships (its Monitor), and configured like the worker
    fetch = cfg.worker.fetch_bytes_per_partition
    floor = _faust_floor(env, topic, total, fetch, "faust") if args.floor else 0.0
    floor_lean = _faust_floor(env, topic, total, fetch, "per-batch") if args.floor else 0.0
    # All workers start together. Rebalances while they join re-deliver uncommitted
    # messages (extra work; the offset guard skips them, so each sample is counted
    # once), so the run ends only when every job was detected and every sample
    # processed; the rate counts unique messages: it errs low, never high.
    logs = Path(cfg.worker.data_dir)
    logs.mkdir(parents=True, exist_ok=True)
    profiler = [] if not args.profile else [
        str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
        "--rate", "200", "--nonblocking", "-o"]
    command = ["-m", "vigil_gpu_monitor", "worker", *(["--stage", "1"] if args.stage1 else [])]
    workers = [subprocess.Popen([*profiler, *([f"{args.profile}/worker-{port}.txt", "--"]
                                              if profiler else []),
                                 sys.executable, *command],
                                env=dict(env, VIGIL_WORKER_WEB_PORT=str(port)),
                                stdout=(logs / f"worker-{port}.log").open("ab"),
                                stderr=subprocess.STDOUT)
               for port in ports]
    print(f"worker logs: {logs}/worker-PORT.log", flush=True)
    first = None
    first_count = 0.0
    last = time.monotonic()
    try:
        deadline = time.monotonic() + 900
        done = detections = 0.0
        wanted = 0 if args.stage1 else len(cluster.jobs)  # stage 1 detects nothing
        while time.monotonic() < deadline and (done < total or detections < wanted):
            time.sleep(0.2)
            if any(w.poll() is not None for w in workers):
                print("a worker exited: see its log", flush=True)
                break
            try:  # one scrape a worker a poll: serving /metrics takes the worker's time
                scraped = [_samples(port) for port in ports]
                now_done = sum(_metric(s, "vigil_worker_samples") for s in scraped)
                detections = sum(_metric(s, "vigil_worker_detections") for s in scraped)
            except OSError:
                continue
            if first is None and now_done > 0:
                first, first_count = time.monotonic(), now_done
            if now_done > done:
                done, last = now_done, time.monotonic()
        elapsed = last - (first or last) if first else 0.0
        rate = (total - first_count) / elapsed if elapsed > 0 else 0.0
        alive = [port for port, w in zip(ports, workers, strict=True) if w.poll() is None]
        offsets = {outcome: sum(_metric(port, "vigil_worker_offset_events", outcome=outcome)
                                for port in alive)
                   for outcome in ("replayed", "gap", "refetch", "lost_to_retention")}
    finally:
        for w in workers:
            w.send_signal(signal.SIGINT if profiler else signal.SIGTERM)
        for w in workers:
            w.wait(timeout=60)
    print(f"{args.workers} worker(s)" + (f" of stage 1 ({shards} shards a job; "
                                         f"summaries sent: {_end_offsets(cfg, topics.SUMMARIES)})"
                                         if args.stage1 else ""))
    sizes = sorted({len(j.nodes) for j in cluster.jobs})
    print(f"{total} node-samples ({total * 8} GPU-samples), {len(cluster.jobs)} jobs of "
          + (f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}") + " nodes")
    print(f"bare aiokafka consumer : {bare:8.0f} node-messages/s")
    if floor:
        print(f"no-op Faust agent      : {floor:8.0f} node-messages/s (Faust's Monitor), "
              f"{floor_lean:.0f} (the worker's per-batch monitor)")
    print(f"vigil worker end to end: {rate:8.0f} node-messages/s "
          f"({rate * 8:.0f} GPU-samples/s), {rate / bare:.0%} of bare"
          + (f", {rate / floor:.0%} / {rate / floor_lean:.0%} of the no-op Faust agent"
             if floor else ""))
    print(f"detections published   : {detections:.0f} (jobs: {len(cluster.jobs)}; "
          f"samples processed {done:.0f} of {total}, a sample processed by two workers "
          "around a rebalance counts twice)")
    print("offsets not processed as delivered: "
          + ", ".join(f"{k} {v:.0f}" for k, v in offsets.items()))
    group = f"{cfg.worker.app_id}-stage1" if args.stage1 else cfg.worker.app_id
    committed, ends, jobs = asyncio.run(_group_outcome(
        cfg.kafka_bootstrap, cfg.kafka.topic_prefix, group))
    print(f"group committed {committed} of {ends} samples offsets; jobs with a firing "
          f"detection on the topic: {len(jobs)} of {len(cluster.jobs)}")
    # the pre-loaded topic is ~0.6 GB a run at the defaults: runs add up on the broker
    delete_topics_starting(cfg, (cfg.kafka.topic_prefix, f"{cfg.worker.app_id}-"))
    return 0


def _faust_floor(env: dict[str, str], topic: str, total: int, fetch_bytes: int,
                 monitor: str) -> float:
    """What a no-op Faust agent drains from ``topic`` (in a process of its own: Faust's
    worker ends its process), with the worker's fetch size and Faust's Monitor or the
    worker's."""
    out = subprocess.run([sys.executable, str(Path(__file__).parent / "bench_worker_parts.py"),
                          "faust-floor", "--topic", topic, "--total", str(total),
                          "--monitor", monitor, "--setting",
                          f"consumer_max_fetch_size={fetch_bytes}"],
                         env=env, capture_output=True, text=True, timeout=900, check=False)
    # Faust's worker sends what the process prints through its logging (to stderr)
    for line in (out.stdout + out.stderr).splitlines():
        if "faust floor" in line:
            return float(line.split("faust floor")[1].split(":")[1].split()[0].replace(",", ""))
    raise RuntimeError("the Faust floor run printed no rate:\n" + out.stdout + out.stderr)


def _live(cfg: Any, env: dict[str, str], topic: str, port: int,
          args: argparse.Namespace) -> int:
    """Publish ``args.live`` node-samples/s in real time; report detection latency."""
    worker = subprocess.Popen([sys.executable, "-m", "vigil_gpu_monitor", "worker"],
                              env=dict(env, VIGIL_WORKER_WEB_PORT=str(port)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nodes = max(8, int(args.live))  # one sample per node per second
    pub = KafkaPublisher(cfg.kafka_bootstrap, topic)
    time.sleep(15)  # the worker joins its group before the clock starts
    start = time.time()
    cluster = _cluster(nodes)
    cluster.faults = [type(f)(f.kind, f.job, f.node, f.gpu, start + 30) for f in cluster.faults]
    try:
        for sample in Simulator(cluster, start, seed=2).samples(args.seconds):
            ahead = sample["ts"] - time.time()  # each tick goes out when its time comes
            if ahead > 0:
                time.sleep(ahead)
            pub.publish(sample)
        pub.close()
        time.sleep(10)
        buckets = _histogram(port, "vigil_worker_detection_latency_seconds")
        detections = _metric(port, "vigil_worker_detections")
        lag = _metric(port, "vigil_worker_lag_messages")
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    print(f"live {nodes} node-samples/s for {args.seconds:.0f}s, {len(cluster.jobs)} jobs: "
          f"{detections:.0f} detections, latency p50 <= {_quantile(buckets, 0.5)} s, "
          f"p99 <= {_quantile(buckets, 0.99)} s, lag at end {lag:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
