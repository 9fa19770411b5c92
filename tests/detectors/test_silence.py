"""When a node counts as silent: after missing more of its own ticks in a row than its
path's counted loss misses by chance, on its own clock's cadence."""

from __future__ import annotations

import random

from vigil_gpu_monitor.detectors.health import MAX_SILENT_TICKS, HealthMonitor, HealthParams

START = 1_000_000.0


def _sample(node: str, ts: float) -> dict[str, object]:
    return {"node": node, "ts": ts, "gpus": {}}


def _silent(monitor: HealthMonitor, now: float) -> set[str]:
    return {f.node for f in monitor.evaluate(now)[1]}


def test_nodes_losing_40_percent_of_a_13s_tick_are_never_silent_in_an_hour() -> None:
    """Eight such nodes beside eight lossless ones (fleet soak: one fell silent for
    132 s within the hour while its loss was learned from a slow moving average)."""
    rng = random.Random(7)
    monitor = HealthMonitor(HealthParams())
    nodes = [f"n{i}" for i in range(16)]
    tick = 13.0
    for k in range(int(3600 / tick)):
        now = START + k * tick
        for i, node in enumerate(nodes):
            if i >= 8 or rng.random() >= 0.4:
                monitor.ingest(_sample(node, now))  # type: ignore[arg-type]
        assert _silent(monitor, now + tick - 0.1) == set(), k


def test_a_lossy_node_that_dies_is_silent_within_its_bound() -> None:
    rng = random.Random(3)
    monitor = HealthMonitor(HealthParams())
    tick = 10.0
    died = START + 1800.0
    k = 0
    while (now := START + k * tick) < died + 600:
        monitor.ingest(_sample("healthy", now))  # type: ignore[arg-type]
        if now < died and rng.random() >= 0.4:
            monitor.ingest(_sample("lossy", now))  # type: ignore[arg-type]
        if "lossy" in _silent(monitor, now):
            break
        k += 1
    last = monitor.nodes["lossy"]
    assert now - last <= (MAX_SILENT_TICKS + 1) * tick and now < died + 600


def test_the_cadence_is_read_on_the_nodes_own_clock() -> None:
    """Its samples placed on the job's clock move as its offset is re-estimated;
    its own clock ticks every 10 s: it loses nothing, and is silent after 4.5 ticks."""
    rng = random.Random(1)
    monitor = HealthMonitor(HealthParams())
    for k in range(120):
        own = START + 10.0 * k
        placed = own + rng.uniform(-4.0, 4.0)
        monitor.ingest(_sample("n0", placed), alive_at=placed,  # type: ignore[arg-type]
                       own_ts=own)
        monitor.ingest(_sample("n1", own))  # type: ignore[arg-type]
    assert monitor.silence_after("n0") == monitor.silence_after("n1") == 45.0
