"""A job that slowed down with nobody to blame: the job-level ``slowdown`` finding.

Some faults slow a whole job without making any GPU busier than its peers. A node
whose host cannot feed its GPUs (a data loader, a saturated CPU) leaves them idle,
with no kernel, at the start of every step, while every other GPU of the job waits
for them in the collective: nobody computes longer, so no straggler test can fire,
yet every step is longer. The cost estimate's counters still see it (see
``detectors/cost.py``): a healthy GPU's tensor duty cycle falls by ``T0 / T`` when
the step stretches from ``T0`` to ``T``.

**How a slowdown is told from normal variation.** The job's level (the mean over
the last ``RECENT_BINS`` of the median node's median duty cycle: a minute, so a
reading that beats with a long step averages out) is compared with its own
healthy level: the upper quartile of its levels over the last ten minutes
(``HISTORY_BINS``), frozen while an inflation is open so a slow level never
becomes the norm (for up to ``MAX_RUN_BINS``: a job that changed its batch size
has a new normal); so is the mean of its last ``SHORT_BINS`` (15 s), each
against its own noise (below). A pause (checkpoint, evaluation: the duty cycle below
``PHASE_FLOOR`` of it, or NVLink traffic below ``TRAFFIC_FLOOR`` of its own, as
no gradients flow, over a whole step) is skipped, not counted. It holds a finding
already open, opens none, and ends a run that had not opened. An inflation must
exceed ``MIN_INFLATION`` plus ``NOISE_Z`` times the noise of the mean it is read
from (the job's own bin-to-bin spread over the root of the mean's bins): near
nothing for short steps, which a bin averages many times over, so their 15 s mean
sees a data loader within seconds; more for 30 s steps, of which a minute holds
two, cut wherever the bins fall, and whose 15 s mean rarely clears its noise.
(A lower bar while a node's GPUs idle, 5 %, found the 15 % loaders but raised a
slowdown on a healthy 30 s-step MoE job after an evaluation in the fleet soak,
whose edges leave a few low bins in the minute's mean: it was taken out.) Only an
inflation that lasts, while no other finding of the job explains it (a straggler, a link or
network fault, a hang, a throttled GPU, load imbalance), is a finding: for
``SUSTAIN_BINS`` in a row when a node stands out as its cause (below), for
``LONE_SUSTAIN_BINS`` when none does. A whole-job phase (an evaluation pass, say)
lowers the duty cycle of every node alike and ends within a minute or two; what
a single node's host does shows on that node alone.

**Candidates.** The finding names what the counters point at, strongest first: a
node whose GPUs idle with no kernel (``gpu_util`` below the job's by
``IDLE_MARGIN``) while their peers wait in collectives; a node whose GPUs are
slower to start than the rest. The data-loader node is named as the first.

Where a job has nodes enough to compare one with its peers, the straggler test
names such a node sooner (its idle time is a statistic of the node test: a
host-bound straggler node, which then explains the slowdown); this finding is for
what that cannot see: a job of two nodes, a node idle from the job's first bin, a
slowdown spread over every node.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from vigil_gpu_monitor.detectors.cost import PHASE_FLOOR, cost_fields, job_duty_metric
from vigil_gpu_monitor.detectors.findings import Finding, fmt
from vigil_gpu_monitor.detectors.robust import nanmedian, quantile
from vigil_gpu_monitor.detectors.window import WindowView

GPU_READS = ("tensor_active", "sm_active", "gpu_util", "nvlink_tx")
NIC_READS: tuple[str, ...] = ()
MIN_INFLATION = 0.10  # steps this much longer than healthy ...
NOISE_Z = 3.0  # ... plus this many of the job's own spreads of its minute levels
EDGE_SHARE = 0.1  # the largest bin-to-bin differences left out of that spread
SUSTAIN_BINS = 4  # for this many bins in a row (20 s at 5 s bins) with a suspect node
LONE_SUSTAIN_BINS = 24  # ... or this many (2 min) with none: longer than a pause lasts
RECENT_BINS = 12  # the current level is the mean of these (1 min: a long step or two) ...
SHORT_BINS = 3  # ... or of these (15 s), held to the larger noise of a shorter mean
HISTORY_BINS = 120  # the job's levels kept (10 min at 5 s bins) ...
HEALTHY_QUANTILE = 0.75  # ... whose upper quartile is its healthy level ...
MIN_HISTORY_BINS = 12  # ... once it has this many
MAX_RUN_BINS = 360  # after 30 min a slower level is the job's new normal
TRAFFIC_FLOOR = 0.5  # NVLink traffic below this share of healthy: a pause, not steps
TRAFFIC_BINS = 6  # ... averaged over this many bins (30 s: a whole step, up to 30 s long)
IDLE_MARGIN = 0.05  # a node's GPUs this much less utilised than the job's: idle
# steps this much longer than healthy, plus the same noise margin, corroborate a
# node's idle time (``stretched_since``); alone they make no finding
STRETCH_FLOOR = 0.05
# after a pause a mean witnesses a stretch only once this many bins more than it
# holds have passed: none of the pause's edges is in it then (the bins either side
# of a checkpoint read low, and a node whose GPUs enter and leave it a second late
# idles there too: envelope seed 219)
SETTLE_EXTRA_BINS = 2
# the stretch witness's bar: STRETCH_FLOOR plus this many spreads of its past means
# (it corroborates a node's idle time; alone it finds nothing)
WITNESS_Z = 2.0
MIN_PAST_MEANS = 12  # means of the past a stretch witness needs (``_past_means``)
RUN_KEYS = ("since", "run", "baseline")  # an inflation's run, in the job's memory
EXPLAINING = frozenset({"straggler", "link_health", "network_bound", "hang",
                        "load_imbalance", "node_silent"})


def find_slowdown(view: WindowView, others: list[Finding],
                  memory: dict[str, Any]) -> list[Finding]:
    """The job-level slowdown finding for the view's latest bin, if any. ``others``:
    the job's other findings this bin; ``memory``: the job's recent levels, the
    baseline of an open run and its length (persisted with the engine)."""
    if not view.gpus:
        return []
    metric = job_duty_metric(view.gpu, memory)
    if metric is None:  # the job's first bins: its counter is not chosen yet
        return []
    per_node = nanmedian(view.per_node(metric, last=1), axis=1)  # nodes × 1
    level = float(nanmedian(per_node[:, 0], axis=0)) if not np.isnan(per_node).all() else None
    history_now: list[float] = memory.get("history", [])
    reference = memory.get("baseline") or (max(history_now) if history_now else None)
    quiet = level is None or _quiet_fabric(view, memory)
    low = reference is not None and level is not None and level < PHASE_FLOOR * reference
    _witness(view.bins[-1], memory, None if quiet else level, low)
    if level is None or quiet or low:
        # a pause (checkpoint, evaluation: the gradients stop flowing, or the duty
        # cycle falls below the floor) is neither evidence nor a new level; it holds
        # a finding already open but opens none
        if not memory.get("open"):
            for key in RUN_KEYS:  # a run that has not opened ends
                memory.pop(key, None)
            return []
        return _open(view, memory, float(reference or 0.0), float(level or 0.0))
    bins: list[float] = memory.setdefault("bins", [])
    bins.append(round(level, 5))
    del bins[:-HISTORY_BINS]
    recent = bins[-RECENT_BINS:]
    if len(recent) < RECENT_BINS // 2:
        return []
    now = statistics.fmean(recent)
    history: list[float] = memory.setdefault("history", [])
    healthy = memory.get("baseline")
    if healthy is None:
        if len(history) < MIN_HISTORY_BINS:
            healthy = None
        else:
            healthy = quantile(history, HEALTHY_QUANTILE)
    margins = _margins(bins, healthy) if healthy is not None else []
    explained = any(f.kind in EXPLAINING or (f.kind == "gpu_health" and f.metrics ==
                                              ("throttle",)) for f in others)
    inflation = healthy / now - 1.0 if healthy is not None and now > 0 else 0.0
    within_noise = healthy is None or not _inflated(margins, MIN_INFLATION)
    if within_noise or explained or int(memory.get("run", 0)) >= MAX_RUN_BINS:
        for key in (*RUN_KEYS, "open"):
            memory.pop(key, None)
        history.append(round(now, 5))
        del history[:-HISTORY_BINS]
        return []
    assert healthy is not None  # an inflation needs a healthy level
    memory["baseline"] = healthy
    memory.setdefault("since", view.bin_start(0, 1))
    memory["run"] = run = int(memory.get("run", 0)) + 1
    # the cost: the bins since the run began only (the minute's mean that opened it
    # still holds bins from before the onset, and reads low)
    since_run = statistics.fmean(recent[-min(run, len(recent)):])
    memory["inflation"] = healthy / since_run - 1.0 if since_run > 0 else inflation
    return _open(view, memory, float(healthy), now)


def _open(view: WindowView, memory: dict[str, Any], healthy: float, now: float
          ) -> list[Finding]:
    """The finding while a run is long enough (held through pauses)."""
    run = int(memory.get("run", 0))
    if run < SUSTAIN_BINS:
        return []
    candidates = _candidates(view)
    if not candidates and run < LONE_SUSTAIN_BINS and not memory.get("open"):
        return []
    memory["open"] = True
    inflation = float(memory["inflation"])
    names = ", ".join(c["node"] for c in candidates[:3])
    pointer = (f"; the evidence points at {names} (its GPUs idle with no kernel while "
               f"their peers wait)" if candidates else "; no node stands out")
    summary = (f"Job steps take {inflation:.0%} longer than its own healthy level and no "
               f"GPU is to blame{pointer}.")
    evidence: dict[str, Any] = {"healthy_level": round(healthy, 4), "level": round(now, 4),
                                "metric": memory["metric"], "candidates": candidates,
                                **cost_fields(len(view.gpus), inflation, "baseline")}
    return [Finding("slowdown", None, None, "warning", (str(memory["metric"]), "gpu_util"),
                    inflation, summary, float(memory["since"]), evidence, fire_after=1)]


def stretched_since(memory: dict[str, Any]) -> int | None:
    """The bin since which the job's steps have been stretched (``_witness``), as of
    the last evaluated bin, outside a pause (None: they are not). Too small an
    inflation to be a finding by itself (a 25 % data loader on one node of a job
    whose steps spend a fifth in the collective stretches them by 10 %, inside the
    slowdown's own noise on many jobs); it corroborates a node's idle time in the
    straggler test (``find_stragglers``)."""
    since = memory.get("stretch_since")
    return int(since) if since is not None else None


def _witness(at: int, memory: dict[str, Any], level: float | None, low: bool) -> None:
    """Whether the job's steps are stretched as of bin ``at`` (``stretch_since``), on
    a level series of its own (``memory["witness"]``): the slowdown's series skips
    every bin below the phase floor as a pause, and on a step longer than a bin
    that skips the very bins a stretch shows in. A 10 s step read in 5 s bins puts
    the collective and the wait in one bin of two or three; where a node's host
    holds the job back that bin read 0.00-0.10 of the healthy 0.45 (envelope seed
    213), and the mean of the bins kept stayed level while the job lost 15-17 %.
    So here a single low bin is held until the next says what it was: another low
    one, a pause (both are skipped, and a mean that still holds a bin of the pause's
    edges witnesses nothing: the bins either side of a checkpoint read low); a
    higher one, a step (both are kept). ``level``: this bin's (None: a pause, the
    fabric quiet or no reading); ``low``: below the slowdown's phase floor, whose
    reference stays the slowdown's own (kept out of its series, a long step's
    collective bins do not lower it: where they did, an evaluation's 0.13 a bin
    against the healthy 0.45 read as steps 142 % longer on a 10 s-step MoE job of
    the fleet soak).

    Stretched: the mean of the last ``SHORT_BINS`` or of the last ``RECENT_BINS``
    below the job's healthy level for a mean that long by ``STRETCH_FLOOR`` plus
    ``WITNESS_Z`` times the spread of such means (``_past_means``), both frozen from
    the first stretched bin until the job has not been stretched for a minute (the
    stretched bins, come into the past, had doubled the spread within two minutes
    and ended the witness before the node's idle time had passed its test: envelope
    seed 205). Means of whole
    long steps barely move where single bins beat with the step (their first
    differences overstate a minute's noise threefold: ``_spread``), and an MoE job
    whose level wanders with its routing has means that wander as far (a shorter
    estimate, adjacent means only, saw a 32-node MoE job's healthy 9-13 % dips as
    stretches)."""
    w: dict[str, Any] = memory.setdefault("witness", {})
    if level is None or (low and "pending" in w):
        w.pop("pending", None)
        w["since_pause"] = 0
        memory.pop("stretch_since", None)
        return
    if low:  # one low bin: a step's collective or a pause's first; the next says
        w["pending"] = round(level, 5)
        return
    bins: list[float] = w.setdefault("bins", [])
    pending = w.pop("pending", None)
    if pending is not None:
        bins.append(pending)
    bins.append(round(level, 5))
    del bins[:-HISTORY_BINS]
    since = int(w.get("since_pause", HISTORY_BINS))
    w["since_pause"] = min(since + 1 + (pending is not None), HISTORY_BINS)
    frozen: dict[str, list[float]] | None = w.get("frozen")
    stretched = False
    for count in (SHORT_BINS, RECENT_BINS):
        past = frozen.get(str(count)) if frozen is not None else _past_means(bins, count)
        if past is None or since < count + SETTLE_EXTRA_BINS:
            continue
        healthy, spread = past
        now = statistics.fmean(bins[-count:])
        if now > 0 and healthy / now - 1.0 >= STRETCH_FLOOR + WITNESS_Z * spread / healthy:
            stretched = True
    if stretched:
        memory.setdefault("stretch_since", at)
        w["calm"] = 0
        if frozen is None:  # the past as it was before the stretch, while it lasts
            w["frozen"] = {str(c): list(p) for c in (SHORT_BINS, RECENT_BINS)
                           if (p := _past_means(bins, c)) is not None}
    else:
        memory.pop("stretch_since", None)
        w["calm"] = calm = int(w.get("calm", 0)) + 1
        if calm >= RECENT_BINS:  # back at its healthy level for a minute
            w.pop("frozen", None)


def _past_means(bins: list[float], count: int) -> tuple[float, float] | None:
    """The healthy level of a mean of ``count`` bins and the spread of such means,
    from the bins before the last ``RECENT_BINS`` (the current level is what is being
    judged): the upper quartile of every ``count`` bins' mean there, as the
    slowdown's healthy level is, and their interquartile range over 1.349 (a
    standard deviation, robust to the few means that hold a pause's edge). None:
    fewer than ``MIN_PAST_MEANS`` such means yet."""
    old = np.asarray(bins[:-RECENT_BINS])
    if len(old) < count + MIN_PAST_MEANS - 1:
        return None
    cumulative = np.concatenate(([0.0], np.cumsum(old)))
    means = (cumulative[count:] - cumulative[:-count]) / count
    low, high = np.quantile(means, (0.25, HEALTHY_QUANTILE))
    return float(high), float(high - low) / 1.349


def _margins(bins: list[float], healthy: float) -> list[tuple[float, float]]:
    """The job's inflation against ``healthy`` as the mean of its last ``SHORT_BINS``
    and of its last ``RECENT_BINS``, each with ``NOISE_Z`` of that mean's own noise
    (``_spread``). The minute's mean is the one a long step needs (its bins beat with
    the step); where a job's bins are steady (steps short against a bin), the shorter
    mean clears its noise as well, and a data loader that stretched every step is
    seen in seconds, not after a minute's mean has turned."""
    sigma, level = _spread(bins)
    out = []
    for count in (SHORT_BINS, RECENT_BINS):
        now = statistics.fmean(bins[-count:])
        noise = sigma / math.sqrt(count) / level if level > 0 else 0.0
        if now > 0:
            out.append((healthy / now - 1.0, NOISE_Z * noise))
    return out


