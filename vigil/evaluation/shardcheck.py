"""Sharded against one-stage detections on one stream of samples (issue #46).

``compare`` replays the same samples (and step batches) once with the one-stage
``ReplayRunner`` and once with ``ShardedReplayRunner`` at each shard count, every
summary passing through ``vigil.summary/2``'s encoder and decoder (split in parts as
Kafka would carry them), and reports, per shard count, the detections found by one
and not the other. A detection is compared by kind, state, node, GPU, start time,
detection time and incident id (its evidence too, with ``evidence=True``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vigil_gpu_monitor.contracts import STEP_SCHEMA
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.jobclock import decode_jobclock, encode_jobclock
from vigil_gpu_monitor.contracts.messages import Detection, JobClock, Summary
from vigil_gpu_monitor.contracts.shards import shard_of
from vigil_gpu_monitor.contracts.summary import decode_summary, encode_summary, split_parts
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardedReplayRunner, ShardEngine

Key = tuple[Any, ...]


def detection_key(det: Detection, evidence: bool = False) -> Key:
    """What two runs must agree on for a detection."""
    base = (det["kind"], det["state"], det["job"], det["node"], det["gpu"],
            det["started_at"], det["detected_at"], det["id"])
    return (*base, json.dumps(det["evidence"], sort_keys=True)) if evidence else base


def over_the_wire(summary: Summary) -> Summary:
    """The summary as stage 2 would read it from Kafka: split in parts, each encoded
    and decoded (validated both ways), then put together again."""
    parts = [decode_summary(encode_summary(p)) for p in split_parts(summary)]
    whole: Summary = {**parts[0], "part": 0, "parts": 1, "nodes": {}, "health": {}}
    for p in parts:
        whole["nodes"].update(p["nodes"])
        whole["health"].update(p["health"])
        if "clocks" in p:
            whole.setdefault("clocks", {}).update(p["clocks"])
    return whole


@dataclass
class Outcome:
    """One shard count's comparison."""

    shards: int
    one: int  # detections of one stage
    sharded: int
    only_one: list[Key] = field(default_factory=list)
    only_sharded: list[Key] = field(default_factory=list)
    same_order: bool = True
    late_one: int = 0
    late_sharded: int = 0
    seconds: float = 0.0
    summaries: int = 0

    @property
    def equal(self) -> bool:
        """The same detections (as a multiset)."""
        return not self.only_one and not self.only_sharded


class KafkaModeRunner:
    """The shards as over Kafka: each on its own clock and watermark
    (``ShardEngine.seal_closed``), stage 2 evaluating a bin once every shard summarised
    it (``JobStage2.evaluate_ready``), and shard 0's summaries held back by ``lag``
    samples (another partition, another worker, behind). With ``feedback`` (a count
    of samples), stage 2's ``vigil.jobclock/1`` reaches every shard of the job that
    many samples after stage 2 wrote it (the topic's round trip), through the
    contract's encoder and decoder; each shard then takes it and seals what the
    job's watermark closed, as stage 1's timer does. Step batches are not handled
    (none of the traces compared here has them)."""

    def __init__(self, cfg: DetectConfig, shards: int, lag: int = 200,
                 nodes: dict[str, set[str]] | None = None,
                 feedback: int | None = None) -> None:
        self.cfg, self.k, self.lag, self.feedback = cfg, shards, lag, feedback
        self.pending: list[tuple[int, JobClock]] = []  # (due at sample count, job clock)
        self.heard: dict[tuple[str, int], int] = {}  # shard → sample count at its last sample
        self.fed_at: dict[tuple[str, int], int] = {}  # shard → count at its last job clock
        # a job whose nodes leave a shard empty is one shard (a real job of K shards
        # has K x shard_nodes nodes; this bench forces K on small jobs)
        self.k_of = {job: shards if len({shard_of(n, shards) for n in names}) == shards
                     else 1 for job, names in (nodes or {}).items()}
        self.shards: dict[tuple[str, int], ShardEngine] = {}
        self.stage2: dict[str, JobStage2] = {}
        self.held: list[Summary] = []
        self.count = 0
        self.jobs = self.stage2

    def _deliver(self, summary: Summary) -> list[Detection]:
        stage = self.stage2[summary["job"]]
        out = stage.receive(over_the_wire(summary)) + stage.evaluate_ready()
        clock = stage.jobclock_due()
        if clock is not None and self.feedback is not None:
            self.pending.append((self.count + self.feedback,
                                 decode_jobclock(encode_jobclock(clock))))
        return out

    def _route(self, k: int, count: int, summaries: list[Summary]) -> list[Detection]:
        out: list[Detection] = []
        for summary in summaries:
            if k == 0 and count > 1:
                self.held.append(summary)
            else:
                out.extend(self._deliver(summary))
        return out

    def _feed_back(self) -> list[Detection]:
        """Every job clock due by now to every shard of its job."""
        out: list[Detection] = []
        while self.pending and self.pending[0][0] <= self.count:
            _, clock = self.pending.pop(0)
            for (job, k), shard in list(self.shards.items()):
                if job != clock["job"]:
                    continue
                quiet = self.heard.get((job, k), 0) <= self.fed_at.get((job, k), -1)
                shard.take_jobclock(clock, watermark=quiet)
                self.fed_at[(job, k)] = self.count
                if quiet:
                    out.extend(self._route(k, shard.shards, shard.seal_closed()))
        return out

    def feed(self, sample: Any) -> list[Detection]:
        """One sample through its shard; summaries to stage 2 (shard 0's late)."""
        if not sample["job"]:
            return []
        count = self.k_of.get(sample["job"], self.k)
        k = shard_of(sample["node"], count)
        key = (sample["job"], k)
        shard = self.shards.get(key)
        if shard is None:
            shard = self.shards[key] = ShardEngine(sample["job"], k, count, self.cfg)
            self.stage2.setdefault(sample["job"], JobStage2(sample["job"], count, self.cfg))
        out = self._route(k, count, shard.ingest(sample) + shard.seal_closed())
        self.count += 1
        self.heard[key] = self.count
        out.extend(self._feed_back())
        if self.count % self.lag == 0:
            out.extend(self.flush())
        return out

    def flush(self) -> list[Detection]:
        """Deliver what is held back."""
        held, self.held = self.held, []
        return [d for s in held for d in self._deliver(s)]

    def feed_steps(self, batch: Any) -> list[Detection]:
        """Not handled: see the class docstring."""
        raise NotImplementedError("step batches in Kafka mode")

    def late(self) -> int:
        """Late samples over every shard."""
        return sum(s.engine.late for s in self.shards.values())


