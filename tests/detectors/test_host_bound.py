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
    ALIAS_MARGIN,
    CORROBORATION_SECONDS,
    STATS,
    _comparable,
    _corroborated,
    _open_gate_beyond_aliasing,
    _step_period,
    _unclaimed,
)
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.evaluation.fleet import fleet_job

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


def _view(busy: np.ndarray, util: np.ndarray) -> SimpleNamespace:
    """A stand-in for ``WindowView`` with nodes × bins of SM activity and
    ``gpu_util`` (one GPU a node), 5 s bins."""
    cubes = {"sm_active": busy[:, None, :], "gpu_util": util[:, None, :]}
    return SimpleNamespace(
        bins=range(1000, 1000 + busy.shape[1]), bin_seconds=5.0,
        activity_metric=lambda: "sm_active",
        per_node=lambda metric, last=None: cubes[metric][:, :, -last:])


def _beat(period: int, nodes: int = 4, bins: int = 12) -> np.ndarray:
    """Each node's busy time beating with a step of ``period`` bins, each node a bin
    later than the one before (its own read instant)."""
    shape = np.array([0.95, 0.5, 0.3, 0.6, 0.4, 0.7][:period])
    return np.array([[shape[(b + n) % period] for b in range(bins)] for n in range(nodes)])


def test_the_step_period_is_read_from_each_nodes_own_beat_and_a_wander_has_none() -> None:
    """Each node on its own clock: nodes a bin apart still repeat with the step.
    A level that wanders correlates at every lag, and no period is read from it."""
    for period in (2, 3, 5):
        assert _step_period(_view(_beat(period), _beat(period)), {}) == period
    wander = np.array([[0.5 + 0.02 * b + 0.01 * n for b in range(12)] for n in range(4)])
    memory: dict[str, Any] = {}
    assert _step_period(_view(wander, wander), memory) is None
    assert memory["period"] == [0, 1011]  # read again a minute later, not every bin


def test_idle_time_beyond_what_a_read_instant_in_step_can_alias_opens_its_gate() -> None:
    """Node 0 reads half idle once every 15 s step: one bin of three. Read every
    5 s (three readings a step), that is what a read instant in step with the job's
    gap makes (a 32-node MoE job of the fleet soak: named host-bound where idle time
    that merely repeated opened the gate): the gate stays shut. Read every second
    (fifteen readings a step), a read instant can add at most one idle reading a
    step, 7 %: 17 % is the node's own, and the gate opens for node 0 alone. Without
    a period (the job's busy time does not beat) it stays shut."""
    util = np.ones((4, 12))
    util[0, ::3] = 0.5
    idle = STATS.index("idle")

    def gate(busy: np.ndarray, tick: float | None) -> list[bool]:
        level = SimpleNamespace(gate=np.zeros((len(STATS), 4), dtype=bool))
        _open_gate_beyond_aliasing(_view(busy, util), level, {},  # type: ignore[arg-type]
                                   lambda: tick)
        return [bool(g) for g in level.gate[idle]]

    assert gate(_beat(3), 5.0) == [False] * 4
    assert gate(_beat(3), 1.0) == [True, False, False, False]
    assert gate(_beat(3), None) == [False] * 4  # no tick known yet
    assert gate(np.full((4, 12), 0.9), 1.0) == [False] * 4
    # just inside the bound at a 1 s tick: one idle reading a step more than peers
    util[0] = 1.0
    util[0, ::3] = 1.0 - 3 * (1 / 15 + ALIAS_MARGIN) + 0.03
    assert gate(_beat(3), 1.0) == [False] * 4


def test_the_bin_after_a_long_steps_collective_is_compared_and_after_a_pause_not() -> None:
    """The first bin of a phase is not compared (node clocks put part of the phase
    before it in it). On a job whose steps beat with the bins, a phase shorter than
    a step that ended it was the step's collective: the next bin starts the next
    step, where a host-bound node's GPUs idle, and is compared. After a pause of
    more bins than a step it is not."""
    computing, waiting = np.full((4, 8), 0.9), np.full((4, 8), 0.02)

    def steady(phases: list[np.ndarray], period: int | None) -> list[bool]:
        memory: dict[str, Any] = {}
        return [_comparable(sm, b, 5.0, memory, period) for b, sm in enumerate(phases)]

    step = [computing, computing, waiting, computing]
    assert steady(step, None) == [False, True, False, False]
    assert steady(step, 3) == [False, True, False, True]
    pause = [computing, computing, waiting, waiting, waiting, computing, computing]
    assert steady(pause, 3) == [False, True, False, False, False, False, True]


def test_a_stretch_that_may_be_another_nodes_idle_time_witnesses_no_second_node() -> None:
    """One stretch, one host-bound node: a stretch begun within the corroboration
    time after another node's witnessed idle time is that node's to explain."""
    within = int(CORROBORATION_SECONDS / 5)
    assert _unclaimed(500, "n2", {}, within) == 500
    assert _unclaimed(500, "n2", {"n0": 480}, within) is None
    assert _unclaimed(500, "n0", {"n0": 480}, within) == 500  # its own
    assert _unclaimed(500, "n2", {"n0": 500 - within - 1}, within) == 500  # long before
    assert _unclaimed(None, "n2", {}, within) is None


def test_a_healthy_moe_job_read_every_5_s_raises_no_host_bound_node_nor_a_slowdown() -> None:
    """The fleet soak's job 72 (32 nodes, MoE, 15 s steps read every 5 s): one node's
    read instant drifts into the job's gap and reads it one bin in three, and an
    evaluation reads 0.13 a bin against the healthy 0.45. Where idle time that
    repeated opened the idle gate it was named host-bound four times, and where a
    long step's collective bins joined the slowdown's series its pause floor fell
    and the evaluation read as a 142 % slowdown."""
    start = 1_950_000_000.0  # the fleet soak's (bench/fleet_soak.py), and its seed
    job = fleet_job(72, start, 3600.0, 1, True)
    runner = ReplayRunner(DetectConfig())
    fired = [(round(d["detected_at"] - start), d["kind"], d["node"])
             for s in Simulator(job.cluster, start, seed=100_072).samples(1700)
             for d in runner.feed(s) if d["state"] == "firing" and d["severity"] != "info"]
    assert fired == []


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
    level and were taken for a pause, so the stretch was never seen, and the bin
    its idle time showed in, the first after the collective, was never compared
    (envelope seeds 201-237: every host-bound node of 4-10 s steps missed). It is
    named within three minutes (150 s here: a minute of whole steps must show
    idle time beyond aliasing first), pages once and stays open; the same job
    healthy raises nothing."""
    found = _ten_second_steps(1, 480.0)
    assert [(d["state"], d["kind"], d["node"]) for d in found] == [
        ("firing", "straggler", "n2")]
    assert found[0]["evidence"]["host_bound"] is True
    assert found[0]["detected_at"] - (START + 480.0) <= 180
    assert _ten_second_steps(1, None) == []
