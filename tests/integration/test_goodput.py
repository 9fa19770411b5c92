"""The goodput ledger against a real Redis: its sums are the detections' costs."""

from __future__ import annotations

import pytest
import redis

from vigil_gpu_monitor.alerting.goodput import DAY, GoodputLedger, rate_of
from vigil_gpu_monitor.alerting.repair import RepairLog
from vigil_gpu_monitor.contracts.codec import validate_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.messages import Detection
from vigil_gpu_monitor.vigil.evaluation.stepcheck import simulate

pytestmark = pytest.mark.integration


def _hang(start: float, end: float) -> list[Detection]:
    fired: Detection = {
        "schema": "vigil.detection/1", "id": "hang-1", "kind": "hang", "state": "firing",
        "severity": "critical", "job": "job-h", "node": None, "gpu": None,
        "started_at": start, "detected_at": start + 30, "metrics": ["sm_active"],
        "score": 1.0, "summary": "hung", "evidence": {"job_gpus": 64, "cost_basis": "hang",
                                                      "gpu_hours_lost_per_hour": 64.0,
                                                      "job_slowdown": None}}
    return [validate_detection(fired),
            validate_detection({**fired, "state": "resolved", "detected_at": end})]


def test_the_ledger_adds_up_to_the_detections_costs(isolated_cfg: Config) -> None:
    r = redis.Redis.from_url(isolated_cfg.redis_url)
    ledger = GoodputLedger(r, isolated_cfg.redis.key_prefix)
    detections, _ = simulate("cost_straggler", 3, counters=False)
    midnight = (int(detections[0]["started_at"] // DAY) + 1) * DAY
    detections += _hang(midnight - 1800, midnight + 1800)  # over a day boundary
    for det in detections:
        ledger.apply(det)
        ledger.apply(det)  # a redelivered detection counts once
    expected: dict[str, float] = {}
    for det in detections:
        rate = rate_of(det)
        if det["state"] == "resolved" and rate is not None:
            hours = rate * (det["detected_at"] - det["started_at"]) / 3600
            expected[det["kind"]] = expected.get(det["kind"], 0.0) + hours
    assert expected["straggler"] > 0 and expected["hang"] == pytest.approx(64.0)
    report = ledger.summary(detections[0]["started_at"] - DAY, midnight + DAY)
    assert report["kind"] == pytest.approx(expected)
    assert report["total"] == pytest.approx(sum(expected.values()))
    assert report["source"]["timings"] == pytest.approx(expected["straggler"])
    assert report["source"]["counters"] == pytest.approx(64.0)  # a hang: the whole job
    hang_days = {d: h for d, h in report["day"].items() if h == pytest.approx(32.0)}
    assert len(hang_days) >= 1  # half of the hang's hour on each side of midnight
    straggler = next(d for d in detections if d["kind"] == "straggler")
    assert report["gpu"][f"{straggler['node']} GPU {straggler['gpu']}"] == pytest.approx(
        expected["straggler"])
    assert ledger.summary(0, 1e10, job="job-h")["total"] == pytest.approx(64.0)


def test_nodes_out_of_service_cost_their_gpus_until_they_return(isolated_cfg: Config) -> None:
    r = redis.Redis.from_url(isolated_cfg.redis_url)
    prefix = isolated_cfg.redis.key_prefix
    ledger, repairs = GoodputLedger(r, prefix), RepairLog(r, prefix)
    t0 = 1_900_000_000.0
    repairs.move("node-7", ("in_service",), "out", "drained", "vigil", t0, gpus=8, out_at=t0)
    ledger.observe_out(repairs.out_nodes(), t0 + 60)
    assert ledger.summary(t0, t0 + 1800)["node"]["node-7"] == pytest.approx(4.0)  # still out
    repairs.move("node-7", ("out",), "in_service", "returned", "vigil", t0 + 3600)
    ledger.observe_out(repairs.out_nodes(), t0 + 3600)
    report = ledger.summary(t0 - 10, t0 + 7200)
    assert report["kind"] == {"out_of_service": pytest.approx(8.0)}
    assert report["source"] == {"lifecycle": pytest.approx(8.0)}


def test_vigil_goodput_prints_the_ledger(isolated_env: dict[str, str],
                                         isolated_cfg: Config) -> None:
    import json
    import subprocess
    import sys
    import time

    r = redis.Redis.from_url(isolated_cfg.redis_url)
    ledger = GoodputLedger(r, isolated_cfg.redis.key_prefix)
    now = time.time()
    for det in _hang(now - 7200, now - 3600):
        ledger.apply(det)
    run = subprocess.run([sys.executable, "-m", "vigil_gpu_monitor", "goodput", "--since", "1d",
                          "--json"], env=isolated_env, capture_output=True, text=True,
                         timeout=60, check=True)
    report = json.loads(run.stdout)
    assert report["total"] == pytest.approx(64.0) and report["kind"] == {
        "hang": pytest.approx(64.0)}
    text = subprocess.run([sys.executable, "-m", "vigil_gpu_monitor", "goodput", "--since", "2w"],
                          env=isolated_env, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and "GPU-hours lost: 64.0 (fleet)" in text.stdout
    bad = subprocess.run([sys.executable, "-m", "vigil_gpu_monitor", "goodput", "--since", "soon"],
                         env=isolated_env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--since 'soon'" in bad.stderr and "Traceback" not in (
        bad.stderr)