def _run(runner: Any, lines: Iterable[Any]) -> list[Detection]:
    out: list[Detection] = []
    for line in lines:
        if line.get("schema") == STEP_SCHEMA:
            out.extend(runner.feed_steps(line))
        else:
            out.extend(runner.feed(line))
    if isinstance(runner, KafkaModeRunner):
        out.extend(runner.flush())
    return out


def compare(lines: Callable[[], Iterable[Any]], shard_counts: Iterable[int],
            cfg: DetectConfig | None = None, wire: bool = True,
            evidence: bool = False, kafka_lag: int = 0,
            feedback: int | None = None) -> tuple[float, list[Outcome]]:
    """One stage against each shard count on the samples ``lines()`` yields (called
    once a run); the one-stage run's seconds and an ``Outcome`` per shard count.
    ``kafka_lag``: run the shards as over Kafka (``KafkaModeRunner``) instead, shard
    0's summaries that many samples behind; ``feedback``: with the job-clock feedback,
    each job clock that many samples on its way."""
    cfg = cfg or DetectConfig()
    t0 = time.perf_counter()
    one = ReplayRunner(cfg)
    found = _run(one, lines())
    one_seconds = time.perf_counter() - t0
    late_one = sum(e.late for e in one.engines.values())
    keys = [detection_key(d, evidence) for d in found]
    outcomes = []
    for k in shard_counts:
        t0 = time.perf_counter()
        nodes: dict[str, set[str]] = {}
        if kafka_lag:
            for line in lines():
                if line.get("schema") != STEP_SCHEMA and line["job"]:
                    nodes.setdefault(line["job"], set()).add(line["node"])
        runner: Any = (KafkaModeRunner(cfg, k, kafka_lag, nodes, feedback) if kafka_lag
                       else ShardedReplayRunner(cfg, k, over_the_wire if wire else None))
        got = [detection_key(d, evidence) for d in _run(runner, lines())]
        a, b = sorted(keys), sorted(got)
        only_one = _minus(a, b)
        only_sharded = _minus(b, a)
        outcomes.append(Outcome(k, len(keys), len(got), only_one, only_sharded, keys == got,
                                late_one, runner.late(), time.perf_counter() - t0,
                                sum(getattr(j, "summaries", 0) for j in runner.jobs.values())))
    return one_seconds, outcomes


def _minus(a: list[Key], b: list[Key]) -> list[Key]:
    """What of sorted ``a`` is not in sorted ``b`` (multisets)."""
    left = list(b)
    out = []
    for item in a:
        try:
            left.remove(item)
        except ValueError:
            out.append(item)
    return out
