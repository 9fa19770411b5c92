"""Checks of the NVML source against a real GPU, for `bench/real_gpu.sh`.

    python3 bench/real_gpu_check.py calls [--ticks 50]     # µs per NVML call, ms per tick
    python3 bench/real_gpu_check.py compare TRACE SMI_CSV DMON   # agent vs nvidia-smi
    python3 bench/real_gpu_check.py phases EVENTS TRACE [TRAIN_LOG]  # work against busy

``calls`` times every NVML call the source makes on the real driver (a timing proxy
around pynvml) and the agent's CPU per tick. ``compare`` pairs each agent sample of a
full-rate trace (``VIGIL_AGENT_ADAPTIVE=false vigil agent --out TRACE``) with the
``nvidia-smi --query-gpu`` row and ``nvidia-smi dmon`` line nearest in time, GPU by
UUID, and prints per metric the median agent/nvidia-smi ratio: a unit or scale error
(mW for W, % for a ratio, MiB for bytes, KB/s for B/s) shows as a ratio far from 1.
``phases`` splits the trace at the schedule's ``phase`` events and prints, per phase,
GPU 0's busy time (SM activity), work rate (``tensor_active × sm_clock``) and work per
busy second, then each cause against the baseline and issue #28's table: a throttled
clock raises busy time and ``tensor_active`` with the work rate level; a stall at the
same SM clock raises busy time with the work rate level; more work (a larger batch)
raises busy time and work rate together. All print Markdown tables.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from vigil_gpu_monitor.contracts.codec import decode_trace
from vigil_gpu_monitor.producers.nvml import NvmlSource

# agent metric → (nvidia-smi --query-gpu field, factor to the agent's unit)
SMI_FIELDS: dict[str, tuple[str, float]] = {
    "power": ("power.draw", 1.0),
    "sm_clock": ("clocks.sm", 1.0),
    "mem_clock": ("clocks.mem", 1.0),
    "temperature": ("temperature.gpu", 1.0),
    "gpu_util": ("utilization.gpu", 0.01),
    "mem_used": ("memory.used", float(1 << 20)),
    "pcie_gen": ("pcie.link.gen.current", 1.0),
    "pcie_width": ("pcie.link.width.current", 1.0),
    "throttle": ("clocks_event_reasons.active", 1.0),
}
SMI_QUERY = ",".join(["timestamp", "uuid", *(f for f, _ in SMI_FIELDS.values())])
# agent metric → (nvidia-smi dmon column, factor to the agent's unit)
DMON_COLUMNS: dict[str, tuple[str, float]] = {
    "power": ("pwr", 1.0), "sm_clock": ("pclk", 1.0), "mem_clock": ("mclk", 1.0),
    "pcie_rx": ("rxpci", 1e6), "pcie_tx": ("txpci", 1e6),
}


class _Timed:
    """pynvml with every function call timed (constants and structs pass through)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.times: dict[str, list[float]] = defaultdict(list)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(value):
            return value

        def timed(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return value(*args)
            finally:
                self.times[name].append(time.perf_counter() - t)
        return timed


def calls(ticks: int, interval: float) -> None:
    """Time the source's NVML calls and ticks on this machine's driver."""
    import pynvml

    timed = _Timed(pynvml)
    source = NvmlSource(timed)
    timed.times.clear()  # start-up calls are not per-tick cost
    wall, cpu = [], []
    for _ in range(ticks):
        t, c = time.perf_counter(), time.process_time()
        reading = source.read(time.monotonic())
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        time.sleep(interval)
    source.close()
    print(f"{len(reading.gpus)} GPU(s), {ticks} ticks, errors {dict(source.errors)}\n")
    print("| NVML call | calls/tick | median µs | p99 µs |\n|---|---|---|---|")
    for name, values in sorted(timed.times.items(), key=lambda kv: -sum(kv[1])):
        values.sort()
        print(f"| {name} | {len(values) / ticks:.1f} | {statistics.median(values) * 1e6:.0f} "
              f"| {values[int(0.99 * (len(values) - 1))] * 1e6:.0f} |")
    print(f"\ntick: wall median {statistics.median(wall) * 1e3:.2f} ms, CPU median "
          f"{statistics.median(cpu) * 1e3:.2f} ms (at 1 tick/s: "
          f"{statistics.median(cpu) * 100:.2f} % of one core)")


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(int(text, 16)) if text.startswith("0x") else float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _smi_rows(path: Path) -> dict[str, list[tuple[float, dict[str, float | None]]]]:
    """uuid → [(epoch seconds, field → value)] from `nvidia-smi --query-gpu` CSV."""
    rows: dict[str, list[tuple[float, dict[str, float | None]]]] = defaultdict(list)
    with path.open() as fh:
        for row in csv.reader(fh, skipinitialspace=True):
            if len(row) != len(SMI_QUERY.split(",")) or row[0].startswith("timestamp"):
                continue
            ts = datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            values = {f: _number(v) for f, v in zip(SMI_QUERY.split(",")[2:], row[2:],
                                                     strict=True)}
            rows[row[1]].append((ts, values))
    return rows


def _dmon_rows(path: Path) -> dict[str, list[tuple[float, dict[str, float | None]]]]:
    """gpu index → [(epoch seconds, column → value)] from `nvidia-smi dmon -o DT`."""
    rows: dict[str, list[tuple[float, dict[str, float | None]]]] = defaultdict(list)
    columns: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            if not columns:
                columns = line.lstrip("#").split()
            continue
        parts = line.split()
        if len(parts) != len(columns):
            continue
        row = dict(zip(columns, parts, strict=True))
        ts = datetime.strptime(f"{row['Date']} {row['Time']}", "%Y%m%d %H:%M:%S").timestamp()
        rows[row["gpu"]].append((ts, {c: _number(v) for c, v in row.items()}))
    return rows


def _nearest(rows: list[tuple[float, dict[str, float | None]]], ts: float,
             within: float) -> dict[str, float | None] | None:
    times = [r[0] for r in rows]
    i = bisect.bisect_left(times, ts)
    best = min((j for j in (i - 1, i) if 0 <= j < len(rows)),
               key=lambda j: abs(times[j] - ts), default=None)
    return rows[best][1] if best is not None and abs(times[best] - ts) <= within else None


def _table(title: str, pairs: dict[str, list[tuple[float, float]]],
           exact: Callable[[str], bool]) -> None:
    print(f"\n### {title}\n\n| metric | pairs | median agent | median reference | "
          "median ratio | verdict |\n|---|---|---|---|---|---|")
    for metric, found in sorted(pairs.items()):
        if not found:
            continue
        agent = statistics.median(a for a, _ in found)
        ref = statistics.median(r for _, r in found)
        if exact(metric):
            share = sum(a == r for a, r in found) / len(found)
            print(f"| {metric} | {len(found)} | {agent:g} | {ref:g} | {share:.0%} equal | "
                  f"{'ok' if share >= 0.9 else 'CHECK'} |")
            continue
        ratios = [a / r for a, r in found if r]
        ratio = statistics.median(ratios) if ratios else float("nan")
        verdict = "ok" if 0.8 <= ratio <= 1.25 else ("—" if not ratios else "CHECK")
        print(f"| {metric} | {len(found)} | {agent:.4g} | {ref:.4g} | {ratio:.3f} | {verdict} |")


def compare(trace: Path, smi: Path, dmon: Path) -> None:
    """Agent readings against nvidia-smi's, metric by metric."""
    smi_rows, dmon_rows = _smi_rows(smi), _dmon_rows(dmon)
    smi_pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    dmon_pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    seen: dict[str, int] = defaultdict(int)
    samples = 0
    for sample in decode_trace(trace.read_text().splitlines()):
        samples += 1
        uuids = sample.get("meta", {}).get("gpu_uuids", {})
        for minor, metrics in sample["gpus"].items():
            for name in metrics:
                seen[name] += 1
            ref = _nearest(smi_rows.get(uuids.get(minor, ""), []), sample["ts"], 0.6)
            for metric, (field, factor) in SMI_FIELDS.items():
                value = ref.get(field) if ref else None
                if metric in metrics and value is not None:
                    smi_pairs[metric].append((metrics[metric], value * factor))
            ref = _nearest(dmon_rows.get(minor, []), sample["ts"], 1.0)
            for metric, (column, factor) in DMON_COLUMNS.items():
                value = ref.get(column) if ref else None
                if metric in metrics and value is not None:
                    dmon_pairs[metric].append((metrics[metric], value * factor))
    print(f"{samples} agent samples; readings per metric (GPM and NVLink availability):\n")
    print(", ".join(f"{m} {n}" for m, n in sorted(seen.items())))
    _table("against nvidia-smi --query-gpu", smi_pairs,
           lambda m: m in ("pcie_gen", "pcie_width", "throttle"))
    _table("against nvidia-smi dmon (1 s means, MB/s)", dmon_pairs, lambda m: False)


# issue #28's table: how each cause moves busy time, work rate and work per busy second
# against the baseline (+1 up, 0 level within LEVEL, -1 down)
EXPECTED: dict[str, dict[str, int]] = {
    "throttled": {"busy": 1, "tensor": 1, "work": 0},
    "memory-clock": {"busy": 1, "work": 0, "work/busy": -1},
    "stall": {"busy": 1, "tensor": 0, "work": 0, "work/busy": -1, "dram": 0},
    # not a row of the table: more work of a memory-bound kind moves more bytes
    "memory-work": {"busy": 1, "tensor": 0, "work": 0, "dram": 1},
    "more-work": {"busy": 1, "tensor": 1, "work": 1, "work/busy": 0},
}
LEVEL = 0.07  # a change under 7 % is level
SETTLE = 3.0  # seconds after an event left out: the change lands within a window or two


def _direction(ratio: float) -> int:
    return 0 if abs(ratio - 1) <= LEVEL else (1 if ratio > 1 else -1)


def _phase_marks(events: Path) -> list[tuple[float, str]]:
    """(epoch seconds, phase name) of each ``HH:MM:SS phase NAME: …`` line, then the end."""
    marks = []
    for line in events.read_text().splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] == "phase":
            t = datetime.strptime(parts[0], "%H:%M:%S")
            marks.append((float(t.hour * 3600 + t.minute * 60 + t.second),
                          parts[2].split(":")[0].strip()))
    return marks


