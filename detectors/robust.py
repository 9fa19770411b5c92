"""Robust peer statistics: medians and MAD-based z-scores that ignore NaN."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution × this = its standard deviation

Array = NDArray[np.float64]


def nanmedian(values: Array, axis: int) -> Array:
    """Median ignoring NaN along ``axis``; all-NaN slices give NaN.

    Sort-based (NaN sorts last), and written with ndarray methods and plain
    indexing: numpy's own ``nanmedian`` goes through masked arrays for small inputs
    and costs ~100x more on the detectors' peer groups, ``np.median`` spends ~20 µs a
    call in Python around its partition, and ``take_along_axis`` ~10 µs building its
    indexes. The arithmetic is numpy's: the mean of the two middle values.

    A sort also beats selecting the two middle values (``np.partition``) on long
    axes: numpy 2's vectorised sort took 3.2 ms where partition took 8.0 ms on 4 x
    131,072 values, 12 against 21 ms on 1.6 M (this machine, numpy 2.4); the
    selection this function used from 64 peers on was ~3x faster than a sort in
    numpy 1.26.
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[axis]
    if n == 0:
        return np.full(np.delete(values.shape, axis), np.nan)
    if n == 1:  # one peer (a one-node job's node level): its value, NaN or not
        return np.asarray(values.take(0, axis=axis), dtype=np.float64)
    ordered = np.sort(values, axis=axis)
    absent = np.isnan(ordered)
    if not absent.any():  # the usual case: the two middle values of the sort
        return (ordered.take((n - 1) // 2, axis=axis) + ordered.take(n // 2, axis=axis)) / 2
    axis %= values.ndim
    rest = [i for i in range(values.ndim) if i != axis]
    rows = ordered.transpose(*rest, axis).reshape(-1, n)  # one slice a row, NaN last
    count = n - absent.transpose(*rest, axis).reshape(-1, n).sum(axis=1)
    at = np.arange(len(rows))
    low = rows[at, np.maximum((count - 1) // 2, 0)]
    high = rows[at, count // 2]  # count 0: a NaN, replaced below
    median = np.where(count > 0, (low + high) / 2, np.nan)
    return median.reshape([values.shape[i] for i in rest])


def quantile(values: Sequence[float], q: float) -> float:
    """``float(np.quantile(values, q))``, numpy's default (linear) method, to the bit,
    for a short list: sorted in Python and the two neighbours interpolated as numpy
    interpolates them (``_lerp``: from the nearer end). ``np.quantile`` spends
    ~30 µs a call in Python around a list of 120 levels, 2.6 % of replaying the
    mixed trace (bench/RESULTS.md, "Replay speed"). A NaN or a zero (whose sign a
    sort may place differently), or a ``q`` outside [0, 1]: numpy's own."""
    n = len(values)
    if (not n or not 0.0 <= q <= 1.0 or 0.0 in values
            or any(map(math.isnan, values))):
        return float(np.quantile(values, q))
    ordered = sorted(map(float, values))
    virtual = (n - 1) * q
    if virtual >= n - 1:
        return ordered[-1]
    low = math.floor(virtual)
    gamma = virtual - low
    below, above = ordered[low], ordered[low + 1]
    step = above - below
    return above - step * (1 - gamma) if gamma >= 0.5 else below + step * gamma


def clamp(values: Array, low: float | Array, high: float | Array) -> Array:
    """``np.clip(values, low, high)`` in two ufunc calls (``np.clip``'s Python layers
    cost ~5 µs a call, most of it on a small job's arrays). With bounds given as
    numbers it is ``np.clip`` to the bit, NaN and signed zeros included; with bounds
    given per element, only the sign of a zero result may differ (``np.clip`` itself
    treats zeros differently there than with numbers)."""
    return np.minimum(high, np.maximum(low, values))


def zero_nan(values: Array) -> Array:
    """NaN → 0 (``np.nan_to_num`` without its Python overhead; for values that are
    never infinite, or where an infinity is clipped anyway)."""
    return np.where(np.isnan(values), 0.0, values)


def mad_sigma(values: Array, axis: int, median: Array | None = None) -> Array:
    """The robust standard deviation along ``axis``: the median absolute deviation
    from the median (``median``, kept dims, when the caller has it) × ``MAD_TO_SIGMA``;
    the axis is dropped. All-NaN slices give NaN."""
    if median is None:
        median = np.expand_dims(nanmedian(values, axis=axis), axis)
    return nanmedian(np.abs(values - median), axis=axis) * MAD_TO_SIGMA


def robust_z(matrix: Array, abs_floor: float,
             rel_floor: float = 0.02) -> tuple[Array, Array, Array]:
    """Column-wise robust z-scores of a (peers × bins) matrix.

    Returns ``(z, median, scale)``: ``z[i, t]`` says how far peer ``i`` sits from the
    column's median in robust standard deviations. The scale never drops below
    ``abs_floor`` or ``rel_floor × |median|``, so near-identical peers do not turn
    noise-level differences into huge scores. NaN entries stay NaN.
    """
    median = nanmedian(matrix, axis=0)
    mad = mad_sigma(matrix, 0, median)
    scale = np.fmax(mad, np.fmax(abs_floor, rel_floor * np.abs(median)))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (matrix - median) / scale
    return z, median, scale


def robust_z_axis(values: Array, axis: int, abs_floor: float | Array,
                  rel_floor: float = 0.02) -> Array:
    """Like ``robust_z`` but over any peer axis (e.g. the GPUs of each node)."""
    median = np.expand_dims(nanmedian(values, axis=axis), axis)
    mad = np.expand_dims(mad_sigma(values, axis, median), axis)
    scale = np.fmax(mad, np.fmax(abs_floor, rel_floor * np.abs(median)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray((values - median) / scale, dtype=np.float64)


@dataclass(frozen=True)
class Persistence:
    """Rows that sit beyond ``threshold`` in one direction in ``need`` of the last ``of``
    bins: ``flagged`` rows, their ``sign``, deviant-bin count ``hits``, offset of the
    ``first`` deviant bin among the last ``of``, and the median deviant score ``score``."""

    flagged: NDArray[np.bool_]
    sign: Array
    hits: NDArray[np.int64]
    first: NDArray[np.int64]
    score: Array


def persistent(scores: Array, threshold: float, need: int, of: int) -> Persistence:
    """Vectorised persistence test over the last axis (time bins); NaN never counts."""
    recent = scores[..., -of:]
    with np.errstate(invalid="ignore"):
        calm = need > 0 and not (np.abs(recent) > threshold).any()
    if calm:  # the usual step: no score beyond the threshold either way, nothing to time
        shape = recent.shape[:-1]
        return Persistence(np.zeros(shape, dtype=bool), np.ones(shape),
                           np.zeros(shape, dtype=np.intp), np.zeros(shape, dtype=np.intp),
                           np.full(shape, np.nan))
    with np.errstate(invalid="ignore"):
        up = (recent > threshold).sum(axis=-1)
        down = (recent < -threshold).sum(axis=-1)
        sign = np.where(up >= down, 1.0, -1.0)
        deviant = (recent * sign[..., None]) > threshold
    hits = np.maximum(up, down)
    flagged = hits >= need
    first = np.argmax(deviant, axis=-1)
    score = np.full(hits.shape, np.nan)
    if flagged.any():  # the median score is only needed where something was found
        score[flagged] = nanmedian(np.where(deviant, recent, np.nan)[flagged], axis=-1)
    return Persistence(flagged, sign, hits, first, score)
