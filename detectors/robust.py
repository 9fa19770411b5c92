"""Robust peer statistics: medians and MAD-based z-scores that ignore NaN."""

from __future__ import annotations

import warnings

import numpy as np
from numpy.typing import NDArray

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution × this = its standard deviation

Array = NDArray[np.float64]


def nanmedian(values: Array, axis: int) -> Array:
    """Median ignoring NaN; all-NaN slices give NaN without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmedian(values, axis=axis), dtype=np.float64)


def robust_z(matrix: Array, abs_floor: float,
             rel_floor: float = 0.02) -> tuple[Array, Array, Array]:
    """Column-wise robust z-scores of a (peers × bins) matrix.

    Returns ``(z, median, scale)``: ``z[i, t]`` says how far peer ``i`` sits from the
    column's median in robust standard deviations. The scale never drops below
    ``abs_floor`` or ``rel_floor × |median|``, so near-identical peers do not turn
    noise-level differences into huge scores. NaN entries stay NaN.
    """
    median = nanmedian(matrix, axis=0)
    mad = nanmedian(np.abs(matrix - median), axis=0) * MAD_TO_SIGMA
    scale = np.fmax(mad, np.fmax(abs_floor, rel_floor * np.abs(median)))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (matrix - median) / scale
    return z, median, scale
