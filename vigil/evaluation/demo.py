"""`make demo`: a guided tour of Vigil on the local stack, about three to four minutes.

A simulated 32-node cluster (4 jobs × 8 nodes × 8 GPUs: data parallel, tensor +
pipeline parallel, mixture-of-experts, data parallel) streams its samples in real
time through the real pipeline: Kafka → the Faust worker → detections → the
alerter → Redis. Faults are injected on a schedule; the live view (`vigil top`)
shows the fleet while it runs, and a closing summary says what was detected, as
what, and how long after each fault began, and whether anything fired that should
not have. A last act (``demo_repair``, about a minute) runs on the local stack's real
Slurm: a detection makes Vigil drain a node, the repair is reported, checked and
verified, and the node is RESUMEd; skipped, saying so, where Slurm cannot start.
Exits non-zero if a fault went undetected or that node did not come back.
"""

from __future__ import annotations

import gzip
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from kafka import KafkaConsumer

from vigil_gpu_monitor.alerting.cost import lost_per_hour
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.contracts.messages import Detection, location
from vigil_gpu_monitor.detectors.baseline import StaticRules
from vigil_gpu_monitor.detectors.cost import gpu_hours_lost
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.evaluation import demo_repair
from vigil_gpu_monitor.vigil.evaluation.benchdetect import matches
from vigil_gpu_monitor.vigil.evaluation.costcheck import true_slowdown
from vigil_gpu_monitor.vigil.ops import localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics
from vigil_gpu_monitor.vigil.views import top

DURATION = 115.0
# The jobs ran this long before the tour starts, and their agents published: Vigil
# joins a running cluster, and its straggler test has learned each GPU's normal (the
# history is sent at once, ahead of the real-time part).
HISTORY = 90.0
SEED = 7
SETTLE = 20.0  # seconds after the simulation ends to collect the last detections
LOG_DIR = ".vigil/demo"


@dataclass(frozen=True)
class Step:
    """One scheduled fault and what the tour says about it."""

    at: float  # seconds after the start
    kind: str
    job: str
    node: str | None
    gpu: str | None
    story: str
    severity: float = 1.3


SCHEDULE = (
    Step(20, "slow_gpu", "llm-dp", "dp-03", "5",
         "a GPU of a data-parallel job slows down (clock throttled): every step waits for it"),
    Step(35, "nic_degraded", "llm-pp", "pp-05", None,
         "a node's InfiniBand link degrades in a pipeline job, with errors and back-pressure",
         1.25),
    Step(50, "xid", "moe-a", "moe-02", "1",
         "a GPU of the mixture-of-experts job reports XID 79 (fallen off the bus)", 79.0),
    Step(65, "hang", "vision-dp", None, None,
         "a whole job hangs in a collective: GPUs look busy but nothing moves"),
)
JOBS = (("llm-dp", "dp", "data_parallel"), ("llm-pp", "pp", "pipeline"),
        ("moe-a", "moe", "moe"), ("vision-dp", "vis", "data_parallel"))


def demo_cluster(start: float) -> Cluster:
    """The tour's cluster and its fault schedule (also the ground truth)."""
    jobs = [JobSpec(name, [f"{prefix}-{i:02d}" for i in range(8)], kind=kind)
            for name, prefix, kind in JOBS]
    faults = [Fault(s.kind, s.job, s.node, s.gpu, start + s.at, severity=s.severity)
              for s in SCHEDULE]
    return Cluster(jobs, faults)


def demo_simulator(cluster: Cluster, start: float) -> Simulator:
    """The tour's samples: ``HISTORY`` seconds before ``start``, then ``DURATION``."""
    return Simulator(cluster, start - HISTORY, seed=SEED)


def _spawn(args: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "vigil_gpu_monitor", *args], env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def _publish_realtime(cfg: Config, sim: Simulator, stop: threading.Event) -> None:
    """Send the simulated samples as their time comes (the agents' pace)."""
    from vigil_gpu_monitor.producers.publisher import KafkaPublisher

    pub = KafkaPublisher(cfg.kafka_bootstrap, topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                         **cfg.kafka_client)
    try:
        for sample in sim.samples(HISTORY + DURATION):
            delay = sample["ts"] - 1.0 - time.time()
            if delay > 0 and stop.wait(delay):
                return
            pub.publish(sample)
    finally:
        pub.close()


Truth = dict[str, list[tuple[float, float]]]


def static_rules(cluster: Cluster, start: float) -> tuple[list[dict[str, Any]], Truth]:
    """What today's static dcgm-exporter rules fire on the very same samples, and the
    simulator's truth of each job's step-time inflation (``Simulator.truth``)."""
    rules = StaticRules()
    sim = demo_simulator(cluster, start)
    fired = [d for sample in sim.samples(HISTORY + DURATION) for d in rules.feed(sample)]
    return fired, sim.truth


