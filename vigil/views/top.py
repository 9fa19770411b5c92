"""`vigil top`: a live terminal view of the fleet, read from Redis.

Per job, its goodput (the share of its GPU time not lost to open incidents, from
their cost estimates) and one row per node with a heat strip for SM, tensor and
DRAM activity (one cell per GPU, the last evaluated 5 s bin: the worker's
``vigil.status`` feed, kept in Redis by the alerter); GPUs with an open incident
are marked. Below: the open incidents, costliest first, each with its cost in
GPU-hours per hour, and the pipeline's health (each worker's lag and dead letters,
silent agents). ``q`` or Ctrl-C quits; ``--once`` prints one frame.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from dataclasses import dataclass, field
from typing import Any

from vigil_gpu_monitor.alerting.cost import by_cost, goodput, lost_per_hour
from vigil_gpu_monitor.alerting.repair import RepairLog
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts.messages import Detection, location
from vigil_gpu_monitor.contracts.status import HEAT_METRICS, HEAT_NAMES, gpu_key_order

LEVELS = "▁▂▃▄▅▆▇█"  # 0 … 1; the lowest stays visible (a hung job reads ~0)
NO_READING = "·"
WORKER_STALE_SECONDS = 30.0
# a job's heat older than this is stale (its numbers are as of then); event time this far
# ahead of this machine's clock is from the future (a skewed clock, `simulate --fast`)
JOB_STALE_SECONDS = 30.0
FUTURE_SECONDS = 5.0
RED, BOLD, RESET = "\x1b[31;1m", "\x1b[1m", "\x1b[0m"


@dataclass
class Snapshot:
    """What one frame shows, read from Redis in one go."""

    taken_at: float
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # job → status
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)  # worker → heartbeat
    incidents: list[Detection] = field(default_factory=list)  # firing, costliest first
    nodes_out: dict[str, int] = field(default_factory=dict)  # repair state → nodes Vigil holds


def gather(state: LiveState, now: float | None = None, max_age: float = 600.0) -> Snapshot:
    """Read the live view's data: job heat, worker heartbeats, open incidents."""
    now = time.time() if now is None else now
    live = state.pipeline_status(max_age=max_age, now=now)
    incidents = by_cost(state.open_incidents())
    out: dict[str, int] = {}
    for record in RepairLog(state.r, state.prefix).out_nodes().values():
        out[record["state"]] = out.get(record["state"], 0) + 1
    return Snapshot(now, live["jobs"], live["workers"], incidents, out)


def cell(value: float | None) -> str:
    """One GPU's heat: a block whose height is the activity (0..1), ``·`` if unread."""
    if value is None:
        return NO_READING
    return LEVELS[min(len(LEVELS) - 1, max(0, round(value * (len(LEVELS) - 1))))]


def job_goodput(gpus: int, incidents: list[Detection]) -> tuple[float, float]:
    """(goodput, GPU-hours per hour lost) of a job from its open incidents' costs."""
    lost = sum(x for d in incidents if (x := lost_per_hour(d)) is not None)
    lost = min(lost, float(gpus)) if gpus else lost
    return goodput(gpus, lost), lost


def freshness(ts: float | None, now: float) -> str:
    """A warning when a job's data is not current: from the future, or stale."""
    if ts is None:
        return ""
    if ts - now > FUTURE_SECONDS:
        return (f"  DATA FROM THE FUTURE: {ts - now:.0f}s ahead of this clock (skewed "
                "clocks, or samples published faster than real time)")
    if now - ts > JOB_STALE_SECONDS:
        return f"  STALE: no data for {_ago(now - ts)[:-4]}; figures as of then"
    return ""


def _job_rows(job: str, status: dict[str, Any], flagged: dict[tuple[str, str | None], str],
              color: bool, incidents: list[Detection], now: float) -> list[str]:
    """The heat strips of one job: a header, then a row per node."""
    metrics = status.get("metrics", list(HEAT_METRICS))
    by_node: dict[str, list[tuple[str, list[float | None]]]] = {}
    for key in sorted(status["heat"], key=gpu_key_order):
        node, _, gpu = key.rpartition("/")
        by_node.setdefault(node, []).append((gpu, status["heat"][key]))
    gpus_per_node = max((len(v) for v in by_node.values()), default=0)
    strip = max(gpus_per_node, 6)
    node_width = min(24, max((len(n) for n in by_node), default=4))
    gpu_count = sum(len(v) for v in by_node.values())
    share, lost = job_goodput(gpu_count, incidents)
    losing = f" (losing {lost:.3g} GPU-h/h)" if lost else ""
    lines = [f"{BOLD if color else ''}{job}{RESET if color else ''}  "
             f"{len(by_node)} nodes, {gpu_count} GPUs  goodput {share:.0%}{losing}  "
             f"late samples {status.get('late', 0)}" + freshness(status.get("ts"), now),
             f"  {'node':<{node_width}}  " + "  ".join(
                 f"{HEAT_NAMES.get(m, (m, m))[0][:strip]:<{strip}}" for m in metrics)]
    for node, gpus in by_node.items():
        parts = []
        for i in range(len(metrics)):
            cells = []
            for gpu, values in gpus:
                text = cell(values[i])
                if (node, gpu) in flagged and color:
                    text = f"{RED}{text}{RESET}"
                cells.append(text)
            parts.append("".join(cells) + " " * (strip - len(gpus)))
        note = ""
        marks = sorted({flagged[(node, g)] for g, _ in gpus if (node, g) in flagged}
                       | ({flagged[(node, None)]} if (node, None) in flagged else set()))
        if marks:
            bad = [g for g, _ in gpus if (node, g) in flagged]
            note = f"  ◀ {', '.join(marks)}" + (f" (GPU {', '.join(bad)})" if bad else "")
        lines.append(f"  {node[:node_width]:<{node_width}}  " + "  ".join(parts) + note)
    return lines


