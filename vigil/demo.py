"""`make demo`: the whole pipeline on the local stack for about a minute.

Starts Kafka and Redis (unless configured elsewhere), the Faust worker and the
alerter, publishes a small simulated cluster in real time with one GPU slowing
down, prints each detection as it arrives and where it sits in Redis, then stops
everything it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import redis
from kafka import KafkaConsumer

from alerting.state import LiveState
from contracts import topics
from contracts.codec import decode_detection
from contracts.config import load
from vigil import localstack
from vigil.kafka_admin import ensure_topics

DURATION = 75.0
SLOW_AFTER = 15.0


def _banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def _spawn(args: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "vigil.cli", *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def main() -> int:
    """Run the demo; returns non-zero when the injected fault was not detected."""
    run = time.strftime("%Y%m%d-%H%M%S")
    env = dict(os.environ, VIGIL_KAFKA_TOPIC_PREFIX=f"demo-{run}.",
               VIGIL_WORKER_APP_ID=f"vigil-demo-{run}", VIGIL_ALERTER_GROUP_ID=f"demo-{run}",
               VIGIL_REDIS_KEY_PREFIX=f"vigil-demo-{run}")
    cfg = load(env=env)
    started = [name for name, svc in localstack.services(cfg).items() if svc.pid() is None]
    _banner("starting the local stack (real Kafka in KRaft mode, real Redis)")
    localstack.up(cfg)
    ensure_topics(cfg)
    os.makedirs(".vigil/demo", exist_ok=True)
    procs = {
        "worker": _spawn(["worker"], env, f".vigil/demo/worker-{run}.log"),
        "alerter": _spawn(["alerter"], env, f".vigil/demo/alerter-{run}.log"),
    }
    labels = f".vigil/demo/labels-{run}.json"
    _banner(f"simulating 2 jobs x 4 nodes x 8 GPUs for {DURATION:.0f}s; "
            f"one GPU slows down after {SLOW_AFTER:.0f}s")
    sim = _spawn(["simulate", "--realtime", "--duration", str(DURATION), "--slow-after",
                  str(SLOW_AFTER), "--labels", labels], env, f".vigil/demo/simulate-{run}.log")
    found: list[dict[str, Any]] = []
    consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=1000)
    try:
        deadline = time.monotonic() + DURATION + 40
        while time.monotonic() < deadline and (sim.poll() is None or not found):
            for record in consumer:
                det = decode_detection(record.value)
                found.append(det)
                print(f"[{det['state']:8}] {det['kind']} {det['job']} {det['node']} "
                      f"gpu={det['gpu']}: {det['summary']}", flush=True)
        time.sleep(3)  # let the alerter apply the last detections
        with open(labels) as fh:
            fault = json.load(fh)[0]
        state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
        _banner("live state in Redis")
        for det in state.open_incidents():
            print(f"HGET {state.open_key(det['job'])} {det['id']}")
            print(f"  -> {det['kind']} on {det['node']} GPU {det['gpu']}, "
                  f"started {det['started_at'] - fault['start']:+.0f}s after the fault, "
                  f"confirmed {det['detected_at'] - fault['start']:.0f}s after it")
        print(f"history stream: XREVRANGE {state.history_key} + - "
              f"({len(state.history())} entries); live updates: SUBSCRIBE {state.updates_channel}")
        hit = any((d["job"], d["node"], d["gpu"]) == (fault["job"], fault["node"], fault["gpu"])
                  for d in found)
        _banner("result")
        print(f"injected: slow GPU {fault['gpu']} on {fault['node']} ({fault['job']}); "
              f"detected: {'yes' if hit else 'NO'}; detections seen: {len(found)}")
        return 0 if hit else 1
    finally:
        consumer.close()
        for proc in [sim, *procs.values()]:
            proc.terminate()
        for proc in [sim, *procs.values()]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if started:
            _banner(f"stopping what the demo started: {', '.join(started)}")
            localstack.down(cfg)


if __name__ == "__main__":
    sys.exit(main())
