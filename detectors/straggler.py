"""Straggler GPUs and nodes, told apart from GPUs that simply carry more work.

A synchronous job's GPUs do their share of each step, then wait at the barrier for
the slowest. Two very different things raise a GPU's busy time above its peers':

- it is **slower** (a stall in memory or an in-compute link wait, a lower clock): it
  does the same work in more time, and everyone waits for it;
- it has **more work** (a hot MoE expert, a larger shard): it does more in more time.

The counters tell them apart (DCGM's definitions, DESIGN.md principle 12):
``sm_active`` counts cycles with a warp resident, stalled or not, so it is busy time;
``tensor_active`` is the share of elapsed cycles, at the current clock, in which the
tensor pipes worked, so ``tensor_active × sm_clock`` is the GPU's work rate (and
DCGM's raw ``mma_cycles_active`` is that rate directly). A slow GPU's busy time
rises while its work rate stays level with its peers'; more work raises both.

**The statistic.** For every GPU against the other GPUs of its node, and every node
(its median GPU) against the job's nodes, each bin gives, as logarithms of ratios to
the peers' median:

- ``x``, the busy excess (``sm_active``);
- ``y``, the work excess (``mma_cycles_active``, else ``tensor_active × sm_clock``,
  else ``dram_active × mem_clock`` where the job does little tensor work);
- the *slowness* ``e``: the stream's busy time per unit of work, ``log(busy /
  work)``, over its peers' median of the same: busy time not explained by work. It
  counts as evidence only in a bin where the stream is busier than its peers
  by more than the noise floor of a ratio (``x > SLOWNESS_FLOOR``): a GPU level with
  its peers, or below them, adds none, whatever its power, DRAM or work readings (a
  cold expert as busy as its peers does less work, and holds nobody back), unless
  the job's GPUs share their work evenly: where the load statistic's learned noise
  is small (data, tensor, pipeline parallel: 1-2 %), or its node's GPUs agree in
  the bin itself (``_even_in_bin``: on long steps the learned noise is swollen by
  the bins that straddle a phase's end), a GPU as busy as its peers doing clearly
  less work (``EVEN_LOAD_Z`` noise units) has no colder expert to explain it and
  counts too. A stalled GPU in a tensor-parallel group or on a
  pipeline stage reads so: its peers wait inside each layer, so it is barely busier,
  and under the power cap it draws less and runs a higher clock. (Its
  normal offset is learned from every bin: learning only from the busier ones would
  bias it by the busy time's own noise.)
- the *load* ``ℓ = min(x, y)``: busier *and* doing more: workload, reported as
  ``load_imbalance`` (info, never a fault);
- the *clock deficit* ``log(peer clock / clock)``: a lower SM clock, again evidence
  only while busier. The clock is read apart from the activity counters (no shared
  window noise), so it is a second, independent witness of a throttled GPU, and
  lets one be found in two bins.
- a *clock surplus* excuses nothing. Under the board's power cap a GPU whose pipes
  stall draws less power a cycle, and the driver raises its clock above its peers'
  (2.7-10 % in the envelope's stalls): its work rate rises with the clock and would
  hide a third to half of the stall from ``s``. Where its clock is above its peers',
  ``s`` is taken in busy cycles per unit of work (the surplus added back), which no
  clock moves. (A colder expert's clock rises too, on a short step held on its mean
  power; it is not busier than its peers, so its slowness counts for nothing.)
- a *clock deficit at its peers' power* is the power budget's: under a shared cap a
  leaky part, or one that waits less at the barrier, buys fewer cycles with the same
  watts, and the deficit grows when the job's duty cycle moves (its peers wait more
  and their clocks rise). Where a GPU or node draws as much as its peers, its
  deficit (up to the 10 % a healthy part may differ) is excused and its slowness
  read in busy cycles, as for a surplus. A throttle the reasons do not name lowers
  the power with the clock, and still counts. There the load ``ℓ`` and the
  even-load gate read work in cycles too (``y`` plus the clock deficit: the tensor
  share): a window inside the computing phase reads a GPU whose clock wandered up
  (a real capped clock moves 1-3 % from second to second) as doing more work, and
  that noise, learned as load noise, hid small stalls in even jobs.

**Why this holds under real counters.** A reading is the average over the agent's
window of a GPU that switches, within each step, between computing, waiting in a
collective (NCCL spins on ~1/132 of the SMs), communicating and idling. Which part
of the step a window catches moves every counter of a GPU together, and all GPUs of
a node sample the same window, so a node's median swings with its sampling phase.
``s`` is a ratio of two counters of the same window: the phase, and any noise factor
shared by one GPU's counters in one window, cancel in it. Two counters agreeing is
one piece of evidence here, not two: the test runs on the one statistic.

**The test** is sequential: ``s`` and ``ℓ`` of every stream feed one-sided CUSUMs
(``detectors/peer_streams.py``, ``detectors/sequential.py``), each stream's static
offset (silicon, cooling, a pipeline stage at node level) learned in its first
compared bins and capped for a GPU (one already slow when first seen is still
found), the noise estimated online across the streams and per stream, its
persistence counted. Evidence starts only beyond a floor no window phase or rounding
makes (``SLOWNESS_FLOOR`` of the busy time). A 25 % slow or throttled GPU is found
in two bins (10 s), a 12 % stall in about as few; the threshold comes from one
setting, false alarms per 1,000 stream-days
(``detect.straggler_false_alarms_per_1000_days``).

**What remains of the older timing rules.** The rules that waited out moving MoE
load (a departure had to outlast four minutes in a job whose load had moved) are
retired: load is now measured, not waited out. Two remain, both about phases, not
load: only bins where the job's busiest GPU is near its recent level are compared
(warm-up, checkpoints, evaluation and hangs hold the sums; a rise restarts
training), and a stream's first compared bins teach its offset; meanwhile it is
tested as if that offset were the cap (10 %), the most the test would ever allow
it, so a GPU slow from the job's start is found in its first bins.

**Without SM activity** (dcgm-exporter's default field set since 4.0 comments
``sm_active`` out, and ``gr_engine_active`` reads 100 % while a GPU spins in a
collective, so it is no busy time), tensor activity stands in for busy time: a
throttled GPU is still found (its tensor share rises as its clock falls, its work
rate stays level), a stall at the same clock is not (its tensor share stays level).

**More memory-bound work is not a stall.** Work above is tensor work, so a GPU
with more memory-bound kernels than its peers (an embedding gather, an uneven
optimizer or vocabulary shard) is busier with its tensor work level. Its DRAM
traffic tells it apart: it moves more bytes per tensor cycle than its peers, and
its busy time per byte moved (``dram_active × mem_clock``) is not above theirs. A
stall or a lower SM clock moves the same bytes and does the same tensor work in
more time, so both excesses rise together. In a bin where memory work explains the
busy time that way, slowness counts against a fault, never for one; what the
stream learns, and the noise, are left as they are. There the load statistic reads
the bytes moved instead of the tensor work, so such a GPU is reported as
``load_imbalance`` with its share in bytes (``share_basis: dram_active``); on a real
H100, 20 % of each step in memory-bound copies read busy ×1.23, tensor work ×1.00,
bytes ×1.35, and is found so (tests/detectors/test_real_counters.py). (Taking the smaller of the two
excesses as the statistic instead, 05717f6, made the noise estimated across
streams smaller and raised a false straggler on a persistent hot expert in the
fleet soak.) Left: a stall on such a GPU smaller than its memory excess is not
seen while the excess lasts; and a fault that keeps the memory interface busy for
more cycles per byte at the same memory clock (retries, say) would read as memory
work (a lowered memory clock does not: the bytes per second stay level).

**A GPU shared with another process is a straggler, not more work.** Device
counters sum every context: a leftover process of an earlier job, or a time-sliced
tenant, makes the GPU busier *and* its work rate higher, which reads as more work
(on a real H100 a second process's matrix products read work ×3.9 while the job's
step took 1.8× as long). Where the agent counts compute processes
(``compute_processes``) and the GPU has more than its peers' median, a finding the
load statistic passes is a straggler, ``shared_gpu: true``, ``remediable: false``
(the fix is the other process, not the hardware).

**A node whose host holds the job back** (a data loader, a saturated CPU) makes no
GPU busier: its GPUs wait with no kernel at the start of every step while the job's
other GPUs wait for them, spinning in the collective (NVML's ``gpu_util`` counts any
kernel, so it reads 100 % there). So each node also carries the *idle* statistic,
``log(peers' gpu_util / its gpu_util)`` for its median GPU against the job's median
node, in the same sequential test: a 25 % data loader is named in two bins, a 15 %
one in three (the job-level ``slowdown``, which needs the job's steps to stretch
for 20 s, took 30 s and missed 15 %). It is a straggler node, ``host_bound: true``,
``remediable: false`` (its GPUs are fine). A utilisation sampled over the last
sixth of a second also reads low, bin after bin, on a healthy node whose agent's
tick keeps step with the job's gap: so the idle time is a finding only beside a
power deficit that has passed its own test (``quiet``: the node idles where its
peers spin, and power is averaged over the sample), or beside the job's own steps
stretching (``stretched_since``: its duty cycle fell below its healthy level,
``detectors/slowdown.py``): an aliased read instant moves neither. Either must
have begun with the idle time, at most ``CORROBORATION_SECONDS`` before (a deficit
an hour old is the node's own drift, such as a pipeline stage's share of the
work). The stretch witnesses nothing while another node or GPU of the job is found
slower than its peers: a power brake or a slow GPU elsewhere stretches every step
too (envelope seed 232: a brake on one node, and an aliased node named host-bound
beside it). Power alone left every host-bound node of the envelope's fresh seeds
(219-224) unnamed: a GPU idling with no kernel draws about what one spinning a
collective on one SM per channel does, so the deficit sat within a noise unit.
The idle time counts in bins where the node keeps fewer SMs busy per unit of work
than its peers (they spin in the collective; it never does), or, on a step longer
than a bin, where the two fall in different bins, while its idle share over whole
steps exceeds its peers' by more than a read instant in step with the job's can
make (``_open_gate_beyond_aliasing``). On such a job the bin after the step's
collective, where that idle time shows, is compared (``_comparable``). Once
witnessed, the same idle departure stays a finding while it lasts (a minute's mean
of long steps comes and goes), and a stretch that may be one node's witnesses no
other (``_unclaimed``).
Only nodes: one GPU's ``gpu_util`` is coarse (NVML samples it over 1/6 s to 1 s;
the foreign generator's 1 s readings of a healthy GPU jump between 0 and 100 %),
and tested per GPU it raised a hundred and fifty false stragglers on the foreign
traces; a node's median GPU, against the job's, raised none. A node idle from the
job's first bin is learned as its normal (node streams have no cap) and is left to
the job's ``slowdown``, as is a job of fewer than ``MIN_NODE_PEERS`` nodes.

**Without a work signal** (an exporter without the profiling fields), ``s`` is the
busy excess alone: such a finding says ``work_basis: none``, and unless its clock is
down or a clock-event flag is up it cannot be told from more work: it carries
``remediable: false``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from vigil_gpu_monitor.detectors.cost import cost_fields, excess_slowdown
from vigil_gpu_monitor.detectors.findings import Finding, fmt
from vigil_gpu_monitor.detectors.peer_streams import (
    Comparison,
    Departure,
    MetricSpec,
    PeerLevel,
    StreamTable,
    advance,
)
from vigil_gpu_monitor.detectors.robust import Array, mad_sigma, nanmedian
from vigil_gpu_monitor.detectors.sequential import Cusum
from vigil_gpu_monitor.detectors.window import WindowView

BUSY = "sm_active"
# Work-rate sources, best first: (activity counter, the clock it is a share of; None:
# a rate already). DRAM activity is a share of memory-clock cycles, so it is a work
# witness that an SM clock change leaves alone; it stands in only where the job does
# little tensor work.
WORK_SOURCES: tuple[tuple[str, str | None], ...] = (
    ("mma_cycles_active", None), ("tensor_active", "sm_clock"), ("dram_active", "mem_clock"))
GPU_READS = (BUSY, "mma_cycles_active", "tensor_active", "sm_clock", "dram_active", "mem_clock",
             "compute_processes", "gpu_util", "power")
NIC_READS: tuple[str, ...] = ()
_B, _CLOCK = GPU_READS.index(BUSY), GPU_READS.index("sm_clock")
_TENSOR = GPU_READS.index("tensor_active")
_PROCESSES = GPU_READS.index("compute_processes")
_UTIL = GPU_READS.index("gpu_util")
_POWER = GPU_READS.index("power")
MIN_WORK_SHARE = 0.02  # a share-type work counter whose peers read below this says nothing
BASIS_WAIT_BINS = 8  # bins (40 s: a 30 s step and more) tensor work has to show up in
MIN_BUSY = 0.05  # peers busier than this are compared (below: idle or a pause)
# The statistics, in log-ratio units. Their noise floors: a departure smaller than
# one floor is never one noise unit (window phase and rounding make that much; idle
# time, a node's median GPU, as slowness: no kernel for 2.5 % of a window is noise).
SLOWNESS_FLOOR = 0.025
LOAD_FLOOR = 0.05
CLOCK_FLOOR = 0.02
IDLE_FLOOR = 0.025
POWER_FLOOR = 0.01  # a node's power this share below its peers': noise (power is averaged)
BUDGET_FLOOR = 0.02  # power this share below its peers' or nearer: on the same power budget
STATS = ("slowness", "load", "clock", "idle")
SLOW_STATS = frozenset({"slowness", "clock"})  # either passing: a slower GPU or node
SPEC = MetricSpec(STATS, np.array([SLOWNESS_FLOOR, LOAD_FLOOR, CLOCK_FLOOR, IDLE_FLOOR]),
                  np.array([1.0, 1.0, 1.0, 1.0]),
                  -1, min_metrics=1, offset_floor=0.0,
                  # NVML's last-period utilisation catches a step's gap or misses it:
                  # a node's idle reading jumps by nature, and its jumps are its noise
                  jumps_are_noise=tuple(s == "idle" for s in STATS))
# "quiet": a node's power below the job's, in its own test (``quiet_test``). Alone it
# decides nothing (less work, a cooler rack); it is the idle statistic's second,
# independent witness.
QUIET_SPEC = MetricSpec(("quiet",), np.array([POWER_FLOOR]), np.array([1.0]), -1,
                        min_metrics=1, offset_floor=0.0)
MIN_GPU_PEERS = 4
MIN_NODE_PEERS = 3
GPU_OFFSET_CAP = 0.10  # the test uses a GPU's learned offset up to this (log units)
LEVEL_TIME_CONSTANT = 600.0  # seconds: how slowly the job's level follows a fall
RISE = 0.3  # the median GPU this much above the job's level: a new phase (warm-up ended)
IDLE = 0.1  # a job whose busiest GPU is below this SM activity is not compared
TYPICAL_FLOOR = 0.5  # ... nor one whose median GPU fell below this share of its level
PEAK_FLOOR = 0.6  # ... nor one whose busiest GPU fell below this share of its usual
SETTLE_BINS = 16  # compared bins before the job counts as settled
EVEN_LOAD_Z = 3.0  # a work deficit this many load-noise units: slower, not colder
# a host-bound node's power deficit began to rise at most this long before its idle
# time did (both start with the fault; an older one is the node's own drift)
CORROBORATION_SECONDS = 300.0
# the idle gate beyond aliasing (``_open_gate_beyond_aliasing``): the job's step
# period is read from its nodes' busy series over PERIOD_BINS (a minute, the window) ...
PERIOD_BINS = 12
MAX_PERIOD_BINS = 6  # ... up to half of it (a 30 s step) ...
PERIOD_CORRELATION = 0.5  # ... where they repeat this closely ...
PERIOD_NODES = 64  # ... on this many nodes at most ...
PERIOD_EVERY = 12  # ... again every minute
MIN_PERIOD_READINGS = 4  # readings a period needs for its aliasing bound to tell
IDLE_EXCESS_BINS = 12  # the idle excess: a mean over whole periods of at least a minute
MIN_READ_SHARE = 0.75  # ... over which a node has this share of its bins read
ALIAS_MARGIN = 0.05  # ... beyond the aliasing bound by this share of the time
# bins a host-bound finding stays open without its departure: on 10 s steps the
# test's sum dipped under its threshold for up to a minute between the bins the idle
# time showed in (a 6-node job, 10 s steps: resolved and paged again 60 s later)
IDLE_RESOLVE_BINS = 16
CLOCK_SIGNATURE = 0.03  # a clock this share below its peers' is a hardware signature
LOAD_COST_BINS = 3  # a load imbalance's cost: the median excess of up to these bins
STATE_VERSION = 13  # the memory layout of the sequential test


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
        """Each node against the job: tuned to two noise units. What slows a whole
        node (its host, its power or cooling) is rarely small, and a node's median
        carries more of the job's structure (pipeline stages, data shards)."""
        return Cusum.for_rate(self.false_alarms_per_1000_days, self.bin_seconds, k=1.0)

    @cached_property
    def quiet_test(self) -> Cusum:
        """A node's power deficit against the job: tuned to one noise unit. What it
        witnesses is small by physics (a GPU spinning in a collective draws little
        more than an idle one), at the same false-alarm rate as every test."""
        return Cusum.for_rate(self.false_alarms_per_1000_days, self.bin_seconds, k=0.5)


