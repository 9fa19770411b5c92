"""One job's samples and step timings, folded in event-time order although they
arrive on two topics.

Why: the engine evaluates a bin once the job's event time passes its end plus the
grace. A step batch that arrives after that is late and lost; one that arrives ahead
of the counters moves the job's event time past samples still to come. Kafka orders
each topic alone, and a worker catching up on a backlog (a restart, an outage) reads
the two topics at whatever pace its fetches give. So in a job that sends both, each
kind waits for the other:

- a sample is folded once the job's step timings have come within ``slack`` seconds
  (the engine's grace) of its time: no step of a bin it could close is still to come;
- a step batch is folded once the job's folded samples have reached its latest end,
  right after the sample that passes it, as the node agent sends it and as
  ``vigil replay`` reads a trace: timings then never move a job's event time ahead
  of its counters, and the engine decides what replay of the same records decides
  (or before the next sample, where that one is more than ``slack`` later: a gap
  in the counters must not make the timings late).

A job this worker holds no checkpoint of may send timings it has not seen yet (a
backlog fetched samples first): its samples wait up to ``first_wait_seconds`` of wall
time for a first step batch (the worker waits 3 s; 0, the default, waits not at all).

Every wait is bounded. A kind whose stream has been silent for ``quiet_seconds`` of
wall time is not waited for (a job without a witness, a witness that stopped, a job
watched from timings alone), and a job holds at most ``max_held`` messages (then
the oldest goes; steps that become late are counted by the engine). There is no
bound in event time: a worker catching up reads up to ``worker.fetch_bytes_per_partition``
of each topic at once, and 4 MiB of a small job's timings is minutes ahead of its
samples (seen in the Kafka test: the whole 7-minute trace). A job that never sent
timings waits for nothing: samples-only jobs fold exactly as before.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class AlignParams:
    """How long one kind waits for the other (see the module docstring)."""

    slack: float = 5.0  # seconds: the engine's grace (detect.grace_seconds)
    quiet_seconds: float = 10.0  # wall seconds of silence after which a kind is not waited for
    max_held: int = 10_000  # messages one job may hold waiting
    first_wait_seconds: float = 0.0  # wall seconds a new job's samples wait for timings


class Held(NamedTuple, Generic[T]):
    """One message waiting: its time (a sample's ``ts``, a step batch's latest
    ``end``), where it came from and what it carries."""

    time: float
    tp: tuple[str, int]  # (topic, partition)
    offset: int
    item: T
    wait: float | None = None  # a sample's: its record's time less its own (detectors/delivery.py)


class JobAligner(Generic[T]):
    """Holds one job's messages until each may be folded (``release``)."""

    def __init__(self, params: AlignParams, now: float,
                 state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.params = params
        self.samples_at: float | None = state.get("samples_at")  # latest folded sample ts
        # the job sends step timings (None: not known yet, a job new to this worker)
        self.timed: bool | None = (state.get("timed", False) if state
                                   else None if params.first_wait_seconds > 0 else False)
        self.began = now
        self.steps_at: float | None = None  # latest step end seen (folded or waiting)
        self.samples: deque[Held[T]] = deque()
        self.steps: deque[Held[T]] = deque()
        self.sample_heard = now  # wall time a sample last arrived (or this began)
        self.steps_heard = now
        self.forced: Counter[str] = Counter()  # releases a bound forced, by reason

    def to_state(self) -> dict[str, Any]:
        """What a checkpoint keeps (the waiting messages are read again instead)."""
        return {"samples_at": self.samples_at, "timed": self.timed}

    @property
    def held(self) -> int:
        """Messages waiting."""
        return len(self.samples) + len(self.steps)

    def add_sample(self, ts: float, tp: tuple[str, int], offset: int, item: T, now: float,
                   wait: float | None = None) -> None:
        self.samples.append(Held(ts, tp, offset, item, wait))
        self.sample_heard = now

    def add_steps(self, end: float, tp: tuple[str, int], offset: int, item: T, now: float) -> None:
        self.steps.append(Held(end, tp, offset, item))
        self.steps_at = end if self.steps_at is None else max(self.steps_at, end)
        self.timed = True
        self.steps_heard = now

    def floor(self, tp: tuple[str, int]) -> int | None:
        """The lowest waiting offset of ``tp`` (None: none waits): nothing from it on
        may be committed, it is in no checkpoint."""
        for queue in (self.samples, self.steps):
            for held in queue:  # one topic's messages wait in offset order
                if held.tp == tp:
                    return held.offset
        return None

    def release(self, now: float) -> list[tuple[bool, Held[T]]]:
        """The messages that may be folded now, in the order to fold them: (is a step
        batch, the message)."""
        out: list[tuple[bool, Held[T]]] = []
        while self.samples or self.steps:
            if self.steps and self._steps_go(now):
                out.append((True, self.steps.popleft()))
            elif self.samples and self._sample_goes(now):
                held = self.samples.popleft()
                self.samples_at = (held.time if self.samples_at is None
                                   else max(self.samples_at, held.time))
                out.append((False, held))
            elif self.held > self.params.max_held:
                self.forced["full"] += 1
                first_steps = not self.samples or (
                    self.steps and self.steps[0].time < self.samples[0].time)
                if first_steps:
                    out.append((True, self.steps.popleft()))
                else:
                    held = self.samples.popleft()
                    self.samples_at = max(self.samples_at or held.time, held.time)
                    out.append((False, held))
            else:
                break
        return out

    def _steps_go(self, now: float) -> bool:
        end = self.steps[0].time
        if self.samples_at is not None and end <= self.samples_at:
            return True
        if self.samples and end < self.samples[0].time - self.params.slack:
            return True  # the counters resume well after it (a gap in them): it goes first
        if now - self.sample_heard >= self.params.quiet_seconds and not self.samples:
            self.forced["quiet"] += 1  # no counters to wait for
            return True
        return False

    def _sample_goes(self, now: float) -> bool:
        if self.timed is None and now - self.began >= self.params.first_wait_seconds:
            self.timed = False  # no timings came: a samples-only job
        if not self.timed:
            return self.timed is False
        ts = self.samples[0].time
        if self.steps_at is not None and ts <= self.steps_at + self.params.slack:
            return True
        if now - self.steps_heard >= self.params.quiet_seconds and not self.steps:
            self.timed = False  # its timings stopped: fold its counters unhindered
            self.forced["quiet"] += 1
            return True
        return False
