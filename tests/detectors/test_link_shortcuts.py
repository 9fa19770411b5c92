"""The link checks' shortcuts for calm steps skip a check only where its full
computation could not have found anything: every score stays under half the
threshold."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vigil_gpu_monitor.detectors.links import (
    NVLINK_ABS_FLOOR,
    NVLINK_REL_FLOOR,
    WAIT_FLOOR,
    _calm_nodes,
    _calm_ports,
)
from vigil_gpu_monitor.detectors.robust import robust_z, robust_z_axis

Z = 4.0
# relative jitter around a node's level: most draws are calm, some are not
jitter = st.one_of(st.floats(-0.2, 0.2), st.just(float("nan")))


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 8), st.just(4)),
                  elements=jitter),
       st.lists(st.floats(0, 3e11), min_size=3, max_size=3), st.floats(1e-4, 1.0))
def test_calm_nodes_have_no_nvlink_score_past_half_the_threshold(
        shape: np.ndarray, levels: list[float], spread: float) -> None:
    cube = np.array(levels[:shape.shape[0]])[:, None, None] * (1 + spread * shape)
    if not _calm_nodes(cube, Z):
        return
    z = robust_z_axis(cube, axis=1, abs_floor=NVLINK_ABS_FLOOR, rel_floor=NVLINK_REL_FLOOR)
    assert not (np.abs(z[~np.isnan(z)]) >= Z / 2).any()


def test_nvlink_shortcut_is_taken_only_when_calm() -> None:
    steady = np.full((2, 8, 4), 5e10)
    assert _calm_nodes(steady, Z)
    slow = steady.copy()
    slow[1, 3] = 2e10  # one GPU far under its node: the full check must run
    assert not _calm_nodes(slow, Z)
    silent = steady.copy()
    silent[0] = np.nan  # a node without readings: never taken for calm
    assert not _calm_nodes(silent, Z)
    assert not _calm_nodes(np.empty((0, 0, 4)), Z)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 12), st.just(4)),
                  elements=st.one_of(st.floats(0, 1e4), st.just(float("nan")))))
def test_ports_within_the_bound_have_no_wait_score_past_half_the_threshold(
        wait: np.ndarray) -> None:
    log_wait = np.log10(1.0 + wait)
    if not _calm_ports(log_wait, Z):
        return
    z, _, _ = robust_z(log_wait, abs_floor=WAIT_FLOOR)
    assert not (np.abs(z[~np.isnan(z)]) >= Z / 2).any()


def test_wait_shortcut_is_taken_only_when_calm() -> None:
    steady = np.log10(1.0 + np.full((8, 4), 100.0))
    assert _calm_ports(steady, Z)
    stuck = steady.copy()
    stuck[2] = np.log10(1.0 + 1e5)  # one port pushing back: the full check must run
    assert not _calm_ports(stuck, Z)
    assert not _calm_ports(np.full((8, 4), np.nan), Z)
