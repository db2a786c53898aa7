"""Small array kernels for the server's per-round updates (Numba, cached).

The server's work per round is a few passes over d-sized arrays (d = 101,632 for the paper's
network) and is limited by memory traffic, not arithmetic: every kernel here makes one pass and
allocates nothing but its output.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numba import njit

_SMALL = 64  # below this many entries NumPy's own loops are as fast as a kernel call
FOLD_WIDTH = 5  # arrays per pass of `fold`: the width of its kernel, `_fold5`


@njit(cache=True)
def _axpy_flat(alpha, x, y):
    for i in range(y.size):
        y[i] += alpha * x[i]


@njit(cache=True)
def _fold5(beta, y, w0, x0, w1, x1, w2, x2, w3, x3, w4, x4, out):
    for i in range(out.size):
        out[i] = beta * y[i] + w0 * x0[i] + w1 * x1[i] + w2 * x2[i] + w3 * x3[i] + w4 * x4[i]


@njit(cache=True)
def _convex_step5(w, gamma, c0, v0, c1, v1, c2, v2, c3, v3, c4, v4, out):
    # the squared distance in four partial sums by index (i mod 4), added in a fixed order:
    # the same floats for the same numbers, call after call (compiled with reassociation the
    # sum's rounding varied between calls on the same numbers, and with it the step norm that
    # decides when the iterates stopped moving); four independent chains keep the loop fast
    n = out.size
    s0 = s1 = s2 = s3 = 0.0
    i = 0
    while i + 4 <= n:
        d0 = c0 * v0[i] + c1 * v1[i] + c2 * v2[i] + c3 * v3[i] + c4 * v4[i] - w[i]
        d1 = (c0 * v0[i + 1] + c1 * v1[i + 1] + c2 * v2[i + 1] + c3 * v3[i + 1]
              + c4 * v4[i + 1] - w[i + 1])
        d2 = (c0 * v0[i + 2] + c1 * v1[i + 2] + c2 * v2[i + 2] + c3 * v3[i + 2]
              + c4 * v4[i + 2] - w[i + 2])
        d3 = (c0 * v0[i + 3] + c1 * v1[i + 3] + c2 * v2[i + 3] + c3 * v3[i + 3]
              + c4 * v4[i + 3] - w[i + 3])
        out[i] = w[i] + gamma * d0
        out[i + 1] = w[i + 1] + gamma * d1
        out[i + 2] = w[i + 2] + gamma * d2
        out[i + 3] = w[i + 3] + gamma * d3
        s0 += d0 * d0
        s1 += d1 * d1
        s2 += d2 * d2
        s3 += d3 * d3
        i += 4
    while i < n:
        d = c0 * v0[i] + c1 * v1[i] + c2 * v2[i] + c3 * v3[i] + c4 * v4[i] - w[i]
        out[i] = w[i] + gamma * d
        s0 += d * d
        i += 1
    return (s0 + s1) + (s2 + s3)


def _flat(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).reshape(-1)


def _five_wide(pairs: list) -> list:
    """(coef, flat array) pairs as the argument list of a five-wide kernel; missing pairs are
    zero coefficients on an array already read."""
    pairs = pairs + [(0.0, pairs[0][1])] * (FOLD_WIDTH - len(pairs))
    return [x for pair in pairs for x in pair]


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

    ``out`` (C-contiguous float64) may be ``y`` itself (in place) but must not overlap any of
    ``arrays`` or be a different view of ``y``. Against one axpy per array this cuts the
    traffic over ``out`` from one read and one write per array to one per FOLD_WIDTH arrays;
    the server's averaging of I client messages (eqs. (Fs0bar)/(Fsmbar)) is this with y the
    previous statistics. A last, shorter group is padded with zero weights on an array already
    read.
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
    if out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError("fold: out must be a C-contiguous float64 array")
    for x in (y, *arrays):
        if np.shape(x) != out.shape:
            raise ValueError(f"fold: shape {np.shape(x)} differs from the output's {out.shape}")
    if (y is not out and np.may_share_memory(y, out)) or any(
            np.may_share_memory(x, out) for x in arrays):
        raise ValueError("fold: out overlaps an input (only y itself may be out)")
    flat = out.reshape(-1)
    src, b = _flat(y), float(beta)
    if not arrays:
        np.multiply(src, b, out=flat)
    for s in range(0, len(arrays), FOLD_WIDTH):
        group = [(float(wj), _flat(x)) for wj, x in zip(weights[s:s + FOLD_WIDTH],
                                                        arrays[s:s + FOLD_WIDTH])]
        _fold5(b, src, *_five_wide(group), flat)
        src, b = flat, 1.0
    return out


def convex_step(w: np.ndarray, gamma: float, target) -> tuple[np.ndarray, float]:
    """(1 - gamma) w + gamma target as a new array, and |target - w|, in one pass (eq. (updatew)).

    ``target`` is an array or a linear combination ((coef, vector), ...) of at most FOLD_WIDTH
    vectors, as :attr:`SubproblemSolution.terms` gives it: then w-bar itself is never formed.
    New arrays rather than recycled buffers: the allocator hands back memory the clients just
    freed, still in cache, and writing there is faster than into buffers kept from earlier
    rounds, which are not.
    """
    terms = [(1.0, target)] if isinstance(target, np.ndarray) else list(target)
    if not 1 <= len(terms) <= FOLD_WIDTH:
        raise ValueError(f"convex_step: 1 to {FOLD_WIDTH} terms, got {len(terms)}")
    w = _flat(w)
    flat = [(float(c), _flat(v)) for c, v in terms]
    for _, v in flat:
        if v.shape != w.shape:
            raise ValueError(f"convex_step: shapes {w.shape} and {v.shape} differ")
    out = np.empty(w.shape)
    dist2 = _convex_step5(w, float(gamma), *_five_wide(flat), out)
    return out, math.sqrt(dist2)


def combination(terms, out: np.ndarray) -> np.ndarray:
    """out = sum_j c_j v_j for terms ((c_j, v_j), ...) (w-bar from its terms), with `fold`."""
    (c0, v0), rest = terms[0], terms[1:]
    return fold(c0, v0, [c for c, _ in rest], [v for _, v in rest], out)
