"""Link checks on what dcgm-exporter's default fields give (issue #29): PCIe replays
that rise while Vigil watches, and NVLink traffic given only as a total."""

from __future__ import annotations

from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 1_880_000_000.0


def _run(edit: Any, seconds: int = 120) -> list[dict[str, Any]]:
    job = JobSpec("x", [f"x{i}" for i in range(4)])
    faults = [Fault("nvlink_degraded", "x", "x2", "5", START + 40)]
    runner = ReplayRunner(DetectConfig())
    out = []
    for s in Simulator(Cluster([job], faults), START, seed=4).samples(seconds):
        edit(s)
        out.extend(d for d in runner.feed(s) if d["state"] == "firing")
    return out


def test_pcie_replays_that_rise_while_watched_are_a_link_fault_and_old_ones_are_not() -> None:
    def replays(s: dict[str, Any]) -> None:
        for gpu, r in s["gpus"].items():
            r.pop("nvlink_tx"), r.pop("nvlink_rx")  # leave the NVLink fault out of it
            t = s["ts"] - START
            # GPU 1 of x1 had 5,000 replays before Vigil watched; GPU 6 of x3 starts
            # replaying 20 a second at t+50
            r["pcie_replay"] = 5000.0 if (s["node"], gpu) == ("x1", "1") else (
                max(0.0, t - 50) * 20 if (s["node"], gpu) == ("x3", "6") else 3.0)

    found = [(d["kind"], d["node"], d["gpu"], tuple(d["metrics"])) for d in _run(replays)]
    assert found == [("link_health", "x3", "6", ("pcie_replay",))], found


def test_nvlink_total_feeds_the_nvlink_check_where_tx_and_rx_are_not_split() -> None:
    def total_only(s: dict[str, Any]) -> None:
        for r in s["gpus"].values():
            r["nvlink_total"] = r.pop("nvlink_tx") + r.pop("nvlink_rx")

    found = [(d["kind"], d["node"], d["gpu"], tuple(d["metrics"])) for d in _run(total_only)]
    assert ("link_health", "x2", "5", ("nvlink_total",)) in found, found
