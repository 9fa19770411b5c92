"""Detection lag of a sharded job over the real Kafka, with 1, 2 and 4 stage-1 workers
(issue #46, docs/sharding.md).

    .venv/bin/vigil up            # or VIGIL_KAFKA_BOOTSTRAP=... for another broker
    .venv/bin/python bench/bench_sharded_lag.py --nodes 256 --shards 4 --workers 1,2,4

One simulated job of ``--nodes`` nodes (8 GPUs each) with faults at known times
(slow GPUs, found by the windowed straggler rule; XIDs, found on their very sample)
is published in real time, one sample a node a second, each at the wall time its
timestamp says: its trace (generated once, ``.vigil/lag-trace-N.jsonl``) is moved in
time by a whole number of bins, so its bins are the trace's. Samples are keyed
``job#k/K`` and sent with the agents' partitioner (``contracts/partition.py``): the
job's ``K`` shards on ``K`` distinct partitions of a topic of ``K`` (Kafka's hash of
``K`` keys would put two shards on one partition and leave a worker idle; the runs
in bench/RESULTS.md before it placed shard ``k`` on partition ``k`` by hand). For
each worker count, a fresh topic prefix and consumer groups: ``W`` processes of
``vigil worker --stage 1`` in one group and one ``vigil worker --stage 2``.

Measured, all wall-clock on this machine (the producer's clock is the trace's):

- **detection lag**: a detection's append to ``vigil.detections`` (its record
  timestamp) minus the time its rule could first have fired: the detection's own
  ``detected_at`` in a replay of the same published lines (``ReplayRunner``, ``vigil replay``'s
  engine; the end of the bin that fired it, or an XID's sample). Reported as is and
  beyond the watermark's grace (``detect.grace_seconds``: a bin is evaluated once
  samples ``grace`` past its end came, a setting for late samples that every
  windowed rule waits for). The detections over Kafka are compared with replay's.
- **per-bin lag**: a bin's last sample produced → stage 2 has evaluated it and sent
  its detections (stage 2's ``vigil_worker_evaluated_until_seconds`` gauge, polled
  every ``--poll`` s), and, split, → every shard's summary of it appended to
  ``vigil.summaries`` (stage 1's part). A bin cannot be evaluated before a sample
  ``grace`` past its end exists, so "beyond the grace" is lag minus
  (bin end + grace − the bin's last sample).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from kafka import KafkaAdminClient, KafkaProducer

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.contracts.shards import shard_key
from vigil_gpu_monitor.contracts.summary import decode_summary
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.producers.publisher import ShardPartitioner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.streams.decode import decode_sample_fast
from vigil_gpu_monitor.vigil.ops.kafka_admin import delete_topics_starting, ensure_topics

START = 1_860_000_000.0  # the generated trace's start (moved to now when published)
JOB = "lag-job"
WARMUP = 120.0  # at most this long for the workers to join their groups


def _cluster(nodes: int, seconds: float) -> Cluster:
    names = [f"n{i:05d}" for i in range(nodes)]
    faults: list[Fault] = []
    # slow GPUs after the straggler rule has learnt each GPU's normal (90 s), then XIDs,
    # on nodes spread over the shards
    for i, at in enumerate(range(90, int(seconds) - 40, 20)):
        faults.append(Fault("slow_gpu", JOB, names[(7 + 37 * i) % nodes], str(i % 8),
                            START + at))
    for i, at in enumerate(range(100, int(seconds) - 20, 25)):
        faults.append(Fault("xid", JOB, names[(19 + 53 * i) % nodes], str((i + 3) % 8),
                            START + at, severity=79))
    return Cluster([JobSpec(JOB, names)], faults)


def _trace(nodes: int, seconds: float) -> Path:
    """The job's trace, generated once (the simulator costs ~0.7 ms a node-sample)."""
    path = Path(f".vigil/lag-trace-{nodes}-{int(seconds)}.jsonl")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        with part.open("wb") as out:
            for s in Simulator(_cluster(nodes, seconds), START, seed=3).samples(seconds):
                out.write(encode_sample(s) + b"\n")
        part.rename(path)
    return path


def _wait_joined(cfg: Config, members: dict[str, int], timeout: float) -> float:
    """Wait until each consumer group is stable with its number of members (the
    workers have their partitions); returns the seconds waited."""
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            found = admin.describe_groups(list(members))
            if all(str(found.get(g, {}).get("group_state")) == "Stable"
                   and len(found.get(g, {}).get("members") or ()) == n
                   for g, n in members.items()):
                return time.monotonic() - t0
            time.sleep(1.0)
    finally:
        admin.close()
    raise RuntimeError(f"the workers did not join in {timeout:.0f} s: {members}")


