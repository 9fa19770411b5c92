"""The fleet-day soak (issue #14): replay healthy GPU-hours and count false alarms.

    make fleet-soak                                   # 50,000 GPU-hours
    .venv/bin/python bench/fleet_soak.py --gpu-hours 5000 --hours-per-job 1 --procs 2

Jobs come from ``vigil/evaluation/fleet.py`` (every kind and size, checkpoints,
evaluations, MoE load that moves, a lossy node, skewed clocks), each over the physics
envelope (issue #45: its own NCCL channels, utilisation period, power limit, tick...;
``--no-envelope`` runs the fleet of issue #14 as it was); each is simulated
and replayed through the detectors as ``vigil replay`` would. Every firing detection
of severity warning or critical is a false alarm. Findings of severity info
(``load_imbalance``: more work, not a fault; ``network_bound``: a phase of the job,
routed to its owner, never paged) are counted apart by kind. Prints the rate per
1,000 GPU-days with its 95 % upper bound, the GPU-hours by kind, and the alarms
themselves.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Simulator
from vigil_gpu_monitor.vigil.evaluation.fleet import fleet_job, kind_of, poisson_upper

START = 1_950_000_000.0


def _run(args: tuple[int, float, int, bool]) -> dict[str, Any]:
    index, seconds, seed, envelope = args
    job = fleet_job(index, START, seconds, seed, envelope)
    runner = ReplayRunner(DetectConfig())
    alarms: list[str] = []
    info: Counter[str] = Counter()
    samples = 0
    for sample in Simulator(job.cluster, START, seed=seed * 100_000 + index).samples(seconds):
        samples += 1
        for det in runner.feed(sample):
            if det["state"] != "firing":
                continue
            if det["severity"] == "info":
                info[det["kind"]] += 1  # the job's owner is told; nobody is paged
            else:
                alarms.append(f"{job.name}: t+{det['detected_at'] - START:.0f}s {det['kind']} "
                              f"{det['node']} {det['gpu']} {det['summary']}")
    return {"name": job.name, "gpu_hours": job.gpu_hours, "samples": samples,
            "alarms": alarms, "info": info, "moe": job.cluster.jobs[0].kind == "moe",
            "kind": kind_of(job), "tick": job.cluster.tick or 1.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu-hours", type=float, default=50_000.0)
    parser.add_argument("--hours-per-job", type=float, default=2.0)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0,
                        help="start at this job of the plan (finish a run that was "
                             "stopped: the jobs are the same every time)")
    parser.add_argument("--no-envelope", action="store_true",
                        help="the fleet without the physics envelope (issue #14's)")
    args = parser.parse_args()
    seconds = args.hours_per_job * 3600.0
    tasks, planned = [], 0.0
    while planned < args.gpu_hours:
        job = fleet_job(len(tasks), START, seconds, args.seed, not args.no_envelope)
        tasks.append((len(tasks), seconds, args.seed, not args.no_envelope))
        planned += job.gpu_hours
    tasks = tasks[args.first:]
    began = time.time()
    done: list[dict[str, Any]] = []
    pool = ProcessPoolExecutor(args.procs)
    try:
        for result in pool.map(_run, tasks):
            done.append(result)
            for line in result["alarms"]:  # as they come: a long run can be read early
                print("  " + line[:220], flush=True)
            hours = sum(r["gpu_hours"] for r in done)
            print(f"[{time.time() - began:6.0f}s] {len(done)}/{len(tasks)} jobs, "
                  f"{hours:,.0f} GPU-hours, {sum(len(r['alarms']) for r in done)} alarms",
                  flush=True)
    except KeyboardInterrupt:  # the jobs come in plan order: the done ones are a prefix
        pool.shutdown(wait=False, cancel_futures=True)
        print(f"\nstopped: jobs {args.first}-{args.first + len(done) - 1} done; the rest "
              f"with --first {args.first + len(done)}", flush=True)
    else:
        pool.shutdown()
    if not done:
        return 1
    gpu_days = sum(r["gpu_hours"] for r in done) / 24.0
    alarms = [a for r in done for a in r["alarms"]]
    kinds = Counter(a.split()[2] for a in alarms)
    upper = poisson_upper(len(alarms))
    print(f"\n{len(done)} healthy jobs, {gpu_days * 24:,.0f} GPU-hours ({gpu_days:,.0f} "
          f"GPU-days), {sum(r['samples'] for r in done):,} node samples, "
          f"{time.time() - began:.0f} s wall on {args.procs} processes")
    moe = sum(r["gpu_hours"] for r in done if r["moe"]) / max(gpu_days * 24, 1e-9)
    info: Counter[str] = Counter()
    for r in done:
        info.update(r["info"])
    by_kind: Counter[str] = Counter()
    for r in done:
        by_kind[r["kind"]] += r["gpu_hours"]
    serving = sum(h for k, h in by_kind.items() if k.startswith("async"))
    print("GPU-hours by kind: " + ", ".join(
        f"{k} {h:,.0f} ({h / max(gpu_days * 24, 1e-9):.0%})" for k, h in sorted(by_kind.items())))
    print(f"asynchronous replicas' share of the GPU-hours: "
          f"{serving / max(gpu_days * 24, 1e-9):.0%}")
    print(f"MoE share of the GPU-hours: {moe:.0%}; info findings (the job owner's, not "
          f"alarms): {dict(info) or 'none'}")
    stragglers = kinds.get("straggler", 0)
    print(f"stragglers: {stragglers}; {1000 * stragglers / gpu_days:.2f} per 1,000 GPU-days, "
          f"95 % upper bound {1000 * poisson_upper(stragglers) / gpu_days:.2f}")
    print(f"false alarms: {len(alarms)} {dict(kinds)}; "
          f"{1000 * len(alarms) / gpu_days:.2f} per 1,000 GPU-days, "
          f"95 % upper bound {1000 * upper / gpu_days:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
