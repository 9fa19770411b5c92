"""Straggler GPUs and nodes: the peers of a synchronous job should look alike.

A slowed GPU keeps computing while its healthy peers wait at the barrier, so its
activity and power rise above theirs, and a throttled one's clock falls below.

**The test** is sequential: every GPU against the other GPUs of its node, and every
node's median GPU against the job's nodes, is a stream (``detectors/peer_streams.py``)
whose evidence accumulates bin after bin in a one-sided CUSUM per metric
(``detectors/sequential.py``). A GPU or node is a straggler when the sums of two
metrics pass the threshold. A 25 % slowdown is found in two bins (10 s), 12 % in
tens of seconds, 5 % in minutes. The threshold comes from one setting, false
alarms per 1,000 days of one stream on noise alone
(``detect.straggler_false_alarms_per_1000_days``), with each metric's noise
estimated online.

**Fault or normal variation.**

- *Noise and static differences* (silicon, cooling; pipeline stages at node level)
  are learned per stream: its offset from its peers, its own noise and how much that
  noise persists (``detectors/peer_streams.py``). A node-level stream is tuned to
  departures of two noise units, a GPU-level one to one: a node's median wanders
  with where the job's work sits, and what slows a whole node is rarely small.
- *A job already degraded when Vigil first sees it*: a stream's first
  ``TRAINING_BINS`` compared bins teach its normal, but the test uses at most a 10 %
  offset for a GPU, so a GPU slower than that from the start is still reported
  (dated from its first bin), after the wait for moving load below. A whole node
  slow from the start is learned as that node's normal, as a pipeline stage would be.
- *Phases* (warm-up, checkpoints, evaluation, a hung job) change every GPU's load at
  once, and a GPU's offset from its peers in one phase is not its offset in another.
  Only bins where the job's busiest GPU is within 15 % of the job's level (which
  follows a rise at once and a fall over 10 minutes), and its median GPU above half
  of its own level, are compared; other bins hold
  the sums. A rise beyond that (a warm-up ending) restarts the streams' training.
  The busiest GPU is used because a straggler itself stays busy while its peers
  wait: a fault does not pause its own test.
- *Moving load* (MoE experts hot for a while) makes a GPU depart just as a slow GPU
  does, and neither need change its clock. What differs is time: hardware departs
  and stays departed; moving load departs and comes back, one GPU after another, and
  often several GPUs of one node swing together. A departure with a lower clock is
  hardware at once. One without must outlast ``LONG_RUN_BINS`` (4 min) in a job whose
  load has been seen to move, or when it began in the job's first compared bins
  (``_workload_made``). The cost: there, a slow GPU that keeps its clock is found
  after 4 minutes, not seconds. A single hot expert that first moves after the job
  has settled is, until it moves, indistinguishable from a slow GPU (a known false
  alarm, once per such job).
- *Lost or held readings*: a stream without a reading in a bin holds its sums.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from contracts.catalog import GPU_METRICS
from detectors.findings import Finding, fmt
from detectors.peer_streams import (
    Comparison,
    Departure,
    MetricSpec,
    PeerLevel,
    StreamTable,
    advance,
)
from detectors.robust import Array, nanmedian
from detectors.sequential import Cusum
from detectors.window import WindowView

# metric → resolution floor of its noise (its unit): a spread below this is not evidence.
STRAGGLER_METRICS: dict[str, float] = {
    "sm_active": 0.015,
    "tensor_active": 0.015,
    "dram_active": 0.015,
    "power": 10.0,
    "sm_clock": 25.0,
}
GPU_READS = tuple(STRAGGLER_METRICS)
NIC_READS: tuple[str, ...] = ()
_NAMES = tuple(STRAGGLER_METRICS)
_SM = _NAMES.index("sm_active")
# Which way each metric moves on a straggler: busier (it computes while its peers
# wait) and drawing more power, or a lower clock (throttled). Only that side counts:
# a GPU idler than its peers holds nobody back. A lower clock is the hardware
# signature; two metrics must agree.
SPEC = MetricSpec(_NAMES, np.array([STRAGGLER_METRICS[m] for m in _NAMES]),
                  np.array([-1.0 if m == "sm_clock" else 1.0 for m in _NAMES]),
                  _NAMES.index("sm_clock"), min_metrics=2)
MIN_GPU_PEERS = 4
MIN_NODE_PEERS = 3
GPU_OFFSET_CAP = 0.10  # the test uses a GPU's offset up to this share of its peers' level
LEVEL_TIME_CONSTANT = 600.0  # seconds: how slowly the job's level follows a fall
STEADY_TOLERANCE = 0.15  # busiest GPU within this share of its recent level = comparable
IDLE = 0.1  # a job whose busiest GPU is below this SM activity is not compared
TYPICAL_FLOOR = 0.5  # ... nor one whose median GPU fell below this share of its level
ROTATION_BINS = 120  # how long (bins: 10 min) such an ended departure is remembered
LONG_RUN_BINS = 48  # a departure outlasting this (4 min) is not moving load
SETTLE_BINS = 16  # compared bins: a departure there since the job's first ones may be its load
STATE_VERSION = 8  # the memory layout of the sequential test


@dataclass(frozen=True)
class StragglerParams:
    """The sequential test (its threshold set from a false-alarm rate)."""

    false_alarms_per_1000_days: float = 1.0
    bin_seconds: float = 5.0

    @cached_property
    def gpu_test(self) -> Cusum:
        """Each GPU against its node: tuned to a shift of one noise unit."""
        return Cusum.for_rate(self.false_alarms_per_1000_days, self.bin_seconds, k=0.5)

    @cached_property
    def node_test(self) -> Cusum:
        """Each node against the job: tuned to two noise units. A node's median GPU
        wanders with where the job's work sits (MoE experts, data shards) more than
        one GPU against its node does, and what slows a whole node (its host, its
        power or cooling) is rarely small."""
        return Cusum.for_rate(self.false_alarms_per_1000_days, self.bin_seconds, k=1.0)


def find_stragglers(view: WindowView, p: StragglerParams,
                    memory: dict[str, Any]) -> list[Finding]:
    """GPU- and node-level straggler findings for the view's latest bin.

    ``memory`` holds each stream's sums and offsets, the noise estimates, the job's
    recent level and the runs of signature-less departures; it is updated in place
    and is part of the engine's persisted state.
    """
    if not view.gpus:
        return []
    if memory.get("version") != STATE_VERSION:  # state of the windowed test: start over
        memory.clear()
        memory["version"] = STATE_VERSION
    last = view.bins[-1]
    latest = view.latest_per_node(_NAMES)  # metrics × nodes × slots
    comparable = _comparable(latest, last, view.bin_seconds, memory)
    gpu_level, node_level = _levels(view, latest)
    learned = memory.setdefault("streams", {})
    for level in ("node", "gpu"):
        learned[level] = StreamTable.load(learned.get(level))
    nodes, gpus = advance(
        [Comparison(node_level, p.node_test, learned["node"],
                    learned.setdefault("noise_node", {})),
         Comparison(gpu_level, p.gpu_test, learned["gpu"], learned.setdefault("noise_gpu", {}))],
        SPEC, comparable, last, view.bin_seconds)
    findings = []
    flagged_nodes = set()
    for node, devs in sorted(nodes.found.items()):
        flagged_nodes.add(node)
        findings.append(_finding(view, node, None, devs))
    candidates = {key: devs for key, devs in gpus.found.items()
                  if key.rsplit("/", 1)[0] not in flagged_nodes}
    departed = {k for k in gpus.departed if k.rsplit("/", 1)[0] not in flagged_nodes}
    explained = _workload_made(candidates, departed, gpus.shed, last, memory)
    for key, devs in sorted(candidates.items()):
        if key not in explained:
            node, gpu = key.rsplit("/", 1)
            findings.append(_finding(view, node, gpu, devs))
    return findings


def memory_state(memory: dict[str, Any]) -> dict[str, Any]:
    """``memory`` as JSON-able state for a checkpoint (live stream tables as lists)."""
    learned = memory.get("streams")
    if not learned:
        return memory
    return {**memory, "streams": {k: v.to_state() if isinstance(v, StreamTable) else v
                                  for k, v in learned.items()}}


def _comparable(latest: Array, last: int, bin_seconds: float,
                memory: dict[str, Any]) -> bool:
    """Whether the job is in its main phase, where its GPUs are compared: its busiest
    GPU's SM activity within ``STEADY_TOLERANCE`` of the job's level (and not idle).

    The level follows a rise at once and a fall slowly (``LEVEL_TIME_CONSTANT``), so
    a checkpoint or an evaluation, where every GPU idles or does other work, is never
    taken for the main phase, however long it lasts within reason. A rise beyond the
    tolerance (a warm-up ending) means that what the streams learned was another
    phase: they start training afresh, and the job settles again. Counts the
    comparable bins until the job has settled.
    """
    sm = latest[_SM]
    if np.isnan(sm).all():
        return False
    busiest = float(np.fmax.reduce(sm, axis=None))  # ``nanmax`` without its Python layers
    typical = float(nanmedian(sm.ravel(), axis=0))
    fall = min(1.0, bin_seconds / LEVEL_TIME_CONSTANT)
    # the typical GPU may fall while a straggler holds it up, but not by half: a
    # checkpoint or evaluation that some nodes enter seconds after the others (their
    # clocks run behind) would otherwise keep the job "in phase" on those nodes alone
    usual = float(memory.get("typical", typical))
    memory["typical"] = _follow(usual, typical, fall)
    level = float(memory.get("level", busiest))
    rise = busiest > level * (1 + STEADY_TOLERANCE)
    if rise:
        for key in ("streams", "compared", "settled_at"):
            memory.pop(key, None)
        level = busiest
    memory["level"] = _follow(level, busiest, fall)
    in_phase = (not rise and busiest >= IDLE and busiest >= level * (1 - STEADY_TOLERANCE)
                and typical >= usual * TYPICAL_FLOOR)
    # the first bin of a phase is not compared: node clocks a few seconds apart put
    # part of the phase before it into that bin on some nodes
    steady = in_phase and bool(memory.get("in_phase"))
    memory["in_phase"] = in_phase
    if steady and "settled_at" not in memory:
        memory["compared"] = memory.get("compared", 0) + 1
        if memory["compared"] >= SETTLE_BINS:
            memory["settled_at"] = last
    return steady


def _follow(level: float, now: float, fall: float) -> float:
    """A level that follows a rise at once and a fall by ``fall`` of the way a bin."""
    return max(now, level + fall * (now - level))


def _levels(view: WindowView, latest: Array) -> tuple[PeerLevel, PeerLevel]:
    """Each GPU against the other GPUs of its node; each node's median GPU against
    the job's nodes."""
    node_value = nanmedian(latest, axis=2)  # metrics × nodes
    gpu_peers = (~np.isnan(latest)).sum(axis=2)  # metrics × nodes
    node_idx, slot_idx = view.positions()
    values = latest[:, node_idx, slot_idx]  # metrics × GPUs
    peer = node_value[:, node_idx]
    gpu = PeerLevel(view.gpu_keys, values - peer,
                    (gpu_peers[:, node_idx] >= MIN_GPU_PEERS) & ~np.isnan(values), peer,
                    GPU_OFFSET_CAP)
    job_value = nanmedian(node_value, axis=1)[:, None]  # metrics × 1
    node_peers = (~np.isnan(node_value)).sum(axis=1, keepdims=True)
    node = PeerLevel(list(view.nodes), node_value - job_value,
                     (node_peers >= MIN_NODE_PEERS) & ~np.isnan(node_value),
                     np.repeat(job_value, node_value.shape[1], axis=1), float("inf"),
                     recenter=True)
    return gpu, node


