"""What the straggler test reads: its work counter is chosen from a bin where the job
computes, and slowness is evidence only where a GPU is busier than its peers beyond
the noise floor."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from vigil_gpu_monitor.detectors.straggler import (
    BASIS_WAIT_BINS,
    GPU_OFFSET_CAP,
    GPU_READS,
    STATS,
    _comparable,
    _even_in_bin,
    _even_load,
    _levels,
    _memory_explains,
    _on_budget,
    _readings,
    _work_basis,
)


def _latest(tensor: float, dram: float) -> np.ndarray:
    a = np.full((len(GPU_READS), 2, 4), np.nan)
    a[GPU_READS.index("tensor_active")] = tensor
    a[GPU_READS.index("dram_active")] = dram
    return a


def test_memory_activity_stands_in_for_work_only_in_a_job_without_tensor_work() -> None:
    """A job first read in its communication phase shows no tensor work and the
    collective's memory traffic: that first bin must not make memory activity the
    job's work counter for good (fleet soak: a false straggler on a rotating MoE)."""
    memory: dict[str, Any] = {}
    assert _work_basis(_latest(0.001, 0.15), memory) is None
    assert _work_basis(_latest(0.4, 0.5), memory) == "tensor_active"
    assert _work_basis(_latest(0.0, 0.15), memory) == "tensor_active"  # kept
    no_tensor: dict[str, Any] = {}
    found = [_work_basis(_latest(0.0, 0.3), no_tensor) for _ in range(BASIS_WAIT_BINS)]
    assert found[:-1] == [None] * (BASIS_WAIT_BINS - 1) and found[-1] == "dram_active"


def test_a_gpu_as_busy_as_its_peers_doing_less_work_gives_no_evidence() -> None:
    """A cold expert: busy 33.2 % against its peers' 33.1 %, 0.92x their work (fleet
    soak: four false stragglers on one persistent-MoE job). Its slowness is real per
    unit of work, but it holds nobody back; a GPU 12 % busier does."""
    busy = np.array([0.332, 0.371])
    peers = np.full(2, 0.3313)
    work = np.array([0.92, 1.0])
    clock = np.full(2, 1980.0)
    r = _readings(["cold", "slow"], busy, peers, work, np.ones(2), clock, clock,
                  np.log(busy / peers / work), "tensor_active", np.ones(2, dtype=bool), 0.05,
                  np.zeros(2, dtype=bool), np.ones(2), np.full(2, np.nan),
                  util=(np.ones(2), np.ones(2)))
    slowness_gate = r.gate[0]
    assert not slowness_gate[0] and slowness_gate[1]


def test_less_work_at_the_same_busy_time_is_evidence_only_where_work_is_even() -> None:
    """A stalled GPU on a pipeline stage or in a tensor-parallel group reads as busy
    as its peers (they wait inside each layer) with 0.94x their work: where the job's
    GPUs share work evenly (load noise 1.4 %) that is slowness's evidence; where
    expert load moves (MoE, 8 %) the same reading is a colder expert, no evidence;
    with no load noise learned yet, none either. A GPU far less busy than its peers
    with less work (its window in another part of the step) is no evidence anywhere."""
    busy = np.array([0.451, 0.451, 0.30])
    peers = np.full(3, 0.45)
    work = np.array([0.94, 1.0, 0.5])
    clock = np.full(3, 1980.0)
    noise_even = [0.013, 0.014, 0.008, None]
    noise_moe = [0.027, 0.084, 0.005, None]
    gates = []
    for noise in (noise_even, noise_moe, None):
        r = _readings(["stalled", "level", "phase"], busy, peers, work, np.ones(3), clock,
                      clock, np.log(busy / peers / work), "tensor_active",
                      np.ones(3, dtype=bool), 0.05, np.zeros(3, dtype=bool), np.ones(3),
                      np.full(3, np.nan), util=(np.ones(3), np.ones(3)),
                      even_load=_even_load(noise))
        gates.append(r.gate[0].tolist())
    assert gates == [[True, False, False], [False, False, False], [False, False, False]]
    assert _even_load([0.001, 0.002, 0.0, None]) == pytest.approx(0.025)  # the floor


