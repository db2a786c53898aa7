"""Small in-place array kernels for the server's per-round updates (Numba, cached)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _axpy_flat(alpha, x, y):
    for i in range(y.size):
        y[i] += alpha * x[i]


def axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> None:
    """y += alpha x in place, without temporaries (y float64 and contiguous)."""
    if y.ndim == 0 or y.size < 64:
        y += alpha * x
    else:
        _axpy_flat(float(alpha), np.ascontiguousarray(x, dtype=np.float64).reshape(-1),
                   y.reshape(-1))


def scaled(alpha: float, x: np.ndarray) -> np.ndarray:
    """A new float64 array alpha x (one allocation)."""
    out = np.empty(np.shape(x))
    np.multiply(x, alpha, out=out)
    return out
