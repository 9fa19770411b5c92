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
    interval = monitor.cadence["lossy"][0]  # learned from its gaps: about its tick
    assert interval < 1.2 * tick
    assert now - last <= MAX_SILENT_TICKS * interval + tick and now < died + 600


def test_the_cadence_is_read_on_the_nodes_own_clock() -> None:
    """Its samples placed on the job's clock move as its offset is re-estimated;
    its own clock ticks every 10 s: it loses nothing, and is silent after four missed
    ticks and half a tick of margin (5.5 intervals)."""
    rng = random.Random(1)
    monitor = HealthMonitor(HealthParams())
    for k in range(120):
        own = START + 10.0 * k
        placed = own + rng.uniform(-4.0, 4.0)
        monitor.ingest(_sample("n0", placed), alive_at=placed,  # type: ignore[arg-type]
                       own_ts=own)
        monitor.ingest(_sample("n1", own))  # type: ignore[arg-type]
    assert monitor.silence_after("n0") == monitor.silence_after("n1") == 55.0


def test_three_missed_ticks_of_a_jittery_30s_agent_are_not_silence() -> None:
    """A 30 s agent read up to 3 s early or late, on a path losing 4.5 %: its
    interval is learned from its shortest gaps (about 26 s), and three missed ticks
    leave a gap of up to 126 s. At 4.5 intervals that passed for silence (the
    envelope's fleet soak, job 200); a node that stops for good still is silent."""
    rng = random.Random(5)
    monitor = HealthMonitor(HealthParams())
    tick, lost = 30.0, {40, 41, 42}
    last = START
    for k in range(80):
        for peer in ("p1", "p2", "p3"):  # the job's other agents jitter as much
            monitor.ingest(_sample(peer, START + k * tick  # type: ignore[arg-type]
                                   + rng.uniform(-3.0, 3.0)))
        now = START + k * tick + 3.0 if k == 43 else START + k * tick + rng.uniform(-3.0, 3.0)
        if k == 43:  # the gap at its longest: read 3 s early before it, 3 s late after
            assert now - last == 126.0
            assert "n0" not in _silent(monitor, now - 0.01)
        if k == 39:
            now = START + k * tick - 3.0
        if k not in lost and k < 70 and (k < 10 or rng.random() >= 0.045 or k in (39, 43)):
            monitor.ingest(_sample("n0", now))  # type: ignore[arg-type]
            last = now
    assert _silent(monitor, START + 79 * tick + 0.5) == {"n0"}
    assert START + 79 * tick - last > monitor.silence_after("n0")