def test_a_node_whose_gpus_agree_in_the_bin_shares_its_work_evenly() -> None:
    """A 10 s-step tensor-parallel job (envelope seed 221): the level's learned load
    noise is 4 % (bins straddling the end of the computing phase), so its bar is 12 %
    and a stalled GPU's 7 % deficit never counted. In a bin inside the phase its
    node's other GPUs agree within 0.5 %: there the deficit counts. The same deficit
    beside experts whose work spreads by ±15 % in the bin (MoE) counts for nothing
    (what the level learned alone decides there), nor does it on a node with no work
    reading at all."""
    places = (np.zeros(8, dtype=np.intp), np.arange(8, dtype=np.intp))
    clock = np.full(8, 1980.0)

    def slowness_gate(work: np.ndarray, with_places: bool) -> list[bool]:
        busy = np.full(8, 0.9)
        peer_work = np.full(8, float(np.median(work)))
        r = _readings([f"n/{i}" for i in range(8)], busy, busy, work, peer_work, clock, clock,
                      np.log(1 / (work / peer_work)), "tensor_active", np.ones(8, dtype=bool),
                      0.05, np.zeros(8, dtype=bool), np.ones(8), np.full(8, np.nan),
                      util=(np.ones(8), np.ones(8)), even_load=_even_load([0.02, 0.04, 0.01, None]),
                      places=places if with_places else None)
        return r.gate[0].tolist()

    even = np.array([0.93, 1.0, 1.004, 0.997, 1.002, 0.996, 1.005, 0.999])
    assert slowness_gate(even, False) == [False] * 8  # the learned bar: 12 %
    assert slowness_gate(even, True) == [True] + [False] * 7
    experts = np.array([0.93, 0.8, 1.15, 1.0, 0.85, 1.2, 0.9, 1.1])
    assert slowness_gate(experts, True) == slowness_gate(experts, False)
    assert not slowness_gate(experts, True)[0]
    assert slowness_gate(np.full(8, np.nan), True) == [False] * 8
    # three GPUs reading work tell no spread: the learned bar alone decides
    few = np.array([-0.07, 0.0, 0.001] + [np.nan] * 5)
    assert np.isinf(_even_in_bin(few, places)).all()
    assert _even_in_bin(np.log(even / np.median(even)), places) == pytest.approx(
        np.full(8, 0.025))  # within 1 %: the floor


def test_busy_time_explained_by_memory_work_is_no_evidence_and_a_stall_is() -> None:
    """Slowness over tensor work and over memory work (log excess over the peers').
    More memory-bound work: 22 % over tensor work, 13 % *under* it per byte. A 25 %
    stall: both up by as much. A stall on a GPU that also moves more bytes: per byte
    still above its peers. No DRAM reading: nothing explained."""
    slowness = np.array([0.22, 0.22, 0.35, 0.22])
    per_byte = np.array([-0.13, 0.22, 0.09, np.nan])
    assert _memory_explains(slowness, per_byte).tolist() == [True, False, False, False]
    busy, peers = np.full(4, 0.9), np.full(4, 0.72)
    ones, clock = np.ones(4), np.full(4, 1980.0)
    bytes_moved = np.array([1.4, 1.0, 1.3, np.nan])  # over the peers'
    r = _readings(list("abcd"), busy, peers, ones, ones, clock, clock, slowness,
                  "tensor_active", np.ones(4, dtype=bool), 0.05,
                  _memory_explains(slowness, per_byte), bytes_moved, np.full(4, np.nan),
                  util=(ones, ones))
    assert r.gate[0].tolist() == [False, True, True, True]
    assert r.gate[2].all()  # a lower clock would still count: a hardware signature
    # where memory work explains the busy time, the load reads the bytes moved (the
    # busy excess bounds it); elsewhere the tensor work (level here)
    load = r.stats[1]
    assert load[0] == pytest.approx(np.log(0.9 / 0.72)) and load[1:3].tolist() == [0.0, 0.0]


def test_a_lower_clock_at_its_peers_power_is_the_budgets_and_at_lower_power_a_throttle(
        ) -> None:
    """Four GPUs 10 % busier than their peers at the same work rate, each with its
    clock 8.5 % under theirs. At its peers' power (within 2 %) the clock is what a
    shared power cap buys a leaky part that waits less at the barrier: its deficit
    is excused and its slowness is read in busy cycles (0 here). Drawing 9 % less,
    the same clock is a throttle the reasons do not name: it counts. A deficit
    beyond the offset cap at the same power counts beyond the cap; one whose
    reasons name a fault is never excused."""
    busy, peers = np.full(4, 0.84), np.full(4, 0.764)
    ones = np.ones(4)
    peer_clock = np.full(4, 1612.0)
    clock = np.array([1480.0, 1480.0, 1300.0, 1480.0])
    power, peer_power = np.array([515.0, 468.0, 515.0, 515.0]), np.full(4, 514.0)
    budget = _on_budget(power, peer_power)
    assert budget.tolist() == [True, False, True, True]
    assert not _on_budget(np.array([np.nan]), np.array([514.0])).any()
    r = _readings(["leaky", "throttled", "far", "flagged"], busy, peers, ones, ones, clock,
                  peer_clock, np.log(busy / peers), "tensor_active", np.ones(4, dtype=bool),
                  0.05, np.zeros(4, dtype=bool), ones, np.full(4, np.nan),
                  util=(ones, ones), clock_fault=np.array([False, False, False, True]),
                  on_budget=budget)
    slowness, excuse = r.stats[STATS.index("slowness")], r.excuse[STATS.index("clock")]
    deficit = np.log(peer_clock / clock)
    assert excuse[0] == pytest.approx(deficit[0]) and slowness[0] == pytest.approx(
        np.log(0.84 / 0.764) - deficit[0])
    assert excuse[1] == 0.0 and excuse[3] == 0.0
    assert slowness[1] == pytest.approx(np.log(0.84 / 0.764))
    assert excuse[2] == pytest.approx(GPU_OFFSET_CAP)  # the rest of 21 % counts


