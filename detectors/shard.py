"""One job's detection in two stages: stage 1 per shard of its nodes, stage 2 per job
(issue #46, docs/sharding.md).

The seam is the sealed node bin. Stage 1 (``ShardEngine``, keyed by job and shard)
runs the one-stage engine's ingest unchanged (``JobEngine.fold``: clock placement,
held readings, the open bins, per-sample health) for its nodes, seals a bin when
told, and sends a ``vigil.summary/2`` (``contracts/summary.py``): each node's bin
means, each node's health bookkeeping, and the health findings that fired on its
samples. Stage 2 (``JobStage2``, keyed by job) assembles the shards' rows of a bin
into exactly the sealed bin one stage holds, takes the union of the shards' health
state, and runs the one-stage evaluation unchanged (``JobEngine._evaluate``: every
window detector, silence, the incident tracker, cost).

Two inputs of stage 1 are job-wide (docs/sharding.md): the job's clock (each node's
offset is against the median clock of all the job's nodes) and the job's watermark
(which bins are closed, which samples late). Stage 2 owns them and feeds them back:
here, in one process, by sharing the clock and handing the watermark to a shard
before each sample (``follow``), so the shards decide what one stage decides;
across Kafka, by the job-clock message a round trip later (``vigil.jobclock/1``:
``JobStage2.jobclock_due`` writes it, ``ShardEngine.take_jobclock`` reads it,
``detectors/jobclock.py``).

What differs from one stage, by design: a health finding that fires on a sample
carries ``evidence.job_nodes`` as stage 2 last counted the job's nodes (at the last
bin), where one stage counts them at that sample.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain, compress
from operator import itemgetter
from typing import Any

import numpy as np

from vigil_gpu_monitor.contracts import SUMMARY_SCHEMA
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import (
    Detection,
    JobClock,
    NodeHealth,
    NodeRows,
    Sample,
    StepBatch,
    Summary,
    SummaryEvent,
)
from vigil_gpu_monitor.contracts.shards import SHARD_SEPARATOR, shard_of
from vigil_gpu_monitor.contracts.summary import rows_from_state, rows_to_state
from vigil_gpu_monitor.detectors.clocks import ClockOffsets
from vigil_gpu_monitor.detectors.engine import JobEngine, NodeMoves
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.health import HealthMonitor
from vigil_gpu_monitor.detectors.jobclock import FedClockOffsets, JobClockKeeper, node_clocks
from vigil_gpu_monitor.detectors.window import Entity, SealedSection

Deliver = Callable[[Summary], Summary]  # a summary as stage 2 receives it


def event_of(ts: float, f: Finding) -> SummaryEvent:
    """A finding that fired on a sample at ``ts`` (job clock), as a summary carries it."""
    return {"ts": ts, "kind": f.kind, "node": f.node, "gpu": f.gpu, "severity": f.severity,
            "metrics": list(f.metrics), "score": f.score, "summary": f.summary,
            "since": f.since, "evidence": f.evidence, "fire_after": f.fire_after}


def finding_of(ev: SummaryEvent) -> Finding:
    """The finding a summary's event carries."""
    return Finding(ev["kind"], ev["node"], ev["gpu"], ev["severity"], tuple(ev["metrics"]),
                   ev["score"], ev["summary"], ev["since"], ev["evidence"], ev["fire_after"])


def node_health(health: HealthMonitor) -> dict[str, NodeHealth]:
    """A health monitor's state now, node by node (the summary's ``health``)."""
    out: dict[str, NodeHealth] = {}
    for node, last in health.nodes.items():
        out[node] = {"last": last, "cadence": health.cadence.get(node),
                     "unplaced": node in health.unplaced, "gpus": {}}
    for key, g in health.gpus.items():
        node, gpu = key.rsplit("/", 1)
        mine = out.get(node)
        if mine is None:
            mine = out[node] = {"last": None, "cadence": health.cadence.get(node),
                                "unplaced": node in health.unplaced, "gpus": {}}
        # a copy: the monitor changes a GPU's state in place as samples come, and a
        # summary must say what it was when its bin sealed (``remap`` is changed in
        # place too; an ``event`` is replaced whole)
        mine["gpus"][gpu] = {**g, "remap": dict(g["remap"])} if "remap" in g else dict(g)
    return out


