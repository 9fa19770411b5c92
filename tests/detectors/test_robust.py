"""Properties of the robust statistics every detector rests on."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vigil_gpu_monitor.detectors.robust import (
    clamp,
    nanmedian,
    persistent,
    quantile,
    robust_z_axis,
)

finite_or_nan = st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6),
                  elements=finite_or_nan), st.integers(0, 2), st.booleans())
def test_nanmedian_is_numpys_to_the_last_bit(values: np.ndarray, axis: int,
                                             from_end: bool) -> None:
    axis = axis % values.ndim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanmedian(values, axis=axis) if values.shape[axis] else np.full(
            np.delete(values.shape, axis), np.nan)
    # exact, not close: detections must not move when the median is computed faster
    got = nanmedian(values, axis - values.ndim if from_end else axis)
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(64, 150)),
                  elements=st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))),
       st.booleans())
def test_long_peer_groups_give_numpys_median_too(values: np.ndarray, with_nan: bool) -> None:
    # long peer groups (a 16,384-GPU job's), with and without NaN: numpy's values
    if not with_nan:
        values = np.nan_to_num(values, nan=1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for axis in (0, 1):
            np.testing.assert_array_equal(nanmedian(values.T if axis == 0 else values, axis),
                                          np.nanmedian(values.T if axis == 0 else values,
                                                       axis=axis))


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 10)),
                  elements=finite_or_nan), st.floats(0.5, 5), st.integers(1, 6))
def test_persistence_counts_match_the_definition(scores: np.ndarray, thr: float,
                                                 of: int) -> None:
    need = max(1, of // 2)
    result = persistent(scores, thr, need, of)
    recent = scores[:, -of:]
    with np.errstate(invalid="ignore"):
        up, down = np.sum(recent > thr, axis=1), np.sum(recent < -thr, axis=1)
    np.testing.assert_array_equal(result.hits, np.maximum(up, down))
    np.testing.assert_array_equal(result.flagged, np.maximum(up, down) >= need)
    for i in np.nonzero(result.flagged)[0]:
        assert abs(result.score[i]) > thr
        assert np.sign(result.score[i]) == result.sign[i]


@settings(max_examples=100, deadline=None)
@given(st.floats(0.1, 100), st.floats(-50, 50))
def test_z_is_invariant_to_shift_and_scale_above_the_floor(scale: float, shift: float) -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(10, 1, size=(3, 8, 4))
    z1 = robust_z_axis(base, axis=1, abs_floor=1e-9, rel_floor=0)
    z2 = robust_z_axis(base * scale + shift, axis=1, abs_floor=1e-9, rel_floor=0)
    np.testing.assert_allclose(z1, z2, rtol=1e-6, atol=1e-6)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 40),
                  elements=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                     st.sampled_from([0.0, -0.0]))),
       st.sampled_from([0.0, -0.0, -1.5]), st.floats(0, 5))
def test_clamp_is_numpys_clip_to_the_bit(values: np.ndarray, low: float, high: float) -> None:
    ours, theirs = clamp(values, low, high), np.clip(values, low, high)
    assert ours.tobytes() == theirs.tobytes()  # NaN and the sign of zero included
    # per-element bounds (the CUSUM's ceiling per column): equal values, and equal
    # bits wherever the value clamped is not -0.0
    ceiling = np.full(values.shape, high) + np.arange(values.size)
    ours, theirs = clamp(values, 0.0, ceiling), np.clip(values, 0.0, ceiling)
    np.testing.assert_array_equal(ours, theirs)
    plain = ~((values == 0) & np.signbit(values))
    assert ours[plain].tobytes() == theirs[plain].tobytes()


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 10)),
                  elements=finite_or_nan), st.integers(1, 6), st.booleans())
def test_a_calm_window_gives_what_the_full_test_gives(scores: np.ndarray, of: int,
                                                      calm: bool) -> None:
    """The shortcut for windows with no score beyond the threshold returns every
    field as the full computation does (signs up, first bin 0, no score)."""
    thr = 2e6 if calm else 0.5  # above every finite element, or below most
    result = persistent(scores, thr, 1, of)
    recent = scores[:, -of:]
    with np.errstate(invalid="ignore"):
        up, down = np.sum(recent > thr, axis=1), np.sum(recent < -thr, axis=1)
        sign = np.where(up >= down, 1.0, -1.0)
        deviant = recent * sign[:, None] > thr
    np.testing.assert_array_equal(result.sign, sign)
    np.testing.assert_array_equal(result.first, np.argmax(deviant, axis=1))
    np.testing.assert_array_equal(result.hits, np.maximum(up, down))
    assert result.first.dtype == np.argmax(deviant, axis=1).dtype
    if calm:
        assert np.isnan(result.score).all() and not result.flagged.any()


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([0.0, -0.0, float("nan"), 2.5])),
                min_size=1, max_size=130),
       st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9, 1.0]), st.floats(0.0, 1.0)))
def test_quantile_is_numpys_to_the_last_bit(values: list[float], q: float) -> None:
    expected = np.quantile(values, q)
    got = quantile(values, q)
    assert type(got) is float
    assert np.array_equal(np.float64(got), expected, equal_nan=True)
    assert np.signbit(got) == np.signbit(expected)
