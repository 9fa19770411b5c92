"""One job's detection engine, driven in event time by the worker and by replay.

``ingest`` folds a sample into the job's window (window metrics the agent's adaptive
sampling skipped are held at their last published value, ``detectors/held.py``) and
health state and returns the detections that must fire on that very sample (XID, ECC).
``advance`` evaluates every bin the watermark (latest event time minus the grace period) has closed,
runs the window detectors and returns what the incident tracker decides to
publish. Samples for bins already evaluated are late: counted, not used. The whole
engine state is JSON-able so it can live in a Faust table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from vigil_gpu_monitor.contracts.codec import DETECTION_KINDS
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Detection, Sample, StepBatch
from vigil_gpu_monitor.detectors import (
    cost,
    hang,
    links,
    network,
    slowdown,
    step_merge,
    straggler,
    synchrony,
)
from vigil_gpu_monitor.detectors.clocks import ClockOffsets
from vigil_gpu_monitor.detectors.delivery import DeliveryWaits
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.grouping import group_by_node
from vigil_gpu_monitor.detectors.hang import HangParams, find_hang
from vigil_gpu_monitor.detectors.health import HealthMonitor, HealthParams
from vigil_gpu_monitor.detectors.held import HeldReadings
from vigil_gpu_monitor.detectors.incidents import IncidentTracker
from vigil_gpu_monitor.detectors.links import LinkParams, find_link_faults
from vigil_gpu_monitor.detectors.network import NetworkParams, find_network_bound
from vigil_gpu_monitor.detectors.sequential import Cusum
from vigil_gpu_monitor.detectors.step_window import StepWindow
from vigil_gpu_monitor.detectors.steps import StepDetector
from vigil_gpu_monitor.detectors.straggler import StragglerParams, find_stragglers
from vigil_gpu_monitor.detectors.window import (
    ALL_GPU_METRICS,
    ALL_NIC_METRICS,
    JobWindow,
    WindowView,
)

# Only what some window detector reads is windowed (in catalog order).
_DETECTORS = (cost, hang, links, network, slowdown, straggler, synchrony)
WINDOW_GPU = tuple(m for m in ALL_GPU_METRICS if any(m in d.GPU_READS for d in _DETECTORS))
WINDOW_NIC = tuple(m for m in ALL_NIC_METRICS if any(m in d.NIC_READS for d in _DETECTORS))
EVALUATED_KINDS = set(DETECTION_KINDS)  # every kind is re-evaluated at each step


class JobEngine:
    """Window + detectors + incident tracker of one job."""

    def __init__(self, job: str, cfg: DetectConfig, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.job = job
        self.cfg = cfg
        self.window = JobWindow(cfg.bin_seconds, state.get("window"), WINDOW_GPU, WINDOW_NIC)
        # held values are in the window's metric order: kept only with its window
        self.held = HeldReadings(cfg.held_seconds,
                                 state.get("held") if self.window.restored else None)
        self.tracker = IncidentTracker(job, cfg.fire_after, cfg.resolve_after,
                                       state.get("incidents"))
        self.health = HealthMonitor(HealthParams(cfg.throttle_seconds, cfg.missing_gpu_seconds,
                                                 cfg.silent_seconds, cfg.health_hold_seconds),
                                    state.get("health"))
        self.peer_memory: dict[str, Any] = state.get("peer_memory", {})
        self.cost_memory: dict[str, Any] = state.get("cost", {})
        self.slowdown_memory: dict[str, Any] = state.get("slowdown", {})
        self.sync_memory: dict[str, Any] = state.get("synchrony", {})
        self.sync_levels = synchrony.BinLevels()
        self.hang_memory: dict[str, Any] = state.get("hang", {})
        self.clocks = ClockOffsets(state.get("clocks"))
        self.delivery = DeliveryWaits(state.get("delivery"))
        self.max_ts: float | None = state.get("max_ts")
        self.next_bin: int | None = state.get("next_bin")
        self.late: int = state.get("late", 0)
        self.window_bins = max(1, math.ceil(cfg.window_seconds / cfg.bin_seconds))
        self.stragglers = StragglerParams(cfg.straggler_false_alarms_per_1000_days,
                                          cfg.bin_seconds)
        self.hang_params = HangParams(cfg.hang_seconds)
        self.link_params = LinkParams(cfg.link_z, errors_per_window=cfg.ib_errors_per_window)
        self.network_params = NetworkParams(cfg.network_link_share)
        # per-rank step timings (vigil.step/1), where the job sends them
        self.steps = StepWindow(cfg.bin_seconds, state.get("steps"))
        self.step_detector = StepDetector(
            Cusum.for_rate(cfg.straggler_false_alarms_per_1000_days, cfg.bin_seconds),
            state.get("step_memory", {}))

    def to_state(self) -> dict[str, Any]:
        """JSON-able state: window, health, open conditions, watermark bookkeeping."""
        return {"window": self.window.to_state(), "held": self.held.to_state(),
                "incidents": self.tracker.to_state(),
                "health": self.health.to_state(),
                "peer_memory": straggler.memory_state(self.peer_memory),
                "cost": self.cost_memory, "slowdown": self.slowdown_memory,
                "synchrony": self.sync_memory, "hang": self.hang_memory,
                "clocks": self.clocks.to_state(), "delivery": self.delivery.to_state(),
                "steps": self.steps.to_state(), "step_memory": self.step_detector.memory,
                "max_ts": self.max_ts, "next_bin": self.next_bin, "late": self.late}

    def ingest(self, sample: Sample, wait: float | None = None) -> list[Detection]:
        """Fold a validated sample in; returns detections firing on this sample.

        Its time is first put on the job's clock (``detectors/clocks.py``). A sample
        for a bin already evaluated is counted in ``late`` and only tells that its
        node is alive. ``wait``: how long it sat in its agent before it was sent (its
        Kafka record's time less its own; None where unknown): ``detectors/delivery.py``.
        """
        ts, immediate = self.fold(sample, wait)
        if not immediate:
            return []
        return self._with_job_size(self.tracker.update(ts, immediate, set()))

    def fold(self, sample: Sample, wait: float | None = None) -> tuple[float, list[Finding]]:
        """``ingest`` without the incident tracker: the per-node part a stage-1 shard
        runs (``detectors/shard.py``). Returns the sample's time on the job's clock
        and the health findings that fire on it (none for a late sample)."""
        raw_ts = sample["ts"]
        excess = self.delivery.excess(sample["node"], wait)
        # a sample that waited for the broker arrives out of its time: how far it is
        # from the job's clock then is its wait, not its node's clock offset
        held_up = excess if excess is not None and excess > self.cfg.grace_seconds else None
        sample, established = self.clocks.place(sample, learn=held_up is None,
                                                interval=self.health.interval(sample["node"]))
        alive_at = self.clocks.alive_at(sample["node"], raw_ts)
        if held_up is not None:
            self.health.delivery_resumed(alive_at + held_up)
        placed = self.clocks.on_job_clock(sample["node"], established)
        b = self.window.bin_of(sample["ts"])
        if self.next_bin is None or (self.max_ts is None and b < self.next_bin):
            self.next_bin = b  # until a node is established, nothing is late yet
        elif b < self.next_bin:
            self.late += 1
            self.health.heard(sample, alive_at, placed, raw_ts)
            return sample["ts"], []
        self.window.add(sample, self.held)
        said = synchrony.declared(sample.get("meta"))
        if said is not None:
            self.sync_memory["declared"] = said
        if established:
            self.max_ts = sample["ts"] if self.max_ts is None else max(self.max_ts,
                                                                       sample["ts"])
        return sample["ts"], self.health.ingest(sample, alive_at, placed, raw_ts)

    def ingest_steps(self, batch: StepBatch) -> None:
        """Fold a validated step batch in (``detectors/step_window.py``); steps of bins
        already evaluated are counted in ``late``. Timings alone move the watermark
        too: a job may be watched from its timings only (a replayed trace)."""
        opened = self.max_ts is not None and self.next_bin is not None
        _, late, latest = self.steps.add(batch, self.next_bin if opened else None)
        self.late += late
        if latest is None:
            return
        first = self.steps.first_bin()
        if first is not None and (self.next_bin is None or (not opened and first < self.next_bin)):
            self.next_bin = first
        self.max_ts = latest if self.max_ts is None else max(self.max_ts, latest)

    def node_left(self, node: str) -> None:
        """The node now reports under another job (or none): forget it here, so it is
        never taken for a silent node of this job."""
        self.health.forget_node(node)
        self.held.forget_node(node)
        self.delivery.forget(node)

    def advance(self) -> list[Detection]:
        """Evaluate every bin closed by the watermark; return detections to publish."""
        out: list[Detection] = []
        closed_any = False
        for b in self.close_bins(self.window.first_bin_from, self.window.seal):
            closed_any = True
            out.extend(self._evaluate(b))
        if closed_any:
            self.forget_old()
        return out

    def close_bins(self, first_bin_from: Callable[[int], int | None],
                   seal: Callable[[int], None]) -> Iterator[int]:
        """Every bin the watermark closed, in order: each is sealed (``seal``, no
        sample enters it any more) and then yielded, and ``next_bin`` moves past it.
        ``first_bin_from`` says which bin at or after a bin holds data (the empty
        bins of a long gap are skipped). One stage passes its own window's; the
        sharded job (``detectors/shard.py``) the union of its shards'."""
        if self.max_ts is None or self.next_bin is None:
            return
        closed = self.window.bin_of(self.max_ts - self.cfg.grace_seconds)  # first open bin
        self._skip_gap(closed, first_bin_from)
        while self.next_bin < closed:
            seal(self.next_bin)
            yield self.next_bin
            self.next_bin += 1
            self._skip_gap(closed, first_bin_from)  # data, a long gap (a clock far off), data

    def forget_old(self) -> None:
        """After bins closed: forget bins, steps and held values no evaluation reads
        again (bounded memory)."""
        if self.max_ts is None or self.next_bin is None:
            return
        self.window.drop_before(self.next_bin - self.window_bins)
        self.steps.drop_before(self.next_bin)
        self.held.forget_before(self.max_ts - self.cfg.held_seconds)

    def _skip_gap(self, closed: int,
                  first_bin_from: Callable[[int], int | None] | None = None) -> None:
        """Over a long gap, move ``next_bin`` past the empty bins to the window before
        ``closed``, but never past a bin that holds data: the straggler test is
        sequential and learns from every bin (a worker's first batch may hold minutes
        of them). Checked after each bin too: one sample from a clock years off must
        not make the engine walk every empty bin in between."""
        assert self.next_bin is not None
        if closed - self.next_bin > self.window_bins:
            skip_to = closed - self.window_bins
            first = (first_bin_from or self.window.first_bin_from)(self.next_bin)
            self.next_bin = skip_to if first is None else min(first, skip_to)

    def heat(self, metrics: tuple[str, ...]) -> dict[str, list[float | None]]:
        """``"node/gpu"`` → the last evaluated bin's mean of each metric (None: no
        reading): what the live view draws."""
        if self.next_bin is None:
            return {}
        means = self.window.means("g", self.next_bin - 1, metrics)
        return {f"{node}/{gpu}": [None if v is None else round(v, 4) for v in values]
                for (node, gpu), values in means.items()}

    def findings(self, last_bin: int) -> list[Finding]:
        """Every detector's findings for the window ending with ``last_bin``."""
        bins = range(last_bin - self.window_bins + 1, last_bin + 1)
        now = (last_bin + 1) * self.cfg.bin_seconds
        view = WindowView(self.window, bins)
        health, silent = self.health.evaluate(now)
        # barrier-based rules only where the job's GPUs (nodes) wait for each other
        sync = synchrony.judge(view, self.sync_memory, self.sync_levels)
        nodes_together = sync.nodes or (sync.gpus and len(view.nodes) == 1)
        hang.learn_levels(view, self.hang_memory)
        hung = find_hang(view, self.hang_params, self.hang_memory) if sync.gpus else []
        found = [*health, *silent, *hung, *find_link_faults(view, self.link_params),
                 *find_network_bound(view, self.network_params, bool(
                     self.tracker.conditions.get("network_bound||", {}).get("firing")))]
        clock_faults = self.health.clock_faults()
        if not hung and sync.gpus:  # a hung job's GPUs are idle together: none out of step
            found.extend(find_stragglers(view, self.stragglers, self.peer_memory, clock_faults,
                                         nodes_together,
                                         slowdown.stretched_since(self.slowdown_memory),
                                         self.health.typical_interval))
        found = group_by_node(found, clock_faults, view.gpus_per_node())
        if nodes_together:
            found.extend(slowdown.find_slowdown(view, found, self.slowdown_memory))
        cost.annotate(view, found, self.cost_memory, set(self.tracker.conditions))
        still_open = {k.split("|", 1)[0] for k, c in self.tracker.conditions.items()
                      if c.get("firing")}
        timings = self.step_detector.evaluate(self.steps, last_bin,
                                              step_merge.explains(found, still_open))
        return step_merge.merge(found, timings, lambda node, gpu: self.step_detector.rank_view(
            self.steps, node, gpu), bool(view.gpus))

    def _evaluate(self, last_bin: int) -> list[Detection]:
        now = (last_bin + 1) * self.cfg.bin_seconds
        out = self.tracker.update(now, self.findings(last_bin), EVALUATED_KINDS)
        return self._with_job_size(out)

    def _with_job_size(self, detections: list[Detection]) -> list[Detection]:
        """Add ``evidence.job_nodes`` (nodes heard from recently): remediation limits
        act on a share of the job."""
        if detections:
            size = len(self.health.nodes)
            for det in detections:
                det["evidence"].setdefault("job_nodes", size)
        return detections


class NodeMoves:
    """Which job each node last reported under. A node whose samples now come under
    another job, or under none, has left its old job: it is not that job's silent
    node. (The worker sees only its partitions' samples: a node that moves to a job
    another worker holds is seen leaving only when the two jobs share a worker.)"""

    def __init__(self) -> None:
        self.job_of: dict[str, str] = {}

    def left(self, sample: Sample) -> str | None:
        """The job this sample's node just left, if it changed jobs."""
        node, job = sample["node"], sample["job"]
        before = self.job_of.get(node)
        if before == job:
            return None
        self.job_of[node] = job
        return before or None


class ReplayRunner:
    """Drives one engine per job over samples in arrival order (as the worker does)."""

    def __init__(self, cfg: DetectConfig) -> None:
        self.cfg = cfg
        self.engines: dict[str, JobEngine] = {}
        self.moves = NodeMoves()

    def feed(self, sample: Sample) -> list[Detection]:
        """Ingest one validated sample and return any detections it triggers."""
        left = self.moves.left(sample)
        if left is not None and left in self.engines:
            self.engines[left].node_left(sample["node"])
        if not sample["job"]:
            return []
        engine = self.engines.get(sample["job"])
        if engine is None:
            engine = self.engines[sample["job"]] = JobEngine(sample["job"], self.cfg)
        return engine.ingest(sample) + engine.advance()

    def feed_steps(self, batch: StepBatch) -> list[Detection]:
        """Ingest one validated step batch and return any detections it triggers."""
        engine = self.engines.get(batch["job"])
        if engine is None:
            engine = self.engines[batch["job"]] = JobEngine(batch["job"], self.cfg)
        engine.ingest_steps(batch)
        return engine.advance()