def _cost(lost: float | None) -> str:
    return "–" if lost is None or math.isnan(lost) else f"{lost:.3g}"


def _true_cost(truth: Truth, cluster: Cluster, label: dict[str, Any],
               det: Mapping[str, Any] | None) -> float | None:
    """GPU-hours per hour the fault truly cost when it was detected."""
    job = next(j for j in cluster.jobs if j.name == label["job"])
    if det is None or job.name not in truth:
        return None
    slowdown = true_slowdown(truth[job.name], label["start"], det["detected_at"])
    return gpu_hours_lost(len(job.nodes) * job.gpus_per_node, slowdown)


def _first(found: Sequence[Mapping[str, Any]], label: dict[str, Any],
           ) -> Mapping[str, Any] | None:
    hits = sorted((d for d in found if matches(d, label)), key=lambda d: d["detected_at"])
    return hits[0] if hits else None


def _delay(det: Mapping[str, Any] | None, label: dict[str, Any]) -> float:
    """Seconds from fault onset to detection (a detection on the onset sample is 0)."""
    return float("nan") if det is None else max(0.0, det["detected_at"] - label["start"])


def summary(cluster: Cluster, start: float, found: list[Detection],
            static: list[dict[str, Any]], truth: Truth | None = None) -> tuple[str, int]:
    """The closing table (Vigil, with each fault's estimated and true cost in GPU-hours
    per hour, beside the static rules) and the faults Vigil missed."""
    firing = [d for d in found if d["state"] == "firing"]
    lines = [f"{'t+':>5}  {'fault':<13} {'job':<10} {'where':<14} "
             f"{'Vigil: detected as':<19} {'delay':>6} {'cost':>6} {'true':>6}   static rules"]
    missed = 0
    explained: set[str] = set()
    for label in cluster.labels():
        explained.update(d["id"] for d in firing if matches(d, label))
        first, rule = _first(firing, label), _first(static, label)
        missed += first is None
        costed = [d for d in firing if matches(d, label) and lost_per_hour(d) is not None]
        estimate = lost_per_hour(costed[0]) if costed else None
        true = _true_cost(truth, cluster, label, costed[0] if costed else first) \
            if truth else None
        lines.append(
            f"{label['start'] - start:>4.0f}s  {label['kind']:<13} {label['job']:<10} "
            f"{location(label['node'], label['gpu']):<14} "
            f"{first['kind'] if first else 'MISSED':<19} "
            f"{_delay(first, label):>5.0f}s {_cost(estimate):>6} {_cost(true):>6}   "
            + (f"{rule['rule']} after {_delay(rule, label):.0f}s" if rule else "missed"))
    false = [d for d in firing if d["id"] not in explained]
    lines.append(f"\n{len(cluster.labels()) - missed} of {len(cluster.labels())} faults "
                 f"detected; {len(false)} detection(s) with no fault behind them"
                 + "".join(f"\n  unexplained: {d['kind']} {d['job']} "
                           f"{location(d['node'], d['gpu'])}: {d['summary']}" for d in false))
    lines.append("cost: GPU-hours per hour lost, as Vigil estimated it at detection and as the "
                 "simulator knows it\n(– : the fault does not slow its job, or no estimate).")
    lines.append("Static rules: XID, ECC, temperature, slowdown and PCIe-width thresholds as "
                 "dcgm-exporter +\nPrometheus users run them (detectors/baseline.py), fed the "
                 "same samples.")
    return "\n".join(lines), missed


def main() -> int:
    """Run the tour, then the repair act (``demo_repair``); returns non-zero when an
    injected fault was not detected or the node taken out did not come back."""
    run = time.strftime("%Y%m%d-%H%M%S")
    env = dict(os.environ, VIGIL_KAFKA_TOPIC_PREFIX=f"demo-{run}.",
               VIGIL_WORKER_APP_ID=f"vigil-demo-{run}", VIGIL_ALERTER_GROUP_ID=f"demo-{run}",
               VIGIL_REDIS_KEY_PREFIX=f"vigil-demo-{run}", VIGIL_WORKER_STATUS_SECONDS="2",
               VIGIL_ALERTER_METRICS_PORT="0")
    cfg = load(env=env)
    started = [name for name, svc in localstack.services(cfg).items() if svc.pid() is None]
    print("=== Vigil demo: starting the local stack (real Kafka in KRaft mode, real Redis)",
          flush=True)
    localstack.up(cfg)
    ensure_topics(cfg)
    os.makedirs(LOG_DIR, exist_ok=True)
    try:
        missed = tour(cfg, env, run)
        back = demo_repair.run_act(os.environ, run, LOG_DIR)
    finally:
        if started:
            print(f"=== stopping what the demo started: {', '.join(started)}", flush=True)
            localstack.down(cfg, only=started)
    trace = trace_path(run)
    print(f"\n=== {'all faults detected' if not missed else f'{missed} fault(s) MISSED'}; "
          + {True: "the node Vigil took out came back, verified",
             False: "the node Vigil took out did NOT come back",
             None: "the repair act was skipped (Slurm could not start here)"}[back], flush=True)
    print(next_steps(trace, cfg, run, stack_stopped=bool(started)), flush=True)
    return 1 if missed or back is False else 0


