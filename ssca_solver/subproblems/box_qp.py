"""Problem 5 handed to Clarabel directly, over a box (and, in :mod:`ssca_solver.model.box`,
the KKT test's linearised step).

Where the subproblem is a quadratic program over a box (every surrogate proximal-linear or a
linearisation, the deterministic terms lambda |w|^2 or absent, the domain only simple bounds
on coordinates), CVXPY's modelling layer is most of its cost on small problems: a compile per
problem form (a run compiles two or three) and, around each of Clarabel's solves, several
times the solve's own time. Here the same problem is written in Clarabel's own form

    minimise  z' P z / 2 + q' z   subject to  A z + s = b,  s in K

(P upper triangular, CSC) and solved by the same interior-point solver at the same tolerances.
Only a "Solved" answer is used, tried at the settings of the CVXPY path's first stage (the
library's tolerances, Clarabel's defaults, without static regularisation, without
equilibration); when none is "Solved" the round goes to the CVXPY path, with its whole chain
of fallbacks (:meth:`CvxpySubproblem._solve_with_retries`), so the direct form adds speed and
no new way to fail.

Problem 5 in the step v = w - w_t about the round's point (the local form of
:meth:`CvxpySubproblem._build`), z = (v, r, s):

    minimise   a_0 |v|^2 + b_0.v + v' B v / 2 + lambda |w_t + v|^2 + c sum_m s_m
    subject to a_m r + b_m.v + e_m - U_m <= s_m,   s_m >= 0            (inequalities)
               |b_m.v + e_m - U_m| <= s_m                               (equalities: a_m = 0)
               |v|^2 <= r                       (one second-order cone, only when an a_m > 0)
               lo <= w_t + v <= hi              (a fixed coordinate: an equality row)

with (a_m, b_m, e_m) each surrogate's statistics recentred at w_t (quad, lin, const) and B
the quasi-Newton model (dense: d <= DIRECT_MAX_DIM). r is the shared epigraph of |v|^2 as in
the CVXPY form; the objective's a_0 |v|^2 goes into P (the CVXPY form writes a_0 r when r
exists: the same minimiser; the comment in :meth:`BoxProblem5.solve` says why not here).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..model.box import DIRECT_MAX_DIM, bound_rows, solve_qp, usable

__all__ = ["BoxProblem5", "DIRECT_MAX_DIM", "solve_qp"]


class BoxProblem5:
    """Problem 5 (Problem 2 when M = 0) in the local form, solved by Clarabel directly
    (module docstring). ``applies`` says whether a problem qualifies; :meth:`solve` returns
    (w, slack, multipliers, value, retries) or None when Clarabel's status is not "Solved" at
    any of the ``attempts`` (Clarabel's settings, in order)."""

    def __init__(self, dim: int, stochastic_objective: bool, bounds, equality, box: tuple,
                 ridge: float, attempts: tuple):
        """``box``: (lo, hi, ...) of :meth:`DeterministicPart.box`; ``ridge``: lambda of the
        terms lambda |w|^2; ``attempts``: Clarabel's settings to try, in order."""
        self.dim = dim
        self.k = 1 if stochastic_objective else 0
        self.U = np.asarray(bounds, dtype=float)
        self.eq = np.asarray(equality, dtype=bool)
        self.lo, self.hi = box[0], box[1]
        self.ridge = float(ridge)
        self.attempts = tuple(dict(a) for a in attempts)

    @staticmethod
    def applies(dim: int, builders, deterministic, solver: str,
                solver_options: Optional[dict]) -> Optional[tuple]:
        """(box, ridge) when the direct form applies to this subproblem, else None."""
        if solver_options or not usable(solver, dim):
            return None
        if not all(getattr(b, "scalar_curvature", False)
                   and [s.name for s in b.statistic_specs(dim)] == ["const", "lin", "quad"]
                   for b in builders):
            return None
        return deterministic.box_terms()

    def solve(self, local: list, penalty: float, x: np.ndarray,
              B: Optional[np.ndarray]) -> Optional[tuple]:
        """Problem 5 at the statistics ``local`` recentred at the round's point ``x``
        (dicts of const, lin, quad), penalty c and quasi-Newton matrix ``B`` (None: none)."""
        d, k = self.dim, self.k
        M = self.U.size
        if len(local) != k + M:
            raise ValueError(f"BoxProblem5: {len(local)} statistics for {k + M} functions")
        a = np.array([float(st["quad"]) for st in local[k:]])
        if np.any(a[self.eq] != 0.0):
            return None                  # an equality whose surrogate is not affine
        use_r = bool(np.any(a > 0.0))
        nr = 1 if use_r else 0
        n = d + nr + M
        P = np.zeros((n, n))
        q = np.zeros(n)
        const = 0.0
        if k:
            # the objective's a_0 |v|^2 in P, also where the constraints share the epigraph r
            # (the CVXPY form writes a_0 r there): the same minimiser, but with a_0 r some
            # runs stalled before their certificate or ended at a point the KKT test wrongly
            # passed, while with a_0 in P Clarabel only says "AlmostSolved" a little more
            # often, which the fallback attempts absorb
            P[:d, :d] += 2.0 * float(local[0]["quad"]) * np.eye(d)
            q[:d] += np.asarray(local[0]["lin"], dtype=float)
            const += float(local[0]["const"])
        if self.ridge:
            P[:d, :d] += 2.0 * self.ridge * np.eye(d)
            q[:d] += 2.0 * self.ridge * x
            const += self.ridge * float(x @ x)
        if B is not None:
            P[:d, :d] += 0.5 * (B + B.T)
        q[d + nr:] = penalty
        # the surrogate constraints, their equalities' second sides, s >= 0
        Gm = np.array([np.asarray(st["lin"], dtype=float) for st in local[k:]]).reshape(M, d)
        em = np.array([float(st["const"]) for st in local[k:]]) - self.U
        rows = np.zeros((M, n))
        rows[:, :d] = Gm
        if use_r:
            rows[:, d] = a
        rows[:, d + nr:] = -np.eye(M)
        ie = np.flatnonzero(self.eq)
        low = np.zeros((ie.size, n))
        low[:, :d] = -Gm[ie]
        low[np.arange(ie.size), d + nr + ie] = -1.0
        neg = np.zeros((M, n))
        neg[:, d + nr:] = -np.eye(M)
        (A_eq, b_eq, _), (A_box, b_box, _, _) = bound_rows(self.lo, self.hi, x, n)
        A_in = np.vstack([rows, low, neg, A_box])
        b_in = np.concatenate([-em, em[ie], np.zeros(M), b_box])
        soc = None
        if use_r:
            # (r + 1, r - 1, 2 v) in the second-order cone: |v|^2 <= r
            A_soc = np.zeros((d + 2, n))
            A_soc[0, d] = A_soc[1, d] = -1.0
            A_soc[2:, :d] = -2.0 * np.eye(d)
            b_soc = np.zeros(d + 2)
            b_soc[0], b_soc[1] = 1.0, -1.0
            soc = (A_soc, b_soc)
        for attempt, tolerances in enumerate(self.attempts):
            z, _, z_in, status = solve_qp(P, q, A_eq, b_eq, A_in, b_in, soc, tolerances)
            if status == "Solved" and np.all(np.isfinite(z)):
                break
        else:
            return None
        v = z[:d]
        s = np.maximum(z[d + nr:], 0.0)
        mult = z_in[:M].copy()
        mult[ie] -= z_in[M:M + ie.size]
        mult = np.where(self.eq, mult, np.maximum(mult, 0.0))
        value = (const + float(q[:d] @ v) + 0.5 * float(v @ (P[:d, :d] @ v))
                 + penalty * float(s.sum()))
        return x + v, s, mult, value, attempt