class _Watch:
    """Stage 2's evaluated-until gauge, polled: when each bin end was first reached."""

    def __init__(self, port: int, period: float) -> None:
        self.port, self.period = port, period
        self.reached: dict[float, float] = {}  # evaluated-until (event time) → wall time
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = None
        while not self.stop.wait(self.period):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                            timeout=2) as resp:
                    text = resp.read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("vigil_worker_evaluated_until_seconds "):
                    value = float(line.split()[1])
                    if value and value != last:
                        self.reached.setdefault(value, time.time())
                        last = value

    def evaluated_at(self, bin_end: float) -> float | None:
        """Wall time stage 2 was first seen past ``bin_end``."""
        times = [t for v, t in self.reached.items() if v >= bin_end]
        return min(times) if times else None


def _publish(cfg: Config, trace: Path, shards: int, shift: float, topic: str,
             out: Path) -> dict[int, float]:
    """Publish the trace moved by ``shift`` s, each sample at its time; writes the
    published lines to ``out``; returns each bin's last sample's wall time."""
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all",
                             compression_type="gzip", linger_ms=5,
                             partitioner=ShardPartitioner())
    last: dict[int, float] = {}
    bin_s = cfg.detect.bin_seconds
    behind = 0.0
    with trace.open("rb") as lines, out.open("wb") as written:
        for line in lines:
            sample = orjson.loads(line)
            sample["ts"] += shift
            raw = orjson.dumps(sample)  # the trace was validated as it was written
            written.write(raw + b"\n")
            wait = sample["ts"] - time.time()
            if wait > 0:
                time.sleep(wait)
            else:
                behind = max(behind, -wait)
            # the agents' partitioner: the job's shards on distinct partitions
            producer.send(topic, key=shard_key(JOB, sample["node"], shards).encode(),
                          value=raw)
            b = math.floor(sample["ts"] / bin_s)
            last[b] = time.time()
    producer.flush()
    producer.close()
    print(f"  producer: at most {behind:.2f} s behind a sample's time", flush=True)
    return last


async def _read(cfg: Config, name: str) -> list[tuple[float, bytes]]:
    """Every record of a topic of this run: (create time in s, value)."""
    consumer = AIOKafkaConsumer(topics.topic(name, cfg.kafka.topic_prefix),
                                bootstrap_servers=cfg.kafka_bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[float, bytes]] = []
    try:
        while batch := await consumer.getmany(timeout_ms=3000, max_records=2000):
            for records in batch.values():
                out.extend((r.timestamp / 1000.0, r.value) for r in records)
    finally:
        await consumer.stop()
    return out


def _replay(path: Path, cfg: Config) -> list[dict[str, Any]]:
    runner = ReplayRunner(cfg.detect)
    out: list[dict[str, Any]] = []
    with path.open("rb") as lines:
        for line in lines:
            out.extend(runner.feed(decode_sample_fast(line)))  # type: ignore[arg-type]
    return out


def _ident(d: Any) -> tuple[Any, ...]:
    return (d["kind"], d.get("node"), d.get("gpu"), d["state"], round(float(d["detected_at"]), 3))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _row(values: list[float]) -> str:
    if not values:
        return "none"
    return (f"p50 {statistics.median(values):.2f} / p99 {_pct(values, 0.99):.2f} / "
            f"max {max(values):.2f} s (n={len(values)})")


def run_once(base_env: dict[str, str], trace: Path, args: argparse.Namespace,
             workers: int) -> dict[str, Any]:
    """One worker count: fresh topics and groups, W stage-1 workers and a stage 2."""
    tag = uuid.uuid4().hex[:6]
    env = dict(base_env, VIGIL_KAFKA_TOPIC_PREFIX=f"lag{tag}.",
               VIGIL_WORKER_APP_ID=f"lag-{tag}", VIGIL_WORKER_DATA_DIR=f".vigil/lag-{tag}",
               VIGIL_KAFKA_SAMPLES_PARTITIONS=str(args.shards),
               VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="10")
    cfg = load(env=env)
    ensure_topics(cfg)
    logs = Path(cfg.worker.data_dir)
    logs.mkdir(parents=True, exist_ok=True)
    ports = [args.port + i for i in range(workers + 1)]  # the last: stage 2

    def start(stage: int, port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "vigil_gpu_monitor", "worker", "--stage", str(stage)],
            env=dict(env, VIGIL_WORKER_WEB_PORT=str(port)),
            stdout=(logs / f"stage{stage}-{port}.log").open("ab"), stderr=subprocess.STDOUT)

    procs = [start(1, p) for p in ports[:-1]] + [start(2, ports[-1])]
    watch = _Watch(ports[-1], args.poll)
    published = logs / "published.jsonl"
    try:
        joined = _wait_joined(cfg, {f"{cfg.worker.app_id}-stage1": workers,
                                    f"{cfg.worker.app_id}-stage2": 1}, WARMUP)
        time.sleep(3.0)  # the tables' recovery after the assignment
        watch.thread.start()
        bin_s = cfg.detect.bin_seconds
        begin = time.time() + 2.0
        shift = math.ceil((begin - START) / bin_s) * bin_s  # whole bins: the trace's bins
        print(f"{workers} stage-1 worker(s), joined in {joined:.0f} s: publishing "
              f"{args.nodes} nodes for {args.seconds:.0f} s", flush=True)
        last_sample = _publish(cfg, trace, args.shards, shift, topics.topic(
            topics.SAMPLES, cfg.kafka.topic_prefix), published)
        time.sleep(args.drain)
        exited = [p.args for p in procs if p.poll() is not None]
    finally:
        watch.stop.set()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    detections = asyncio.run(_read(cfg, topics.DETECTIONS))
    summaries = asyncio.run(_read(cfg, topics.SUMMARIES))
    delete_topics_starting(cfg, (cfg.kafka.topic_prefix, f"{cfg.worker.app_id}-"))
    return _analyse(cfg, args, workers, published, detections, summaries, last_sample,
                    watch, exited)