@dataclass(frozen=True)
class _Readings:
    """One level's streams in the latest bin: busy time, work rate and clock of each
    stream and of its peers (the peers' median), and the statistics."""

    keys: list[str]
    busy: Array
    peer_busy: Array
    util: Array  # gpu_util: the share of time a kernel ran
    peer_util: Array
    work: Array
    peer_work: Array
    clock: Array
    peer_clock: Array
    stats: Array  # STATS × streams
    valid: NDArray[np.bool_]  # STATS × streams
    gate: NDArray[np.bool_]  # STATS × streams: may count for a fault this bin
    memory_ratio: Array  # bytes moved a second over the peers' (NaN: no DRAM reading)
    extra_processes: Array  # compute processes beyond the peers' median (NaN: unknown)
    quiet: Array  # log(peers' power / its power) where compared, else NaN
    # STATS × streams: how much of a departure from the stream's normal the clock
    # the power cap takes for its extra work explains this bin (0: none)
    excuse: Array


def find_stragglers(view: WindowView, p: StragglerParams,
                    memory: dict[str, Any],
                    clock_faults: Collection[str] = frozenset(),
                    compare_nodes: bool = True,
                    stretched_since: int | None = None,
                    tick_seconds: Callable[[], float | None] | None = None) -> list[Finding]:
    """Straggler and load-imbalance findings, GPU and node level, for the view's
    latest bin.

    ``clock_faults``: the ``"node/gpu"`` keys whose clock-event reasons name a fault
    (HW slowdown, thermal, power brake) in the latest sample: there a lower clock is
    evidence whatever the GPU's work; elsewhere only where its work is not above its
    peers' (a GPU doing more work under the board's power cap runs a lower clock).
    ``compare_nodes``: whether the job's nodes wait for each other
    (``detectors/synchrony.py``); where not, only GPUs of one node are compared.
    ``stretched_since``: the bin since which the job's steps have been stretched
    (``slowdown.stretched_since``; None: they are not), which corroborates a
    node's idle time as a power deficit does, unless another node or GPU of the
    job is found slower than its peers in this bin. ``tick_seconds``: what gives
    the job's agents' typical interval (``HealthMonitor.typical_interval``; None:
    not known yet), which bounds how far a read instant in step with the job can
    alias its idle time; asked only on a job whose steps beat with the bins (it
    sorts every node's interval: 3 ms a bin at 16,384 nodes).

    ``memory`` holds each stream's sums and offsets, the noise estimates, the job's
    recent level and its work basis; it is updated in place and is part of the
    engine's persisted state.
    """
    if not view.gpus:
        return []
    if memory.get("version") != STATE_VERSION:  # state of an older test: start over
        memory.clear()
        memory["version"] = STATE_VERSION
    last = view.bins[-1]
    latest = view.latest_per_node(GPU_READS)  # metrics × nodes × slots
    if np.isnan(latest[_B]).all():  # dcgm-exporter's default fields: no SM activity
        latest[_B] = latest[_TENSOR]
    comparable = _comparable(latest[_B], last, view.bin_seconds, memory,
                             _step_period(view, memory))
    basis = _work_basis(latest, memory)
    # a node whose window caught another part of the step (its median GPU below the
    # phase floor: the collective's spinning kernel, no tensor work) compares nothing
    phase_floor = max(MIN_BUSY, TYPICAL_FLOOR * float(memory.get("level", 0.0)))
    learned = memory.setdefault("streams", {})
    for level in ("node", "gpu", "quiet"):
        learned[level] = StreamTable.load(learned.get(level))
    load_noise = learned.setdefault("noise_gpu", {}).get("sigma")
    gpu_level, node_level = _levels(view, latest, basis, phase_floor, clock_faults,
                                    compare_nodes, _even_load(load_noise))
    _open_gate_beyond_aliasing(view, node_level, memory, tick_seconds)
    nodes, gpus = advance(
        [Comparison(_peer_level(node_level, float("inf"), True), p.node_test, learned["node"],
                    learned.setdefault("noise_node", {})),
         Comparison(_peer_level(gpu_level, GPU_OFFSET_CAP, False), p.gpu_test, learned["gpu"],
                    learned.setdefault("noise_gpu", {}))],
        SPEC, comparable, last, view.bin_seconds)
    quiet_level = PeerLevel(node_level.keys, node_level.quiet[None, :],
                            np.isfinite(node_level.quiet)[None, :],
                            np.ones((1, len(node_level.keys))), float("inf"), recenter=True)
    (quiet,) = advance([Comparison(quiet_level, p.quiet_test, learned["quiet"],
                                   learned.setdefault("noise_quiet", {}))],
                       QUIET_SPEC, comparable, last, view.bin_seconds)
    findings = []
    job_gpus = len(view.gpus)
    flagged_nodes = set()
    slow_at = _slow_nodes(nodes.found) | _slow_nodes(gpus.found)
    # node -> the bin its witnessed idle departure began
    witnessed: dict[str, int] = memory.setdefault("witnessed", {})
    for node in set(witnessed) - set(node_level.keys):
        del witnessed[node]
    within = int(CORROBORATION_SECONDS / view.bin_seconds)
    for node, found in sorted(nodes.found.items()):
        # the job's steps stretch for a slow part elsewhere too: no witness then
        stretch = None if slow_at - {node} else _unclaimed(stretched_since, node,
                                                          witnessed, within)
        devs = _corroborated(found, quiet.found.get(node, []), within, stretch,
                             witnessed.get(node))
        idle = [d for d in devs if d.metric == "idle"]
        if idle:  # a witness opens it; the same idle time's departure holds it
            witnessed[node] = idle[0].first
        if not devs:
            continue
        flagged_nodes.add(node)
        findings.append(_finding(view, node_level, node, None, devs, basis, job_gpus))
    for key, devs in sorted(gpus.found.items()):
        node, gpu = key.rsplit("/", 1)
        if node not in flagged_nodes:
            findings.append(_finding(view, gpu_level, node, gpu, devs, basis, job_gpus))
    return findings