def _step_ms(train_log: Path | None) -> list[tuple[float, float]]:
    """(epoch seconds, median ms a step's own work took) from gpu_train.py's lines."""
    if train_log is None or not train_log.exists():
        return []
    rows = []
    for line in train_log.read_text().splitlines():
        parts = line.split()
        if "step_ms" in parts:
            rows.append((float(parts[0]), float(parts[parts.index("step_ms") + 1])))
    return rows


def phase_samples(events: Path, trace: Path,
                  marks: list[tuple[float, str]] | None = None
                  ) -> dict[str, list[dict[str, Any]]]:
    """Phase name → the trace's samples in it, SETTLE seconds after its start left out
    (phases of one name after the first are appended to it); ``marks``: the events'
    phases, where the caller has read them already."""
    marks = _phase_marks(events) if marks is None else marks
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sample in decode_trace(trace.read_text().splitlines()):
        tod = sample["ts"] % 86400  # time of day, UTC, as the log's
        current = [(start, name) for start, name in marks if start <= tod]
        if current and tod >= current[-1][0] + SETTLE:
            found[current[-1][1]].append(sample)
    return dict(found)


def phase_table(events: Path, trace: Path,
                train_log: Path | None = None) -> dict[str, dict[str, float]]:
    """Phase name → GPU 0's mean readings over it.

    Work rate is ``tensor_active × sm_clock`` (a share of cycles at the current clock,
    times the clock); where GPM's raw cycle counters came, ``mma`` (MMA Gcycles a
    second) is the second witness. ``busy_sd`` is the spread of the 1 s readings within
    the phase: what the step's beat against the window makes on a steady GPU."""
    marks = _phase_marks(events)
    steps = [(ts % 86400, ms) for ts, ms in _step_ms(train_log)]
    table: dict[str, dict[str, float]] = {}
    for name, samples in phase_samples(events, trace, marks).items():
        phase = [{"busy": g["sm_active"], "tensor": g["tensor_active"], "clock": g["sm_clock"],
                  "work": g["tensor_active"] * g["sm_clock"],
                  "mem_clock": g.get("mem_clock", float("nan")),
                  "dram": g.get("dram_active", float("nan")),
                  "power": g.get("power", float("nan")),
                  "mma": g.get("mma_cycles_active", float("nan")) / 1e9}
                 for g in (s["gpus"].get("0", {}) for s in samples)
                 if {"sm_active", "tensor_active", "sm_clock"} <= g.keys()]
        if len(phase) < 3:
            continue
        spans = [(start, end) for (start, n), (end, _) in
                 zip(marks, [*marks[1:], (float("inf"), "")], strict=True) if n == name]
        ms = [m for ts, m in steps  # a line covers the 5 s before it
              if any(start + SETTLE + 5 <= ts < end for start, end in spans)]
        mean = {k: statistics.fmean(v[k] for v in phase) for k in phase[0]}
        mean["work/busy"] = mean["work"] / max(mean["busy"], 1e-6)
        mean["busy_sd"] = statistics.stdev(v["busy"] for v in phase)
        mean["samples"] = len(phase)
        mean["step_ms"] = statistics.median(ms) if ms else float("nan")
        table[name] = mean
    return table