class ShardEngine:
    """Stage 1: one shard's nodes of a job. Its ``engine`` is the one-stage engine,
    of which it runs the ingest and the seal, never the detectors."""

    def __init__(self, job: str, shard: int, shards: int, cfg: DetectConfig,
                 state: dict[str, Any] | None = None) -> None:
        # ``job``: the samples key it is kept under (the job id, or ``job#k/K``)
        self.job = job if shards <= 1 else f"{job}{SHARD_SEPARATOR}{shard}/{shards}"
        self.shard, self.shards = shard, shards
        self.engine = JobEngine(job, cfg, state)
        self.engine.clocks = FedClockOffsets((state or {}).get("clocks"))
        self.cfg = cfg

    def to_state(self) -> dict[str, Any]:
        """JSON-able state (the engine's: window, held, health, clocks, watermark)."""
        return self.engine.to_state()

    def take_jobclock(self, message: JobClock, watermark: bool = False) -> None:
        """The job's clock from stage 2 (``vigil.jobclock/1``): samples are placed with
        it from the next vote on. With ``watermark``, the job's watermark too: bins it
        closed are sealed by the next ``seal_closed``, what comes for them is late. Only
        for a shard that has gone quiet (its nodes all silent, nothing else would seal
        its bins): a shard behind, a restarted worker with a backlog, must not take a
        watermark its own samples have not reached, or its backlog would all be late."""
        clocks = self.engine.clocks
        if message["shards"] != self.shards:
            return
        if isinstance(clocks, FedClockOffsets):
            clocks.take(message["clock"], message["reference"], message["voters"],
                        message["at"], message["bin"])
        if watermark:
            self.follow(message["max_ts"], message["next_bin"])

    def follow(self, max_ts: float | None, next_bin: int | None) -> None:
        """The job's watermark, fed back by stage 2: samples of bins the job has
        closed are late here too, and bins the job closed are sealed."""
        e = self.engine
        if max_ts is not None:
            e.max_ts = max_ts if e.max_ts is None else max(e.max_ts, max_ts)
        if next_bin is not None and e.max_ts is not None:
            e.next_bin = next_bin if e.next_bin is None else max(e.next_bin, next_bin)

    def ingest(self, sample: Sample, wait: float | None = None) -> list[Summary]:
        """Fold one validated sample of this shard's nodes in; a summary of only events
        when health findings fired on it (sent at once: an XID does not wait for its
        bin to close). ``wait``: as ``JobEngine.ingest``'s."""
        ts, found = self.engine.fold(sample, wait)
        if not found:
            return []
        return [self._summary(None, [event_of(ts, f) for f in found], health=False)]

    def seal(self, b: int) -> Summary:
        """Seal bin ``b`` and summarise it: each node's means and every node's health
        state (what one stage's evaluation of ``b`` would read of these nodes)."""
        e = self.engine
        e.window.seal(b)
        e.health.forget_stale((b + 1) * self.cfg.bin_seconds)
        if self.shards > 1 and isinstance(e.clocks, FedClockOffsets):
            e.clocks.remember(b, e.max_ts)
        summary = self._summary(b, [], health=True)
        e.window.drop_before(b)  # the summary has it; the last bin shares device lists
        return summary

    def seal_closed(self) -> list[Summary]:
        """Summaries of every bin this shard's own watermark closed (with the job's
        fed back by ``follow``): how a shard runs without a shared watermark."""
        e = self.engine
        out = [self.seal(b) for b in e.close_bins(e.window.first_bin_from, lambda b: None)]
        if out:
            e.forget_old()
        return out

    def node_left(self, node: str) -> None:
        """The node now reports under another job: forget it here."""
        self.engine.node_left(node)

    def _summary(self, b: int | None, events: list[SummaryEvent], health: bool) -> Summary:
        e = self.engine
        nodes: dict[str, NodeRows] = {}
        sealed = e.window.sealed.get(str(b)) if b is not None else None
        if sealed is not None:
            rows: dict[str, dict[str, list[Any]]] = {}
            for section in ("g", "n"):
                part = sealed[section]
                for i, (node, dev) in enumerate(part.devices):
                    mine = rows.setdefault(node, {"g": [], "n": [], "gi": [], "ni": []})
                    mine[section].append(dev)
                    mine[section + "i"].append(i)
            for node, mine in rows.items():
                nodes[node] = {
                    "gpus": mine["g"], "nics": mine["n"],
                    "gpu_means": _raw(sealed["g"].means, mine["gi"]),
                    "nic_means": _raw(sealed["n"].means, mine["ni"])}
        following = e.window.first_bin_from(b + 1) if b is not None else None
        summary: Summary = {"schema": SUMMARY_SCHEMA, "job": e.job, "shard": self.shard,
                "shards": self.shards, "bin": b, "next_bin": e.next_bin, "part": 0, "parts": 1,
                "bin_seconds": self.cfg.bin_seconds, "max_ts": e.max_ts,
                "next_data_bin": following, "late": e.late,
                "declared": e.sync_memory.get("declared"),
                "gpu_metrics": list(e.window.gpu_metrics),
                "nic_metrics": list(e.window.nic_metrics),
                "nodes": nodes, "health": node_health(e.health) if health else {},
                "events": events}
        if health and isinstance(e.clocks, FedClockOffsets):
            summary["clocks"] = node_clocks(e.clocks)
        if health and e.health.resumed is not None:
            summary["resumed"] = e.health.resumed
        return summary