def _slow_nodes(found: dict[str, list[Departure]]) -> set[str]:
    """The nodes of the streams (``node`` or ``node/gpu``) found slower than their
    peers (slowness or clock) this bin."""
    return {key.split("/", 1)[0] for key, devs in found.items()
            if any(d.metric in SLOW_STATS for d in devs)}


def _unclaimed(stretched_since: int | None, node: str, witnessed: dict[str, int],
               within_bins: int) -> int | None:
    """``stretched_since`` unless the stretch may be another node's idle time: it
    began no more than ``within_bins`` after the first bin of another node's
    witnessed idle departure (``witnessed``: node -> that bin). One stretch
    witnesses one node: the host-bound node's own stretch, outlasting its finding
    where its read instant fell out of its idle time, made a neighbour's aliased
    idle time a second host-bound node (envelope seed 220, 1.4 s steps read every
    5 s)."""
    if stretched_since is None or any(other != node and first >= stretched_since - within_bins
                                      for other, first in witnessed.items()):
        return None
    return stretched_since


def _corroborated(devs: list[Departure], quiet: list[Departure],
                  within_bins: int, stretched_since: int | None = None,
                  witnessed: int | None = None) -> list[Departure]:
    """A node's departures that make a finding: idle time counts only beside a power
    deficit that passed its own test (``quiet``; see ``_readings``), or beside the
    job's steps stretching (``stretched_since``), either begun with it, no more than
    ``within_bins`` before the idle time was. What a host holds back starts all
    three at once; a power deficit that has built up for an hour is the node's own
    drift (a pipeline stage whose share of the work creeps), and the fleet soak's
    one false alarm paired such a deficit, rising since t+780 s, with a minute of
    last-period utilisation aliased on the job's gap at t+3,425 s. An idle departure
    once witnessed (``witnessed``: the bin its sum began to rise) stays a finding
    while it lasts: a witness measured over a minute of long steps comes and goes
    with the bins its mean holds, and the finding with it would page again and
    again (seven pages more on seeds 201-237 of the envelope, 10 s steps). A
    stretch that may be another node's witnesses nothing here (``_unclaimed``)."""
    return [d for d in devs if d.metric != "idle" or d.first == witnessed
            or any(q.first >= d.first - within_bins for q in quiet)
            or (stretched_since is not None and stretched_since >= d.first - within_bins)]


