"""Adaptive sampling (Moneo §2.3) on every simulated job type and fault.

    .venv/bin/python bench/bench_sampling.py
    .venv/bin/python bench/bench_sampling.py --trace recorded.jsonl   # a recorded trace
    .venv/bin/python bench/bench_sampling.py --seed 2 --noise-sigmas 3  # sensitivity

For every node-series the simulator produces, the sampler decides what to publish.
Reported per job type: values read / values published (reduction), the peak
envelope error (Moneo's criterion: the max over each 30 s window of the published
series, held between publishes, against the same of the full-rate series, relative),
and for every injected fault whether its onset was published within one base
interval. ``--trace`` runs the same measurement over a recorded JSON-lines trace of
full-rate samples (record one with `VIGIL_AGENT_ADAPTIVE=false vigil agent --out F`).
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from vigil_gpu_monitor.contracts.catalog import CATALOG, Scope
from vigil_gpu_monitor.contracts.codec import decode_trace
from vigil_gpu_monitor.producers.sampler import NOISE_FLOOR, AdaptiveSampler, SamplingConfig
from vigil_gpu_monitor.simulator.cluster import Cluster, Event, Fault, JobSpec, Simulator

START = 1_000_000.0
_BY_NAME = {m.name: m for m in CATALOG}
ENVELOPE = 30
# the metrics in which each fault first shows; its onset counts as published when any
# of them publishes a changed value within one base interval
ONSET_METRIC = {"slow_gpu": ("sm_clock", "sm_active", "power"),
                "slow_node": ("sm_clock", "sm_active", "power"), "thermal": ("throttle",),
                "nvlink_degraded": ("nvlink_tx",), "pcie_downgrade": ("pcie_gen",),
                "xid": ("xid",), "ecc_dbe": ("ecc_dbe",), "hang": ("sm_active",),
                "nic_degraded": ("ib_rate",), "network_phase": ("sm_active", "ib_tx")}


Series = dict[tuple[str, str, str], list[tuple[float, float]]]


def measure(samples: Iterable[dict[str, Any]], seed: int = 1, origin: float | None = None,
            cfg: SamplingConfig | None = None) -> tuple[AdaptiveSampler, Series, list[float]]:
    """Offer every reading to the sampler; return it, what it published (times in
    seconds after ``origin``, by default the first sample's), and the peak envelope
    errors of every meaningful 30 s window."""
    sampler = AdaptiveSampler(cfg or SamplingConfig(), random.Random(seed))
    full: Series = defaultdict(list)
    pub: Series = defaultdict(list)
    start = origin
    for s in samples:
        start = s["ts"] if start is None else start
        t = s["ts"] - start
        for scope, devices in ((Scope.GPU, s["gpus"]), (Scope.NIC, s["nics"])):
            for dev, metrics in devices.items():
                for name, value in metrics.items():
                    key = (s["node"], dev, name)
                    full[key].append((t, value))
                    out = sampler.offer(scope, f"{s['node']}/{dev}", name, value, t)
                    if out is not None:
                        pub[key].append((t, out))
    errors = []
    for key, series in full.items():
        held, j, last = [], 0, None
        for t, _ in series:
            while j < len(pub[key]) and pub[key][j][0] <= t:
                last = pub[key][j][1]
                j += 1
            held.append(last if last is not None else 0.0)
        values = [v for _, v in series]
        unit = _BY_NAME[key[2]].unit
        meaningful = 10 * NOISE_FLOOR.get(unit, 0.0)  # relative error of ~0 is noise
        for w in range(0, len(values) - ENVELOPE + 1, ENVELOPE):
            peak = max(values[w:w + ENVELOPE])
            if peak > meaningful:
                errors.append(abs(max(held[w:w + ENVELOPE]) - peak) / peak)
    return sampler, pub, errors


def run(job_type: str, fault: str | None, seed: int = 1,
        cfg: SamplingConfig | None = None) -> dict[str, float]:
    nodes = [f"n{i}" for i in range(4)]
    job = JobSpec("j", nodes, kind=job_type, events=[Event("warmup", START, START + 40),
                                                     Event("checkpoint", START + 200,
                                                           START + 215)])
    at = START + 120.5
    faults = []
    if fault:
        node = None if fault in ("hang", "network_phase") else "n1"
        gpu = None if fault in ("hang", "network_phase", "slow_node", "nic_degraded") else "2"
        faults = [Fault(fault, "j", node, gpu, at, severity=79 if fault == "xid" else 1.3)]
    samples = Simulator(Cluster([job], faults), START, seed=seed).samples(300)
    sampler, pub, errors = measure(samples, seed, origin=START, cfg=cfg)
    onset_ok = 1.0
    if fault and fault in ONSET_METRIC:
        onset_ok = 0.0
        node = "n1" if faults[0].node else "n0"
        for metric in ONSET_METRIC[fault]:
            dev = faults[0].gpu or ("mlx5_0" if metric.startswith("ib_") else "0")
            published = pub[(node, dev, metric)]
            before = [v for t, v in published if t < 120.5]
            after = [(t, v) for t, v in published if 120.5 <= t <= 121.5]
            if after and (not before or after[0][1] != before[-1]):
                onset_ok = 1.0
    return {"read": sampler.read, "published": sampler.published,
            "p50_err": statistics.median(errors),
            "p99_err": sorted(errors)[int(0.99 * len(errors))],
            "onset_ok": onset_ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", help="a recorded JSON-lines trace instead of the simulator")
    parser.add_argument("--seed", type=int, default=1, help="simulator and jitter seed")
    parser.add_argument("--noise-sigmas", type=float, default=SamplingConfig.noise_sigmas,
                        help="the sampler's noise test (0: none, every >10%% wobble publishes)")
    args = parser.parse_args()
    cfg = SamplingConfig(noise_sigmas=args.noise_sigmas)
    if args.trace:
        with open(args.trace, "rb") as fh:
            sampler, _, errors = measure(decode_trace(fh),
                                         cfg=cfg)
        print(f"{args.trace}: reduction {sampler.read / max(1, sampler.published):.1f}x, "
              f"peak err p50 {statistics.median(errors):.1%} "
              f"p99 {sorted(errors)[int(0.99 * len(errors))]:.1%} ({len(errors)} windows)")
        return 0
    print(f"{'job type':14} {'fault':16} {'reduction':>9} {'peak err p50':>12} "
          f"{'p99':>6} {'onset<=1 tick':>13}")
    rows = []
    for job_type in ("data_parallel", "pipeline", "moe"):
        for fault in (None, *ONSET_METRIC):
            if fault == "network_phase" and job_type != "moe":
                continue
            r = run(job_type, fault, args.seed, cfg)
            rows.append((f"{job_type} {fault or 'healthy'}", r))
            print(f"{job_type:14} {fault or 'healthy':16} {r['read'] / r['published']:8.1f}x "
                  f"{r['p50_err']:11.1%} {r['p99_err']:6.1%} "
                  f"{'yes' if r['onset_ok'] else 'NO':>13}", flush=True)
    least = min(rows, key=lambda row: row[1]["read"] / row[1]["published"])
    worst = max(rows, key=lambda row: row[1]["p99_err"])
    print(f"seed {args.seed}, noise_sigmas {args.noise_sigmas:g}: least reduction "
          f"{least[1]['read'] / least[1]['published']:.1f}x ({least[0]}), worst p99 "
          f"{worst[1]['p99_err']:.1%} ({worst[0]}), onsets "
          f"{sum(int(r['onset_ok']) for _, r in rows)}/{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