def _inflated(margins: list[tuple[float, float]], floor: float) -> bool:
    """Whether either mean of ``_margins`` sits below the healthy level by more than
    ``floor`` plus its noise margin."""
    return any(inflation >= floor + noise for inflation, noise in margins)


def _spread(bins: list[float]) -> tuple[float, float]:
    """The noise of one bin's level and the job's typical level (the noise of a mean
    of ``n`` bins, relative to it, is the first over the root of ``n`` over the
    second): the bin-to-bin spread of its per-bin levels (from first differences,
    so a level that moved, a slowdown itself, is one difference among
    ``HISTORY_BINS``, not noise). The differences' root mean square, not their
    median: a 30 s step's bins repeat a pattern (compute, compute, the collective) whose typical
    difference is zero and whose spread is in the few that are not. The largest
    ``EDGE_SHARE`` of them are left out: a bin half in a checkpoint is a pause's
    edge, not the step's noise. Near 0 for short steps, which every bin averages
    many times over; larger for 30 s steps, whose bins catch compute or the
    collective by turns. An inflation has to stand out of it, not only exceed
    ``MIN_INFLATION``."""
    if len(bins) < MIN_HISTORY_BINS:
        return 0.0, 0.0
    values = np.asarray(bins)
    level = float(np.median(values))
    squares = np.sort(np.diff(values) ** 2)
    kept = squares[:max(1, int(len(squares) * (1 - EDGE_SHARE)))]  # pause edges out
    sigma = math.sqrt(float(np.mean(kept)) / 2.0)
    return sigma, level


