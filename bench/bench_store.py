"""The engine table in the memory store: what recovery costs as its changelog grows.

    .venv/bin/vigil up
    .venv/bin/python bench/bench_store.py [--nodes 256] [--seconds 120] [--checkpoint-steps 6,1]

For each ``worker.checkpoint_steps`` value, in a fresh consumer group: pre-load
``nodes × seconds`` node-samples (8-node jobs, one slow GPU each), run one worker until
it has processed them all (rate, peak RSS, batch errors: must be 0), stop it with
SIGTERM, and measure the engines changelog (records and bytes a recovering worker
reads: the memory store rebuilds the table from it at every start). Then start a worker
again twice and time it from spawn to Faust's "Worker ready" (table recovered,
consuming): on the same data directory (a restart) and on an empty one (a new host).
Fewer checkpoint steps = more checkpoints = a longer changelog to recover.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

sys.path.insert(0, str(Path(__file__).parent))

from bench_agent import _peak_rss_mb
from bench_worker import START, _cluster, _metric

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.producers.publisher import KafkaPublisher
from vigil_gpu_monitor.simulator.cluster import Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

READY = b"[^Worker]: Ready"


def _spawn(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "vigil_gpu_monitor", "worker"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _time_to_ready(env: dict[str, str], log: Path) -> float:
    """Seconds from spawning a worker to its "Ready" line."""
    log.write_bytes(b"")
    began = time.monotonic()
    proc = _spawn(env, log)
    try:
        while time.monotonic() - began < 300 and proc.poll() is None:
            if READY in log.read_bytes():
                return time.monotonic() - began
            time.sleep(0.05)
        raise RuntimeError(f"worker not ready, see {log}")
    finally:
        _stop(proc)


async def _changelog(bootstrap: str, topic: str) -> tuple[int, int]:
    """Records and value bytes in the changelog: everything a recovering worker reads."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    records = size = 0
    try:
        await reader._client.force_metadata_update()
        tps = [TopicPartition(topic, p) for p in reader.partitions_for_topic(topic) or ()]
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        ends = await reader.end_offsets(tps)
        while [tp for tp in tps if await reader.position(tp) < ends[tp]]:
            for part in (await reader.getmany(timeout_ms=1000)).values():
                records += len(part)
                size += sum(len(r.value or b"") for r in part)
    finally:
        await reader.stop()
    return records, size


def run(steps: int, nodes: int, seconds: int, port: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    data_dir = Path(f".vigil/bench-store-{tag}")
    env = dict(os.environ, VIGIL_KAFKA_TOPIC_PREFIX=f"store{tag}.",
               VIGIL_WORKER_APP_ID=f"store-{tag}", VIGIL_WORKER_DATA_DIR=str(data_dir),
               VIGIL_WORKER_CHECKPOINT_STEPS=str(steps), VIGIL_WORKER_WEB_PORT=str(port))
    cfg = load(env=env)
    ensure_topics(cfg)
    pub = KafkaPublisher(cfg.kafka_bootstrap, topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix))
    for sample in Simulator(_cluster(nodes), START, seed=1).samples(seconds):
        pub.publish(sample)
    pub.close()
    total = pub.sent
    data_dir.mkdir(parents=True, exist_ok=True)
    worker = _spawn(env, data_dir / "worker-1.log")
    first = last = 0.0
    done = 0.0
    try:
        deadline = time.monotonic() + 600
        while done < total and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.2)
            try:
                now_done = _metric(port, "vigil_worker_samples")
            except OSError:
                continue
            if now_done and not first:
                first = time.monotonic()
            if now_done > done:
                done, last = now_done, time.monotonic()
        rss = _peak_rss_mb(worker.pid)
        errors = _metric(port, "vigil_worker_batch_errors")
    finally:
        _stop(worker)
    changelog = f"{cfg.worker.app_id}-engines-changelog"
    records, size = asyncio.run(_changelog(cfg.kafka_bootstrap, changelog))
    same_host = _time_to_ready(env, data_dir / "worker-2.log")
    fresh = Path(f"{data_dir}-fresh")
    new_host = _time_to_ready(dict(env, VIGIL_WORKER_DATA_DIR=str(fresh)),
                              data_dir / "worker-3.log")
    shutil.rmtree(fresh, ignore_errors=True)
    return {"steps": steps, "samples": total, "processed": done, "errors": errors,
            "rate": done / (last - first) if last > first else 0.0, "rss_mb": rss,
            "changelog_records": records, "changelog_mb": size / 1e6,
            "ready_same_host_s": same_host, "ready_new_host_s": new_host}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--port", type=int, default=16166)
    parser.add_argument("--checkpoint-steps", default="6,1")
    args = parser.parse_args()
    rows = [run(int(n), args.nodes, args.seconds, args.port)
            for n in args.checkpoint_steps.split(",")]
    print(f"{'steps':>5} {'samples':>8} {'errors':>6} {'msg/s':>7} {'peak RSS MB':>12} "
          f"{'changelog':>18} {'ready: same host':>17} {'new host':>9}")
    for r in rows:
        print(f"{r['steps']:5d} {r['processed']:8.0f} {r['errors']:6.0f} {r['rate']:7.0f} "
              f"{r['rss_mb']:12.0f} "
              f"{r['changelog_records']:6d} rec {r['changelog_mb']:6.1f} MB "
              f"{r['ready_same_host_s']:16.1f}s {r['ready_new_host_s']:8.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