def test_idle_time_is_read_for_nodes_against_the_job_never_for_one_gpu() -> None:
    """A node whose GPUs run no kernel a fifth of the time while the job's other
    GPUs keep one running reads ``log(1 / 0.8)`` of idle time, and counts where its
    SMs per unit of work and its power say so too (issue #45); one GPU's own
    ``gpu_util`` is too coarse to be read (it raised false stragglers on the foreign
    traces), so the GPU level never carries the statistic."""
    nodes, slots = 5, 8
    latest = np.full((len(GPU_READS), nodes, slots), np.nan)
    for metric, value in (("sm_active", 0.6), ("tensor_active", 0.3), ("sm_clock", 1980.0),
                          ("dram_active", 0.3), ("mem_clock", 2619.0), ("gpu_util", 1.0),
                          ("power", 500.0)):
        latest[GPU_READS.index(metric)] = value
    latest[GPU_READS.index("gpu_util"), 2] = 0.8  # node 2 waits for its host ...
    # ... so it never spins in the collective: fewer SMs per unit of work, less power
    latest[GPU_READS.index("sm_active"), 2] = 0.58
    latest[GPU_READS.index("power"), 2] = 480.0
    latest[GPU_READS.index("gpu_util"), 3] = 0.8  # node 3: a read instant in the job's gap
    latest[GPU_READS.index("gpu_util"), 0, 3] = 0.5  # one GPU's coarse reading
    node_idx, slot_idx = np.repeat(np.arange(nodes), slots), np.tile(np.arange(slots), nodes)
    view = SimpleNamespace(nodes=[f"n{i}" for i in range(nodes)],
                           gpu_keys=[f"n{n}/{g}" for n, g in zip(node_idx, slot_idx, strict=True)],
                           positions=lambda: (node_idx, slot_idx))
    gpu, node = _levels(view, latest, "tensor_active", 0.05)  # type: ignore[arg-type]
    idle = STATS.index("idle")
    assert node.stats[idle].tolist() == pytest.approx([0.0, 0.0, np.log(1 / 0.8),
                                                       np.log(1 / 0.8), 0.0])
    assert node.valid[idle].all()
    # idle time counts only where the node's window averages say it idled too
    assert node.gate[idle].tolist() == [False, False, True, False, False]
    assert not gpu.valid[idle].any()


def _sm(typical: float, busiest: float) -> np.ndarray:
    """A 16-node job's SM activity: every GPU at ``typical``, one at ``busiest``."""
    sm = np.full((16, 8), typical)
    sm[3, 7] = busiest
    return sm


def test_a_phase_that_lowers_every_gpu_is_not_compared_and_a_straggler_is() -> None:
    """Fleet soak job 81 (MoE inside 16 nodes): a 76 s evaluation phase read a median
    51 % of the job's level, inside the median's floor, and its forward passes ran
    one GPU 5-10 % slower per unit of work than training did: a false straggler. Its
    busiest GPU fell as far. A straggler whose peers wait as long keeps computing:
    the job's busiest GPU stays busy, and the job is compared."""
    def after_training(typical: float, busiest: float, bins: int = 3) -> list[bool]:
        memory: dict[str, Any] = {}
        for k in range(200):
            _comparable(_sm(0.63, 0.76), k, 5.0, memory)
        return [_comparable(_sm(typical, busiest), 200 + k, 5.0, memory)
                for k in range(bins)]

    assert after_training(0.63, 0.76) == [True] * 3
    assert after_training(0.33, 0.35) == [False] * 3  # evaluation: all lower alike
    assert after_training(0.33, 0.95) == [True] * 3  # a straggler's peers wait
    assert after_training(0.45, 0.50) == [True] * 3  # a host holds its node back 50 %
