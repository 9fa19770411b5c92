"""The detectors on the physics envelope (issue #45), tuning seeds only: the classes
whose rule changed, each at an end of the range that broke it before.

The held-out seeds are measured in ``bench/bench_envelope.py``, never here.
"""

from __future__ import annotations

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.vigil.evaluation.benchdetect import run_suite
from vigil_gpu_monitor.vigil.evaluation.envelope import CLASSES, TUNING_SEEDS, envelope_suite

BARRIER = ("straggler", "hang", "slowdown")


def _score(name: str, seed: int, pins: dict[str, str]
           ) -> tuple[int, int, list[float], dict[str, int]]:
    classes = tuple(c for c in CLASSES if c.name == name)
    scenario = envelope_suite((seed,), (4,), classes, pins)[0]
    tally, _, _ = run_suite([scenario], DetectConfig())
    false = {k: n - tally.correct[k] for k, n in tally.fired.items() if n > tally.correct[k]}
    return (sum(tally.labels.values()), sum(tally.found.values()),
            [d for v in tally.delays.values() for d in v], false)


@pytest.mark.parametrize("channels", ["low", "high"])
def test_a_hang_is_found_within_20_s_at_either_end_of_the_channel_count(channels: str) -> None:
    labels, found, delays, false = _score("hang", TUNING_SEEDS[0],
                                          {"nccl_channels": channels, "tick": "low"})
    assert found == labels == 1 and max(delays) <= 20 and not false


@pytest.mark.parametrize("name", ["async_gpu", "async_node", "hot_expert_capped",
                                  "healthy_tensor_parallel"])
def test_healthy_look_alikes_get_no_barrier_finding(name: str) -> None:
    for seed in TUNING_SEEDS[:1]:
        _, _, _, false = _score(name, seed, {})
        assert not {k: n for k, n in false.items() if k in BARRIER}, (name, seed, false)


def test_a_node_wide_power_brake_is_found_once() -> None:
    labels, found, _, false = _score("power_brake", TUNING_SEEDS[1], {"tick": "low"})
    assert found == labels == 1 and not false


def test_an_eight_to_fifteen_percent_stall_in_a_tensor_parallel_group_within_4_min() -> None:
    labels, found, delays, false = _score("tp_slow", TUNING_SEEDS[0], {"tick": "low"})
    assert found == labels == 1 and max(delays) <= 240 and not false
