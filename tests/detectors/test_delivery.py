"""A broker outage's backlogs are not silence (``detectors/delivery.py``): samples that
waited in their agents for a broker that was away, delivered one agent after another
as each producer reconnects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.summary import decode_summary, encode_summary
from vigil_gpu_monitor.detectors.delivery import DeliveryWaits
from vigil_gpu_monitor.detectors.engine import JobEngine
from vigil_gpu_monitor.detectors.shard import ShardedJob
from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator

T0 = 1_900_000_000.0
DOWN, UP = T0 + 120, T0 + 180  # the broker is away between these
NODES = [f"n{i}" for i in range(6)]

Feed = Callable[[dict[str, Any], float | None], list[Any]]


def _samples(seconds: float = 300) -> list[dict[str, Any]]:
    job = JobSpec("j", NODES)
    return list(Simulator(Cluster([job], []), T0, seed=4).samples(seconds))


def _after_outage(samples: list[dict[str, Any]], first: str, dead: str | None = None,
                  usual_wait: float = 0.05) -> list[tuple[dict[str, Any], float]]:
    """The samples as a worker reads them, each with its wait (its record's send time
    less its own): before the outage as taken; then ``first``'s backlog, sent as its
    producer reconnects at ``UP``; then the other agents', 1.5 s later; then the rest.
    ``dead`` stops sampling halfway through the outage."""
    before = [(s, usual_wait) for s in samples if s["ts"] < DOWN]
    held = [s for s in samples if DOWN <= s["ts"] < UP
            and not (s["node"] == dead and s["ts"] >= DOWN + 30)]
    firsts = [(s, UP - s["ts"]) for s in held if s["node"] == first]
    others = [(s, UP + 1.5 - s["ts"]) for s in held if s["node"] != first]
    after = [(s, usual_wait) for s in samples if s["ts"] >= UP and s["node"] != dead]
    return before + firsts + others + after


def _one_stage() -> Feed:
    engine = JobEngine("j", DetectConfig())
    return lambda s, wait: engine.ingest(s, wait) + engine.advance()


def _two_stages() -> Feed:
    job = ShardedJob("j", 2, DetectConfig(),
                     deliver=lambda s: decode_summary(encode_summary(s)))
    return job.feed


def _silent(feed: Feed, stream: list[tuple[dict[str, Any], float | None]]) -> list[Any]:
    return [(d["node"], d["detected_at"]) for s, wait in stream for d in feed(s, wait)
            if d["state"] == "firing" and d["kind"] == "node_silent"]


def test_without_waits_the_first_agent_back_reads_as_the_only_live_node() -> None:
    """What the worker decided before it read waits: a false node_silent (the engine
    of 2026-11-28 took n0's backlog for a clock 30 s fast and named n0)."""
    stream = [(s, None) for s, _ in _after_outage(_samples(), "n0")]
    assert _silent(_one_stage(), stream)  # type: ignore[arg-type]


def test_backlogs_delivered_one_agent_after_another_are_no_silence() -> None:
    for feed in (_one_stage(), _two_stages()):
        assert _silent(feed, _after_outage(_samples(), "n0")) == []  # type: ignore[arg-type]


def test_a_node_that_died_during_the_outage_is_found_once_the_path_is_back() -> None:
    """n2 stopped at 150 s, while the broker was away: its silence counts from when
    the backlogs got through (180 s), and it is found a silence later."""
    for feed in (_one_stage(), _two_stages()):
        found = _silent(feed, _after_outage(_samples(), "n0", dead="n2"))  # type: ignore[arg-type]
        assert [node for node, _ in found] == ["n2"]
        assert UP < found[0][1] <= UP + 30


def test_an_agent_that_always_sends_late_hides_no_silence() -> None:
    """A node whose samples always wait 20 s (a slow path, a broker's clock) is judged
    against its own habit: it does not keep the others' silence from counting."""
    samples = _samples()
    stream: list[tuple[dict[str, Any], float | None]] = []
    for s in samples:
        if s["node"] == "n3" and s["ts"] >= T0 + 150:
            continue  # n3 dies at 150 s; no outage at all
        stream.append((s, 20.0 if s["node"] == "n1" else 0.05))
    found = _silent(_one_stage(), stream)  # type: ignore[arg-type]
    assert [node for node, _ in found] == ["n3"] and found[0][1] <= T0 + 150 + 30


def test_waits_beyond_an_hour_either_way_say_nothing() -> None:
    """A record time on another clock than the sample's (a simulation published in
    one go, a replayed topic) is no wait."""
    waits = DeliveryWaits()
    assert waits.excess("n", -1e8) is None and waits.excess("n", 7200.0) is None
    assert waits.excess("n", 0.1) == 0.0  # the first wait is the usual one
    assert waits.excess("n", 60.0) is not None and waits.excess("n", 60.0) > 55
    assert waits.to_state()["n"] < 2.0  # a backlog barely moves the usual wait