def _open_gate_beyond_aliasing(view: WindowView, node_level: _Readings,
                               memory: dict[str, Any],
                               tick_seconds: Callable[[], float | None] | None) -> None:
    """Open the idle statistic's gate (``held_back`` in ``_readings``) also for a node
    whose GPUs, over the last whole step periods, ran no kernel for a larger share
    of the time than its peers by more than aliasing can make.

    On a step longer than a bin the two signs of a host-bound node fall in different
    bins: its GPUs idle with no kernel at the start of the step while their peers
    compute (the same busy time per unit of work there), and the peers spin in the
    collective at its end, a spin too small to see at a few channels (envelope seeds
    201-237: every host-bound node of 4-10 s steps missed). But a reading of the
    last sixth of a second, taken at the same phase of every step where the tick
    keeps step with the job, catches the job's own gap every time or never: a node
    read every 5 s whose read instant drifted into a 15 s step's gap read no kernel
    for 52-72 % of one bin in three, bin after bin (a 32-node MoE job of the fleet
    soak, named host-bound where the gate opened on idle time that merely repeated).

    How far aliasing can go is known: a node read ``k`` times per period of the
    tick against the step (the bins' own period, ``_step_period``) catches a gap
    at most once more per period than its peers, so its idle share over whole
    periods exceeds theirs by at most ``1/k``. The gate opens where the excess,
    the node's mean ``gpu_util`` below the job's median node's over whole periods
    (at least ``IDLE_EXCESS_BINS``), passes ``1/k`` by ``ALIAS_MARGIN``: a 25 %
    data loader on 10 s steps read every second (k = 10) passes; an aliased read
    at a 5 s tick on 15 s steps (k = 3) cannot (that job's node: 16-20 % over whole
    periods, its most aliased node 33 %, the bound 37 %). Without a period (steps a bin or
    shorter, which every bin averages over, or no tick known yet) or with fewer than
    ``MIN_PERIOD_READINGS`` readings a period it stays as ``held_back`` left it."""
    period = _step_period(view, memory)
    tick = tick_seconds() if period is not None and tick_seconds is not None else None
    if period is None or not tick or tick <= 0:
        return
    readings = period * view.bin_seconds / tick
    if readings < MIN_PERIOD_READINGS:
        return
    span = period * math.ceil(IDLE_EXCESS_BINS / period)
    if len(view.bins) < span:
        return
    util = nanmedian(view.per_node("gpu_util", last=span), axis=1)  # nodes × bins
    if np.isnan(util).all():
        return
    peer = nanmedian(util, axis=0)
    gap = peer[None, :] - util
    read = np.isfinite(gap).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = np.nansum(gap, axis=1) / read
    beyond = (read >= span * MIN_READ_SHARE) & (excess > 1.0 / readings + ALIAS_MARGIN)
    node_level.gate[STATS.index("idle")] |= beyond


def _step_period(view: WindowView, memory: dict[str, Any]) -> int | None:
    """The job's step period in bins, where its nodes' busy time repeats with one of
    2 to ``MAX_PERIOD_BINS`` bins (a step of 10 to 30 s at 5 s bins, or a
    shorter one whose beat with the bins repeats that soon): the smallest lag at
    which the nodes' own busy series (each node on its own clock, so a node read
    a bin late still counts) correlate by ``PERIOD_CORRELATION`` on average, and by
    ``PERIOD_CORRELATION`` more than at one bin (a level that wanders correlates at
    every lag). Read over ``PERIOD_BINS`` on up to ``PERIOD_NODES`` nodes, again
    every ``PERIOD_EVERY`` bins (``memory["period"]``: the lag, 0 for none, and the
    bin it was read at). None: no such period."""
    last = view.bins[-1]
    kept = memory.get("period")
    if kept is not None and last - int(kept[1]) < PERIOD_EVERY and kept[1] <= last:
        return int(kept[0]) or None
    lag = 0
    metric = view.activity_metric()
    if metric is not None and len(view.bins) >= PERIOD_BINS:
        busy = nanmedian(view.per_node(metric, last=PERIOD_BINS), axis=1)
        rows = busy[np.isfinite(busy).all(axis=1)]
        rows = rows[np.linspace(0, len(rows) - 1, min(len(rows), PERIOD_NODES)).astype(int)
                    ] if len(rows) else rows
        centred = rows - rows.mean(axis=1, keepdims=True)
        power = (centred ** 2).mean(axis=1)
        centred, power = centred[power > 0], power[power > 0]
        if len(centred):
            corr = [float(np.mean((centred[:, :-k] * centred[:, k:]).mean(axis=1) / power))
                    for k in range(1, MAX_PERIOD_BINS + 1)]
            lag = next((k for k in range(2, MAX_PERIOD_BINS + 1)
                        if corr[k - 1] >= PERIOD_CORRELATION
                        and corr[k - 1] >= corr[0] + PERIOD_CORRELATION), 0)
    memory["period"] = [lag, last]
    return lag or None


def memory_state(memory: dict[str, Any]) -> dict[str, Any]:
    """``memory`` as JSON-able state for a checkpoint (live stream tables as lists)."""
    learned = memory.get("streams")
    if not learned:
        return memory
    return {**memory, "streams": {k: v.to_state() if isinstance(v, StreamTable) else v
                                  for k, v in learned.items()}}


