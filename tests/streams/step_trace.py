"""A job's samples and per-rank step timings in the order the simulator emits them
(each sample, then the step batches it drained), as a node agent sends them and as
``vigil replay`` reads a trace; shared by the worker's tests with and without Kafka."""

from __future__ import annotations

from typing import Any

from vigil_gpu_monitor.contracts import STEP_SCHEMA
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Fault, Simulator
from vigil_gpu_monitor.simulator.steps import StepTimings
from vigil_gpu_monitor.vigil.evaluation.stepcheck import T0, _build

Key = tuple[str, str, str, float]


def slow_rank_trace(seed: int = 61) -> tuple[list[dict[str, Any]], Fault]:
    """`bench/bench_steps.py`'s 10 % slow rank (a GPU stalled, no clock change, no
    flag) with its counters: samples and step batches interleaved, and the fault."""
    cluster, sigma, duration, fault = _build("slow_rank", seed)
    assert fault is not None
    sim = Simulator(cluster, T0, seed=seed)
    timings = StepTimings(seed=seed, seq_sigma=sigma)
    sim.step_timings = timings
    out: list[dict[str, Any]] = []
    for sample in sim.samples(duration):
        out.append(dict(sample))
        out.extend(dict(batch) for batch in timings.drain())
    return out, fault


def is_steps(message: dict[str, Any]) -> bool:
    return bool(message["schema"] == STEP_SCHEMA)


def replayed(trace: list[dict[str, Any]], cfg: DetectConfig | None = None,
             ) -> list[dict[str, Any]]:
    """What replay decides on the trace, in its order (``vigil replay``'s loop)."""
    runner = ReplayRunner(cfg or DetectConfig())
    out: list[dict[str, Any]] = []
    for message in trace:
        out.extend(runner.feed_steps(message) if is_steps(message)  # type: ignore[arg-type]
                   else runner.feed(message))  # type: ignore[arg-type]
    return [dict(d) for d in out]


def keys(detections: list[dict[str, Any]]) -> set[Key]:
    """A detection as the crash tests compare them: a repeat is the same detection."""
    return {(d["id"], d["kind"], d["state"], d["detected_at"]) for d in detections}
