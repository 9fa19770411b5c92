"""A node whose host holds the job back is told by two witnesses that accumulate:
its GPUs run no kernel while its peers' spin (``gpu_util``, the last period's share)
and it draws less power (averaged over the sample), or the job's steps stretch with
it (``detectors/slowdown.py``). Low utilisation alone is how a
healthy node reads when its agent's read instant keeps falling in the job's gap
(fleet soak: six false host-bound stragglers in 5,168 GPU-hours while the power was
checked by its sign each bin)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.peer_streams import Departure
from vigil_gpu_monitor.detectors.straggler import (
    CORROBORATION_SECONDS,
    IDLE_REPEAT_BINS,
    STATS,
    _corroborated,
    _open_gate_where_idle_repeats,
)
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 1_000_000.0
FROM = START + 120.0  # after the job has settled


def _edited(util: float, power: Callable[[int], float], seed: int,
            util_from: float = FROM) -> Iterator[dict[str, Any]]:
    """A healthy 6-node job in which, from FROM, node n3's GPUs read ``power(bin)``
    of their power, and from ``util_from`` ``util`` of their ``gpu_util`` and fewer
    SMs resident per unit of work than their peers (as if they did not spin in the
    collective)."""
    job = JobSpec("job-h", [f"n{i}" for i in range(6)])
    for s in Simulator(Cluster([job]), START, seed=seed).samples(900):
        if s["node"] == "n3" and s["ts"] >= FROM:
            s = copy.deepcopy(s)
            share = power(int(s["ts"] // 5))
            idle = s["ts"] >= util_from
            for r in s["gpus"].values():
                r["power"] *= share
                if idle:
                    r["gpu_util"] = round(r["gpu_util"] * util, 2)
                    r["sm_active"] *= 0.97
        yield s


def _firing(util: float, power: Callable[[int], float], seed: int,
            util_from: float = FROM) -> list[dict[str, Any]]:
    runner = ReplayRunner(DetectConfig())
    return [d for s in _edited(util, power, seed, util_from) for d in runner.feed(s)
            if d["state"] == "firing"]


def test_low_utilisation_with_power_level_on_average_is_no_straggler() -> None:
    """Its power wanders 2 % either side of its peers', bin by bin: below them in
    half the bins, as chance has it, never on the whole."""
    def wandering(b: int) -> float:
        return 0.98 if random.Random(b).random() < 0.5 else 1.02
    for seed in (1, 2):
        assert _firing(0.75, wandering, seed) == []


def test_low_utilisation_with_less_power_is_a_host_bound_node() -> None:
    found = _firing(0.75, lambda _: 0.9, 1)
    assert [(d["kind"], d["node"], d["gpu"]) for d in found] == [("straggler", "n3", None)]
    assert found[0]["evidence"]["host_bound"] is True
    assert found[0]["detected_at"] - FROM <= 60


def test_a_power_deficit_that_began_long_before_the_idle_time_corroborates_nothing() -> None:
    """The node draws 10 % less from FROM (a pipeline stage whose share drifted) and
    reads low utilisation only 480 s later (its read instant aliased on the job's
    gap): the two did not begin together, so no host holds it back (the fleet
    soak's one false alarm). Begun 180 s apart, they did."""
    late = _firing(0.75, lambda _: 0.9, 1, util_from=FROM + 480)
    assert [d for d in late if d["kind"] == "straggler"] == []
    soon = _firing(0.75, lambda _: 0.9, 1, util_from=FROM + 180)
    assert [(d["kind"], d["node"]) for d in soon] == [("straggler", "n3")]


def test_steps_that_stretched_with_the_idle_time_corroborate_it_as_power_does() -> None:
    """A node's idle time is a finding beside the job's steps stretching (a host that
    holds one node back lengthens every step) when the stretch began with it, at
    most ``CORROBORATION_SECONDS`` before; an older stretch, or none, corroborates
    nothing, and the node's other statistics never need a witness."""
    within = int(CORROBORATION_SECONDS / 5)
    idle = Departure("idle", 4.0, 0.2, 0.0, first=1_000)
    slow = Departure("slowness", 4.0, 0.1, 0.0, first=1_000)
    assert _corroborated([idle, slow], [], within) == [slow]
    assert _corroborated([idle], [], within, stretched_since=1_003) == [idle]
    assert _corroborated([idle], [], within, stretched_since=1_000 - within) == [idle]
    assert _corroborated([idle], [], within, stretched_since=1_000 - within - 1) == []


def test_steps_stretched_by_a_slow_part_elsewhere_corroborate_no_idle_time() -> None:
    """A GPU 40 % slower on n0 stretches every step of the job. Node n3, its read
    instant aliased on the job's gap, reads low utilisation from the same moment at
    its peers' power: the stretch is the slow GPU's, not n3's host's (envelope seed
    232, a power brake on one node and a host-bound finding on another). The slow GPU
    is found; n3 is not named."""
    job = JobSpec("job-h", [f"n{i}" for i in range(6)])
    cluster = Cluster([job], [Fault("slow_gpu", "job-h", "n0", "2", FROM, severity=1.4)])
    runner = ReplayRunner(DetectConfig())
    found = []
    for s in Simulator(cluster, START, seed=1).samples(900):
        if s["node"] == "n3" and s["ts"] >= FROM:
            s = copy.deepcopy(s)
            for r in s["gpus"].values():
                r["gpu_util"] = round(r["gpu_util"] * 0.75, 2)
                r["sm_active"] *= 0.97
        found += [(d["kind"], d["node"], d["gpu"]) for d in runner.feed(s)
                  if d["state"] == "firing" and d["kind"] == "straggler"]
    assert found == [("straggler", "n0", "2")]


def test_idle_time_that_repeats_opens_its_gate_and_one_idle_bin_does_not() -> None:
    """On a step longer than a bin a host-bound node idles in one bin of two or
    three, with its busy time per unit of work at its peers' there (the gate's
    other sign falls in another bin): idle time in this bin and in two others of
    the last ``IDLE_REPEAT_BINS`` opens the gate. A node whose GPUs enter and leave
    a checkpoint late idles in the bins at its edges, 25 s apart: never three."""
    idle = STATS.index("idle")
    recent: dict[str, list[int]] = {}

    def gate(bin_: int, a: float, b: float) -> list[bool]:
        stats = np.zeros((len(STATS), 2))
        stats[idle] = (a, b)
        level = SimpleNamespace(keys=["host", "late"], stats=stats,
                                gate=np.zeros((len(STATS), 2), dtype=bool))
        _open_gate_where_idle_repeats(level, recent, bin_)  # type: ignore[arg-type]
        return [bool(g) for g in level.gate[idle]]

    assert gate(100, 0.5, 0.9) == [False, False]  # the first idle bin of each
    assert gate(101, 0.0, 0.0) == [False, False]
    assert gate(102, 0.4, 0.0) == [False, False]  # one other: not yet
    assert gate(103, float("nan"), float("nan")) == [False, False]  # not compared
    assert gate(105, 0.5, 0.9) == [True, False]  # "late": its second edge, 25 s on
    # idle bins further back than ``IDLE_REPEAT_BINS`` are forgotten
    assert gate(105 + IDLE_REPEAT_BINS, 0.5, 0.9) == [False, False]
    assert recent == {"host": [105 + IDLE_REPEAT_BINS], "late": [105 + IDLE_REPEAT_BINS]}


def test_an_idle_departure_once_witnessed_stays_a_finding_while_it_lasts() -> None:
    """A stretch measured over a minute of long steps comes and goes with the bins
    its mean holds: the idle departure it witnessed (the same first bin) holds
    without it; a new departure needs a witness of its own."""
    within = int(CORROBORATION_SECONDS / 5)
    idle = Departure("idle", 4.0, 0.2, 0.0, first=1_000)
    assert _corroborated([idle], [], within) == []
    assert _corroborated([idle], [], within, witnessed=1_000) == [idle]
    assert _corroborated([idle], [], within, witnessed=990) == []


def _ten_second_steps(seed: int, onset: float | None) -> list[dict[str, Any]]:
    """Detections of a 6-node job of 10 s steps (8 s computing, 2 s in the
    collective) read every second, whose node n2's host holds it back a quarter of
    its computing time from ``onset`` (None: healthy), 300 s on."""
    job = JobSpec("job-l", [f"n{i}" for i in range(6)], compute_seconds=8.0,
                  comm_seconds=2.0)
    faults = [] if onset is None else [
        Fault("slow_host", "job-l", "n2", None, START + onset, severity=1.25)]
    runner = ReplayRunner(DetectConfig())
    end = (onset or 480.0) + 300.0
    return [d for s in Simulator(Cluster([job], faults), START, seed=seed).samples(end)
            for d in runner.feed(s)]


def test_a_host_bound_node_of_a_job_of_ten_second_steps_is_named_once() -> None:
    """Its GPUs idle at the start of each step and its peers spin at the end, in
    different 5 s bins; the bins its peers wait through read far below the job's
    level and were taken for a pause, so the stretch was never seen (envelope seeds
    201-237: every host-bound node of 4-10 s steps missed). It is named within two
    minutes, pages once and stays open; the same job healthy raises nothing."""
    found = _ten_second_steps(1, 480.0)
    assert [(d["state"], d["kind"], d["node"]) for d in found] == [
        ("firing", "straggler", "n2")]
    assert found[0]["evidence"]["host_bound"] is True
    assert found[0]["detected_at"] - (START + 480.0) <= 120
    assert _ten_second_steps(1, None) == []