def _quiet_fabric(view: WindowView, memory: dict[str, Any]) -> bool:
    """Whether the job's NVLink traffic, over the last ``TRAFFIC_BINS``, fell below
    ``TRAFFIC_FLOOR`` of its healthy level: steps that merely take longer still
    exchange their gradients every step (a fifth less often, for a fifth longer
    steps); an evaluation pass or a checkpoint exchanges none. The mean spans a
    whole step, as a step of 30 s sends its gradients in one burst and bins between
    bursts carry none. The healthy level is the upper quartile of the means that
    were not quiet."""
    traffic = view.gpu("nvlink_tx")[:, -1]
    if np.isnan(traffic).all():
        return False
    burst: list[float] = memory.setdefault("traffic_bins", [])
    burst.append(round(float(nanmedian(traffic, axis=0)), 1))
    del burst[:-TRAFFIC_BINS]
    now = statistics.fmean(burst)
    history: list[float] = memory.setdefault("traffic", [])
    healthy = (quantile(history, HEALTHY_QUANTILE)
               if len(history) >= MIN_HISTORY_BINS else None)
    if healthy is not None and healthy > 0 and now < TRAFFIC_FLOOR * healthy:
        if not memory.get("quiet"):
            _forget_pause_start(memory, burst[:-1], TRAFFIC_FLOOR * healthy)
        memory["quiet"] = True
        return True
    memory["quiet"] = False
    history.append(round(now, 1))
    del history[:-HISTORY_BINS]
    return False