def verdicts(table: dict[str, dict[str, float]]) -> dict[str, tuple[dict[str, float], str]]:
    """Cause → (its readings over the baseline's, whether they move as issue #28's table
    says: "yes", "NO", "not run", or "not applied" where the memory clock did not move)."""
    base = table.get("baseline")
    out: dict[str, tuple[dict[str, float], str]] = {}
    for name, expected in EXPECTED.items():
        if base is None or name not in table:
            out[name] = ({}, "not run")
            continue
        ratio = {k: table[name][k] / base[k] if base[k] else float("nan")
                 for k in ("busy", "tensor", "work", "work/busy", "dram", "mma", "mem_clock")}
        if name == "memory-clock" and _direction(ratio["mem_clock"]) == 0:
            out[name] = (ratio, "not applied (memory clock unchanged)")
            continue
        agree = all(_direction(ratio[k]) == d for k, d in expected.items())
        out[name] = (ratio, "yes" if agree else "NO")
    return out


def phases(events: Path, trace: Path, train_log: Path | None = None) -> None:
    """Print the phase table, then each cause against the baseline and issue #28's table."""
    table = phase_table(events, trace, train_log)
    print("| phase | samples | step ms | busy (sd) | tensor | SM MHz | mem MHz | work (tensor "
          "× MHz) | work / busy | dram | power W | MMA Gcycles/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, m in table.items():
        print(f"| {name} | {m['samples']:.0f} | {m['step_ms']:.1f} | {m['busy']:.3f} "
              f"({m['busy_sd']:.3f}) | {m['tensor']:.3f} | {m['clock']:.0f} | "
              f"{m['mem_clock']:.0f} | {m['work']:.1f} | {m['work/busy']:.1f} | "
              f"{m['dram']:.3f} | {m['power']:.0f} | {m['mma']:.1f} |")
    print("\n| cause | busy | tensor | work | work / busy | dram | MMA | as issue #28's table "
          "says |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (ratio, verdict) in verdicts(table).items():
        cells = [f"×{ratio[k]:.2f}" if k in ratio else "—"
                 for k in ("busy", "tensor", "work", "work/busy", "dram", "mma")]
        print(f"| {name} | {' | '.join(cells)} | {verdict} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("calls")
    c.add_argument("--ticks", type=int, default=50)
    c.add_argument("--interval", type=float, default=0.2, help="seconds between ticks (GPM "
                   "needs ≥ 0.1)")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("trace", type=Path)
    cmp_.add_argument("smi", type=Path)
    cmp_.add_argument("dmon", type=Path)
    ph = sub.add_parser("phases")
    ph.add_argument("events", type=Path)
    ph.add_argument("trace", type=Path)
    ph.add_argument("train_log", type=Path, nargs="?")
    args = parser.parse_args()
    if args.what == "calls":
        calls(args.ticks, args.interval)
    elif args.what == "phases":
        phases(args.events, args.trace, args.train_log)
    else:
        compare(args.trace, args.smi, args.dmon)


if __name__ == "__main__":
    main()
