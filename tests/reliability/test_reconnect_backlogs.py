"""After a broker outage each agent delivers its backlog when its own producer
reconnects, one after another. The worker reads the first agent's minute before the
others' and must not take their silence for news (``detectors/delivery.py``); a
node that really stopped during the outage is still found.

Published in real time (a sample is sent at its ``ts``), so each Kafka record's send
time stands beside its sample's as an agent's would. The outage is where the test
holds the samples back: what the worker reads is what a real outage produces, in the
order chosen here (node r0's producer back 1.5 s before the others'). Once with one
worker, once with the job in two shards (``vigil worker --stage 1`` and ``--stage 2``:
the moment the path came back travels in the shards' summaries)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.kafka_helpers import read_topic, start_worker
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.producers.publisher import BufferedPublisher
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
NODES = [f"r{i}" for i in range(6)]  # two shards hold r0-r3 and r4-r5
DOWN, UP, END = 15.0, 32.0, 60.0  # seconds into the run: the outage, the end
DEAD = "r3"  # stops sampling during the outage, at DOWN + 5


def _silent(values: list[bytes]) -> list[str | None]:
    return [d["node"] for d in map(decode_detection, values)
            if d["state"] == "firing" and d["kind"] == "node_silent"]


def _workers(env: dict[str, str], shards: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """One worker, or stage 1 and stage 2 of a sharded job (stage 2's last)."""
    if shards == 1:
        return [start_worker(env, logs / "worker.log")]
    return [start_worker(env, logs / f"stage{stage}.log", stage) for stage in (1, 2)]


@pytest.mark.parametrize("shards", [1, 2])
def test_backlogs_after_a_broker_outage_are_no_silence_and_a_dead_node_is_found(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path,
        shards: int) -> None:
    ensure_topics(isolated_cfg)
    start = float(int(time.time()) + 2)
    job = JobSpec("job-r", NODES)
    faults = [Fault("node_silent", "job-r", DEAD, None, start + DOWN + 5)]
    samples = sorted(Simulator(Cluster([job], faults), start, seed=5).samples(END),
                     key=lambda s: s["ts"])
    topic = topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix)
    agents = {n: BufferedPublisher(isolated_cfg.kafka_bootstrap, topic,
                                   shards=lambda _job: shards) for n in NODES}
    workers = _workers(isolated_env, shards, tmp_path)

    def logs() -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("*.log")))
    held: dict[str, list[dict[str, Any]]] = {n: [] for n in NODES}
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
                    agents["r0"].publish(kept)
                assert agents["r0"].flush(30)
                time.sleep(1.5)  # the other producers' backoff
                for node in NODES[1:]:
                    for kept in held[node]:
                        agents[node].publish(kept)
            agents[s["node"]].publish(s)
        for agent in agents.values():
            assert agent.close(30) and agent.dropped == 0
        values = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: DEAD in _silent(v),
                            150, workers[-1])
        assert all(w.poll() is None for w in workers), logs()
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
    assert _silent(values) == [DEAD], logs()
