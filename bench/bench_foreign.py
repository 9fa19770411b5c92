"""The foreign validation traces as served, and as other agents would read them.

    .venv/bin/python bench/bench_foreign.py [--foreign ../shared/foreign] [--jobs 2]

Each trace of ``../shared/foreign/`` (another generator, other physics: see its
README) is replayed with ``vigil replay`` and scored with its own ``score.py``, in
these variants, none of which changes a fault or a label:

- ``as served``: 1 s windows, every field;
- ``default fields``: without what dcgm-exporter's default field set leaves out
  since 4.0 (``sm_active``, ``sm_occupancy``, the FP pipes);
- ``2 s windows`` and ``5 s windows``: each node's consecutive samples averaged in
  twos or fives, as an agent polling less often reads them (DCGM's profiling fields
  are averages over the watch's interval; the InfiniBand rates are counter deltas
  over it; error counts and PCIe state are the last read; XIDs and clock-event
  reasons are kept if any window of the group saw them).

The traces are for checking, never for tuning (their README): no constant of the
detectors was fitted to these figures.
"""

from __future__ import annotations

import argparse
import json
import lzma
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

TRACES = ("base-5", "hard-15")
NOT_IN_DEFAULT_FIELDS = ("sm_active", "sm_occupancy", "fp16_active", "fp32_active",
                         "fp64_active")
LAST_READ = frozenset({"pcie_gen", "pcie_width", "ecc_sbe", "ecc_dbe", "ib_rate",
                       "ib_errors", "mem_used"})

Sample = dict[str, Any]


def default_fields(samples: Iterable[Sample]) -> Iterator[Sample]:
    """Samples without the fields dcgm-exporter's default set does not export."""
    for sample in samples:
        for gpu in sample["gpus"].values():
            for name in NOT_IN_DEFAULT_FIELDS:
                gpu.pop(name, None)
        yield sample


def longer_windows(k: int) -> Callable[[Iterable[Sample]], Iterator[Sample]]:
    """Each node's ``k`` consecutive samples as one, stamped at the last one's end (a
    node's trailing part-group is dropped, as an agent stopped mid-interval sends
    nothing for it)."""
    def rewindow(samples: Iterable[Sample]) -> Iterator[Sample]:
        groups: dict[str, list[Sample]] = defaultdict(list)
        for sample in samples:
            group = groups[sample["node"]]
            group.append(sample)
            if len(group) == k:
                merged = dict(group[-1])
                for part in ("gpus", "nics"):
                    names = set().union(*(s.get(part, {}) for s in group))
                    merged[part] = {name: _merge([s[part][name] for s in group
                                                  if name in s.get(part, {})])
                                    for name in names}
                merged["host"] = _merge([s.get("host", {}) for s in group])
                yield merged
                group.clear()
    return rewindow


def _merge(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """One device's readings over several windows as one window's."""
    out: dict[str, Any] = {}
    for name in set().union(*readings):
        values = [r[name] for r in readings if name in r]
        if name == "xid":
            seen = [v for v in values if v]
            out[name] = seen[-1] if seen else 0
        elif name == "throttle":
            mask = 0
            for v in values:
                mask |= int(v)
            out[name] = mask
        elif name in LAST_READ:
            out[name] = values[-1]
        else:
            out[name] = sum(values) / len(values)
    return out


VARIANTS: dict[str, Callable[[Iterable[Sample]], Iterator[Sample]]] = {
    "as served": lambda samples: iter(samples),
    "default fields": default_fields,
    "2 s windows": longer_windows(2),
    "5 s windows": longer_windows(5),
}


def _run(job: tuple[str, str, str]) -> tuple[str, str, dict[str, Any]]:
    """Replay one variant of one trace and score it with the trace's scorer."""
    foreign, trace, variant = job
    root = Path(foreign)
    vigil = Path(sys.executable).with_name("vigil")
    with tempfile.TemporaryDirectory() as tmp:
        made, found = Path(tmp, "trace.jsonl"), Path(tmp, "det.jsonl")
        with lzma.open(root / f"{trace}.jsonl.xz", "rt") as src, made.open("w") as dst:
            for sample in VARIANTS[variant](json.loads(line) for line in src):
                dst.write(json.dumps(sample) + "\n")
        replay = subprocess.run([str(vigil), "replay", str(made), "--out", str(found)],
                                capture_output=True, text=True)
        if replay.returncode:
            raise RuntimeError(f"vigil replay of {trace} ({variant}) exited "
                               f"{replay.returncode}: {replay.stderr[-2000:]}")
        scored = subprocess.run([sys.executable, str(root / "score.py"),
                                 str(root / f"{trace}.labels.json"), str(found)],
                                check=True, capture_output=True, text=True)
    return trace, variant, json.loads(scored.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--foreign", default=str(Path(__file__).resolve().parents[2]
                                                 / "shared" / "foreign"),
                        help="the folder of the foreign traces and their scorer")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    jobs = [(args.foreign, trace, variant) for trace in TRACES for variant in VARIANTS]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_run, jobs))
    required = {trace: _required(args.foreign, trace) for trace in TRACES}
    print("| trace | variant | F1 | found | false | median delay s | max delay s | missed |")
    print("|---|---|---|---|---|---|---|---|")
    for trace, variant, score in results:
        missed = [name for name, fault in score["per_fault"].items()
                  if fault is None and name in required[trace]]
        print(f"| {trace} | {variant} | {score['f1']:.3f} | {score['found']}/{score['faults']} "
              f"| {score['false']} | {score['median_delay']} | {score['max_delay']} "
              f"| {', '.join(missed) or '–'} |")
    return 0


def _required(foreign: str, trace: str) -> set[str]:
    """The trace's faults that count (optional ones are left out by its scorer)."""
    labels = json.loads(Path(foreign, f"{trace}.labels.json").read_text())
    return {f["id"] for f in labels["faults"] if not f.get("optional")}


if __name__ == "__main__":
    raise SystemExit(main())
