"""After a broker outage each agent delivers its backlog when its own producer
reconnects, one after another. The worker reads the first agent's minute before the
others' and must not take their silence for news (``detectors/delivery.py``); a
node that really stopped during the outage is still found.

Published in real time (a sample is sent at its ``ts``), so each Kafka record's send
time stands beside its sample's as an agent's would. The outage is where the test
holds the samples back: what the worker reads is what a real outage produces, in the
order chosen here (node r0's producer back 1.5 s before the others'). Both
topologies at once, each on its own topics, fed the same samples: one worker, and
the job in two shards (``vigil worker --stage 1`` and ``--stage 2``: the moment the
path came back travels in the shards' summaries)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.kafka_helpers import log_excerpt, read_topic, start_worker
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.producers.publisher import BufferedPublisher
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
NODES = [f"r{i}" for i in range(6)]  # two shards hold r0-r3 and r4-r5
DOWN, UP, END = 15.0, 32.0, 60.0  # seconds into the run: the outage, the end
DEAD = "r3"  # stops sampling during the outage, at DOWN + 5
SHARDS = (1, 2)


def _silent(values: list[bytes]) -> list[str | None]:
    return [d["node"] for d in map(decode_detection, values)
            if d["state"] == "firing" and d["kind"] == "node_silent"]


def _beside(env: dict[str, str], tag: str) -> dict[str, str]:
    """The test's environment with its own topics, app and data directory."""
    out = dict(env)
    for key in ("VIGIL_KAFKA_TOPIC_PREFIX", "VIGIL_WORKER_APP_ID", "VIGIL_ALERTER_GROUP_ID",
                "VIGIL_WORKER_DATA_DIR"):
        out[key] = env[key].rstrip(".") + tag + ("." if env[key].endswith(".") else "")
    return out


def _workers(env: dict[str, str], shards: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """One worker, or stage 1 and stage 2 of a sharded job (stage 2's last)."""
    logs.mkdir()
    if shards == 1:
        return [start_worker(env, logs / "worker.log")]
    return [start_worker(env, logs / f"stage{stage}.log", stage) for stage in (1, 2)]


def test_backlogs_after_a_broker_outage_are_no_silence_and_a_dead_node_is_found(
        isolated_env: dict[str, str], tmp_path: Path) -> None:
    envs = {k: _beside(isolated_env, f"-{k}") for k in SHARDS}
    cfgs = {k: load(env=env) for k, env in envs.items()}
    for cfg in cfgs.values():
        ensure_topics(cfg)
    start = float(int(time.time()) + 2)
    job = JobSpec("job-r", NODES)
    faults = [Fault("node_silent", "job-r", DEAD, None, start + DOWN + 5)]
    samples = sorted(Simulator(Cluster([job], faults), start, seed=5).samples(END),
                     key=lambda s: s["ts"])
    agents = {(k, n): BufferedPublisher(
        cfg.kafka_bootstrap, topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
        shards=lambda _job, k=k: k) for k, cfg in cfgs.items() for n in NODES}
    workers = {k: _workers(env, k, tmp_path / f"shards-{k}") for k, env in envs.items()}

    def logs(k: int) -> str:
        return "\n".join(log_excerpt(p, 2000)
                         for p in sorted((tmp_path / f"shards-{k}").glob("*.log")))

    def publish(node: str, sample: Sample) -> None:
        for k in SHARDS:
            agents[(k, node)].publish(sample)
    held: dict[str, list[Sample]] = {n: [] for n in NODES}
    values: dict[int, list[bytes]] = {}
    try:
        back = False
        for s in samples:
            time.sleep(max(0.0, s["ts"] - time.time()))  # sampled now
            if start + DOWN <= s["ts"] < start + UP:
                held[s["node"]].append(s)  # the broker is away: the agent buffers it
                continue
            if s["ts"] >= start + UP and not back:  # back: r0's producer reconnects first
                back = True
                for kept in held["r0"]:
                    publish("r0", kept)
                assert all(agents[(k, "r0")].flush(30) for k in SHARDS)
                time.sleep(1.5)  # the other producers' backoff
                for node in NODES[1:]:
                    for kept in held[node]:
                        publish(node, kept)
            publish(s["node"], s)
        for agent in agents.values():
            assert agent.close(30) and agent.dropped == 0
        for k, cfg in cfgs.items():
            values[k] = read_topic(cfg, topics.DETECTIONS, lambda v: DEAD in _silent(v),
                                   150, workers[k][-1])
            assert all(w.poll() is None for w in workers[k]), logs(k)
    finally:
        for each in workers.values():
            for worker in each:
                worker.send_signal(signal.SIGTERM)
        for each in workers.values():
            for worker in each:
                worker.wait(timeout=60)
    for k in SHARDS:
        assert _silent(values[k]) == [DEAD], f"{k} shard(s):\n{logs(k)}"
