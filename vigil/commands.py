"""Subcommand bodies that wire stages together (simulate, replay, report, alerter, alerts)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from vigil_gpu_monitor.contracts import STEP_SCHEMA, topics
from vigil_gpu_monitor.contracts.codec import (
    ContractError,
    decode_sample,
    encode_detection,
    encode_sample,
)
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import VigilError
from vigil_gpu_monitor.contracts.messages import Sample, location
from vigil_gpu_monitor.vigil.progress import Progress
from vigil_gpu_monitor.vigil.reach import redis_client, require_kafka

log = logging.getLogger("vigil")


@contextmanager
def _open(path: str, mode: str) -> Iterator[IO[Any]]:
    if path == "-":
        yield sys.stdout.buffer if "w" in mode else sys.stdin.buffer
        return
    with open(path, mode) as fh:
        yield fh


def simulate(cfg: Config, args: argparse.Namespace) -> int:
    """Publish (or write) the demo cluster's samples. To Kafka they go at the pace of
    their timestamps (event time), so the live view never sees data from the future;
    ``--fast`` publishes them as fast as Kafka takes them (tests, benchmarks)."""
    from vigil_gpu_monitor.simulator.cluster import Simulator, demo_cluster

    start = args.start if args.start is not None else time.time()
    cluster = demo_cluster(args.jobs, args.nodes, start=start, slow_after=args.slow_after)
    sim = Simulator(cluster, start, seed=args.seed)
    if args.labels:
        with open(args.labels, "w") as fh:
            json.dump(cluster.labels(), fh, indent=2)
    if args.out:
        with _open(args.out, "wb") as out:
            for sample in sim.samples(args.duration):
                out.write(encode_sample(sample) + b"\n")
        return 0
    from vigil_gpu_monitor.producers.publisher import KafkaPublisher
    from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

    require_kafka(cfg)
    ensure_topics(cfg)
    pub = KafkaPublisher(cfg.kafka_bootstrap, topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                         **cfg.kafka_client)
    samples = sim.samples(args.duration)
    for sample in (samples if args.fast else paced(samples, start)):
        pub.publish(sample)
    pub.close()
    log.info("published %d samples (%d failed)", pub.sent, pub.failed)
    return 0 if pub.failed == 0 else 1


def paced(samples: Iterable[Sample], start: float,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> Iterator[Sample]:
    """The samples, each handed on no sooner than its timestamp's distance from
    ``start`` after the first: event time never runs ahead of the wall clock."""
    began = clock()
    for sample in samples:
        delay = (sample["ts"] - start) - (clock() - began)
        if delay > 0:
            sleep(delay)
        yield sample


def trace_samples(path: str, progress: Progress | None = None) -> Iterator[Sample]:
    """Valid samples of a trace (plain, gzip or zstd JSON lines); invalid lines are
    summarised once, and a trace with none valid is an error (``vigil.tracefile``)."""
    from vigil_gpu_monitor.vigil.tracefile import read_samples

    for count, sample in enumerate(read_samples(path), 1):
        if progress is not None:
            progress.update(f"{count:,} samples")
        yield sample


def _sample_or_steps(raw: bytes | str) -> Any:
    """One trace line: a ``vigil.step/1`` batch (lenient: a bad step costs that step) or
    a sample (the worker's fast decoder)."""
    from vigil_gpu_monitor.contracts.steps import decode_steps
    from vigil_gpu_monitor.streams.decode import decode_sample_fast

    steps = b'"vigil.step/1"' in raw if isinstance(raw, bytes) else '"vigil.step/1"' in raw
    if steps:
        return decode_steps(raw, [])
    return decode_sample_fast(raw)


def replay(cfg: Config, args: argparse.Namespace) -> int:
    """Run the detectors over a trace in event time and print detections as JSON lines.
    The trace may hold per-rank step timings (``vigil.step/1``) beside the samples, or
    instead of them."""
    from vigil_gpu_monitor.detectors.engine import ReplayRunner
    from vigil_gpu_monitor.detectors.shard import ShardedReplayRunner

    processes = getattr(args, "jobs", 1) or 1
    shards = getattr(args, "shards", 1) or 1
    if processes > 1 and args.trace != "-" and not _compressed(args.trace):
        done = _replay_over_processes(args.trace, args.out, processes, cfg, shards)
        if done:
            return 0
    from vigil_gpu_monitor.vigil.tracefile import read_samples

    runner: ReplayRunner | ShardedReplayRunner = (
        ReplayRunner(cfg.detect) if shards <= 1 else ShardedReplayRunner(cfg.detect, shards))
    progress = Progress("replay")
    found = 0
    with _open(args.out, "wb") as out:
        for count, line in enumerate(read_samples(args.trace, _sample_or_steps), 1):
            progress.update(f"{count:,} lines")
            fed = (runner.feed_steps(line) if line["schema"] == STEP_SCHEMA
                   else runner.feed(line))
            for detection in fed:
                found += 1
                out.write(encode_detection(detection) + b"\n")
    if isinstance(runner, ShardedReplayRunner):
        jobs, late = len(runner.jobs), runner.late()
    else:
        jobs, late = len(runner.engines), sum(e.late for e in runner.engines.values())
    progress.done(f"{jobs} jobs, {found} detections, {late} late samples"
                  + (f", {shards} shards a job" if shards > 1 else ""))
    return 0


def _compressed(trace: str) -> bool:
    """A compressed trace is replayed in one process (the plan reads plain lines); a
    path that cannot be read is left to the one-process path's error."""
    from vigil_gpu_monitor.vigil.tracefile import compressed

    try:
        return compressed(trace)
    except OSError:
        return True


def _replay_over_processes(trace: str, out_path: str, processes: int, cfg: Config,
                           shards: int = 1) -> bool:
    """`vigil replay --jobs N [--shards K]`: the trace's jobs over N processes
    (``vigil.replay_jobs``). False when the plan did not hold and one process must
    replay the trace instead."""
    from vigil_gpu_monitor.vigil.replay_jobs import replay_jobs
    from vigil_gpu_monitor.vigil.tracefile import skipped_summary

    progress = Progress("replay")
    outcome = replay_jobs(trace, processes, cfg.detect, shards)
    if outcome is None:
        log.warning("%s: the plan over processes did not hold (a line read otherwise "
                    "when decoded whole, or an invalid line moved a node); replaying in "
                    "one process", trace)
        return False
    with _open(out_path, "wb") as out:
        for detection in outcome.detections:
            out.write(detection + b"\n")
    if outcome.invalid:
        first = [f"line {n}: {why[:160]}" for n, why in sorted(outcome.invalid.items())]
        skipped_summary(trace, len(outcome.invalid), outcome.lines, first)
    progress.done(f"{outcome.jobs} jobs, {len(outcome.detections)} detections, "
                  f"{outcome.late} late samples, {processes} processes"
                  + (f", {shards} shards a job" if shards > 1 else ""))
    return True


def topic_samples(cfg: Config, job: str, progress: Progress | None = None,
                  ) -> Iterator[Sample]:
    """One job's valid samples in the samples topic, oldest first, up to its end now."""
    from kafka import KafkaConsumer, TopicPartition

    name = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    require_kafka(cfg)
    consumer = KafkaConsumer(bootstrap_servers=cfg.kafka_bootstrap, enable_auto_commit=False,
                             **cfg.kafka_client)
    try:
        parts = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
        if not parts:
            raise ContractError("unknown_topic", f"topic {name} not found")
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        key, read = job.encode(), 0
        while any(consumer.position(tp) < end[tp] for tp in parts):
            for records in consumer.poll(timeout_ms=1000, max_records=5000).values():
                for record in records:
                    read += 1
                    if record.key != key or record.offset >= end[TopicPartition(
                            record.topic, record.partition)]:
                        continue
                    try:
                        yield decode_sample(record.value)
                    except ContractError:
                        continue  # the worker dead-letters these; a report just skips
            if progress is not None:
                progress.update(f"{read:,} of {sum(end.values()):,} messages read")
    finally:
        consumer.close()


def report(cfg: Config, args: argparse.Namespace) -> int:
    """Write a job's HTML report from a trace or the samples topic."""
    from vigil_gpu_monitor.vigil.views.report import build
    from vigil_gpu_monitor.vigil.views.report_html import render

    progress = Progress(f"report {args.job}")
    samples = (trace_samples(args.trace, progress) if args.trace
               else topic_samples(cfg, args.job, progress))
    try:
        data = build(samples, args.job, cfg.detect)
    except ValueError as exc:
        raise VigilError(str(exc), fix="`vigil alerts` or the trace names the jobs; check "
                         "the job id") from None
    out = args.out or f"vigil-report-{args.job}.html"
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(render(data))
    progress.done(f"{data.samples:,} samples, {len(data.detections)} detections → {out}")
    return 0


def alerter(cfg: Config, args: argparse.Namespace) -> int:
    """Consume detections into Redis live state until stopped."""
    from vigil_gpu_monitor.alerting.service import run_alerter

    require_kafka(cfg)
    return run_alerter(cfg, max_seconds=args.max_seconds)


def alerts(cfg: Config, args: argparse.Namespace) -> int:
    """Print open incidents from Redis, costliest first (GPU-hours lost per hour;
    those without an estimate after, newest first)."""
    from vigil_gpu_monitor.alerting.cost import by_cost, lost_per_hour
    from vigil_gpu_monitor.alerting.state import LiveState

    state = LiveState(redis_client(cfg), cfg.redis.key_prefix)
    rows = state.open_incidents(job=args.job)
    rows = [r for r in rows if (not args.kind or r["kind"] == args.kind)
            and (not args.severity or r["severity"] == args.severity)]
    if not rows:
        print("no open incidents")
    else:
        print(f"{'id':16} {'severity':8} {'kind':13} {'job':12} {'where':28} "
              f"{'GPU-h/h':>8} summary")
    for det in by_cost(rows):
        where = location(det["node"], det["gpu"])
        lost = lost_per_hour(det)
        cost = "–" if lost is None else f"{lost:.3g}"
        print(f"{det['id']:16} {det['severity']:8} {det['kind']:13} {det['job']:12} "
              f"{where:28} {cost:>8} {det['summary']}")
    return 0


def select_metrics(cfg: Config, args: argparse.Namespace) -> int:
    """Print the representative metric subset of a trace and the groups (Moneo §2.2)."""
    import numpy as np

    from vigil_gpu_monitor.contracts.catalog import GPU_METRICS
    from vigil_gpu_monitor.detectors.selection import select_metrics as select

    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    for sample in trace_samples(args.trace):
        for gpu, readings in sample["gpus"].items():
            key = (sample["node"], gpu)
            per = rows.setdefault(key, {})
            for name in GPU_METRICS:
                per.setdefault(name, []).append(float(readings.get(name, np.nan)))
    if not rows:
        print("no samples in the trace")
        return 1
    length = min(len(r[next(iter(GPU_METRICS))]) for r in rows.values())
    arrays = {m: np.array([r[m][:length] for r in rows.values()], dtype=np.float64)
              for m in GPU_METRICS}
    health = frozenset(m for m, spec in GPU_METRICS.items() if spec.health)
    result = select(arrays, args.min_variance, args.max_distance, always_keep=health)
    print(f"{len(rows)} GPUs x {length} steps; kept {len(result.keep)} of {len(arrays)} "
          f"GPU metrics")
    print(f"constant (variance < {args.min_variance:g}): {', '.join(result.constant) or '-'}")
    for rep, members in result.groups.items():
        others = [m for m in members if m != rep]
        print(f"keep {rep:14} {'stands for ' + ', '.join(others) if others else ''}")
    print(f"always kept (health signals): {', '.join(sorted(health))}")
    print("agent catalog: metrics = " + json.dumps(result.keep))
    return 0


def _silences(cfg: Config) -> Any:
    from vigil_gpu_monitor.alerting.silences import SilenceStore

    return SilenceStore(redis_client(cfg), cfg.redis.key_prefix)


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise VigilError(f"--for {text!r} is not a duration", fix="use 90s, 30m, 2h or 1d")
    return seconds


# the labels a detection carries, which a silence may match (alerting/silences.py)
SILENCE_LABELS = ("kind", "severity", "job", "node", "gpu", "incident")


def _matchers(items: list[str]) -> dict[str, str]:
    """``--match label=value`` options, refused when no detection could carry them: an
    unknown label, or a kind or severity that matches none (a misspelt silence would
    silence nothing, silently)."""
    import fnmatch

    from vigil_gpu_monitor.contracts.codec import DETECTION_KINDS, SEVERITIES

    matchers: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise VigilError(f"--match {item!r} is not label=value",
                             fix="for example --match kind=straggler --match job='prod-*'")
        if key not in SILENCE_LABELS:
            raise VigilError(f"--match {item!r}: no detection carries a label {key!r}",
                             fix=f"use one of {', '.join(SILENCE_LABELS)}")
        known = {"kind": DETECTION_KINDS, "severity": SEVERITIES}.get(key)
        if known is not None and not fnmatch.filter(known, value):
            raise VigilError(f"--match {item!r}: no detection has {key} {value!r}",
                             fix=f"use one of {', '.join(known)}")
        matchers[key] = value
    if not matchers:
        raise VigilError("a silence needs at least one --match label=value",
                         fix="for example --match kind=straggler")
    return matchers


def silence(cfg: Config, args: argparse.Namespace) -> int:
    """Add, list or expire silences (shared by every alerter through Redis)."""
    import getpass

    if args.action == "add":
        matchers = _matchers(args.match or [])
        seconds = _duration(args.duration)
        store = _silences(cfg)
        ident = store.add(matchers, seconds, args.by or getpass.getuser(), args.comment or "")
        print(f"silence {ident}")
    elif args.action == "list":
        active = _silences(cfg).active()
        if not active:
            print("no active silences")
        for ident, s in sorted(active.items(), key=lambda kv: kv[1]["ends_at"]):
            left = (s["ends_at"] - time.time()) / 60
            match = " ".join(f"{k}={v}" for k, v in s["matchers"].items())
            print(f"{ident}  {match:40} {left:6.0f} min left  by {s['by']}: {s['comment']}")
    elif args.action == "expire":
        if not args.id:
            raise VigilError("`vigil silence expire` needs the silence's id",
                             fix="`vigil silence list` shows the ids")
        if not _silences(cfg).expire(args.id):
            raise VigilError(f"no active silence {args.id!r}",
                             fix="`vigil silence list` shows the ids")
        print(f"silence {args.id} expired")
    return 0


def ack(cfg: Config, args: argparse.Namespace) -> int:
    """Acknowledge an incident: pager channels stop re-notifying it."""
    import getpass

    from vigil_gpu_monitor.alerting.state import LiveState

    store = _silences(cfg)
    state = LiveState(store.r, cfg.redis.key_prefix)
    if not any(d["id"] == args.incident for d in state.open_incidents()):
        pattern = state.incident_key("*", _glob_escape(args.incident))
        if next(iter(store.r.scan_iter(match=pattern, count=1000)), None) is None:
            raise VigilError(f"no incident {args.incident!r}",
                             fix="`vigil alerts` lists the open incidents with their ids")
        print(f"{args.incident} is resolved already", file=sys.stderr)
    store.ack(args.incident, args.by or getpass.getuser())
    print(f"acknowledged {args.incident}")
    return 0


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis SCAN pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def actions(cfg: Config, args: argparse.Namespace) -> int:
    """Print the remediation audit (every decision, acted on or not, and why), then
    each node's repair lifecycle: every state change, why, and who made it."""
    from vigil_gpu_monitor.alerting.remediation import audit_log
    from vigil_gpu_monitor.alerting.repair import RepairLog

    r = redis_client(cfg)
    rows = audit_log(r, cfg.redis.key_prefix, args.count)
    rows = [x for x in rows if (not args.job or x["job"] == args.job)
            and (not args.node or x["node"] == args.node)]
    if not rows:
        print("no remediation decisions")
    for x in rows:
        print(f"{_when(x['decided_at'])} {x['decision']:9} {x['action']:17} {x['job']:12} "
              f"{location(x['node'], x.get('gpu'))}: {x['why']}")
    changes = RepairLog(r, cfg.redis.key_prefix).history(args.node, args.count)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for change in reversed(changes):
        by_node.setdefault(change["node"], []).append(change)
    for node, steps in sorted(by_node.items()):
        print(f"\nlifecycle of {node}:")
        for step in steps:
            print(f"  {_when(step['at'])} {step['from']:>15} -> {step['to']:15} "
                  f"by {step['who']}: {step['why']}")
    return 0


def nodes(cfg: Config, args: argparse.Namespace) -> int:
    """Nodes Vigil holds out of service: state, since when, why, GPU-hours out."""
    from vigil_gpu_monitor.alerting.repair import RepairLog, gpu_hours

    out = RepairLog(redis_client(cfg), cfg.redis.key_prefix).out_nodes()
    if not out:
        print("no nodes out of service")
        return 0
    now = time.time()
    print(f"{'node':16} {'state':15} {'since':19} {'out for':>8} {'GPU-h':>7} why")
    for node, rec in out.items():
        hours = (now - float(rec.get("out_at") or now)) / 3600
        print(f"{node:16} {rec['state']:15} {_when(float(rec['since'])):19} {hours:7.1f}h "
              f"{gpu_hours(rec, now):7.1f} {rec.get('why', '')}")
    return 0


def repair(cfg: Config, args: argparse.Namespace) -> int:
    """``vigil repair done NODE``: a person reports a node repaired; Vigil verifies it
    and returns it (or holds it out with the reason)."""
    import getpass

    from vigil_gpu_monitor.alerting.repair import RepairLog, TransitionRefused, repair_done

    log_ = RepairLog(redis_client(cfg), cfg.redis.key_prefix)
    try:
        repair_done(log_, args.node, args.by or getpass.getuser(), args.note or "")
    except TransitionRefused as exc:
        raise VigilError(str(exc), fix="`vigil nodes` lists the nodes Vigil holds out") from None
    print(f"{args.node}: verifying (the alerter runs the check, then watches the evidence)")
    return 0
