"""Small array kernels for the server's per-round updates (Numba, cached).

The server's work per round is a few passes over d-sized arrays (d = 101,632 for the paper's
network) and is limited by memory traffic, not arithmetic: every kernel here makes one pass and
allocates nothing but its output.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Sequence

import numpy as np
from numba import njit

_SMALL = 64  # below this many entries NumPy's own loops are as fast as a kernel call
FOLD_WIDTH = 5  # arrays per pass of `fold` (measured best of 3, 4, 5, 8 at d = 101,632)


@njit(cache=True)
def _axpy_flat(alpha, x, y):
    for i in range(y.size):
        y[i] += alpha * x[i]


@njit(cache=True)
def _fold5(beta, y, w0, x0, w1, x1, w2, x2, w3, x3, w4, x4, out):
    for i in range(out.size):
        out[i] = beta * y[i] + w0 * x0[i] + w1 * x1[i] + w2 * x2[i] + w3 * x3[i] + w4 * x4[i]


@njit(cache=True, fastmath={"reassoc"})  # reassociation lets the sum vectorise
def _convex_step(w, gamma, target, out):
    dist = 0.0
    for i in range(out.size):
        diff = target[i] - w[i]
        out[i] = w[i] + gamma * diff
        dist += diff * diff
    return dist


def _flat(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).reshape(-1)


def axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> None:
    """y += alpha x in place, without temporaries (y float64 and contiguous)."""
    if y.ndim == 0 or y.size < _SMALL:
        y += alpha * x
    else:
        _axpy_flat(float(alpha), _flat(x), y.reshape(-1))


def scaled(alpha: float, x: np.ndarray) -> np.ndarray:
    """A new float64 array alpha x (one allocation)."""
    out = np.empty(np.shape(x))
    np.multiply(x, alpha, out=out)
    return out


def fold(beta: float, y: np.ndarray, weights: Sequence[float], arrays: Sequence[np.ndarray],
         out: np.ndarray) -> np.ndarray:
    """out = beta y + sum_j weights[j] arrays[j], reading FOLD_WIDTH arrays per pass.

    ``out`` may be ``y`` (in place). Against one axpy per array this cuts the traffic over
    ``out`` from one read and one write per array to one per FOLD_WIDTH arrays; the server's
    averaging of I client messages (eqs. (Fs0bar)/(Fsmbar)) is this with y the previous
    statistics. A last, shorter group is padded with zero weights on an array already read.
    """
    if len(weights) != len(arrays):
        raise ValueError(f"fold: {len(weights)} weights for {len(arrays)} arrays")
    if out.ndim == 0 or out.size < _SMALL:     # scalar statistics: plain NumPy
        acc = beta * np.asarray(y, dtype=float)
        for wj, x in zip(weights, arrays):
            acc = acc + wj * x
        if np.shape(acc) != out.shape:
            raise ValueError(f"fold: shapes {[np.shape(x) for x in arrays]} do not match the "
                             f"output's {out.shape}")
        out[...] = acc
        return out
    for x in (y, *arrays):
        if np.shape(x) != out.shape:
            raise ValueError(f"fold: shape {np.shape(x)} differs from the output's {out.shape}")
    flat = out.reshape(-1)
    src, b = _flat(y), float(beta)
    if not arrays:
        np.multiply(src, b, out=flat)
    for s in range(0, len(arrays), FOLD_WIDTH):
        group = [(float(wj), _flat(x)) for wj, x in zip(weights[s:s + FOLD_WIDTH],
                                                        arrays[s:s + FOLD_WIDTH])]
        group += [(0.0, group[0][1])] * (FOLD_WIDTH - len(group))
        _fold5(b, src, *[v for pair in group for v in pair], flat)
        src, b = flat, 1.0
    return out


def convex_step(w: np.ndarray, gamma: float, target: np.ndarray,
                out: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(1 - gamma) w + gamma target, and |target - w|, in one pass (eq. (updatew)).

    The result goes to ``out`` (float64, contiguous, not aliasing w or target) or a new array.
    """
    w, target = _flat(w), _flat(target)
    if w.shape != target.shape:
        raise ValueError(f"convex_step: shapes {w.shape} and {target.shape} differ")
    if out is None:
        out = np.empty(w.shape)
    elif out.shape != w.shape or np.shares_memory(out, w) or np.shares_memory(out, target):
        raise ValueError("convex_step: out must have w's shape and share no memory with w or "
                         "target")
    dist2 = _convex_step(w, float(gamma), target, out)
    return out, math.sqrt(dist2)


class BufferPool:
    """Float64 arrays for the server's per-round results, reused once nothing refers to them.

    The server makes a few d-sized arrays every round (the averaged statistics, w-bar, w_{t+1})
    while those of two rounds back become garbage. Fresh arrays from the C allocator sometimes
    come as fresh pages, and touching them costs a page fault per 4 KiB (measured: 562 faults,
    about 0.2 ms, per round at d = 101,632 in some runs and none in others). The pool hands out
    an array it made before only when its reference count shows that no one else holds it (no
    variable, state, result or view of it), so reuse is never visible; arrays a caller keeps
    are simply not reused. At most ``max_bytes`` are pooled.
    """

    min_size = 4096  # smaller arrays are cheap to allocate: plain np.empty

    def __init__(self, max_bytes: int = 256 * 2**20):
        self.max_bytes = int(max_bytes)
        self._arrays: list[np.ndarray] = []
        self._lock = threading.Lock()

    def empty(self, shape) -> np.ndarray:
        """An uninitialised float64 array of ``shape``, recycled when one is free."""
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(n) for n in shape)
        if math.prod(shape) < self.min_size:
            return np.empty(shape)
        with self._lock:
            arrays = self._arrays
            for i in range(len(arrays)):
                # 2 references: the pool's list and getrefcount's argument, i.e. nobody else
                if arrays[i].shape == shape and sys.getrefcount(arrays[i]) == 2:
                    return arrays[i]
            out = np.empty(shape)
            arrays.append(out)
            total = sum(a.nbytes for a in arrays)
            while total > self.max_bytes and len(arrays) > 1:
                total -= arrays.pop(0).nbytes
            return out