def _comparable(sm: Array, last: int, bin_seconds: float, memory: dict[str, Any],
                period: int | None = None) -> bool:
    """Whether the job is in its main phase, where its GPUs are compared: its median
    GPU's SM activity at least ``TYPICAL_FLOOR`` of the job's level, and its busiest
    GPU not idle and at least ``PEAK_FLOOR`` of its usual (``peak``, a slow average
    of the busiest GPU's activity, so one spike does not move it).

    The two floors part a slow part from another phase. A straggler keeps computing
    all the time, so the job's busiest GPU stays at or above its usual, while its
    peers wait and the median falls by up to half; a host that delays its node by
    up to two thirds of a step still leaves the busiest GPU above ``PEAK_FLOOR``.
    An evaluation pass or a data stall lowers every GPU alike, the busiest too: the
    fleet soak's last false alarm came from a 76 s evaluation phase whose median
    read 51 % of the level (inside ``TYPICAL_FLOOR``) and whose busiest GPU read
    45 % of its usual, where forward passes ran a GPU 5-10 % slower per unit of
    work than training did.

    The level follows a rise at once and a fall slowly (``LEVEL_TIME_CONSTANT``), so
    a checkpoint, an evaluation or a hang, where every GPU idles or does other work,
    is never taken for the main phase. The gate is wide on purpose: which part of
    the step a node's window catches swings every reading of the node (by tens of
    percent on long steps), and the statistics cancel that swing themselves; the
    gate only keeps other phases from teaching. A rise of the median by more than
    ``RISE`` (a warm-up ending) means what the streams learned was another phase:
    they start training afresh.
    """
    if np.isnan(sm).all():
        return False
    busiest = float(np.fmax.reduce(sm, axis=None))
    typical = float(nanmedian(sm.ravel(), axis=0))
    fall = min(1.0, bin_seconds / LEVEL_TIME_CONSTANT)
    level = float(memory.get("level", typical))
    peak = float(memory.get("peak", busiest))
    rise = typical > level * (1 + RISE)
    if rise:
        for key in ("streams", "compared", "settled_at"):
            memory.pop(key, None)
        level, peak = typical, busiest
    memory["level"] = _follow(level, typical, fall)
    memory["peak"] = peak + fall * (busiest - peak)
    in_phase = (not rise and busiest >= IDLE and typical >= level * TYPICAL_FLOOR
                and busiest >= peak * PEAK_FLOOR)
    # the first bin of a phase is not compared: node clocks a few seconds apart put
    # part of the phase before it into that bin on some nodes. Where the job's steps
    # beat with the bins (``period``), a phase of fewer bins than a step that ended
    # it was the step's own collective, not a pause: the bin after it is the start
    # of the next step, where a host-bound node's GPUs idle (a 15 s step read in 5 s
    # bins: the only bin of three its idle time showed in was never compared,
    # envelope seeds 203 and 213)
    out = int(memory.get("out_of_phase", 0))
    steady = in_phase and (bool(memory.get("in_phase"))
                           or (period is not None and 0 < out < period))
    memory["in_phase"] = in_phase
    memory["out_of_phase"] = 0 if in_phase else min(out + 1, 1000)
    if steady and "settled_at" not in memory:
        memory["compared"] = memory.get("compared", 0) + 1
        if memory["compared"] >= SETTLE_BINS:
            memory["settled_at"] = last
    return steady


def _follow(level: float, now: float, fall: float) -> float:
    """A level that follows a rise at once and a fall by ``fall`` of the way a bin."""
    return max(now, level + fall * (now - level))


def _work_basis(latest: Array, memory: dict[str, Any]) -> str | None:
    """The job's work-rate source (the activity counter of ``WORK_SOURCES``), chosen
    once, the first bin one reads at a usable level, then kept: the streams learn
    their offsets on one basis. Memory activity stands in only for a job that shows
    no tensor work for ``BASIS_WAIT_BINS``. None while the job has none."""
    chosen = memory.get("work_basis")
    if chosen is not None:
        return str(chosen)
    memory["basis_bins"] = seen = int(memory.get("basis_bins", 0)) + 1
    for counter, _clock in WORK_SOURCES:
        values = latest[GPU_READS.index(counter)]
        if np.isnan(values).all():
            continue
        level = float(nanmedian(values.ravel(), axis=0))
        # a lesser source only once a better one has had a whole step to show: a
        # first bin in the communication phase reads no tensor work, and memory
        # traffic there is the collective's, not the step's work
        if (counter == "mma_cycles_active" or level >= MIN_WORK_SHARE) and (
                counter != "dram_active" or seen >= BASIS_WAIT_BINS):
            memory["work_basis"] = counter
            return counter
    return None


def _work(latest: Array, basis: str | None) -> Array:
    """Each GPU's work rate on the job's basis (nodes × slots; NaN: none)."""
    if basis is None:
        return np.full(latest.shape[1:], np.nan)
    clock = dict(WORK_SOURCES)[basis]
    rate = latest[GPU_READS.index(basis)]
    return rate if clock is None else rate * latest[GPU_READS.index(clock)]


def _even_load(noise: list[float | None] | None) -> float:
    """How far below its node's median work rate a GPU must work to be slower rather
    than colder, from the GPU level's learned noise of the load statistic
    (``EVEN_LOAD_Z`` noise units, never under ``SLOWNESS_FLOOR``); infinite while
    none is learned. Where a job's GPUs share its work evenly (data, tensor or
    pipeline parallel: a load noise of 1-2 %), a GPU as busy as its peers doing 6 %
    less work has no colder expert to explain it; where expert load moves (MoE: 5-10 %)
    it may have, and busy time must show it."""
    sigma = None if noise is None else noise[STATS.index("load")]
    return math.inf if sigma is None else max(SLOWNESS_FLOOR, EVEN_LOAD_Z * sigma)


