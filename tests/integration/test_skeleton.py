"""The walking skeleton through real Kafka and Redis: simulate → worker → alerter."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from alerting.state import LiveState
from contracts import topics
from contracts.codec import decode_detection
from contracts.config import Config
from tests.integration.kafka_helpers import read_topic

pytestmark = pytest.mark.integration
VIGIL = [sys.executable, "-m", "vigil.cli"]


def test_injected_slow_gpu_reaches_redis(isolated_env: dict[str, str], isolated_cfg: Config,
                                         tmp_path: Path) -> None:
    labels_path = tmp_path / "labels.json"
    subprocess.run([*VIGIL, "simulate", "--duration", "150", "--jobs", "2", "--nodes", "4",
                    "--labels", str(labels_path)], env=isolated_env, check=True, timeout=120)
    labels = json.loads(labels_path.read_text())
    worker = subprocess.Popen([*VIGIL, "worker"], env=isolated_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        dets = [decode_detection(v) for v in read_topic(
            isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 150, worker)]
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert dets, f"no detection; worker stderr tail:\n{err.decode(errors='replace')[-3000:]}"
    fault = labels[0]
    blamed = {(d["job"], d["node"], d["gpu"]) for d in dets if d["state"] == "firing"}
    assert blamed == {(fault["job"], fault["node"], fault["gpu"])}

    subprocess.run([*VIGIL, "alerter", "--max-seconds", "15"], env=isolated_env, check=True,
                   timeout=90)
    state = LiveState(redis.Redis.from_url(isolated_cfg.redis_url),
                      isolated_cfg.redis.key_prefix)
    open_now = state.open_incidents()
    assert [(d["job"], d["node"], d["gpu"], d["kind"]) for d in open_now] == [
        (fault["job"], fault["node"], fault["gpu"], "straggler")]
    assert state.history(10)[0]["id"] == open_now[0]["id"]
    listing = subprocess.run([*VIGIL, "alerts"], env=isolated_env, check=True,
                             capture_output=True, text=True, timeout=30).stdout
    assert fault["node"] in listing and "straggler" in listing