def _workload_made(candidates: dict[str, list[Departure]], departed: set[str],
                   shed: set[str], last_bin: int, memory: dict[str, Any]) -> set[str]:
    """The GPU-level findings (``"node/gpu"``) that the job's own workload may explain.

    A slow GPU departs from its node's others and *stays* departed; load that moves
    between GPUs (MoE experts that are hot for a while) makes GPUs depart and come
    back, one after another. So every signature-less departure (``departed``: on one
    metric or more, not on the clock; what a GPU carrying more of the work looks
    like, and also a slow GPU that keeps its clock) is remembered as a run of bins
    per GPU, and a GPU that has become less busy than its own learned normal
    (``shed``: load that sat there has left) as a run that has ended.

    A signature-less finding must outlast ``LONG_RUN_BINS`` (longer than such load
    stays on one GPU) while some run has ended within ``ROTATION_BINS`` (the job's
    load moves), or when it began before the job had been compared in
    ``SETTLE_BINS`` bins (it may be where the load sits). Two or more GPUs of one
    node departing together without a lower clock is the node's load shifting, not
    two slow GPUs, and never counts.
    """
    runs: dict[str, list[int]] = memory.setdefault("runs", {})  # current: [start, end]
    ended: dict[str, int] = memory.setdefault("ended", {})  # GPU → its last run's end
    quiet = candidates.keys() & departed  # findings without a lower clock
    for key in departed:
        run = runs.get(key)
        if run is not None and run[1] >= last_bin - 1:  # one bin's gap is still one run
            run[1] = last_bin
        else:
            runs[key] = [last_bin, last_bin]
    for key in shed - departed:
        ended[key] = last_bin
    for key in [k for k, (_, end) in runs.items() if end < last_bin - 1]:
        ended[key] = runs.pop(key)[1]
    for key in [k for k, end in ended.items() if end < last_bin - ROTATION_BINS]:
        del ended[key]
    moving = bool(ended)  # a departure ended within ROTATION_BINS: the load moves
    settled = memory.get("settled_at", last_bin + 1)
    per_node = Counter(key.rsplit("/", 1)[0] for key in quiet)
    explained = set()
    for key in quiet:
        start = runs[key][0]
        if per_node[key.rsplit("/", 1)[0]] >= 2 or ((moving or start < settled)
                                                    and last_bin - start < LONG_RUN_BINS):
            explained.add(key)
    return explained


