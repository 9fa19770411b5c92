"""Window metrics the agent's adaptive sampling skipped are held at their last value."""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import orjson
import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.held import HeldReadings
from vigil_gpu_monitor.detectors.window import JobWindow
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler, SamplingConfig
from vigil_gpu_monitor.simulator.cluster import Simulator
from vigil_gpu_monitor.vigil.evaluation.scenarios import suite


def _sample(ts: float, gpus: dict[str, dict[str, float]], node: str = "n1") -> dict[str, Any]:
    return {"schema": "vigil.sample/1", "ts": ts, "job": "j", "node": node, "gpus": gpus,
            "host": {}, "nics": {}}


class _Held:
    """Held readings as the engine uses them: each sample folded into a window."""

    def __init__(self) -> None:
        self.held = HeldReadings(20.0)
        self.state = self.held.state

    def fill(self, sample: dict[str, Any]) -> dict[str, Any]:
        """What the window binned of this one sample: device → metric → value."""
        window = JobWindow(5.0, gpu_metrics=("sm_active", "power"), nic_metrics=("ib_tx",))
        window.add(sample, self.held)  # type: ignore[arg-type]
        means = window.means("g", window.bin_of(sample["ts"]), window.gpu_metrics)
        return {"gpus": {dev: {m: v for m, v in zip(window.gpu_metrics, values, strict=True)
                               if v is not None}
                         for (_, dev), values in means.items()}}

    def forget_before(self, ts: float) -> None:
        self.held.forget_before(ts)

    def to_state(self) -> Any:
        return self.held.to_state()


def _held() -> _Held:
    return _Held()


def test_a_skipped_metric_takes_its_last_value_until_the_hold_ends() -> None:
    held = _held()
    held.fill(_sample(100.0, {"0": {"sm_active": 0.6, "power": 400.0}}))
    quiet = _sample(110.0, {"0": {"power": 410.0}})
    original = copy.deepcopy(quiet)
    assert held.fill(quiet)["gpus"]["0"] == {"power": 410.0, "sm_active": 0.6}
    assert quiet == original  # the input is not changed
    assert held.fill(_sample(121.0, {"0": {}}))["gpus"]["0"] == {"power": 410.0}
    assert held.fill(_sample(131.0, {"0": {}}))["gpus"]["0"] == {}


def test_a_device_or_node_that_stops_answering_gets_nothing_held() -> None:
    held = _held()
    held.fill(_sample(100.0, {"0": {"sm_active": 0.6}, "1": {"sm_active": 0.6}}))
    assert held.fill(_sample(101.0, {"0": {}}))["gpus"] == {"0": {"sm_active": 0.6}}
    other = held.fill(_sample(101.0, {"0": {}}, node="n2"))
    assert other["gpus"] == {"0": {}}


def test_per_sample_signals_are_never_repeated() -> None:
    held = _held()
    held.fill(_sample(100.0, {"0": {"sm_active": 0.6, "xid": 79.0, "throttle": 64.0}}))
    assert held.fill(_sample(101.0, {"0": {}}))["gpus"]["0"] == {"sm_active": 0.6}


def test_a_late_older_reading_does_not_replace_a_newer_one() -> None:
    held = _held()
    held.fill(_sample(105.0, {"0": {"sm_active": 0.2}}))
    held.fill(_sample(103.0, {"0": {"sm_active": 0.6}}))
    assert held.fill(_sample(106.0, {"0": {}}))["gpus"]["0"] == {"sm_active": 0.2}


def test_forgetting_keeps_memory_bounded_as_nodes_leave() -> None:
    held = _held()
    for i in range(50):
        held.fill(_sample(100.0 + i, {"0": {"sm_active": 0.5}}, node=f"n{i}"))
    held.forget_before(140.0)
    assert sorted(held.state) == [f"n{i}" for i in range(40, 50)]
    # the checkpoint as the worker writes it (orjson): power, never sent, is no value
    stored = orjson.loads(orjson.dumps(held.to_state()))
    assert stored["nodes"]["n40"]["g"]["0"] == [[0.5, None], None, 140.0]


SLOW_GPU = suite(sizes=(4,), seeds=(1,), job_types=("data_parallel",), faults=("slow_gpu",))[0]


def _detections(held_seconds: float) -> list[dict[str, Any]]:
    runner = ReplayRunner(DetectConfig(held_seconds=held_seconds))
    samplers: dict[str, AdaptiveSampler] = {}
    out = []
    sc = SLOW_GPU
    for sample in Simulator(sc.cluster, sc.start, seed=sc.seed).samples(sc.duration):
        sampler = samplers.setdefault(sample["node"], AdaptiveSampler(SamplingConfig()))
        out.extend(runner.feed(sampler.thin(sample, sample["ts"])))
    return [d for d in out if d["state"] == "firing"]


