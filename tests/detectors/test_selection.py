"""Moneo §2.2 metric selection."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.detectors.selection import moneo_distance, scaled_variance, select_metrics


def test_eq1_matches_the_paper_formula() -> None:
    x = np.array([1.0, 2.0, 4.0])
    y = np.array([1.0, 3.0, 2.0])
    expected = np.sqrt((0 / 4) ** 2 + (1 / 4) ** 2 + (2 / 4) ** 2) / np.sqrt(3)
    assert moneo_distance(x, y) == np.float64(expected)
    assert moneo_distance(x, x) == 0.0


# Metric readings: zero or at least 1e-9. Subnormal floats (5e-324 × 0.5 == 0.0) would
# break scale-freedom by underflow, not by the distance (hypothesis found it once).
READING = st.one_of(st.just(0.0), st.floats(1e-9, 1e6))


@settings(max_examples=50, deadline=None)
@given(st.lists(READING, min_size=2, max_size=50), st.floats(0.1, 1e3))
def test_distance_is_scale_free_and_symmetric(values: list[float], scale: float) -> None:
    x = np.array(values)
    y = x[::-1].copy()
    d = moneo_distance(x, y)
    assert np.isclose(d, moneo_distance(y, x))
    assert np.isclose(d, moneo_distance(x * scale, y * scale), atol=1e-9)
    assert 0 <= d <= 1.0 + 1e-9


def test_constant_and_duplicate_metrics_collapse_but_health_stays() -> None:
    t = np.linspace(0, 20, 200)
    wave = (np.sin(t) + 1.5)[None, :].repeat(3, axis=0)
    series = {
        "sm_active": wave / 3,
        "tensor_active": wave / 3 * 1.01,  # near-identical shape and range
        "power": 100 + 50 * np.cos(t)[None, :].repeat(3, axis=0),
        "mem_clock": np.full((3, 200), 2619.0),
        "xid": np.zeros((3, 200)),
    }
    result = select_metrics(series, always_keep=frozenset({"xid"}))
    assert result.constant == ["mem_clock"]
    assert result.groups["sm_active"] == ["sm_active", "tensor_active"]
    assert result.keep == ["sm_active", "power", "xid"]
    assert scaled_variance(np.full(10, 5.0)) == 0.0