def _finding(view: WindowView, node: str, gpu: str | None,
             devs: list[Departure]) -> Finding:
    top = sorted(devs, key=lambda d: 0.0 if math.isnan(d.z) else -abs(d.z))
    scores = [abs(d.z) for d in top if not math.isnan(d.z)]
    score = statistics.median(scores) if scores else 0.0  # np.nanmedian's arithmetic
    detail = ", ".join(f"{d.metric} {fmt(d.value, GPU_METRICS[d.metric].unit)} vs peers' "
                       f"{fmt(d.peer, GPU_METRICS[d.metric].unit)}" for d in top[:2])
    who = f"GPU {gpu} on {node}" if gpu is not None else f"Node {node}"
    peers = "the other GPUs of its node" if gpu is not None else "the job's other nodes"
    evidence: dict[str, Any] = {
        "peers": peers,
        "deviations": [{"metric": d.metric, "value": round(d.value, 4),
                        "peer_median": round(d.peer, 4),
                        "z": None if math.isnan(d.z) else round(d.z, 2)} for d in top],
    }
    since = min(d.first for d in top) * view.bin_seconds
    return Finding("straggler", node, gpu, "warning", tuple(d.metric for d in top), score,
                   f"{who} is out of step with {peers}: {detail}.", since, evidence,
                   fire_after=1)
