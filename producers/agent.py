"""The node agent loop: read every source once per base tick, let the adaptive
sampler choose what to publish, hand the sample to the publisher. Never blocks on
the publisher; a source that fails is counted and skipped for that tick.

Only catalog metrics leave the node: sources produce catalog names, the sampler
drops anything else, and the contract's encoder refuses unknown names. No process
names, command lines or user data are read.

One bad value costs one value: a reading the contract refuses on its own (outside
its range, not finite) is taken out before the sampler sees it (so it is never
averaged into a published mean), counted per metric and reason
(``vigil_agent_readings_dropped_total``) and logged once per metric and reason; the
node's other readings are published.

A tick in which no source read anything (every source failed, or answered empty), or
in which the node's GPU sources (``gpu_sources``) read no GPU, is never published: a
sample without GPUs would read as a node with nothing wrong. The node then reads as
silent downstream (``node_silent``), the agent counts it
(``vigil_agent_errors_total{kind="blind"}``) and logs it once per streak.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from vigil_gpu_monitor.contracts import SAMPLE_SCHEMA
from vigil_gpu_monitor.contracts.codec import drop_bad_readings
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.producers.reading import Reading, Source
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler

log = logging.getLogger(__name__)
AGENT_VERSION = "vigil-agent/0.1"
# What a source may put in a sample's meta: identities, and XIDs from before the agent
# watched (context for a person, never an event).
META_KEYS = ("gpu_models", "gpu_uuids", "xid_history")


class Sink(Protocol):
    def publish(self, sample: Sample) -> None: ...


class Agent:
    """One node's agent: sources → sampler → sink."""

    def __init__(self, node: str, sources: dict[str, Source], sink: Sink,
                 sampler: AdaptiveSampler | None, job_of: Callable[[], str],
                 wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 gpu_sources: frozenset[str] = frozenset()) -> None:
        self.node = node
        self.sources = sources
        self.sink = sink
        self.sampler = sampler
        self.job_of = job_of
        self.wall = wall
        self.monotonic = monotonic
        self.errors: Counter[str] = Counter()
        self.gpu_sources = gpu_sources  # sources that read GPUs: none read = blind
        self.blind_ticks = 0  # consecutive ticks in which nothing (or no GPU) was read
        self.dropped: Counter[tuple[str, str]] = Counter()  # (metric, reason) → readings
        self.ticks = 0

    def tick(self) -> Sample:
        """Read, sample and publish once; returns the sample built (not handed to the
        sink when no source read anything: ``blind_ticks`` counts those)."""
        now = self.monotonic()
        reading = Reading()
        for name, source in self.sources.items():
            try:
                reading.merge(source.read(now))
            except Exception as exc:  # one broken source must not stop the others
                self.errors[f"source:{name}:{type(exc).__name__}"] += 1
                log.warning("source %s failed: %s", name, exc)
        sample: Sample = {
            "schema": SAMPLE_SCHEMA, "ts": round(self.wall(), 3), "job": self.job_of(),
            "node": self.node,
            "gpus": {g: dict(m) for g, m in reading.gpus.items()}, "host": dict(reading.host),
            "nics": {n: dict(m) for n, m in reading.nics.items()},
            "meta": {"agent": AGENT_VERSION, **{k: v for k, v in reading.meta.items()
                                                 if k in META_KEYS}},
        }
        if not (reading.gpus or reading.host or reading.nics) or (
                self.gpu_sources & set(self.sources) and not reading.gpus):
            self.errors["blind"] += 1
            self.blind_ticks += 1
            if self.blind_ticks == 1:
                log.error("no GPU or no reading at all from %s: nothing published, so the "
                          "node reads as silent rather than healthy", ", ".join(self.sources))
            self.ticks += 1
            return sample
        if self.blind_ticks:
            log.info("sources read again after %d blind tick(s)", self.blind_ticks)
            self.blind_ticks = 0
        for bad in drop_bad_readings(sample):
            key = (bad.metric, bad.reason)
            if key not in self.dropped:  # once per metric and reason, not every tick
                log.warning("reading dropped, the rest of the sample published: %s (%s); "
                            "counted in vigil_agent_readings_dropped_total", bad.detail,
                            bad.reason)
            self.dropped[key] += 1
        if self.sampler is not None:
            sample = self.sampler.thin(sample, now)
        try:
            self.sink.publish(sample)
        except Exception as exc:  # a sample the contract refuses: count it, go on
            self.errors[f"publish:{type(exc).__name__}"] += 1
            log.warning("sample not published: %s", exc)
        self.ticks += 1
        return sample

    def run(self, interval: float, stop: threading.Event) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set (drift-free schedule)."""
        next_tick = self.monotonic()
        while not stop.is_set():
            self.tick()
            next_tick += interval
            delay = next_tick - self.monotonic()
            if delay < 0:  # a slow tick: skip the missed slots rather than burst
                next_tick = self.monotonic()
                delay = 0
            stop.wait(delay)