def _levels(view: WindowView, latest: Array, basis: str | None, phase_floor: float,
            clock_faults: Collection[str] = frozenset(), compare_nodes: bool = True,
            even_load: float = math.inf) -> tuple[_Readings, _Readings]:
    """Each GPU against the GPUs of its node; each node's median GPU against the
    job's nodes. Peers whose median busy time is below ``phase_floor`` are in another
    part of the step this bin (a lossy node's one window in the collective, say):
    there the work counter reads near zero and its ratio is noise.

    Busy time per unit of work, ``log(busy / work)``, is taken per GPU before any
    median: the median of busy times and the median of work rates of a node whose
    load varies are two different GPUs, and their ratio would describe neither.
    Busy time per byte moved is taken the same way, for ``_memory_explains``."""
    busy, clock, work, util = latest[_B], latest[_CLOCK], _work(latest, basis), latest[_UTIL]
    node_power = nanmedian(latest[_POWER], axis=1)
    # memory work (bytes moved per second) as a second reading of work, where the
    # basis is another counter
    memory = (_work(latest, "dram_active") if basis not in (None, "dram_active")
              else np.full(busy.shape, np.nan))
    with np.errstate(invalid="ignore", divide="ignore"):
        per_work = np.log(busy / work)
        per_memory_work = np.log(busy / memory)
    node_busy, node_work, node_clock, node_per_work, node_per_memory_work, node_memory, \
        node_util = (nanmedian(a, axis=1) for a in (busy, work, clock, per_work,
                                                     per_memory_work, memory, util))
    peers = (~np.isnan(busy)).sum(axis=1)
    node_idx, slot_idx = view.positions()
    at = (node_idx, slot_idx)
    with np.errstate(invalid="ignore"):  # inf - inf where a GPU read no work: NaN
        own_per_work = per_work[at] - node_per_work[node_idx]
        own_per_memory_work = per_memory_work[at] - node_per_memory_work[node_idx]
    # nearly every bin names no clock fault: no pass over the GPUs' keys then (27 ms
    # a bin at 131,072 GPUs)
    gpu_fault = (np.array([key in clock_faults for key in view.gpu_keys], dtype=bool)
                 if clock_faults else np.zeros(len(view.gpu_keys), dtype=bool))
    # a node's clock is its median GPU's: a fault there when half its GPUs have one
    faulted = np.bincount(node_idx, weights=gpu_fault, minlength=len(view.nodes))
    node_fault = (faulted > 0) & (faulted >= np.bincount(node_idx, minlength=len(view.nodes)) / 2)
    processes = latest[_PROCESSES]
    extra_processes = (np.full(len(node_idx), np.nan) if np.isnan(processes).all()
                       else processes[at] - nanmedian(processes, axis=1)[node_idx])
    gpu = _readings(view.gpu_keys, busy[at], node_busy[node_idx], work[at],
                    node_work[node_idx], clock[at], node_clock[node_idx], own_per_work,
                    basis, peers[node_idx] >= MIN_GPU_PEERS, phase_floor,
                    _memory_explains(own_per_work, own_per_memory_work),
                    _ratio(memory[at], node_memory[node_idx]), extra_processes,
                    # one GPU's gpu_util is too coarse to compare (see the docstring)
                    util=(np.full(len(node_idx), np.nan),) * 2, clock_fault=gpu_fault,
                    even_load=even_load,
                    on_budget=_on_budget(latest[_POWER][at], node_power[node_idx]),
                    places=at)
    job = [float(nanmedian(a, axis=0)) if not np.isnan(a).all() else math.nan
           for a in (node_busy, node_work, node_clock, node_per_work, node_per_memory_work,
                     node_memory, node_util, node_power)]
    n = len(view.nodes)
    node_slowness = _minus(node_per_work, job[3])
    node = _readings(list(view.nodes), node_busy, np.full(n, job[0]), node_work,
                     np.full(n, job[1]), node_clock, np.full(n, job[2]),
                     node_slowness, basis,
                     np.full(n, compare_nodes
                             and int((~np.isnan(node_busy)).sum()) >= MIN_NODE_PEERS),
                     phase_floor,
                     _memory_explains(node_slowness, _minus(node_per_memory_work, job[4])),
                     _ratio(node_memory, job[5]), np.full(n, np.nan),
                     util=(node_util, np.full(n, job[6])), clock_fault=node_fault,
                     power=(node_power, np.full(n, job[7])),
                     on_budget=_on_budget(node_power, np.full(n, job[7])))
    return gpu, node


def _even_in_bin(cycles: Array, places: tuple[NDArray[np.intp], NDArray[np.intp]]) -> Array:
    """Each GPU's work-deficit bar from this bin alone: ``EVEN_LOAD_Z`` times the
    robust spread (MAD) of the work, in cycles, of its node's GPUs in this bin
    (never under ``SLOWNESS_FLOOR``; infinite where fewer than ``MIN_GPU_PEERS`` of
    them read work: no spread to speak of). The level's learned load noise is
    smoothed over a minute, and on long steps (10 s) the bins whose windows straddle
    the end of the computing phase swell it to 3-5 %: a GPU that finishes a few
    tenths of a second after its peers reads a fifth more busy time and work there.
    In the bins inside the phase the node's GPUs agree within 1 %, and a stalled GPU
    read 6-8 % less work at their busy time (envelope seed 221, tensor parallel),
    yet the learned bar (9-15 %) never let it count. Where expert load moves, a
    node's experts spread by 5-18 % in most bins (envelope seed 201) and the bar
    stays high; in 23 of 293 bins of a 10 s-step MoE job (seed 205) they agreed
    within 2 %, and none fell behind there (no finding on a healthy MoE job of seeds
    201-237, nor in the fleet soak). ``places``: each GPU's node and slot."""
    node_idx, slot_idx = places
    grid = np.full((int(node_idx.max()) + 1, int(slot_idx.max()) + 1), np.nan)
    grid[node_idx, slot_idx] = np.where(np.isfinite(cycles), cycles, np.nan)
    with np.errstate(invalid="ignore"):
        spread = mad_sigma(grid, axis=1)
    bar = np.maximum(SLOWNESS_FLOOR, EVEN_LOAD_Z * spread)
    bar[(~np.isnan(grid)).sum(axis=1) < MIN_GPU_PEERS] = np.inf
    return bar[node_idx]


