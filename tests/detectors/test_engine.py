"""The straggler detector and incident tracker through the job engine."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.contracts.codec import validate_detection
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import JobEngine, ReplayRunner
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.incidents import IncidentTracker
from vigil_gpu_monitor.detectors.robust import robust_z
from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator, demo_cluster

CFG = DetectConfig()
START = 1_000_000.0


def _run(samples: Iterator[dict[str, Any]], cfg: DetectConfig = CFG) -> list[dict[str, Any]]:
    runner = ReplayRunner(cfg)
    return [d for s in samples for d in runner.feed(s)]


def _healthy(seed: int, nodes: int = 4) -> Cluster:
    return Cluster([JobSpec("job-h", [f"n{i}" for i in range(nodes)])])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_slow_gpu_is_found_within_30s_and_blamed_exactly(seed: int) -> None:
    cluster = demo_cluster(jobs=2, nodes=4, start=START, slow_after=60.0)
    fault = cluster.faults[0]
    dets = _run(Simulator(cluster, START, seed=seed).samples(200))
    firing = [d for d in dets if d["state"] == "firing"]
    assert len(firing) == 1, firing
    det = validate_detection(firing[0])
    assert (det["job"], det["node"], det["gpu"]) == (fault.job, fault.node, fault.gpu)
    assert 0 <= det["detected_at"] - fault.start <= 30
    assert abs(det["started_at"] - fault.start) <= CFG.bin_seconds
    assert "sm_active" in det["metrics"] and det["evidence"]["deviations"]


@pytest.mark.parametrize("seed", range(5))
def test_healthy_jobs_raise_nothing(seed: int) -> None:
    assert _run(Simulator(_healthy(seed, nodes=8), START, seed=seed).samples(300)) == []


def _whole_job_pause(samples: Iterator[dict[str, Any]], start: float,
                     end: float) -> Iterator[dict[str, Any]]:
    """A checkpoint: every GPU of the job idles at once."""
    for s in samples:
        if start <= s["ts"] < end:
            s = copy.deepcopy(s)
            for g in s["gpus"].values():
                g.update(sm_active=0.01, tensor_active=0.0, dram_active=0.02, power=95.0)
        yield s


def test_whole_job_checkpoint_is_not_a_straggler() -> None:
    sim = Simulator(_healthy(0, nodes=4), START, seed=4)
    assert _run(_whole_job_pause(sim.samples(300), START + 100, START + 140)) == []


def test_slow_gpu_resolves_with_the_same_id() -> None:
    cluster = demo_cluster(jobs=1, nodes=4, start=START, slow_after=30.0)
    fault = cluster.faults[0]
    cluster.faults[0] = type(fault)(fault.kind, fault.job, fault.node, fault.gpu, fault.start,
                                    START + 120)
    dets = _run(Simulator(cluster, START, seed=5).samples(240))
    assert [d["state"] for d in dets] == ["firing", "resolved"]
    assert dets[0]["id"] == dets[1]["id"]
    assert dets[1]["detected_at"] > START + 120


def test_restarting_from_state_gives_identical_detections() -> None:
    """What the worker does on failover: rebuild the engine from its JSON state."""
    samples = list(Simulator(demo_cluster(1, 4, START), START, seed=6).samples(200))
    straight = _run(iter(samples))
    engine: JobEngine | None = None
    resumed = []
    for i, s in enumerate(samples):
        if engine is None or i % 97 == 0:  # restart from a JSON round trip, often
            state = json.loads(json.dumps(engine.to_state())) if engine else None
            engine = JobEngine(s["job"], CFG, state)
        resumed.extend(engine.ingest(s) + engine.advance())
    assert resumed == straight and straight


def test_late_samples_are_counted_not_used() -> None:
    samples = list(Simulator(_healthy(0), START, seed=1).samples(60))
    engine = JobEngine("job-h", CFG)
    for s in samples:
        engine.ingest(s)
        engine.advance()
    old = dict(samples[0], ts=samples[0]["ts"])
    window_before = json.dumps(engine.window.to_state(), sort_keys=True)
    assert engine.ingest(old) == []
    assert engine.late == 1
    assert json.dumps(engine.window.to_state(), sort_keys=True) == window_before


def test_out_of_order_within_grace_gives_same_result() -> None:
    samples = list(Simulator(demo_cluster(1, 4, START), START, seed=8).samples(200))
    shuffled = []
    for i in range(0, len(samples), 8):  # swap neighbouring ticks (1 s apart)
        shuffled.extend(samples[i + 4:i + 8] + samples[i:i + 4])
    assert _run(iter(shuffled)) == _run(iter(samples))


@pytest.mark.parametrize("mutate", ["drop_metric", "drop_gpu", "nan_free_empty", "single_gpu"])
def test_degenerate_inputs_do_not_crash_or_accuse(mutate: str) -> None:
    cluster = Cluster([JobSpec("job-d", ["n0", "n1"], gpus_per_node=1 if mutate == "single_gpu"
                                else 8)])
    out = []
    for s in Simulator(cluster, START, seed=2).samples(120):
        s = copy.deepcopy(s)
        if mutate == "drop_metric":
            for g in s["gpus"].values():
                g.pop("sm_active", None)
        elif mutate == "drop_gpu" and s["ts"] > START + 50:
            s["gpus"].pop("2", None)
        elif mutate == "nan_free_empty":
            s["gpus"] = {}
        out.append(s)
    dets = _run(iter(out))
    if mutate == "drop_gpu":  # a GPU that stops answering is a health incident, nothing else
        assert {(d["kind"], d["node"], d["gpu"]) for d in dets} == {
            ("gpu_health", "n0", "2"), ("gpu_health", "n1", "2")}
        assert all("stopped answering" in d["summary"] for d in dets)
    else:
        assert dets == []


def test_tracker_persistence_and_hysteresis() -> None:
    tracker = IncidentTracker("j", fire_after=2, resolve_after=2)
    f = Finding("straggler", "n", "1", "warning", ("sm_active",), 5.0, "s", 10.0)
    assert tracker.update(15, [f], {"straggler"}) == []
    fired = tracker.update(20, [f], {"straggler"})
    assert [d["state"] for d in fired] == ["firing"]
    assert tracker.update(25, [], {"straggler"}) == []  # one clear evaluation: still open
    assert tracker.update(30, [f], {"straggler"}) == []  # back: no second firing
    assert tracker.update(35, [], {"hang"}) == []  # other kinds' evaluations do not resolve it
    assert tracker.update(40, [], {"straggler"}) == []
    resolved = tracker.update(45, [], {"straggler"})
    assert [d["state"] for d in resolved] == ["resolved"]
    assert resolved[0]["id"] == fired[0]["id"] and resolved[0]["detected_at"] == 45
    assert tracker.open_incidents() == []


def test_a_finding_without_its_readings_keeps_an_incident_open_but_never_opens_one(
        ) -> None:
    tracker = IncidentTracker("j", fire_after=1, resolve_after=1)
    unread = Finding("load_imbalance", "n", "1", "info", ("sm_active",), 0.0, "s", 10.0,
                     {"unread": True, "job_slowdown": None})
    read = Finding("load_imbalance", "n", "1", "info", ("sm_active",), 2.0, "s", 10.0,
                   {"job_slowdown": 0.2})
    assert tracker.update(15, [unread], {"load_imbalance"}) == []
    [fired] = tracker.update(20, [read], {"load_imbalance"})
    assert fired["evidence"]["job_slowdown"] == 0.2
    assert tracker.update(25, [unread], {"load_imbalance"}) == []  # held open
    assert tracker.open_incidents()


def test_a_non_finite_number_in_a_finding_goes_out_as_null_and_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """A detector's NaN in its evidence would be refused by the detection contract and
    stop the worker at every restart on the same samples: the tracker sends the
    detection with that number null (unknown), keeps it out of the incident's cost,
    and logs the bug."""
    tracker = IncidentTracker("j", fire_after=1, resolve_after=1)
    good = Finding("load_imbalance", "n", "1", "info", ("sm_active",), 2.0, "s", 10.0,
                   {"job_slowdown": 0.2, "job_gpus": 8, "cost_basis": "blamed"})
    bad = Finding("load_imbalance", "n", "1", "info", ("sm_active",), 2.0, "s", 10.0,
                  {"job_slowdown": float("nan"), "job_gpus": 8, "cost_basis": "blamed",
                   "deviations": [{"value": float("inf")}]})
    [fired] = tracker.update(15, [bad], {"load_imbalance"})
    validate_detection(json.loads(json.dumps(fired)))
    assert fired["evidence"]["job_slowdown"] is None
    assert fired["evidence"]["deviations"] == [{"value": None}]
    assert "evidence.job_slowdown" in caplog.text and "a detector bug" in caplog.text
    tracker.update(20, [good], {"load_imbalance"})
    tracker.update(25, [bad], {"load_imbalance"})
    [resolved] = tracker.update(30, [], {"load_imbalance"})
    assert resolved["evidence"]["job_slowdown"] == 0.2  # the one estimate there was
    validate_detection(json.loads(json.dumps(resolved)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=5, max_size=40), st.integers(0, 4),
       st.floats(0.2, 1.0))
def test_robust_z_flags_one_outlier_and_ignores_the_rest(peers: list[float], where: int,
                                                         jump: float) -> None:
    base = np.full(len(peers), 0.5) + (np.array(peers) - 0.5) * 0.01  # tight peers
    values = base.copy()
    values[where] = values[where] + jump if values[where] + jump <= 1.5 else values[where] - jump
    z, median, scale = robust_z(values.reshape(-1, 1), abs_floor=0.015)
    assert scale[0] >= 0.015
    assert abs(z[where, 0]) > 4
    others = np.delete(z[:, 0], where)
    assert np.all(np.abs(others) < 4)
    with_nan = values.copy()
    with_nan[(where + 1) % len(values)] = np.nan
    z2, _, _ = robust_z(with_nan.reshape(-1, 1), abs_floor=0.015)
    assert np.isnan(z2[(where + 1) % len(values), 0]) and abs(z2[where, 0]) > 4


def test_a_sample_years_away_does_not_walk_every_empty_bin_between() -> None:
    """A clock far off (ts 1 s, then today) must not make the engine evaluate the
    hundreds of millions of empty bins in between: it skips to the newest window."""
    from vigil_gpu_monitor.detectors.engine import ReplayRunner as Runner

    runner = Runner(DetectConfig())
    for ts in (1.0, 1.5, START, START + 10.0, START + 20.0):
        runner.feed({"schema": "vigil.sample/1", "ts": ts, "job": "j", "node": "n",
                     "gpus": {"0": {"power": 3.0}}, "host": {}, "nics": {}})
    engine = runner.engines["j"]
    assert engine.next_bin is not None and engine.next_bin * CFG.bin_seconds > START - 3600


def test_a_finding_may_stay_open_longer_without_its_evidence_than_the_default() -> None:
    """A host-bound node's idle time on a long step shows once a step: its finding
    says how many evaluations without it resolve it (``resolve_after``), and the
    tracker keeps that through a checkpoint of its state."""
    tracker = IncidentTracker("j", fire_after=1, resolve_after=2)
    f = Finding("straggler", "n", None, "warning", ("gpu_util",), 5.0, "s", 10.0,
                resolve_after=4)
    [fired] = tracker.update(15, [f], {"straggler"})
    restored = IncidentTracker("j", 1, 2, json.loads(json.dumps(tracker.to_state())))
    assert [restored.update(t, [], {"straggler"}) for t in (20, 25, 30)] == [[], [], []]
    [resolved] = restored.update(35, [], {"straggler"})
    assert resolved["state"] == "resolved" and resolved["id"] == fired["id"]
    default = IncidentTracker("j", fire_after=1, resolve_after=2)
    plain = Finding("straggler", "n", None, "warning", ("gpu_util",), 5.0, "s", 10.0)
    default.update(15, [plain], {"straggler"})
    assert default.update(20, [], {"straggler"}) == []
    assert [d["state"] for d in default.update(25, [], {"straggler"})] == ["resolved"]
