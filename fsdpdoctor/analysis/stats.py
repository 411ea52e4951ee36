"""Order statistics without ``np.median``: its NaN check imports ``numpy.ma`` on first use, 15-25 ms
in every process (a tenth of the analysis of a small trace)."""

from __future__ import annotations

import math

import numpy as np


def median(values) -> float:
    """The median of a sequence or array, as ``np.median`` gives it (NaN for an empty or NaN-holding input)."""
    a = np.asarray(values, dtype=np.float64).ravel()
    n = a.size
    if n == 0 or np.isnan(a).any():
        return math.nan
    k = n // 2
    if n % 2:
        return float(np.partition(a, k)[k])
    p = np.partition(a, (k - 1, k))
    return float((p[k - 1] + p[k]) / 2.0)


def member(values: np.ndarray, test: np.ndarray) -> np.ndarray:
    """``np.isin(values, test)`` for float arrays by binary search: ``np.isin`` sorts floats through
    ``np.unique``, whose first call imports ``numpy.ma``."""
    s = np.sort(np.asarray(test, dtype=np.float64))
    if s.size == 0:
        return np.zeros(len(values), dtype=bool)
    i = np.minimum(np.searchsorted(s, values), s.size - 1)
    return s[i] == values