def trace_path(run: str) -> str:
    """Where the tour leaves its samples as a trace."""
    return os.path.join(LOG_DIR, f"trace-{run}.jsonl.gz")


def write_trace(cluster: Cluster, start: float, run: str) -> None:
    """The tour's samples as a trace file (the simulator is deterministic: the very
    samples its agents published), so what comes next works without the stack."""
    with gzip.open(trace_path(run), "wb", compresslevel=3) as out:
        for sample in demo_simulator(cluster, start).samples(HISTORY + DURATION):
            out.write(encode_sample(sample) + b"\n")


def next_steps(trace: str, cfg: Config, run: str, stack_stopped: bool) -> str:
    """The demo's closing lines: commands that work now, after it ended."""
    lines = ["\n=== what next (these work now):",
             f"  vigil replay {trace}                  # the same detectors, offline",
             f"  vigil report llm-dp --trace {trace}   # a job's HTML report",
             f"  vigil select-metrics {trace}          # Moneo's metric selection"]
    if stack_stopped:
        lines += ["  vigil up; vigil worker & vigil alerter & vigil simulate &   # a live run",
                  "  vigil top; vigil alerts; vigil down   # watch it, list incidents, stop"]
    else:  # the stack runs on: the demo's incidents are still in Redis
        lines += [f"  VIGIL_REDIS_KEY_PREFIX={cfg.redis.key_prefix} vigil alerts   "
                  "# the demo's open incidents",
                  f"  VIGIL_KAFKA_TOPIC_PREFIX=demo-{run}. vigil report llm-dp   "
                  "# from the samples topic"]
    return "\n".join(lines)


def tour(cfg: Config, env: dict[str, str], run: str) -> int:
    """The fault tour on the running stack; the number of faults Vigil missed."""
    interactive = sys.stdout.isatty()
    procs = {name: _spawn([name], env, f"{LOG_DIR}/{name}-{run}.log")
             for name in ("worker", "alerter")}
    start = time.time() + 5  # give the worker a moment to join its group
    cluster = demo_cluster(start)
    print(f"=== a 32-node cluster: {', '.join(f'{n} ({k})' for n, _, k in JOBS)}; "
          f"{DURATION:.0f}s of samples, faults on this schedule:")
    for s in SCHEDULE:
        print(f"    t+{s.at:>3.0f}s  {s.story}")
    print(f"    (logs: {LOG_DIR}/; watch it yourself in another terminal with "
          f"VIGIL_REDIS_KEY_PREFIX={cfg.redis.key_prefix} vigil top)", flush=True)
    stop = threading.Event()
    feeder = threading.Thread(target=_publish_realtime,
                              args=(cfg, demo_simulator(cluster, start), stop),
                              daemon=True)
    feeder.start()
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", **cfg.kafka_client)
    found: list[Detection] = []
    try:
        next_frame = 0.0
        while time.time() < start + DURATION + SETTLE:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    det = decode_detection(record.value)
                    found.append(det)
                    if not interactive:
                        print(f"  t+{det['detected_at'] - start:>4.0f}s [{det['state']}] "
                              f"{det['kind']} {det['job']} {location(det['node'], det['gpu'])}: "
                              f"{det['summary']}", flush=True)
            if time.monotonic() >= next_frame:
                next_frame = time.monotonic() + (2 if interactive else 30)
                frame = top.render(top.gather(state), 120, 60, color=interactive)
                elapsed = max(0.0, time.time() - start)
                header = f"demo t+{elapsed:.0f}s of {DURATION:.0f}s\n"
                print(("\x1b[H\x1b[2J" if interactive else "\n") + header + frame, flush=True)
        table, missed = summary(cluster, start, found, *static_rules(cluster, start))
        print("\n=== summary: what was injected, what Vigil said, how long it took\n" + table)
        write_trace(cluster, start, run)
        return missed
    finally:
        stop.set()
        consumer.close()
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
