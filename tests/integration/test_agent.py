"""`vigil agent` as a process: Kafka, /metrics, SIGTERM that flushes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from kafka import KafkaConsumer

from tests.integration.ports import free_port
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.catalog import GPU_METRICS
from vigil_gpu_monitor.contracts.codec import decode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        lines = resp.read().decode().splitlines()
    return {ln.split()[0]: float(ln.split()[1]) for ln in lines
            if ln.startswith("vigil_agent_")}


def test_agent_publishes_exposes_metrics_and_flushes_on_sigterm(
        isolated_env: dict[str, str], isolated_cfg: Config) -> None:
    ensure_topics(isolated_cfg)
    port = free_port()
    env = dict(isolated_env, VIGIL_AGENT_METRICS_PORT=str(port), VIGIL_AGENT_NODE="gpu-node-7",
               VIGIL_AGENT_JOB="job-42")
    agent = subprocess.Popen([sys.executable, "-m", "vigil_gpu_monitor", "agent", "--sources",
                              "fake-nvml,host"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        deadline, seen = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            try:
                seen = _metrics(port)
                if seen.get("vigil_agent_samples_published_total", 0) >= 3:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert seen.get("vigil_agent_samples_published_total", 0) >= 3, agent.stderr
        assert seen["vigil_agent_samples_dropped_total"] == 0
        read, published = (seen["vigil_agent_values_read_total"],
                           seen["vigil_agent_values_published_total"])
        assert read > published > 0
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err.decode()[-2000:]
    ticks = int(err.decode().split("agent stopped after ")[1].split()[0])
    consumer = KafkaConsumer(topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix),
                             bootstrap_servers=isolated_cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    samples = [decode_sample(r.value) for r in consumer]
    consumer.close()
    assert len(samples) == ticks  # every tick's sample reached Kafka before exit
    assert {s["node"] for s in samples} == {"gpu-node-7"}
    assert {s["job"] for s in samples} == {"job-42"}
    # the first tick reads every metric the NVML source reads: all but graphics-engine
    # activity (producers/nvml.py says why)
    assert len(samples[0]["gpus"]) == 8
    assert set(samples[0]["gpus"]["0"]) == set(GPU_METRICS) - {"gr_engine_active"}
