"""One fault of one node is one incident (issue #45): a node-wide clock event is one
finding on the node, and the straggler it makes is part of it."""

from __future__ import annotations

from typing import Any

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.grouping import group_by_node
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

T0 = 1_950_000_000.0
BRAKE = 0x80


def _fired(fault: Fault, bits: int | None, seconds: float = 240) -> list[dict[str, Any]]:
    job = JobSpec("j", [f"n{i}" for i in range(4)])
    samples = list(Simulator(Cluster([job], [fault]), T0, seed=8).samples(seconds))
    if bits is not None:
        for s in samples:
            if s["node"] == fault.node and fault.active(s["ts"]):
                for g, r in s["gpus"].items():
                    if fault.gpu in (None, g):
                        r["throttle"] = float(bits)
    runner = ReplayRunner(DetectConfig())
    return [d for s in samples for d in runner.feed(s) if d["state"] == "firing"]


def test_a_node_wide_power_brake_is_one_incident() -> None:
    brake = Fault("slow_node", "j", "n2", None, T0 + 90, severity=1.3)
    fired = _fired(brake, BRAKE)
    assert [(d["kind"], d["node"], d["gpu"]) for d in fired] == [("gpu_health", "n2", None)]
    det = fired[0]
    assert det["evidence"]["gpus"] == [str(g) for g in range(8)]
    assert det["evidence"]["throttle_bits"] == BRAKE and "power brake" in det["summary"]
    assert det["detected_at"] - brake.start <= 30
    assert det["evidence"]["gpu_hours_lost_per_hour"] > 0


def test_a_throttled_gpu_is_one_incident_found_at_the_straggler_speed() -> None:
    thermal = Fault("thermal", "j", "n2", "5", T0 + 90)
    fired = _fired(thermal, None)
    assert [(d["kind"], d["node"], d["gpu"]) for d in fired] == [("gpu_health", "n2", "5")]
    assert fired[0]["detected_at"] - thermal.start <= 15
    assert fired[0]["evidence"]["straggler"]["busy"] is not None


def test_a_slow_gpu_under_the_power_cap_alone_stays_a_straggler() -> None:
    """The power cap (0x4) names no fault: no health finding to fold it into."""
    fired = _fired(Fault("slow_gpu", "j", "n2", "5", T0 + 90, severity=1.25), None)
    assert [(d["kind"], d["node"], d["gpu"]) for d in fired] == [("straggler", "n2", "5")]


def _throttled(gpu: str) -> Finding:
    return Finding("gpu_health", "n1", gpu, "warning", ("throttle",), 20.0, "t", 100.0,
                   {"throttle_bits": 0x40, "seconds": 20.0})


@pytest.mark.parametrize(("gpus", "node_level"), [(["0"], False), (["0", "1"], False),
                                                   (["0", "1", "2", "3"], True)])
def test_half_a_node_or_more_is_node_wide(gpus: list[str], node_level: bool) -> None:
    out = group_by_node([_throttled(g) for g in gpus], {f"n1/{g}": 0x40 for g in gpus},
                        {"n1": 8})
    assert [f.gpu is None for f in out] == ([True] if node_level else [False] * len(gpus))


def test_a_host_bound_node_is_never_folded_into_a_clock_event() -> None:
    host = Finding("straggler", "n1", None, "warning", ("gpu_util",), 3.0, "h", 90.0,
                   {"host_bound": True})
    out = group_by_node([host], {f"n1/{g}": 0x80 for g in range(8)}, {"n1": 8})
    assert out == [host]
