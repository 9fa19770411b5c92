"""The walking skeleton through real Kafka and Redis: simulate → worker → alerter."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import redis

from tests.integration.kafka_helpers import read_topic
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.status import decode_status

pytestmark = pytest.mark.integration
VIGIL = [sys.executable, "-m", "vigil_gpu_monitor"]


def test_injected_slow_gpu_reaches_redis(isolated_env: dict[str, str], isolated_cfg: Config,
                                         tmp_path: Path) -> None:
    labels_path = tmp_path / "labels.json"
    subprocess.run([*VIGIL, "simulate", "--fast", "--duration", "150", "--jobs", "2",
                    "--nodes", "4", "--labels", str(labels_path)], env=isolated_env, check=True,
                   timeout=120)
    labels = json.loads(labels_path.read_text())
    worker = subprocess.Popen([*VIGIL, "worker"], env=isolated_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        dets = [decode_detection(v) for v in read_topic(
            isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 150, worker)]
        fault = labels[0]
        # The live view's feed: the worker's status for the faulty job, with heat.
        statuses = [decode_status(v) for v in read_topic(
            isolated_cfg, topics.STATUS, lambda v: any(
                fault["job"].encode() in x and b'"kind":"job"' in x for x in v), 60, worker)]
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert dets, f"no detection; worker stderr tail:\n{err.decode(errors='replace')[-3000:]}"
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

    report = tmp_path / "report.html"
    subprocess.run([*VIGIL, "report", fault["job"], "--out", str(report)], env=isolated_env,
                   check=True, timeout=120)  # from the samples topic
    page = report.read_text()
    assert page.count("data:image/png;base64,") == 5  # four plots, lost GPU-hours by cause
    assert f"<td>{fault['node']}</td><td>{fault['gpu']}</td>" in page  # the detection row

    heat = [st for st in statuses if st["kind"] == "job" and st["job"] == fault["job"]]
    assert heat and f"{fault['node']}/{fault['gpu']}" in heat[-1]["heat"]
    assert any(st["kind"] == "worker" for st in statuses)
    screen = _top_in_pty(isolated_env)
    assert "OPEN INCIDENTS" in screen and "straggler" in screen, screen
    assert f"{fault['node']}" in screen and f"◀ straggler (GPU {fault['gpu']})" in screen, screen
    assert "worker " in screen and "dead letters" in screen, screen


def _top_in_pty(env: dict[str, str]) -> str:
    """Run `vigil top` on a pseudo-terminal, collect a frame or two, quit with ``q``."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
    proc = subprocess.Popen([*VIGIL, "top", "--interval", "0.5"], env=env, stdin=child,
                            stdout=child, stderr=child, close_fds=True)
    os.close(child)
    screen = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and b"silent agents" not in screen:
            ready, _, _ = select.select([parent], [], [], 1.0)
            if ready:
                screen += os.read(parent, 65536)
        os.write(parent, b"q")
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        try:  # drain what is left so the child never blocks on a full pty
            while select.select([parent], [], [], 0.2)[0] and os.read(parent, 65536):
                pass
        except OSError:
            pass
        os.close(parent)
    return screen.decode(errors="replace")