def _on_budget(power: Array, peer_power: Array) -> NDArray[np.bool_]:
    """Where a stream draws as much power as its peers' median, or more, within
    ``BUDGET_FLOOR`` (no power reading: False)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(power >= peer_power * (1.0 - BUDGET_FLOOR), dtype=bool)


def _ratio(values: Array, reference: Array | float) -> Array:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(values / reference, dtype=float)


def _memory_explains(slowness: Array, memory_slowness: Array) -> NDArray[np.bool_]:
    """Where a stream's busy time is explained by memory work: its busy time per
    byte moved is not above its peers' (``memory_slowness`` within the slowness
    floor) *and* it moves more bytes per tensor cycle than they do (by more than the
    load floor). That is more memory-bound work (an embedding gather, an uneven
    optimizer shard), not a stall: a stall or a lower clock does the same tensor
    work and moves the same bytes in more time, so both excesses rise together and
    the bytes per tensor cycle stay level. NaN (no DRAM reading): not explained."""
    with np.errstate(invalid="ignore"):
        return np.asarray((memory_slowness <= SLOWNESS_FLOOR)
                          & (slowness - memory_slowness > LOAD_FLOOR), dtype=bool)


def _minus(values: Array, reference: float) -> Array:
    with np.errstate(invalid="ignore"):
        return values - reference


def _readings(keys: list[str], busy: Array, peer_busy: Array, work: Array, peer_work: Array,
              clock: Array, peer_clock: Array, per_work: Array, basis: str | None,
              enough: NDArray[np.bool_], phase_floor: float,
              memory_explained: NDArray[np.bool_], memory_ratio: Array,
              extra_processes: Array, util: tuple[Array, Array],
              clock_fault: NDArray[np.bool_] | None = None,
              power: tuple[Array, Array] | None = None,
              even_load: float = math.inf,
              on_budget: NDArray[np.bool_] | None = None,
              places: tuple[NDArray[np.intp], NDArray[np.intp]] | None = None) -> _Readings:
    """The slowness and load statistics of streams against their peers' medians
    (``per_work``: the stream's busy time per unit of work over its peers', log;
    ``memory_explained``: where more memory work explains the busy time, so
    slowness may not count for a fault, and the bytes moved are the load's work;
    ``memory_ratio``: bytes moved a second over the peers'; ``util``: the streams'
    ``gpu_util`` and their peers'; ``clock_fault``: where the clock-event reasons
    name a fault; ``power``: the streams' power and their peers', where compared;
    ``even_load``: a work deficit beyond this, at any busy time, is slowness's
    evidence as much as a busy excess is: ``_even_load``; ``places``: each GPU's node
    and slot, where this bin's agreement among a node's GPUs may lower that bar,
    ``_even_in_bin``; ``on_budget``: where the stream draws as much power as its
    peers, ``_on_budget``).

    Under the board's power limit the driver trades clock for power, so a stream
    doing more work than its peers runs a lower clock without any fault. Unless
    its clock-event reasons name a fault, the part of its clock deficit that its
    work excess can explain (at most that excess: the power drawn grows no faster
    than the work rate, and the clock it costs at least linearly) is load: it is
    taken out of the slowness (busy time per unit of work rises as the clock falls)
    and excused from the clock statistic. A clock far below what its extra work
    could cost still counts.

    A stream that draws as much power as its peers (``on_budget``) while its clock
    is lower is spending the same power budget on fewer cycles: a leaky part, or one
    that waits less at the barrier and so computes through more of each step. Under
    a shared power cap its clock is what that budget buys, whatever its work, so its
    clock deficit, up to ``GPU_OFFSET_CAP`` (the most the test lets a healthy part
    differ from its peers), is excused the same way and its slowness counts in busy
    cycles per unit of work. A throttle the clock-event reasons do not name lowers
    the power with the clock (an 8 % lower clock draws ~9 % less than peers that wait
    for it), and a stall still reads in cycles. Without it, the feedback between
    clock and duty cycle made stragglers of healthy parts: when another node began
    to hold the job back, a leaky GPU's peers waited more and the cap let their
    clocks rise 10 %, its own 3 %, and its busy time per unit of work rose 6 %
    (envelope seeds 214 and 216, with the H200's clock wander).

    For the clock statistic that part is an excuse for this bin (``excuse``), taken
    from the test's departure, not from the reading the stream learns its normal
    from: a GPU's clock at its normal is its silicon's (a leaky part draws more
    power for the same work and runs a lower clock at the cap), so a leaky GPU that
    carried a hot expert all through its training learns its lower clock as its
    own, and is not called slow once the expert moves on (held-out seed 203 of the
    envelope). Slowness keeps the excuse inside its reading and its normal, as
    before: busy time per unit of work moves with load by itself (a GPU that waits
    less at the barrier spends less time in the collective's spin), and learned
    from the unexcused reading its normal rose by the excuse's mean on noise, which
    cost two small stalls at a 30 s tick their finding within 4 minutes."""
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.log(busy / peer_busy)
        # more memory-bound work is more work: where it explains the busy time, the
        # work that rose with it is the bytes moved, not the tensor work
        y = np.where(memory_explained, np.log(memory_ratio), np.log(work / peer_work))
        lower_clock = np.log(peer_clock / clock)
        # time with no kernel at all, against peers that keep one running (computing,
        # or spinning in the collective while they wait): input the host did not feed
        idle = np.log(util[1] / util[0])
        quiet = (np.full(x.shape, np.nan) if power is None
                 else np.log(power[1] / power[0]))
        quiet[~np.isfinite(quiet)] = np.nan
        # busier beyond what a window's phase makes: a GPU as busy as its peers
        # (+0.2 %) that does less work is a cold expert, not holding anyone back
        busier = x > SLOWNESS_FLOOR
        fault = np.zeros(x.shape, dtype=bool) if clock_fault is None else clock_fault
        # on a shared power budget the clock is the budget's: work is read in cycles
        # (a window inside the computing phase reads a faster clock as more work)
        cycles = (y if on_budget is None else
                  np.where(~fault & on_budget & np.isfinite(lower_clock), y + lower_clock, y))
        # ... or, where the job's work is shared evenly (by the level's learned load
        # noise, or by how its node's GPUs agree in this very bin: ``_even_in_bin``),
        # doing clearly less work than its peers at the same busy time: no colder
        # expert explains that (a GPU less busy than its peers is in another part of
        # the step, or waits)
        bar = even_load if places is None else np.fmin(even_load, _even_in_bin(cycles, places))
        behind = (cycles < -bar) & (x > -SLOWNESS_FLOOR)
        # the clock the power cap takes for more work: at most the work excess (power
        # grows no faster than the work rate, the clock at least linearly in power)
        capped = np.where(~fault & (y > 0), np.fmin(np.fmax(lower_clock, 0.0), y), 0.0)
        if on_budget is not None:  # ... or a power budget spent on fewer cycles
            capped = np.where(~fault & on_budget, np.fmax(capped, np.fmin(
                np.fmax(lower_clock, 0.0), GPU_OFFSET_CAP)), capped)
        capped = np.nan_to_num(capped, nan=0.0)
        # a clock above its peers' (log units, <= 0; no clock reading: 0)
        surplus = np.fmin(lower_clock, 0.0)
    compared = enough & (peer_busy >= phase_floor) & (busy > 0)
    if basis is None:  # no work signal: busy time alone
        slowness, load = x, np.full(x.shape, np.nan)
    else:
        # a clock above its peers' excuses no busy time: under the power cap a GPU
        # whose pipes stall draws less a cycle and the driver raises its clock, so
        # its work rate (tensor share x clock) rises and would hide part of the
        # stall. There slowness is busy cycles per unit of work, which the clock
        # cannot move (below its peers' clock it is busy time per unit, as above)
        slowness, load = per_work - capped - surplus, np.fmin(x, cycles)
        compared &= (peer_work > 0) & (work > 0)
    stats = np.stack([slowness, load, lower_clock, idle])
    valid = compared[None, :] & np.isfinite(stats)  # a zero reading: no ratio to take
    # slowness and a lower clock count as evidence only in a bin where the stream is
    # busier than its peers by more than the noise floor (what they learn, their
    # normal offset, comes from every bin: gating it would bias it by the busy
    # time's own noise)
    anyway = np.ones(x.shape, dtype=bool)
    # a node its host holds back is the one the others wait for: it never spins in
    # the collective, so per unit of work it keeps fewer SMs resident than its peers
    # (by the spin's channels/SM count times its idle share), and it draws less power
    # (idle, not spinning). Its idle time counts only in bins where the first is so,
    # and it is a finding only once the power deficit has passed its own test
    # ("quiet", below): a utilisation sampled over the last sixth of a second reads
    # low on a healthy node whose read instant falls in the job's gap, bin after bin
    # where its agent's tick keeps step with the job's, while its power, averaged
    # over the sample, stays level with its peers'. A sign test of the power each
    # bin is passed by chance often enough in an hour (six false host-bound nodes in
    # 5,168 GPU-hours): the deficit must accumulate, as the idle time does.
    with np.errstate(invalid="ignore"):
        held_back = ~(slowness >= 0)  # NaN (no work reading): not told apart
    gate = np.stack([(busier | behind) & ~memory_explained, anyway, busier, held_back])
    # the clock statistic goes to the test as read, its excuse beside it (docstring)
    excuse = np.zeros(stats.shape)
    excuse[STATS.index("clock")] = capped
    return _Readings(keys, busy, peer_busy, util[0], util[1], work, peer_work, clock, peer_clock,
                     np.where(valid, stats, np.nan), valid, gate, memory_ratio,
                     extra_processes, np.where(compared, quiet, np.nan), excuse)


def _peer_level(r: _Readings, cap: float, recenter: bool) -> PeerLevel:
    """The statistics as a level of the sequential test (their peers' level is 0 in
    log units; offsets are capped at ``cap``)."""
    return PeerLevel(r.keys, r.stats, r.valid, np.ones(r.stats.shape), cap, recenter=recenter,
                     gate=r.gate, excuse=r.excuse)


def _finding(view: WindowView, r: _Readings, node: str, gpu: str | None,
             devs: list[Departure], basis: str | None, job_gpus: int) -> Finding:
    """A straggler (slowness or a lower clock passed: slower; idle time passed: its
    host holds it back) or a load imbalance (load alone passed)."""
    i = r.keys.index(node if gpu is None else f"{node}/{gpu}")
    slow = [d for d in devs if d.metric in SLOW_STATS]
    idle = [d for d in devs if d.metric == "idle"]
    dev = (slow or idle or devs)[0]
    who = f"GPU {gpu} on {node}" if gpu is not None else f"Node {node}"
    peers = "the other GPUs of its node" if gpu is not None else "the job's other nodes"
    since = dev.first * view.bin_seconds
    busy, peer_busy = float(r.busy[i]), float(r.peer_busy[i])
    util, peer_util = float(r.util[i]), float(r.peer_util[i])
    work, peer_work = float(r.work[i]), float(r.peer_work[i])
    # the finding is told in this bin's readings only where they compare with the
    # peers' (the statistic that decided it is read this bin): a sum holds through a
    # bin without a reading, or one whose peers are in another part of the step
    # (their work near nothing), and that bin's numbers say nothing of its size
    if not any(r.valid[STATS.index(d.metric), i] for d in devs):
        return _unread_finding(node, gpu, who, peers, bool(slow or idle), since, basis,
                               job_gpus)
    work_ratio = work / peer_work if basis is not None and peer_work > 0 else math.nan
    clock, peer_clock = float(r.clock[i]), float(r.peer_clock[i])
    throttled = clock < peer_clock * (1 - CLOCK_SIGNATURE)
    work_text = (f"work rate ({_basis_text(basis)}) {work_ratio:.2f}× peers'"
                 if basis is not None else "no work counter to tell work from slowness")
    evidence: dict[str, Any] = {
        "peers": peers, "busy": round(busy, 4), "peer_busy": round(peer_busy, 4),
        "work_basis": basis or "none",
        "work_ratio": None if math.isnan(work_ratio) else round(work_ratio, 4),
        "sm_clock": None if math.isnan(clock) else round(clock, 1),
        "peer_sm_clock": None if math.isnan(peer_clock) else round(peer_clock, 1),
        "z": None if math.isnan(dev.z) else round(dev.z, 2),
        # the readings behind it, in the shape every straggler has carried
        "deviations": [{"metric": m, "value": _rounded(v), "peer_median": _rounded(p),
                        "z": None if math.isnan(dev.z) else round(dev.z, 2)}
                       for m, v, p in ((BUSY, busy, peer_busy),
                                       (basis, work, peer_work))
                       if m is not None],
    }
    extra = float(r.extra_processes[i])
    if slow:
        evidence["clock_signature"] = bool(throttled)
        evidence["remediable"] = bool(throttled or basis is not None)
        clock_text = (f", sm_clock {fmt(clock, 'MHz')} vs peers' {fmt(peer_clock, 'MHz')}"
                      if throttled else "")
        summary = (f"{who} is slower than {peers}: busy {fmt(busy, 'ratio')} vs peers' "
                   f"{fmt(peer_busy, 'ratio')} with {work_text}{clock_text}.")
    elif idle:  # no kernel while its peers keep one running: its host, not its silicon
        evidence.update(clock_signature=False, remediable=False, host_bound=True,
                        gpu_util=round(util, 4), peer_gpu_util=round(peer_util, 4))
        evidence["deviations"] = [{"metric": "gpu_util", "value": round(util, 4),
                                   "peer_median": round(peer_util, 4), "z": evidence["z"]}]
        summary = (f"{who} holds the job back from its host: its GPUs run no kernel "
                   f"{fmt(1 - util, 'ratio')} of the time (gpu_util {fmt(util, 'ratio')} vs "
                   f"{peers}' {fmt(peer_util, 'ratio')}, who wait for it in their "
                   f"collectives): input not fed in time (data loader, saturated CPU).")
    elif extra >= 1:  # load on a shared GPU (NaN, no process count: False)
        evidence.update(clock_signature=False, remediable=False, shared_gpu=True,
                        compute_processes_above_peers=int(extra))
        summary = (f"{who} is shared with another process ({int(extra)} more compute "
                   f"process{'es' if extra >= 2 else ''} than {peers}): the rank there "
                   f"waits for GPU time, and its counters carry the other's work (busy "
                   f"{fmt(busy, 'ratio')} vs {fmt(peer_busy, 'ratio')}, {work_text}).")
    if slow or idle or extra >= 1:
        metrics = ("gpu_util", BUSY) if idle and not slow else (BUSY, basis or BUSY)
        # idle time on a long step shows once a step: its finding outlasts the bins
        # between, or it would resolve and page again (``IDLE_RESOLVE_BINS``)
        return Finding("straggler", node, gpu, "warning", metrics, _score(dev),
                       summary, since, evidence, fire_after=1,
                       resolve_after=IDLE_RESOLVE_BINS if idle and not slow else None)
    share = work_ratio - 1.0
    memory_share = float(r.memory_ratio[i]) - 1.0
    # NaN (no DRAM reading): False; inf (peers that moved no bytes): no share to tell
    memory_work = math.isfinite(memory_share) and memory_share > share + LOAD_FLOOR
    evidence["share_above_peers"] = round(memory_share if memory_work else share, 4)
    evidence["share_basis"] = "dram_active" if memory_work else basis or "none"
    evidence.update(cost_fields(job_gpus, _load_cost(view, node, gpu, dev.first, busy - peer_busy),
                                "blamed"))
    what = (f"{memory_share:.0%} more memory-bound work (bytes moved, dram_active × "
            f"mem_clock, {memory_share + 1:.2f}× peers')" if memory_work
            else f"{share:.0%} more work")
    summary = (f"{who} carries {what} than {peers} (busy {fmt(busy, 'ratio')} vs "
               f"{fmt(peer_busy, 'ratio')}, {work_text}): workload, not a fault.")
    return Finding("load_imbalance", node, gpu, "info", (BUSY, basis or BUSY), _score(dev),
                   summary, since, evidence)


def _load_cost(view: WindowView, node: str, gpu: str | None, first: int,
               excess_now: float) -> float:
    """The job's slowdown from a load imbalance: its busy excess over its peers (the
    median over the bins since its load's sum began to rise, at most
    ``LOAD_COST_BINS`` of the newest: one bin's excess swings with what part of the
    step the window caught), costed by ``excess_slowdown``. ``excess_now``: the
    latest bin's, where the bins say nothing more."""
    metric = view.activity_metric()
    if metric is None:
        return excess_slowdown(excess_now, 0.0)
    cube = view.per_node(metric, last=int(min(LOAD_COST_BINS, max(1, view.bins[-1] - first + 1))))
    n = view.nodes.index(node)
    with np.errstate(invalid="ignore"):
        if gpu is None:  # the node's median GPU against the job's median node
            medians = nanmedian(cube, axis=1)
            excess = medians[n] - nanmedian(medians, axis=0)
        else:
            row = view.gpu_keys.index(f"{node}/{gpu}")
            excess = cube[n, view.positions()[1][row]] - nanmedian(cube[n], axis=0)
    if np.isnan(excess).all():
        return excess_slowdown(excess_now, 0.0)
    return excess_slowdown(float(nanmedian(excess, axis=0)), 0.0)


def _unread_finding(node: str, gpu: str | None, who: str, peers: str, slow: bool,
                    since: float, basis: str | None, job_gpus: int) -> Finding:
    """A stream whose sums passed the threshold in earlier bins but that has no
    reading in this one (a sample lost, an agent that polls less often than a bin),
    or none that compares with its peers' (they are in another part of the step):
    its evidence holds, but this bin says nothing of its size. It is reported with
    its readings and its cost unknown (null), never with an older bin's numbers as
    news; the incident's cost stays what the bins with readings gave, and such a
    finding keeps an incident open but never opens one (``detectors/incidents.py``)."""
    evidence: dict[str, Any] = {
        "peers": peers, "busy": None, "peer_busy": None, "work_basis": basis or "none",
        "work_ratio": None, "sm_clock": None, "peer_sm_clock": None, "z": None,
        "deviations": [], "unread": True}
    if slow:  # nothing read now to act on: never remediated from this finding
        evidence.update(clock_signature=False, remediable=False)
        summary = (f"{who} is slower than {peers} (no reading in the latest bin: the "
                   f"evidence of the bins before holds).")
        return Finding("straggler", node, gpu, "warning", (BUSY, basis or BUSY), 0.0,
                       summary, since, evidence, fire_after=1)
    evidence.update(share_above_peers=None, share_basis=basis or "none",
                    **cost_fields(job_gpus, None, "blamed"))
    summary = (f"{who} carries more work than {peers} (no reading in the latest bin: "
               f"the evidence of the bins before holds): workload, not a fault.")
    return Finding("load_imbalance", node, gpu, "info", (BUSY, basis or BUSY), 0.0, summary,
                   since, evidence)


def _basis_text(basis: str | None) -> str:
    clock = dict(WORK_SOURCES).get(basis or "")
    return f"{basis} × {clock}" if clock else str(basis)


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def _score(dev: Departure) -> float:
    return 0.0 if math.isnan(dev.z) else abs(dev.z)
