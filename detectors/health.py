"""GPU health and silent nodes, from per-sample state (not bin means).

- XID errors are classified (replace the GPU, reset it, the application's fault, or
  investigate) and fire on the sample that carries them.
- A rise of the volatile double-bit ECC counter fires on its sample too. The first
  count seen of a GPU is its baseline, not news: the counter holds every error since
  the driver loaded, so a count already there when a GPU joins a job, or when an agent
  or exporter starts, is history.
- Thermal / hardware slowdown clock-event reasons held for ``throttle_seconds``.
- A GPU that stops appearing in its node's samples while the node still reports.
- ``node_silent``: a node of the job stops reporting for ``silent_seconds`` while
  the job's other nodes go on (when every node stops, the job ended). A node that
  loses many of its messages on the way (a flaky network path) leaves gaps that
  could pass for silence: each node's cadence is learned on its own clock (its
  typical interval, and its ticks due against those that arrived, so its loss rate),
  and its silence threshold rises to the gap its own losses would reach by chance
  once in ten million samples (at most ``MAX_SILENT_TICKS`` ticks). A node's silence is
  judged only once its samples are on the job's clock (``detectors/clocks.py``): the
  first sample of a node whose clock is 30 s off, before its offset is known, says
  nothing about when it was taken. Nor is silence news while the path to the broker
  was down: after a sample that waited in its agent for a broker that was away
  (``detectors/delivery.py``), a node's silence counts only from when that sample
  got through (``resumed``), so the agents that reconnect a second later are not
  taken for silent ones.

Events stay open for ``hold_seconds`` after they were last seen, then resolve.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.detectors.findings import Finding

# XID → (action, severity, meaning). From NVIDIA's XID catalogue; unknown codes
# are "investigate".
XID_CLASSES: dict[int, tuple[str, str, str]] = {
    13: ("application", "info", "graphics engine exception, usually the application"),
    31: ("application", "info", "GPU memory page fault, usually the application"),
    43: ("application", "info", "GPU stopped processing, usually the application"),
    45: ("application", "info", "preemptive cleanup after an earlier fault"),
    48: ("replace", "critical", "double-bit ECC error"),
    61: ("reset", "warning", "internal micro-controller breakpoint"),
    62: ("reset", "critical", "internal micro-controller halt"),
    63: ("investigate", "warning", "ECC page retirement or row remapping recorded"),
    64: ("replace", "critical", "ECC page retirement or row remapping failed"),
    74: ("reset", "critical", "NVLink error"),
    79: ("replace", "critical", "GPU has fallen off the bus"),
    92: ("investigate", "warning", "high single-bit ECC error rate"),
    94: ("reset", "critical", "contained ECC error"),
    95: ("replace", "critical", "uncontained ECC error"),
    119: ("reset", "critical", "GSP RPC timeout"),
    120: ("reset", "critical", "GSP error"),
    140: ("replace", "critical", "unrecovered ECC error"),
}
ACTION_ADVICE = {"replace": "drain the node and replace the GPU", "reset": "reset the GPU",
                 "application": "check the application", "investigate": "investigate"}
# HW slowdown, SW thermal, HW thermal, HW power brake
SLOWDOWN_BITS = 0x8 | 0x20 | 0x40 | 0x80
FORGET_SECONDS = 3600.0
# one C call reads a GPU's three per-sample signals (KeyError: one is missing)
_SIGNALS = operator.itemgetter("xid", "ecc_dbe", "throttle")
# HBM row remapping (a GPU's memory going bad): metric → (severity, what it means,
# advice). Only a rise seen while watching is an event; the first value is a baseline.
REMAP_EVENTS: dict[str, tuple[str, str, str]] = {
    "row_remap_failure": ("critical", "a row remap failed", "replace"),
    "row_remap_pending": ("warning", "a row remap is pending", "reset the GPU when idle"),
    "remapped_rows_uncorrectable": ("warning", "rows remapped for uncorrectable errors rose",
                                    "reset the GPU when idle"),
}
CADENCE_GAP_CAP = 60.0  # a longer gap (a pause, a restart) teaches a node's cadence no more
MAX_SILENT_SECONDS = 120.0  # however lossy its path, a node this quiet is silent
# ticks a node's path may miss in a row before it counts as silent, at the least: a
# path losing 5 % of samples misses four in a row once in 160,000
SILENT_MISSES = 4
# the gap after m missed ticks is m + 1 intervals; half an interval more absorbs a
# read late by its jitter (up to a tenth of the tick either way) and an interval
# learned from the node's shortest gaps (a low quantile: 14 % short at that jitter).
# Without it, at 4.5 intervals, three missed ticks of a 30 s agent at 10 % jitter
# passed for silence (envelope fleet soak: 126 s, once an hour on a 4.5 % path)
TICK_MARGIN = 1.5
# ... and however lossy its path, silent after this many of its ticks: a path losing
# 40 % of them misses 16 in a row once in 2.3 million ticks (10, as before, was once in
# 9,500: a 13 s agent losing 40 % fell silent for 132 s within the hour)
MAX_SILENT_TICKS = 16
LOSS_MEMORY = 0.995  # the ticks and arrivals a node's loss is counted over decay so
# (about its last 200 ticks: a path that mends is trusted again within the hour)


@dataclass(frozen=True)
class HealthParams:
    """Timers of the health and silence checks (event-time seconds)."""

    throttle_seconds: float = 15.0
    missing_gpu_seconds: float = 10.0
    silent_seconds: float = 8.0
    hold_seconds: float = 300.0
    # a live node's path misses the ticks its silence threshold allows by chance this
    # rarely per sample (a fleet of 12,500 nodes at a 1 s tick sends 45 million
    # samples an hour: one in a million was 45 false silences an hour)
    silent_by_chance: float = 1e-7


def classify_xid(code: int) -> tuple[str, str, str]:
    """(action, severity, meaning) of an XID code."""
    return XID_CLASSES.get(code, ("investigate", "warning", "unclassified XID"))


class HealthMonitor:
    """Per-GPU and per-node health bookkeeping of one job; JSON-able state."""

    def __init__(self, p: HealthParams, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.p = p
        self.gpus: dict[str, dict[str, Any]] = state.get("gpus", {})
        self.nodes: dict[str, float] = state.get("nodes", {})
        # node → [typical interval (s; 0: not known), ticks due, arrivals, last time
        # on its own clock]: its gaps counted in its ticks, decayed by LOSS_MEMORY
        # (a state from before the counts holds [interval, mean gap])
        self.cadence: dict[str, list[float]] = state.get("cadence", {})
        # nodes heard from only before their clock offset was known: not judged
        self.unplaced: set[str] = set(state.get("unplaced", []))
        # when, on the job's clock, the latest sample that waited for a broker that
        # was away got through: no node's silence counts from before it
        self.resumed: float | None = state.get("resumed")

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for a table or a checkpoint."""
        state: dict[str, Any] = {"gpus": self.gpus, "nodes": self.nodes,
                                 "cadence": self.cadence, "unplaced": sorted(self.unplaced)}
        if self.resumed is not None:
            state["resumed"] = self.resumed
        return state

    def delivery_resumed(self, at: float) -> None:
        """A sample that waited for the broker got through at ``at`` (job's clock)."""
        self.resumed = at if self.resumed is None else max(self.resumed, at)

    def _heard_node(self, node: str, ts: float, placed: bool = True,
                    own_ts: float | None = None) -> None:
        """The node's last time (``ts``, on the job's clock), and its cadence, from
        the gaps between its samples on its own clock (``own_ts``, default ``ts``):
        a node's clock is steady against itself, while its placement on the job's
        clock moves as its offset is re-estimated (at a 10 s tick, placed gaps of
        4 and 16 s made a lossless node look as if it lost half its samples). The
        typical interval follows short gaps quickly and long ones slowly (a low
        quantile); each gap counts, in that interval, how many ticks were due and
        that one arrived, the counts decaying by ``LOSS_MEMORY``: the share of its
        samples that arrive. ``placed``: whether ``ts`` is on the job's clock; a
        node first heard before it is starts afresh with its first sample that is."""
        own = ts if own_ts is None else own_ts
        kept = self.cadence.get(node)
        if kept is None or len(kept) < 4:  # first heard (or a state from before counts)
            self.cadence[node] = [kept[0] if kept else 0.0, 0.0, 0.0, own]
        elif own > kept[3]:  # (an older, reordered sample makes no gap)
            interval, ticks, arrived, own_last = kept
            gap = min(own - own_last, CADENCE_GAP_CAP)
            interval = interval if interval > 0 else gap
            ticks = LOSS_MEMORY * ticks + max(1.0, round(gap / interval))
            arrived = LOSS_MEMORY * arrived + 1.0
            interval += (0.2 if gap < interval else 0.01) * (gap - interval)
            self.cadence[node] = [interval, ticks, arrived, own]
        if not placed:
            if node not in self.nodes:
                self.unplaced.add(node)
                self.nodes[node] = ts
            return
        if node in self.unplaced:
            self.unplaced.discard(node)
            self.nodes.pop(node, None)
        last = self.nodes.get(node)
        self.nodes[node] = max(ts, last if last is not None else ts)

    def silence_after(self, node: str) -> float:
        """Seconds without a sample after which ``node`` counts as silent: at least
        ``silent_seconds`` and ``SILENT_MISSES`` of its own ticks missed in a row (an
        agent may tick every 30 s, as dcgm-exporter's default scrape does), more
        where its path is seen to lose more samples (enough ticks in a row that its
        loss, as counted, misses them by chance once in ``1 / silent_by_chance``),
        each plus ``TICK_MARGIN`` intervals, at most
        ``MAX_SILENT_SECONDS`` or ``MAX_SILENT_TICKS`` of its ticks, whichever is
        longer. Its loss is the Bayesian mean of its counts under a uniform-ish prior
        (Jeffreys: half a loss in one tick), so a node heard a few times without loss
        is not taken for a lossless one. Its interval is at least the job's typical
        one (a node heard only once is given that), and while no node's interval is
        known, the silence is the longest."""
        return self._silence_after(node, self.typical_interval())

    def interval(self, node: str) -> float:
        """The node's typical interval on its own clock (0 while not known)."""
        kept = self.cadence.get(node)
        return kept[0] if kept else 0.0

    def typical_interval(self) -> float | None:
        """The job's agents' interval: the median of the nodes' known ones (None while
        none is known)."""
        known = sorted(c[0] for c in self.cadence.values() if c[0] > 0)
        return known[len(known) // 2] if known else None

    def _silence_after(self, node: str, typical: float | None) -> float:
        """``silence_after`` given the job's ``typical_interval`` (worked out once an
        evaluation: sorting every node's interval for each quiet node cost 70 ms a
        bin of a 16,384-node job with a node gone silent)."""
        if typical is None:
            return MAX_SILENT_SECONDS
        kept = self.cadence.get(node) or [0.0]
        interval = kept[0]
        ticks, arrived = (kept[1], kept[2]) if len(kept) == 4 else (0.0, 0.0)
        # a node's interval, learned from its shortest gaps, is at least the job's:
        # two samples close together (a retry, a reordered pair) do not shorten it
        interval = max(interval, typical)
        base = max(self.p.silent_seconds, (SILENT_MISSES + TICK_MARGIN) * interval)
        if interval <= 0:
            return base
        lost = min((ticks - arrived + 0.5) / (ticks + 1.0), 0.99)
        misses = math.log(self.p.silent_by_chance) / math.log(lost)
        by_chance = (misses + TICK_MARGIN) * interval
        return min(max(base, by_chance), max(MAX_SILENT_SECONDS, MAX_SILENT_TICKS * interval))

    def forget_node(self, node: str) -> None:
        """The node left the job: no silence or missing GPU is judged for it."""
        self.nodes.pop(node, None)
        self.cadence.pop(node, None)
        for key in [k for k in self.gpus if k.rsplit("/", 1)[0] == node]:
            del self.gpus[key]

    def heard(self, sample: Sample, alive_at: float | None = None, placed: bool = True,
              own_ts: float | None = None) -> None:
        """A sample too late for the window still says its node and GPUs are alive
        (a node whose clock just jumped back is not silent); nothing else of it is
        used. ``alive_at``: when it was taken, for the silence of the node and its
        GPUs (default: its time); ``placed``: whether that is on the job's clock;
        ``own_ts``: its time on its node's own clock (default: its time)."""
        node = sample["node"]
        alive = sample["ts"] if alive_at is None else alive_at
        self._heard_node(node, alive, placed, own_ts)
        for gpu in sample["gpus"]:
            g = self.gpus.get(f"{node}/{gpu}")
            if g is not None:
                g["last"] = max(alive, g["last"])

    def ingest(self, sample: Sample, alive_at: float | None = None, placed: bool = True,
               own_ts: float | None = None) -> list[Finding]:
        """Fold one sample in; return findings that must fire on this very sample.
        ``alive_at``: when it was taken, for the silence of the node and its GPUs
        (default: its time): both on one clock, or a GPU would look missing beside
        its own node; ``own_ts``: its time on its node's own clock (default: its
        time), for the node's cadence."""
        ts, node = sample["ts"], sample["node"]
        alive = ts if alive_at is None else alive_at
        self._heard_node(node, alive, placed, own_ts)
        out = []
        gpus = self.gpus
        for gpu, r in sample["gpus"].items():
            g = gpus.get(key := f"{node}/{gpu}")
            if g is None:
                g = gpus[key] = {"last": alive, "thr": None}
            elif alive > g["last"]:
                g["last"] = alive
            if not r.keys().isdisjoint(REMAP_EVENTS):  # rare: health states publish on change
                out.extend(self._remaps(node, gpu, g, r, ts))
            try:  # the usual reading: no XID, no throttling, the ECC count it had
                xid, dbe, throttle = _SIGNALS(r)
            except KeyError:
                pass
            else:
                if not xid and not throttle and g["thr"] is None and g.get("dbe") == dbe:
                    continue
            code = r.get("xid")
            if code:
                xid = int(code)
                action, severity, meaning = classify_xid(xid)
                g["event"] = {"ts": ts, "metric": "xid", "severity": severity,
                              "text": f"XID {xid} ({meaning}): {ACTION_ADVICE[action]}",
                              "xid": xid, "action": action}
                out.append(self._event_finding(node, gpu, g))
            dbe = r.get("ecc_dbe")
            if dbe is not None:
                # the first count seen of a GPU is its baseline: errors from before Vigil
                # watched it (volatile counts live until the driver reloads) are history
                if dbe > g.get("dbe", dbe) and not (g.get("event", {}).get("ts") == ts):
                    g["event"] = {"ts": ts, "metric": "ecc_dbe", "severity": "critical",
                                  "text": f"double-bit ECC errors rose to {dbe:.0f}: "
                                          f"{ACTION_ADVICE['replace']}", "action": "replace"}
                    out.append(self._event_finding(node, gpu, g))
                g["dbe"] = dbe
            throttle = r.get("throttle")
            if throttle is not None:
                bad = int(throttle) & SLOWDOWN_BITS
                if bad:
                    if g["thr"] is None:
                        g["thr"] = ts
                    g["thr_bits"] = bad
                elif g["thr"] is not None:  # it ended (a GPU never slowed writes nothing)
                    g["thr"] = None
                    g["thr_bits"] = 0
        return out

    def _remaps(self, node: str, gpu: str, g: dict[str, Any], r: dict[str, float],
                ts: float) -> list[Finding]:
        """Row-remap findings: a rise over the GPU's first value (its baseline)."""
        out = []
        base = g.setdefault("remap", {})
        for metric, (severity, meaning, advice) in REMAP_EVENTS.items():
            value = r.get(metric)
            if value is None:
                continue
            if value > base.get(metric, value):
                action = "replace" if advice == "replace" else "reset"
                text = ACTION_ADVICE["replace"] if advice == "replace" else advice
                g["event"] = {"ts": ts, "metric": metric, "severity": severity,
                              "text": f"{meaning} ({value:.0f}): {text}", "action": action}
                out.append(self._event_finding(node, gpu, g))
            base[metric] = value
        return out

    def _event_finding(self, node: str, gpu: str, g: dict[str, Any]) -> Finding:
        ev = g["event"]
        return Finding("gpu_health", node, gpu, ev["severity"], (ev["metric"],),
                       10.0 if ev["severity"] == "critical" else 5.0,
                       f"GPU {gpu} on {node}: {ev['text']}.", ev["ts"],
                       {k: v for k, v in ev.items() if k != "text"}, fire_after=1)

    def clock_faults(self) -> dict[str, int]:
        """``"node/gpu"`` → the fault bits (HW slowdown, thermal, power brake; not the
        power cap) of the GPUs whose latest clock-event reasons name one."""
        return {k: int(g.get("thr_bits") or 0) for k, g in self.gpus.items()
                if g["thr"] is not None}

    def forget_stale(self, now: float) -> None:
        """Forget what ``evaluate`` forgets at ``now``: GPUs and nodes unheard for
        ``FORGET_SECONDS`` (a stage-1 shard does so before it sends its nodes' state,
        ``detectors/shard.py``, or its next summary would bring back what stage 2
        forgot)."""
        for key in [k for k, g in self.gpus.items() if now - g["last"] > FORGET_SECONDS]:
            del self.gpus[key]
        self._forget_nodes(now)

    def _forget_nodes(self, now: float) -> None:
        for node in [n for n, t in self.nodes.items() if now - t > FORGET_SECONDS]:
            del self.nodes[node]
            self.cadence.pop(node, None)

    def evaluate(self, now: float) -> tuple[list[Finding], list[Finding]]:
        """(gpu_health, node_silent) findings at event time ``now``."""
        p = self.p
        # most GPUs have nothing to tell, nor are they to be forgotten: one pass picks
        # those that may be either, then only they are sorted and split
        quiet = min(p.missing_gpu_seconds, FORGET_SECONDS)
        maybe = []
        for key in [k for k, g in self.gpus.items() if now - g["last"] >= quiet
                    or g["thr"] is not None or "event" in g]:
            g = self.gpus[key]
            if now - g["last"] > FORGET_SECONDS:
                del self.gpus[key]
            elif (g.get("event") or g["thr"] is not None
                  or now - g["last"] >= p.missing_gpu_seconds):
                maybe.append(key)
        self._forget_nodes(now)
        health: list[Finding] = []
        for key in sorted(maybe):
            g = self.gpus[key]
            node, gpu = key.rsplit("/", 1)
            node_last = self.nodes.get(node, g["last"])
            ev = g.get("event")
            if ev and now - ev["ts"] <= p.hold_seconds:
                health.append(self._event_finding(node, gpu, g))
            elif g["thr"] is not None and now - g["thr"] >= p.throttle_seconds:
                health.append(Finding(
                    "gpu_health", node, gpu, "warning", ("throttle",), now - g["thr"],
                    f"GPU {gpu} on {node} has been slowed by thermal or hardware slowdown "
                    f"for {now - g['thr']:.0f}s (clock-event reasons {g['thr_bits']:#x}).",
                    g["thr"], {"throttle_bits": g["thr_bits"], "seconds": now - g["thr"]}))
            elif (now - g["last"] >= p.missing_gpu_seconds
                  and now - node_last < p.missing_gpu_seconds / 2):
                health.append(Finding(
                    "gpu_health", node, gpu, "critical", ("gpu_util",), now - g["last"],
                    f"GPU {gpu} on {node} stopped answering {now - g['last']:.0f}s ago while "
                    f"its node still reports: it may have fallen off the bus.", g["last"],
                    {"last_seen": g["last"]}, fire_after=1))
        silent: list[Finding] = []
        # a node heard from within the shortest silence any node can be given is not
        # silent: only the others are given their own (``silence_after``)
        shortest = min(p.silent_seconds, MAX_SILENT_SECONDS)
        quiet_nodes = [n for n, t in self.nodes.items()
                       if now - t >= shortest and n not in self.unplaced]
        typical = self.typical_interval() if quiet_nodes else None
        after = {n: self._silence_after(n, typical) for n in quiet_nodes}
        # a silence counts from when the path to the broker was last seen back up
        since = {n: max(self.nodes[n], self.resumed or -math.inf) for n in after}
        active = [n for n in self.nodes if n not in after or now - since[n] < after[n]]
        if active:
            for node in sorted(after):
                last = self.nodes[node]
                if now - since[node] >= after[node]:
                    silent.append(Finding(
                        "node_silent", node, None, "critical", (), now - last,
                        f"Node {node} has sent nothing for {now - last:.0f}s while "
                        f"{len(active)} other node(s) of the job still report.", last,
                        {"last_seen": last, "reporting_nodes": len(active)}, fire_after=1))
        return health, silent