def _raw(means: np.ndarray[Any, Any], rows: list[int]) -> bytes:
    """The rows' means as ``vigil.summary/2`` carries them: little-endian float64."""
    if not rows:
        return b""
    first, last = rows[0], rows[-1]
    block = means[first:last + 1] if last - first + 1 == len(rows) else means[rows]
    return np.ascontiguousarray(block, dtype="<f8").tobytes()


def _without_none(keys: list[str], values: list[Any]) -> dict[str, Any]:
    """``keys`` → ``values``, leaving out the keys whose value is None."""
    if None not in values:
        return dict(zip(keys, values, strict=True))
    return {k: v for k, v in zip(keys, values, strict=True) if v is not None}


class JobStage2:
    """Stage 2: a job's evaluation over its shards' summaries. Its ``engine`` is the
    one-stage engine whose window holds only sealed bins, assembled from summaries,
    and whose health monitor holds the union of the shards' nodes."""

    def __init__(self, job: str, shards: int, cfg: DetectConfig,
                 state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.job, self.shards, self.cfg = job, shards, cfg
        self.engine = JobEngine(job, cfg, state.get("engine"))
        # bin → shard → the nodes' rows received (parts merged); parts still missing
        self.bins: dict[int, dict[int, dict[str, NodeRows]]] = {
            int(b): {int(k): rows_from_state(v) for k, v in shards_.items()}
            for b, shards_ in state.get("bins", {}).items()}
        self.parts_seen: dict[str, list[int]] = state.get("parts_seen", {})  # "bin/shard"
        self.newest: dict[str, float] = state.get("newest", {})  # shard → its max_ts
        self.node_state: dict[str, NodeHealth] = state.get("node_state", {})
        self.owner: dict[str, int] = state.get("owner", {})  # node → its shard
        self.late: dict[str, int] = state.get("late", {})  # shard → its late samples
        self.done: dict[str, int] = state.get("done", {})  # shard → last bin summarised
        # bin → shard → its nodes' health as it sealed that bin (what one stage's
        # evaluation of the bin reads of them)
        self.health_at: dict[str, dict[str, dict[str, NodeHealth]]] = state.get(
            "health_at", {})
        # bin → the latest time a shard's samples were seen to get through after
        # waiting for the broker, as of that bin (``detectors/delivery.py``)
        self.resumed_at: dict[str, float] = state.get("resumed_at", {})
        # [the bin before whose evaluation it applies (null: at once), event]
        self.events: list[list[Any]] = state.get("events", [])
        self.clock = JobClockKeeper(shards, state.get("clock"))
        # [next bin, watermark's bin] of the last job clock sent (None: none yet)
        self.clock_sent: list[int | None] | None = state.get("clock_sent")
        # derived, not kept: each shard's nodes (``owner`` inverted), and per section
        # the last assembled bin's section and each node's device entities, so a bin
        # of the same devices shares them rather than building 131,072 tuples and a
        # set of them again (a bin of 16,384 nodes: issue #46)
        self._shard_nodes: dict[int, set[str]] = {}
        for node, k in self.owner.items():
            self._shard_nodes.setdefault(k, set()).add(node)
        self._last: dict[str, SealedSection] = {}
        self._node_devices: dict[str, dict[str, tuple[list[str], list[Entity]]]] = {}
        # section → the last bin's nodes, each node's devices, and its device list
        self._bin_devices: dict[str, tuple[list[str], list[list[str]], list[Entity]]] = {}
        # the nodes, their GPUs and the ``"node/gpu"`` keys of the last health view,
        # as the health monitor keys them (formatting 131,072 keys a bin was 5 % of
        # a bin's evaluation)
        self._gpu_keys: tuple[list[str], list[tuple[str, ...]], list[str]] | None = None

    def to_state(self) -> dict[str, Any]:
        """JSON-able state: the engine's, and the summaries not yet evaluated."""
        return {"engine": self.engine.to_state(),
                "bins": {str(b): {str(k): rows_to_state(v) for k, v in s.items()}
                         for b, s in self.bins.items()},
                "parts_seen": self.parts_seen, "newest": self.newest,
                "node_state": self.node_state,
                "owner": self.owner, "late": self.late, "done": self.done,
                "health_at": self.health_at, "resumed_at": self.resumed_at,
                "events": self.events,
                "clock": self.clock.to_state(), "clock_sent": self.clock_sent}

    def jobclock_due(self) -> JobClock | None:
        """The job's clock and watermark for its stage-1 shards (``vigil.jobclock/1``),
        when a bin was evaluated or the watermark moved a bin since the last one sent;
        None otherwise, and always for a job of one shard (its shard has the whole job)."""
        if self.shards <= 1:
            return None
        e = self.engine
        max_ts = max(self.newest.values(), default=None)
        now = [e.next_bin, None if max_ts is None else e.window.bin_of(max_ts)]
        if now == self.clock_sent or (max_ts is None and e.next_bin is None):
            return None
        self.clock_sent = now
        return self.clock.message(self.job, self.cfg.bin_seconds, e.next_bin, max_ts)

    def receive(self, summary: Summary) -> list[Detection]:
        """Take one validated summary part in: its events go through the incident
        tracker at once (as one stage does at their sample); its rows and health wait
        for the bin's evaluation. ``ContractError`` for a summary of another job or
        window layout (nothing of it is used)."""
        e = self.engine
        if summary["job"] != self.job or summary["shards"] != self.shards:
            raise ContractError("bad_summary", f"summary of {summary['job']} in "
                                f"{summary['shards']} shards sent to {self.job} in "
                                f"{self.shards}")
        if (summary["gpu_metrics"] != list(e.window.gpu_metrics)
                or summary["nic_metrics"] != list(e.window.nic_metrics)
                or summary["bin_seconds"] != self.cfg.bin_seconds):
            raise ContractError("bad_summary", "summary metrics or bin differ from stage 2's "
                                "(stages of two versions or configurations)")
        shard = summary["shard"]
        self.late[str(shard)] = max(self.late.get(str(shard), 0), summary["late"])
        e.late = sum(self.late.values())
        if summary["declared"] is not None:
            e.sync_memory["declared"] = summary["declared"]
        # an event applies where one stage applied it: after the bins its shard had
        # sealed when its sample came, before the next one
        self.events.extend([summary["next_bin"], ev] for ev in summary["events"])
        out = self._release(e.next_bin)
        b = summary["bin"]
        if b is None:
            return out
        if summary["max_ts"] is not None:
            self.newest[str(shard)] = max(self.newest.get(str(shard), summary["max_ts"]),
                                          summary["max_ts"])
        done = self.done.get(str(shard))
        if (done is not None and b <= done) or (e.next_bin is not None and b < e.next_bin):
            return out  # sent again after a stage-1 restart: already taken
        key = f"{b}/{shard}"
        seen = self.parts_seen.setdefault(key, [])
        if summary["part"] in seen:
            return out
        seen.append(summary["part"])
        clocks = summary.get("clocks")
        if clocks is not None:
            self.clock.take(shard, b, clocks, summary["max_ts"])
        self.bins.setdefault(b, {}).setdefault(shard, {}).update(summary["nodes"])
        self.health_at.setdefault(str(b), {}).setdefault(str(shard), {}).update(
            summary["health"])
        resumed = summary.get("resumed")
        if resumed is not None:
            self.resumed_at[str(b)] = max(resumed, self.resumed_at.get(str(b), resumed))
        if len(seen) == summary["parts"]:
            del self.parts_seen[key]
            self.done[str(shard)] = b
        return out

    def _release(self, upto: int | None) -> list[Detection]:
        """Send the events due before bin ``upto`` is evaluated through the tracker,
        in the order they came (None: none is due yet, stage 2 has not started)."""
        if upto is None or not self.events:
            return []
        e = self.engine
        out: list[Detection] = []
        keep = []
        for tag, ev in self.events:
            if tag is None or tag <= upto:
                out.extend(e._with_job_size(e.tracker.update(ev["ts"], [finding_of(ev)],
                                                             set())))
            else:
                keep.append([tag, ev])
        self.events = keep
        return out

    def evaluate_ready(self) -> list[Detection]:
        """Evaluate, in order, every bin all shards have summarised (each shard's
        summaries come in its order: a bin it skipped, after a long gap, is empty
        there). How stage 2 runs over Kafka, where the shards seal by their own
        watermarks. Every shard is waited for, always: one behind (a backlog, a
        stage-1 worker restarting) is not a silent one. A shard with no node never
        reports, and stalls its job: ``K = ceil(nodes / shard_nodes)`` with
        ``shard_nodes`` >= 16 leaves one empty about once in 65,000 jobs of 17 nodes
        (the job-clock feedback, not built, would let stage 1 seal it)."""
        e = self.engine
        if len(self.done) < self.shards:
            return []  # a shard not heard from yet (a backlog may hold it back)
        closed = min(self.done.values()) + 1
        if e.next_bin is None:
            e.next_bin = min(self.bins, default=closed)
        e.max_ts = max(self.newest.values(), default=None)

        def first_bin_from(b: int) -> int | None:
            return min((k for k, v in self.bins.items() if k >= b and any(v.values())),
                       default=None)

        out: list[Detection] = []
        e._skip_gap(closed, first_bin_from)
        evaluated = False
        while e.next_bin < closed:
            out.extend(self.evaluate(e.next_bin))
            e.next_bin += 1
            evaluated = True
            e._skip_gap(closed, first_bin_from)
        if evaluated:
            self.forget_old()
        return out + self._release(e.next_bin)

    def _take_health(self, shard: int, fresh: dict[str, NodeHealth]) -> None:
        """A shard's whole health state as it sealed a bin: it replaces what stage 2
        held of that shard's nodes."""
        before = self._shard_nodes.get(shard)
        if before:
            for node in before.difference(fresh):
                if self.owner.get(node) == shard:  # not since taken by another shard
                    del self.owner[node]
                    self.node_state.pop(node, None)
        self._shard_nodes[shard] = set(fresh)
        owner, node_state = self.owner, self.node_state
        for node, state in fresh.items():
            moved = owner.get(node)
            if moved is not None and moved != shard:
                self._shard_nodes.get(moved, set()).discard(node)
            owner[node] = shard
            node_state[node] = state

    def complete(self, b: int) -> bool:
        """Whether every shard has summarised bin ``b`` (or a later one)."""
        return all(self.done.get(str(k), b - 1) >= b for k in range(self.shards))

    def evaluate(self, b: int) -> list[Detection]:
        """Evaluate bin ``b`` as one stage does: its assembled sealed bin in the
        window, the shards' health state in the health monitor."""
        e = self.engine
        out = self._release(b)
        for at in sorted((k for k in self.health_at if int(k) <= b), key=int):
            for shard, fresh in self.health_at.pop(at).items():
                self._take_health(int(shard), fresh)
        h = e.health
        for at in [k for k in self.resumed_at if int(k) <= b]:
            h.delivery_resumed(self.resumed_at.pop(at))
        self._assemble(b)
        self.clock.settle(b)
        h.gpus = self._health_gpus()
        # each a pass in C over the nodes (a dict's comprehension a bin cost 30 ms
        # at 16,384 nodes)
        nodes, states = list(self.node_state), self.node_state.values()
        h.nodes = _without_none(nodes, list(map(itemgetter("last"), states)))
        h.cadence = _without_none(nodes, list(map(itemgetter("cadence"), states)))
        h.unplaced = set(compress(nodes, map(itemgetter("unplaced"), states)))
        return out + e._evaluate(b)

    def _health_gpus(self) -> dict[str, Any]:
        """``"node/gpu"`` → each GPU's health state, in the nodes' and their GPUs'
        order (the health monitor's view of the union of the shards). The keys are
        kept while the nodes and their GPUs stay the same, and the dict is built in
        C: a Python step a node cost 50 ms a bin of 16,384 nodes."""
        per_node = list(map(itemgetter("gpus"), self.node_state.values()))
        nodes, names = list(self.node_state), list(map(tuple, per_node))
        known = self._gpu_keys
        if known is None or known[0] != nodes or known[1] != names:
            known = self._gpu_keys = (nodes, names, [
                f"{node}/{gpu}" for node, listed in zip(nodes, names, strict=True)
                for gpu in listed])
        return dict(zip(known[2], chain.from_iterable(map(dict.values, per_node)),
                        strict=True))

    def _assemble(self, b: int) -> None:
        """Bin ``b``'s shards' rows as the one-stage sealed bin: devices sorted by node
        and device (each node's rows come sorted), means stacked in that order. A bin
        of the previous bin's devices shares its device list and set, as sealing
        shares them."""
        received = self.bins.pop(b, {})
        rows = {node: r for part in received.values() for node, r in part.items()}
        if not rows:
            return
        order = sorted(rows)
        in_order: list[Any] = list(map(rows.__getitem__, order))
        w = self.engine.window
        sealed: dict[str, SealedSection] = {}
        for section, names, means_key, width in (
                ("g", "gpus", "gpu_means", len(w.gpu_metrics)),
                ("n", "nics", "nic_means", len(w.nic_metrics))):
            listed = list(map(itemgetter(names), in_order))
            last = self._bin_devices.get(section)
            if last is not None and last[0] == order and last[1] == listed:
                devices = last[2]  # the usual bin: the previous bin's nodes and devices
            else:
                devices = self._devices_of(section, order, listed)
                self._bin_devices[section] = (order, listed, devices)
            # one buffer for the whole bin, joined in C: a numpy array a node cost a
            # third of a step (each node's bytes were checked on decode: its devices x
            # metrics; a node without devices adds none)
            raw = b"".join(map(itemgetter(means_key), in_order))
            means = np.frombuffer(raw, dtype="<f8").astype(np.float64).reshape(
                len(devices), width)
            before = self._last.get(section)
            if before is not None and before.devices == devices:
                part = SealedSection(before.devices, means, before.device_set())
            else:
                part = SealedSection(devices, means)
            self._last[section] = sealed[section] = part
        w.sealed[str(b)] = sealed

    def _devices_of(self, section: str, order: list[str], listed: list[list[str]]
                    ) -> list[Entity]:
        """The bin's (node, device) list, ``order``'s nodes with ``listed``'s devices;
        a node listing the devices it listed last time keeps its entities (shared
        objects compare by identity)."""
        known = self._node_devices.get(section, {})
        fresh: dict[str, tuple[list[str], list[Entity]]] = {}
        devices: list[Entity] = []
        for node, devs in zip(order, listed, strict=True):
            if devs:
                mine = known.get(node)
                if mine is None or mine[0] != devs:
                    mine = (devs, [(node, d) for d in devs])
                fresh[node] = mine
                devices += mine[1]
        self._node_devices[section] = fresh  # only this bin's nodes: bounded
        return devices

    def forget_old(self) -> None:
        """After bins were evaluated: what one stage forgets then."""
        self.engine.forget_old()
        first = self.engine.next_bin
        if first is not None:
            for b in [b for b in self.bins if b < first]:
                del self.bins[b]


class ShardedJob:
    """A job's two stages in one process, the watermark and clock fed back at once:
    ``vigil replay --shards K`` and the equality tests. ``deliver`` is what a summary
    goes through on its way (default: as is; the tests encode and decode it)."""

    def __init__(self, job: str, shards: int, cfg: DetectConfig,
                 deliver: Deliver | None = None) -> None:
        self.stage2 = JobStage2(job, shards, cfg)
        self.shards = [ShardEngine(job, k, shards, cfg) for k in range(shards)]
        self.deliver = deliver or (lambda s: s)
        clock = ClockOffsets()
        for shard in self.shards:  # one clock for the job: the feedback, without delay
            shard.engine.clocks = clock
        self.summaries = 0

    def _send(self, summary: Summary) -> list[Detection]:
        self.summaries += 1
        return self.stage2.receive(self.deliver(summary))

    def feed(self, sample: Sample, wait: float | None = None) -> list[Detection]:
        """One validated sample of this job: its shard ingests it, then every bin the
        job's watermark closed is sealed by every shard and evaluated by stage 2.
        ``wait``: as ``JobEngine.ingest``'s."""
        job = self.stage2.engine
        shard = self.shards[shard_of(sample["node"], len(self.shards))]
        e = shard.engine
        e.max_ts, e.next_bin = job.max_ts, job.next_bin
        summaries = shard.ingest(sample, wait)
        job.max_ts, job.next_bin = e.max_ts, e.next_bin
        out: list[Detection] = []
        for summary in summaries:
            out.extend(self._send(summary))
        return out + self._advance()

    def feed_steps(self, batch: StepBatch) -> list[Detection]:
        """A step batch goes to stage 2 (keyed by job), as it moves the watermark too."""
        self.stage2.engine.ingest_steps(batch)
        return self._advance()

    def node_left(self, node: str) -> None:
        """The node left the job: its shard forgets it (stage 2 with its next bin)."""
        self.shards[shard_of(node, len(self.shards))].node_left(node)

    @property
    def late(self) -> int:
        """Late samples over the job's shards (as ``JobEngine.late``)."""
        return sum(s.engine.late for s in self.shards)

    def _advance(self) -> list[Detection]:
        job = self.stage2.engine
        out: list[Detection] = []

        def first_bin_from(b: int) -> int | None:
            found = [f for s in self.shards
                     if (f := s.engine.window.first_bin_from(b)) is not None]
            return min(found, default=None)

        def seal(b: int) -> None:
            for shard in self.shards:
                out.extend(self._send(shard.seal(b)))

        closed_any = False
        for b in job.close_bins(first_bin_from, seal):
            closed_any = True
            out.extend(self.stage2.evaluate(b))
        if closed_any:
            for shard in self.shards:
                shard.engine.max_ts, shard.engine.next_bin = job.max_ts, job.next_bin
                shard.engine.forget_old()
            self.stage2.forget_old()
        return out


class ShardedReplayRunner:
    """``ReplayRunner`` with every job split into ``shards`` stage-1 shards and a
    stage 2 (``ShardedJob``): what it publishes must equal the one-stage runner's."""

    def __init__(self, cfg: DetectConfig, shards: int, deliver: Deliver | None = None) -> None:
        self.cfg, self.shards, self.deliver = cfg, shards, deliver
        self.jobs: dict[str, ShardedJob] = {}
        self.moves = NodeMoves()

    def _job(self, job: str) -> ShardedJob:
        found = self.jobs.get(job)
        if found is None:
            found = self.jobs[job] = ShardedJob(job, self.shards, self.cfg, self.deliver)
        return found

    def feed(self, sample: Sample) -> list[Detection]:
        """Ingest one validated sample and return any detections it triggers."""
        left = self.moves.left(sample)
        if left is not None and left in self.jobs:
            self.jobs[left].node_left(sample["node"])
        if not sample["job"]:
            return []
        return self._job(sample["job"]).feed(sample)

    def feed_steps(self, batch: StepBatch) -> list[Detection]:
        """Ingest one validated step batch and return any detections it triggers."""
        return self._job(batch["job"]).feed_steps(batch)

    def late(self) -> int:
        """Late samples over every job's shards."""
        return sum(j.late for j in self.jobs.values())
