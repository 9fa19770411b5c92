"""Clock skew up to ±30 s on the nodes and duplicated deliveries: no false
alarms, the real fault still found once, with the same incident ids.

The job's event-time watermark is its newest timestamp minus ``detect.grace_seconds``;
a node whose clock runs behind by more than the grace has its samples counted late.
So skew is tolerated up to the grace: the default 5 s covers NTP-synchronised
clusters, and ±30 s needs a grace of 2 × 30 s plus the tick (detections then come
that much later in wall time). docs/reliability.md has the figures.
"""

from __future__ import annotations

from typing import Any

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 1_880_000_000.0


SKEW = 30.0
SKEW_TOLERANT = DetectConfig(grace_seconds=2 * SKEW + 2)


def _run(cluster: Cluster, duplicate: bool,
         cfg: DetectConfig = SKEW_TOLERANT) -> list[dict[str, Any]]:
    runner = ReplayRunner(cfg)
    out = []
    for sample in Simulator(cluster, START, seed=11).samples(240):
        out.extend(runner.feed(sample))
        if duplicate:  # Kafka's at-least-once: the same sample again
            out.extend(runner.feed(dict(sample)))
    return out


@pytest.mark.parametrize("kind", ["data_parallel", "pipeline", "moe"])
@pytest.mark.parametrize("duplicate", [False, True])
def test_skewed_clocks_raise_no_false_alarm(kind: str, duplicate: bool) -> None:
    jobs = [JobSpec(f"{kind}-{j}", [f"{kind}{j}-n{i}" for i in range(8)], kind=kind)
            for j in range(2)]
    found = _run(Cluster(jobs, [], skew_seconds=SKEW, reorder_seconds=3.0), duplicate)
    assert found == [], [(d["kind"], d["node"], d["summary"]) for d in found]


@pytest.mark.parametrize("kind", ["data_parallel", "pipeline", "moe"])
def test_duplicates_neither_hide_nor_repeat_a_fault(kind: str) -> None:
    job = JobSpec("j", [f"n{i}" for i in range(8)], kind=kind)
    cluster = Cluster([job], [Fault("slow_gpu", "j", "n5", "3", START + 60)],
                      skew_seconds=SKEW)
    once, twice = _run(cluster, False), _run(cluster, True)
    firing = [(d["id"], d["node"], d["gpu"]) for d in twice if d["state"] == "firing"]
    assert firing and {(n, g) for _, n, g in firing} == {("n5", "3")}
    assert len(firing) == len({i for i, _, _ in firing}), "an incident fired twice"
    assert {d["id"] for d in once} == {d["id"] for d in twice}


def test_default_config_tolerates_ntp_grade_skew_and_corrects_30_seconds() -> None:
    """±2 s is absorbed by the grace period; clocks up to ±30 s off are put back on
    the job's clock (detectors/clocks.py), so no node looks silent. (Before that
    correction, the nodes running behind looked silent: their samples arrived behind
    the watermark.)"""
    jobs = [JobSpec("dp", [f"n{i}" for i in range(8)])]
    assert _run(Cluster(jobs, [], skew_seconds=2.0, reorder_seconds=2.0), True,
                DetectConfig()) == []
    assert _run(Cluster(jobs, [], skew_seconds=SKEW), False, DetectConfig()) == []
