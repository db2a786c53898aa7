"""Quadratic programs over a box in Clarabel's own form (no CVXPY): the pieces shared by the
KKT test's linearised step (:meth:`DeterministicPart.linearized_step`) and the rounds' Problem 5
(:mod:`ssca_solver.subproblems.box_qp`, which explains why).

Clarabel solves  minimise z' P z / 2 + q' z  subject to  A z + s = b,  s in K  (P upper
triangular, CSC). Only its "Solved" counts; callers fall back to their CVXPY forms otherwise.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import scipy.sparse as sp

try:                                    # a dependency of the package; guarded all the same
    import clarabel
except ImportError:                     # pragma: no cover
    clarabel = None

#: the direct form is used up to this many variables: P holds the quasi-Newton matrix dense,
#: whose factorisation grows like d^3 while CVXPY's factored term grows with d times its
#: rank, so above this size the dense form costs more per solve than the CVXPY model it
#: replaces
DIRECT_MAX_DIM = 128


def usable(solver: str, dim: int) -> bool:
    """Whether a QP over a box of ``dim`` variables may go to Clarabel directly: Clarabel is
    the chosen solver (and importable) and dim <= DIRECT_MAX_DIM."""
    return clarabel is not None and solver.upper() == "CLARABEL" and dim <= DIRECT_MAX_DIM


def settings(tolerances: dict):
    """Clarabel's settings at ``tolerances`` (tol_gap_abs, tol_gap_rel, tol_feas), quiet."""
    st = clarabel.DefaultSettings()
    st.verbose = False
    for k, v in tolerances.items():
        setattr(st, k, v)
    return st


def bound_rows(lo: np.ndarray, hi: np.ndarray, x: np.ndarray, n: int):
    """The rows of lo <= x + v <= hi, v the first x.size of n columns, as dense arrays:
    (equality A, b, fixed indices), (inequality A, b, upper indices, lower indices)."""
    fixed = np.flatnonzero(np.isfinite(lo) & (lo == hi))
    upper = np.flatnonzero(np.isfinite(hi) & (lo != hi))
    lower = np.flatnonzero(np.isfinite(lo) & (lo != hi))
    A_eq = np.zeros((fixed.size, n))
    A_eq[np.arange(fixed.size), fixed] = 1.0
    A_in = np.zeros((upper.size + lower.size, n))
    A_in[np.arange(upper.size), upper] = 1.0
    A_in[upper.size + np.arange(lower.size), lower] = -1.0
    b_in = np.concatenate([hi[upper] - x[upper], x[lower] - lo[lower]])
    return (A_eq, hi[fixed] - x[fixed], fixed), (A_in, b_in, upper, lower)


def solve_qp(P: np.ndarray, q, A_eq: np.ndarray, b_eq, A_in: np.ndarray, b_in,
             soc: Optional[tuple], tolerances: dict):
    """Clarabel on min z'Pz/2 + q'z s.t. A_eq z = b_eq, A_in z <= b_in and, with ``soc`` =
    (A_soc, b_soc), b_soc - A_soc z in the second-order cone (dense arrays, converted to CSC
    once: building them sparse block by block costs more than the solve on small problems).
    Returns (x, z_eq, z_in, status)."""
    blocks, b, cones = [], [], []
    if A_eq.shape[0]:
        blocks.append(A_eq), b.append(b_eq)
        cones.append(clarabel.ZeroConeT(A_eq.shape[0]))
    if A_in.shape[0]:
        blocks.append(A_in), b.append(b_in)
        cones.append(clarabel.NonnegativeConeT(A_in.shape[0]))
    if soc is not None:
        blocks.append(soc[0]), b.append(soc[1])
        cones.append(clarabel.SecondOrderConeT(soc[0].shape[0]))
    A = sp.csc_matrix(np.vstack(blocks))
    sol = clarabel.DefaultSolver(sp.csc_matrix(np.triu(P)), np.asarray(q, dtype=float), A,
                                 np.concatenate(b), cones, settings(tolerances)).solve()
    z = np.asarray(sol.z, dtype=float)
    n_eq = A_eq.shape[0]
    return (np.asarray(sol.x, dtype=float), z[:n_eq], z[n_eq:n_eq + A_in.shape[0]],
            str(sol.status))


def linearized_step_box(box: tuple, ridge: float, w, g0, G, cons, eq, t: float,
                        sigma: float, P_elastic: float, tolerances: dict) -> Optional[tuple]:
    """The linearised KKT step of :meth:`DeterministicPart.linearized_step` (its scaled data:
    objective over sigma, rows over their norms) over a box, by Clarabel directly, in the step
    v = u - w:

        minimise  g0.v + |v|^2 / (2 t) + lambda |w + v|^2 / sigma + P sum_m e_m
        subject to cons_m + G_m.v <= e_m (and -(cons_m + G_m.v) <= e_m for an equality),
                   e >= 0,  lo <= w + v <= hi.

    Returns (u, mu (scaled), bound multipliers (z_lo, z_hi) scaled, elastic), or None when
    Clarabel's status is not "Solved"."""
    lo, hi = box[0], box[1]
    d = w.size
    M = cons.size
    n = d + M
    # the objective multiplied by t, so that the proximal term has unit curvature: at its
    # own scale a long step (small curvature 1 / t) makes a sizeable step error cost less
    # than Clarabel's gap tolerance, so the error stays in the answer (tests/test_kkt.py);
    # the duals are divided back
    P = np.zeros((n, n))
    P[np.arange(d), np.arange(d)] = 1.0 + 2.0 * ridge * t / sigma
    q = t * np.concatenate([g0 + (2.0 * ridge / sigma) * w, np.full(M, P_elastic)])
    ie = np.flatnonzero(eq)
    up = np.hstack([G.T, -np.eye(M)])
    low = np.hstack([-G.T[ie], -np.eye(M)[ie]])
    neg = np.hstack([np.zeros((M, d)), -np.eye(M)])
    (A_eq, b_eq, fixed), (A_box, b_box, upper, lower) = bound_rows(lo, hi, w, n)
    A_in = np.vstack([up, low, neg, A_box])
    b_in = np.concatenate([-cons, cons[ie], np.zeros(M), b_box])
    z, z_eq, z_in, status = solve_qp(P, q, A_eq, b_eq, A_in, b_in, None, tolerances)
    if status != "Solved" or not np.all(np.isfinite(z)):
        return None
    v = z[:d]
    z_eq, z_in = z_eq / t, z_in / t
    mu = z_in[:M].copy()
    mu[ie] -= z_in[M:M + ie.size]
    zb = z_in[2 * M + ie.size:]
    z_hi = np.zeros(d)
    z_lo = np.zeros(d)
    z_hi[upper] = zb[:upper.size]
    z_lo[lower] = zb[upper.size:]
    z_hi[fixed] = np.maximum(z_eq, 0.0)
    z_lo[fixed] = np.maximum(-z_eq, 0.0)
    e = np.maximum(z[d:], 0.0)
    return w + v, mu, (z_lo, z_hi), float(np.sum(e))
