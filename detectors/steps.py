"""Detection from per-rank step timings: stragglers, stage imbalance, slowdown.

Rules, each evaluated per bin on the ranks' median step in the bin
(``detectors/step_window.py``):

- **Straggler.** A rank whose ``compute`` (time before it waited for its peers)
  exceeds its pipeline stage's median by more than ``MIN_EXCESS`` accumulates
  evidence in the same one-sided CUSUM as the counter straggler test
  (``detectors/sequential.py``), at the same false-alarm rate per stream: its
  departure ``(compute − median × (1 + MIN_EXCESS)) / scale`` in robust units of
  its peers' spread (MAD, floored at ``REL_FLOOR`` of the median: timings of
  identical ranks must not turn microseconds into evidence). Peers are the ranks of
  the same stage, so a stage given more layers is never a straggler. Sequence-length
  variation moves every rank of a step together and cancels in the comparison.
  When half or more of a node's ranks are over the threshold, the node is the
  straggler (its host, its clocks or its network), else each GPU is.
- **Stage imbalance.** A stage whose median compute exceeds the median of the other
  stages' by ``STAGE_FLOOR`` or more in the job's first ``EARLY_BINS`` bins with
  timings, and still does by about as much, is ``load_imbalance`` (partitioning,
  not hardware: info).
- **Slowdown.** The job's step (the median rank's wall time) against its healthy
  level (the median of its last ``HISTORY_BINS`` levels outside an inflation, so
  the slow level never becomes the norm): a mean over ``RECENT_BINS`` longer by
  ``MIN_INFLATION`` plus ``NOISE_Z`` times its own noise, for ``SUSTAIN_BINS`` bins,
  with no straggler to blame, is a job-level ``slowdown``.

**Cost** (``cost_basis: steps``) is measured, not inferred: a straggler's cost is
the what-if of the step without it (its compute beyond the slowest other rank's,
off the measured step: ``excess / (wall − excess)``); a slowdown's is its measured
inflation; a stage's, its compute beyond the next-slowest stage's.

Assumptions: the job trains synchronously (every rank's step ends at the barrier);
``compute`` measures the same span on every rank. Without ``compute`` (a log's
step time only) only the slowdown rule applies. Timings cannot tell more work from
a slower GPU (a hot MoE expert from a stall): ``detectors/step_merge.py`` lets the
counters decide that where both speak.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from vigil_gpu_monitor.detectors.cost import cost_fields
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.robust import MAD_TO_SIGMA, Array, nanmedian
from vigil_gpu_monitor.detectors.sequential import Cusum
from vigil_gpu_monitor.detectors.step_window import StepWindow

MIN_EXCESS = 0.05  # a rank this much slower than its stage's median is a straggler
REL_FLOOR = 0.02  # the peers' spread is never taken below this share of their median
MIN_PEERS = 3  # ranks a stage needs with timings in a bin to compare them
NODE_SHARE = 0.5  # this share of a node's ranks slow: the node is the straggler
STAGE_FLOOR = 0.08  # a stage this much longer than the others: imbalanced
EARLY_BINS = 6  # bins from the job's first timings that say how it was partitioned
STAGE_TOLERANCE = 0.05  # ... and how far a steady stage may move from that since
HISTORY_BINS = 120  # the job's healthy step levels kept (10 min at 5 s bins)
MIN_HISTORY_BINS = 12  # ... before a slowdown can be judged
RECENT_BINS = 12  # the current level: the mean of this many bins' steps
MIN_INFLATION = 0.05  # steps this much longer than healthy ...
NOISE_Z = 3.0  # ... plus this many noise units of the recent mean
SUSTAIN_BINS = 6  # ... for this many bins in a row
SOURCE = "timings"


def _robust_scale(values: Array, median: float) -> float:
    mad = float(nanmedian(np.abs(values - median), axis=0)) * MAD_TO_SIGMA
    return max(mad, REL_FLOOR * abs(median), 1e-9)


def _what_if(steps: dict[int, tuple[float, dict[str, float]]], slow: set[str],
             pace: set[str]) -> float | None:
    """The slowdown the ``slow`` ranks cause: over the bin's steps, the time each step
    would have saved had they computed no longer than the slowest of the ``pace``
    ranks (each step's own), over the time the steps would have taken."""
    saved = spent = 0.0
    for wall, computes in steps.values():
        mine = [computes[k] for k in slow if k in computes]
        rest = [computes[k] for k in pace if k in computes]
        if not mine or not rest:
            continue
        excess = min(max(0.0, max(mine) - max(rest)), wall)
        saved += excess
        spent += wall - excess
    return saved / spent if spent > 0 else None


class StepDetector:
    """The three rules over one job's step window; ``memory`` is JSON-able."""

    def __init__(self, cusum: Cusum, memory: dict[str, Any]) -> None:
        self.cusum = cusum
        self.memory = memory

    def evaluate(self, window: StepWindow, b: int, explained: bool = False) -> list[Finding]:
        """Findings for bin ``b`` (a bin with no step holds the evidence as it was).
        ``explained``: another finding of the job (the counters') explains a slowdown
        now; the slowdown is then reported only as that finding's measured cost."""
        rows = window.medians(b)
        now = (b + 1) * window.bin_seconds
        mem = self.memory
        sums: dict[str, float] = mem.setdefault("sums", {})
        since: dict[str, float] = mem.setdefault("since", {})
        last: dict[str, list[float]] = mem.setdefault("last", {})  # key → compute, peers
        stages: dict[int, list[str]] = {}
        for key in rows:
            stages.setdefault(int(window.ranks[key]["stage"]), []).append(key)
        stage_median: dict[int, float] = {}
        for stage, keys in stages.items():
            compute = np.array([rows[k][0] for k in keys], dtype=np.float64)
            valid = ~np.isnan(compute)
            if valid.sum() == 0:
                continue
            median = float(nanmedian(compute, axis=0))
            stage_median[stage] = median
            if valid.sum() < MIN_PEERS:
                continue
            z = (compute - median * (1 + MIN_EXCESS)) / _robust_scale(compute, median)
            old = np.array([sums.get(k, 0.0) for k in keys])
            new = self.cusum.step(old, z)
            for k, zk, total in zip(keys, z, new, strict=True):
                if math.isnan(zk):
                    continue
                if total > 0 and sums.get(k, 0.0) == 0:
                    since[k] = b * window.bin_seconds
                if total <= 0:
                    since.pop(k, None)
                sums[k] = float(total)
                last[k] = [float(rows[k][0]), median]
        wall = float(statistics.median(w for _, w in rows.values())) if rows else math.nan
        if math.isfinite(wall):
            mem["wall"] = wall
        flagged = [k for k, s in sums.items() if s >= self.cusum.h and k in window.ranks]
        found = self._stragglers(window, b, flagged, mem.get("wall", math.nan))
        found.extend(self._stage_imbalance(window, b, stage_median, now))
        slow = self._slowdown(wall, b, window.bin_seconds, bool(flagged), explained)
        found.extend(slow)
        for f in found:  # what each costs the whole job: one GPU a rank
            ev = f.evidence
            ev.update(cost_fields(len(window.ranks), ev["job_slowdown"], ev["cost_basis"]))
        return found

    def _stragglers(self, window: StepWindow, b: int, flagged: list[str],
                    wall: float) -> list[Finding]:
        if not flagged:
            return []
        last, sums = self.memory["last"], self.memory["sums"]
        by_node: dict[str, list[str]] = {}
        for k in flagged:
            by_node.setdefault(window.ranks[k]["node"], []).append(k)
        groups: list[tuple[str, list[str], bool, set[str]]] = []
        for node, keys in sorted(by_node.items()):
            mine = [k for k, r in window.ranks.items() if r["node"] == node]
            # a node whose ranks gather evidence together is one fault, even before
            # half of them are over the threshold: one incident from its first bin
            rising = {k for k in mine if sums.get(k, 0.0) > 0}
            whole = len(mine) > 1 and len(rising) >= NODE_SHARE * len(mine)
            if whole:
                groups.append((node, keys, True, rising | set(keys)))
            else:
                groups.extend((node, [k], False, {k}) for k in keys)
        slow = set().union(*(g[3] for g in groups))
        # the pace without them: every rank neither slow nor above its peers by the margin
        pace = {k for k, v in last.items() if k not in slow and v[1] > 0
                and v[0] <= v[1] * (1 + MIN_EXCESS)}
        steps = window.by_step(b)
        return [self._straggler(window, node, keys, whole, _what_if(steps, group, pace), wall)
                for node, keys, whole, group in groups]

    def _straggler(self, window: StepWindow, node: str, keys: list[str], whole_node: bool,
                   slowdown: float | None, wall: float) -> Finding:
        last, sums, since = self.memory["last"], self.memory["sums"], self.memory["since"]
        worst = max(keys, key=lambda k: last[k][0] / last[k][1] if last[k][1] else 0.0)
        compute, peers = last[worst]
        share = compute / peers - 1 if peers else math.nan
        info = window.ranks[worst]
        gpu = None if whole_node else info["gpu"]
        costs: dict[str, float] = self.memory.setdefault("costs", {})
        key = f"straggler|{node}|{gpu or ''}"
        if slowdown is None:  # no step of theirs ended in this bin: the last estimate
            slowdown = costs.get(key)
        else:
            costs[key] = slowdown
        evidence: dict[str, Any] = {
            "source": SOURCE, "compute": round(compute, 5), "peer_compute": round(peers, 5),
            "share_above_peers": round(share, 4), "stage": info["stage"],
            "ranks": sorted(window.ranks[k]["rank"] for k in keys
                            if window.ranks[k]["rank"] is not None),
            "step": round(wall, 5) if math.isfinite(wall) else None,
            "evidence_ratio": round(max(sums[k] for k in keys) / self.cusum.h, 3),
            **cost_fields(len(window.ranks), slowdown, "steps" if slowdown is not None
                          else "none")}
        who = f"{node}" if gpu is None else f"{node} GPU {gpu}"
        what = f"{len(keys)} of its ranks" if gpu is None else f"rank {info['rank']}"
        summary = (f"{who} holds the job back: {what} compute{'s' if gpu else ''} "
                   f"{share:.0%} longer than {'their' if gpu is None else 'its'} stage's "
                   f"median ({compute * 1000:.0f} ms vs {peers * 1000:.0f} ms a step, "
                   f"measured step times).")
        start = min(since.get(k, math.inf) for k in keys)
        return Finding("straggler", node, gpu, "warning", ("step_compute",),
                       float(max(sums[k] for k in keys)), summary,
                       start if math.isfinite(start) else 0.0, evidence, fire_after=1)

    def rank_view(self, window: StepWindow, node: str, gpu: str | None
                  ) -> dict[str, Any] | None:
        """What the timings say of a place (one GPU's rank, or a node's ranks: their
        median) as of their last bin with compute: its compute against its stage's
        median, how far its evidence has come to the threshold, and the last measured
        cost of a straggler there (``job_slowdown``, None if never one); None where no
        rank there sent compute times."""
        last: dict[str, list[float]] = self.memory.get("last", {})
        sums: dict[str, float] = self.memory.get("sums", {})
        keys = [k for k, r in window.ranks.items() if r["node"] == node and k in last
                and (gpu is None or r["gpu"] == gpu)]
        if not keys:
            return None
        shares = [last[k][0] / last[k][1] - 1 for k in keys if last[k][1] > 0]
        if not shares:
            return None
        share = statistics.median(shares)
        cost = self.memory.get("costs", {}).get(f"straggler|{node}|{gpu or ''}")
        return {"share_above_peers": round(share, 4), "slower": share > MIN_EXCESS,
                "evidence_ratio": round(max(sums.get(k, 0.0) for k in keys) / self.cusum.h, 3),
                "job_slowdown": cost}

    def _stage_imbalance(self, window: StepWindow, b: int, medians: dict[int, float],
                         now: float) -> list[Finding]:
        if len(medians) < 2:
            return []
        excess: dict[int, float] = {}
        for stage, m in medians.items():
            rest = statistics.median(v for s, v in medians.items() if s != stage)
            excess[stage] = m / rest - 1 if rest > 0 else 0.0
        early: dict[str, list[float]] = self.memory.setdefault("stage_early", {})
        started = float(self.memory.setdefault("stage_since", now))
        if max((len(v) for v in early.values()), default=0) < EARLY_BINS:
            for stage, e in excess.items():
                early.setdefault(str(stage), []).append(e)
            return []
        worst = max(excess, key=lambda s: excess[s])
        first = statistics.median(early.get(str(worst), [0.0]))
        if first < STAGE_FLOOR or abs(excess[worst] - first) > max(STAGE_TOLERANCE,
                                                                     0.5 * first):
            return []
        stage_of = {k: int(r["stage"]) for k, r in window.ranks.items()}
        slowdown = _what_if(window.by_step(b), {k for k, s in stage_of.items() if s == worst},
                            {k for k, s in stage_of.items() if s != worst})
        evidence = {"source": SOURCE, "stage": worst,
                    "share_above_peers": round(excess[worst], 4), "share_basis": "step_compute",
                    "stages": {str(s): round(e, 4) for s, e in sorted(excess.items())},
                    **cost_fields(0, slowdown, "steps" if slowdown is not None else "none")}
        summary = (f"Pipeline stage {worst} computes {excess[worst]:.0%} longer than the "
                   f"other stages, as it has since the job began: partitioning (more layers "
                   f"or heavier ones on that stage), not hardware.")
        return [Finding("load_imbalance", None, None, "info", ("step_compute",),
                        excess[worst], summary, started, evidence)]

    def _slowdown(self, wall: float, b: int, bin_seconds: float, by_straggler: bool,
                  by_other: bool) -> list[Finding]:
        """A bin's step level joins the healthy history only once it leaves the recent
        mean, and only while no inflation is open: a slowdown's first bins are judged
        before they can become the norm."""
        mem = self.memory
        recent: list[float] = mem.setdefault("recent", [])
        history: list[float] = mem.setdefault("history", [])
        if math.isfinite(wall):
            if len(recent) >= RECENT_BINS:
                leaving = recent.pop(0)
                if "run" not in mem:
                    history.append(leaving)
                    del history[:-HISTORY_BINS]
            recent.append(wall)
        if len(history) < MIN_HISTORY_BINS or not recent:
            mem["inflation"] = None
            return []
        healthy = statistics.median(history)
        level = statistics.fmean(recent)
        spread = statistics.median(abs(h - healthy) for h in history) * MAD_TO_SIGMA
        bar = MIN_INFLATION + NOISE_Z * spread / math.sqrt(len(recent)) / healthy
        inflation = level / healthy - 1
        mem["inflation"] = inflation if inflation > bar else None
        run = mem.get("run")
        if inflation <= bar:
            # a run ends once a whole recent window is calm: a dip of a bin or two
            # must not let the slow level into the healthy history
            if run is not None:
                run["calm"] = run.get("calm", 0) + 1
                if run["calm"] >= RECENT_BINS:
                    del mem["run"]
            return []
        if run is None:
            run = mem["run"] = {"since": b * bin_seconds, "bins": 0, "explained": False}
        run["bins"] += 1
        run["calm"] = 0
        # a run another finding explained at any time is that finding's, to its end:
        # a straggler's carries its own cost; another's (the counters') gets this one
        run["explained"] = run["explained"] or by_straggler
        run["other"] = run.get("other", False) or by_other
        if run["bins"] < SUSTAIN_BINS or run["explained"]:
            return []
        evidence = {"source": SOURCE, "healthy_step": round(healthy, 5),
                    "step": round(level, 5), "explained": run["other"],
                    **cost_fields(0, inflation, "steps")}
        summary = (f"The job's steps take {inflation:.0%} longer than its healthy level "
                   f"({level * 1000:.0f} ms vs {healthy * 1000:.0f} ms, measured step "
                   f"times), with no rank to blame.")
        return [Finding("slowdown", None, None, "warning", ("step_wall",), inflation, summary,
                        float(run["since"]), evidence, fire_after=1)]