def _analyse(cfg: Config, args: argparse.Namespace, workers: int, published: Path,
             detections: list[tuple[float, bytes]], summaries: list[tuple[float, bytes]],
             last_sample: dict[int, float], watch: _Watch, exited: list[Any]
             ) -> dict[str, Any]:
    bin_s = cfg.detect.bin_seconds

    expected = _replay(published, cfg)
    firing_at = {_ident(d): d for d in expected}
    got = [(t, decode_detection(v)) for t, v in detections]
    lags: dict[str, list[float]] = defaultdict(list)
    grace = cfg.detect.grace_seconds
    for t, d in got:
        want = firing_at.get(_ident(d))
        if want is None:
            continue
        lag = t - float(want["detected_at"])
        # an XID fires on its sample (its evidence carries the sample's time); every
        # other rule at the end of the bin whose evaluation found it
        windowed = want["evidence"].get("ts") != want["detected_at"]
        lags["all"].append(lag)
        lags["beyond grace" if windowed else "on the sample"].append(
            lag - grace if windowed else lag)
        lags[d["kind"]].append(lag)
    same = sorted(map(_ident, expected)) == sorted(_ident(d) for _, d in got)

    # per bin: the last shard's summary of it appended; stage 2 past its end
    summarised: dict[int, dict[int, float]] = defaultdict(dict)
    for t, raw in summaries:
        s = decode_summary(raw)
        if s["bin"] is not None:
            before = summarised[s["bin"]].get(s["shard"], 0.0)
            summarised[s["bin"]][s["shard"]] = max(before, t)
    stage1_lag: list[float] = []
    bin_lag: list[float] = []
    beyond: list[float] = []
    bins = sorted(last_sample)[2:-2]  # not the first bins (joining) nor the last (drain)
    for b in bins:
        produced = last_sample[b]
        shards_in = summarised.get(b, {})
        if len(shards_in) == args.shards:
            stage1_lag.append(max(shards_in.values()) - produced)
        evaluated = watch.evaluated_at((b + 1) * bin_s)
        if evaluated is not None:
            bin_lag.append(evaluated - produced)
            # the earliest it could be: the first sample grace past the bin's end
            beyond.append(evaluated - max(produced, (b + 1) * bin_s + grace))
    result = {"workers": workers, "detections": len(got), "replay": len(expected),
              "same": same, "lags": dict(lags), "bin_lag": bin_lag, "beyond": beyond,
              "stage1": stage1_lag, "bins": len(bins), "exited": exited}
    print(f"  detections over Kafka {len(got)}, replay {len(expected)}: "
          + ("the same" if same else "NOT the same") + (f"; exited: {exited}" if exited else ""))
    for key in sorted(lags):
        print(f"  detection lag, {key:>14}: {_row(lags[key])}")
    print(f"  per bin, last sample -> summaries of every shard appended: {_row(stage1_lag)}")
    print(f"  per bin, last sample -> stage 2 evaluated: {_row(bin_lag)}")
    print(f"  per bin, beyond bin end + grace: {_row(beyond)}", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--poll", type=float, default=0.1,
                        help="how often stage 2's /metrics is read (s)")
    parser.add_argument("--drain", type=float, default=15.0,
                        help="seconds to wait after the last sample")
    parser.add_argument("--port", type=int, default=16166)
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    args = parser.parse_args()
    trace = _trace(args.nodes, args.seconds)
    results = [run_once(dict(os.environ), trace, args, int(w))
               for w in args.workers.split(",")]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