def test_a_steady_straggler_is_found_in_adaptively_sampled_data_with_the_hold() -> None:
    fault = SLOW_GPU.cluster.faults[0]
    found = _detections(DetectConfig().held_seconds)
    assert [(d["kind"], d["node"], d["gpu"]) for d in found] == [
        ("straggler", fault.node, fault.gpu)]
    # without the hold too, and within a bin of it: since issue #28 a GPU's activity
    # counters are published together, so the bare readings of a bin already compare
    bare = [d for d in _detections(0.5) if d["kind"] == "straggler"]
    assert [(d["node"], d["gpu"]) for d in bare] == [(fault.node, fault.gpu)]
    assert abs(bare[0]["detected_at"] - found[0]["detected_at"]) <= DetectConfig().bin_seconds


def test_a_checkpoint_of_the_previous_layout_is_still_held() -> None:
    """Layout 2 listed a time per metric even when all were the same; a worker that
    restarts on such a checkpoint keeps holding its values."""
    old = {"layout": 2, "nodes": {"n1": {"g": {"0": [[0.5, 300.0], [100.0, 100.0], 100.0]},
                                         "n": {}}}}
    held = HeldReadings(20.0, old)
    window = JobWindow(5.0, gpu_metrics=("sm_active", "power"), nic_metrics=())
    window.add(_sample(110.0, {"0": {"sm_active": 0.6}}), held)  # type: ignore[arg-type]
    assert window.means("g", 22, window.gpu_metrics)[("n1", "0")] == [0.6, 300.0]
    held.remember(held.node("n1", 105.0)["g"], "0", [0.7, 310.0], 105.0)  # late: older than 110
    assert held.node("n1", 105.0)["g"]["0"][0] == [0.6, 310.0]


def test_the_sweep_that_skips_recent_nodes_keeps_what_a_full_sweep_keeps() -> None:
    """The sweep visits only nodes holding something older than its cut. Fed the same
    late, partial and full samples, it leaves the same state as a sweep that visits
    every node (its bounds cleared before each sweep)."""
    rng = random.Random(7)
    skipping, full = _Held(), _Held()
    ts = 100.0
    for step in range(400):
        ts += rng.uniform(0.0, 1.5)
        at = ts - rng.choice((0.0, 0.0, 0.0, 3.0, 30.0))  # some late, a few very late
        gpus = {str(g): {m: rng.random() for m in ("sm_active", "power")
                         if rng.random() < 0.7}
                for g in range(rng.randint(0, 3))}
        sample = _sample(at, gpus, node=f"n{rng.randint(0, 5)}")
        assert skipping.fill(sample) == full.fill(sample)
        if step % 3 == 0:
            full.held.oldest.clear()  # no bounds: every node is visited
            full.held.earliest = -math.inf
            skipping.forget_before(ts - 20.0)
            full.forget_before(ts - 20.0)
            assert skipping.to_state() == full.to_state()
    assert skipping.held.oldest.keys() <= skipping.state.keys()


@pytest.mark.parametrize("others", [False, True])
def test_held_values_follow_the_rule_whatever_path_a_sample_takes(others: bool) -> None:
    """Against the rule written out plainly (each metric's last published value and
    its time; held while at most the hold old): sources that always lack the same
    metrics (replaced whole), adaptive gaps, full samples, late ones, sweeps, and a
    restart from the checkpoint, in random order. ``others``: samples also carry
    keys no window reads, some and not others (``JobWindow.add`` replaces whole a
    device sending the same window metrics whatever its other keys)."""
    metrics = ("sm_active", "power", "dram_active")
    rng = random.Random(11)
    held = HeldReadings(20.0)
    last: dict[tuple[str, str, str], tuple[float, float]] = {}  # → (time, value)
    ts = 100.0
    for step in range(1500):
        ts += rng.uniform(0.0, 1.0)
        at = ts - rng.choice((0.0,) * 8 + (2.0, 25.0))
        node, dev = f"n{rng.randint(0, 2)}", str(rng.randint(0, 2))
        shape = rng.choice((metrics, metrics[:2], metrics[:2], metrics[1:], ()))
        sent = {m: round(rng.random(), 3) for m in shape if rng.random() < 0.9}
        if others:
            sent.update({m: 1.0 for m in ("temperature", "xid") if rng.random() < 0.5})
        window = JobWindow(5.0, gpu_metrics=metrics, nic_metrics=())
        window.add(_sample(at, {dev: sent}, node=node), held)  # type: ignore[arg-type]
        got = window.means("g", window.bin_of(at), metrics)[(node, dev)]
        for i, m in enumerate(metrics):
            before = last.get((node, dev, m))
            if m in sent:
                expected: float | None = sent[m]
                if before is None or at >= before[0]:
                    last[(node, dev, m)] = (at, sent[m])
            else:
                fresh = before is not None and 0.0 <= at - before[0] <= 20.0
                expected = before[1] if fresh and before is not None else None
            assert got[i] == expected, (step, m, got, expected)
        if step % 50 == 0:
            cut = ts - 20.0
            held.forget_before(cut)
            last = {k: v for k, v in last.items() if v[0] >= cut}
        if step % 400 == 399:  # a restart: the checkpoint as the worker stores it
            held = HeldReadings(20.0, orjson.loads(orjson.dumps(held.to_state())))