def _ago(seconds: float) -> str:
    if seconds < -FUTURE_SECONDS:
        return f"in {-seconds:.0f}s!"  # event time ahead of this clock
    seconds = max(seconds, 0.0)
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def render(snap: Snapshot, width: int = 120, height: int = 60, color: bool = True) -> str:
    """One frame as text."""
    flagged: dict[str, dict[tuple[str, str | None], str]] = {}
    for det in snap.incidents:
        if det["node"]:
            flagged.setdefault(det["job"], {})[(det["node"], det["gpu"])] = det["kind"]
    title = (f"vigil top — {time.strftime('%H:%M:%S', time.localtime(snap.taken_at))}  "
             f"jobs {len(snap.jobs)}  open incidents {len(snap.incidents)}  "
             f"workers {len(snap.workers)}  nodes out {sum(snap.nodes_out.values())}"
             + (f" ({', '.join(f'{n} {s}' for s, n in sorted(snap.nodes_out.items()))})"
                if snap.nodes_out else ""))
    lines = [f"{BOLD}{title}{RESET}" if color else title, ""]
    # Jobs with open incidents first, then by name; the rest is summarised.
    order = sorted(snap.jobs, key=lambda j: (j not in flagged, j))
    budget = max(8, height - 12 - min(len(snap.incidents), 8) - len(snap.workers))
    shown = 0
    for job in order:
        rows = _job_rows(job, snap.jobs[job], flagged.get(job, {}), color,
                         [d for d in snap.incidents if d["job"] == job], snap.taken_at)
        if shown and shown + len(rows) > budget:
            lines.append(f"… {len(order) - order.index(job)} more job(s)")
            break
        lines.extend(rows)
        lines.append("")
        shown += len(rows) + 1
    if not snap.jobs:
        lines.extend(["no job heat yet (is the worker publishing vigil.status, and the "
                      "alerter running?)", ""])
    lines.append(f"{BOLD if color else ''}OPEN INCIDENTS{RESET if color else ''}")
    for det in by_cost(snap.incidents)[:8]:
        where = location(det["node"], det["gpu"])
        lost = lost_per_hour(det)
        cost = "cost ?" if lost is None else f"{lost:.3g} GPU-h/h"
        line = (f"  {det['severity']:<8} {det['kind']:<13} {det['job']:<16} {where:<22} "
                f"{cost:>13} {_ago(snap.taken_at - det['detected_at']):>8}  {det['summary']}")
        lines.append(line[:width])
    if len(snap.incidents) > 8:
        lines.append(f"  … {len(snap.incidents) - 8} more (vigil alerts)")
    if not snap.incidents:
        lines.append("  none")
    lines.extend(["", f"{BOLD if color else ''}PIPELINE{RESET if color else ''}"])
    for name, hb in sorted(snap.workers.items()):
        age = snap.taken_at - hb["seen"]
        stale = age > WORKER_STALE_SECONDS
        lag = sum(hb["lag"].values())
        line = (f"  worker {name:<24} {'STALE ' if stale else ''}lag {lag:>8}  "
                f"dead letters {hb['deadletters']:>6}  samples {hb['samples']:>10}  "
                f"jobs {hb['jobs']:>4}  seen {_ago(age)}")
        lines.append(f"{RED}{line}{RESET}" if stale and color else line[:width])
    if not snap.workers:
        lines.append("  no worker heartbeat")
    silent = sorted({d["node"] for d in snap.incidents
                     if d["kind"] == "node_silent" and d["node"] is not None})
    newest = max((float(j["ts"]) for j in snap.jobs.values() if "ts" in j), default=None)
    if newest is not None and snap.taken_at - newest > JOB_STALE_SECONDS:
        lines.append(f"  no fresh data: the newest job heat is {_ago(snap.taken_at - newest)} "
                     "(agents, worker or alerter stopped?)")
    lines.append(f"  silent agents: {', '.join(silent) if silent else 'none'}")
    return "\n".join(lines[:max(height, 10)]) + "\n"


def run(state: LiveState, interval: float = 2.0, once: bool = False,
        color: bool | None = None) -> int:
    """Redraw every ``interval`` seconds until ``q``/Ctrl-C; ``once`` prints a frame."""
    out = sys.stdout
    tty_in = sys.stdin.isatty() and not once
    color = out.isatty() if color is None else color
    if once or not out.isatty():
        size = os.get_terminal_size(out.fileno()) if out.isatty() else os.terminal_size((120, 200))
        out.write(render(gather(state), size.columns, size.lines, color))
        return 0
    saved = termios.tcgetattr(sys.stdin) if tty_in else None
    try:
        if tty_in:
            tty.setcbreak(sys.stdin.fileno())
        out.write("\x1b[?25l")  # hide the cursor while redrawing
        while True:
            size = os.get_terminal_size(out.fileno())
            frame = render(gather(state), size.columns, size.lines - 1, color)
            out.write("\x1b[H\x1b[2J" + frame)
            out.flush()
            if tty_in:
                ready, _, _ = select.select([sys.stdin], [], [], interval)
                if ready and sys.stdin.read(1).lower() == "q":
                    return 0
            else:
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        out.write("\x1b[?25h\n")
        out.flush()
        if saved is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