def _forget_pause_start(memory: dict[str, Any], before: list[float], floor: float) -> None:
    """Take back the levels of the bins just before a pause was seen that read low
    while their own traffic was already below ``floor``: the pause began there (the
    mean over a step lags it by a few bins) and, kept, their low levels read as an
    inflation for a minute after the pause. A bin at the healthy level stops the
    walk back: between a 30 s step's bursts a bin carries no traffic and is a step's."""
    lead = 0
    for value in reversed(before):
        if value >= floor:
            break
        lead += 1
    reference = memory.get("baseline") or max(memory.get("history") or [0.0])
    bins = memory.get("bins", [])
    while lead and bins and bins[-1] * (1.0 + MIN_INFLATION) < reference:
        bins.pop()
        lead -= 1


def _candidates(view: WindowView) -> list[dict[str, Any]]:
    """Nodes whose GPUs idle with no kernel while the job's others are kept busy
    (by computing or by waiting in a collective), least utilised first."""
    util = nanmedian(view.per_node("gpu_util", last=RECENT_BINS), axis=1)  # nodes × bins
    node_util = np.array([statistics.median(r) if (r := [v for v in row if v == v])
                          else math.nan for row in util.tolist()])
    if np.isnan(node_util).all() or len(view.nodes) < 2:
        return []
    job_util = float(nanmedian(node_util, axis=0))
    out = [{"node": node, "gpu_util": round(float(u), 4), "job_gpu_util": round(job_util, 4),
            "why": f"GPUs busy {fmt(float(u), 'ratio')} of the time vs the job's "
                   f"{fmt(job_util, 'ratio')}: waiting for input"}
           for node, u in zip(view.nodes, node_util.tolist(), strict=True)
           if u == u and u < job_util - IDLE_MARGIN]
    return sorted(out, key=lambda c: c["gpu_util"])
