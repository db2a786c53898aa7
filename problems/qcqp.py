"""A stochastic QCQP with several stochastic quadratic constraints (synthetic, seeded).

    minimise   F_0(w) = E[ w'(I + Delta) w / 2 + b'w ]
    subject to F_m(w) = E[ w'(I + Delta_m) w / 2 + b_m'w ] <= U_m,   m = 1..M,

where each sample carries a random symmetric Delta (with I + Delta positive semidefinite in
expectation) and a random b. Over N samples the expectations are sample averages, so F_0 and F_m
are Problem 3's averages and the pooled problem is a convex QCQP that CVXPY solves exactly:
the independent reference.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

import ssca_solver as ss


def make_samples(N: int = 600, d: int = 5, M: int = 3, noise: float = 0.3, seed: int = 0):
    """Rows of (vec(Delta_0), b_0, vec(Delta_1), b_1, ...) and the bounds U (M,)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for m in range(M + 1):
        A = rng.normal(scale=noise, size=(N, d, d))
        Delta = 0.5 * (A + A.transpose(0, 2, 1))
        b = rng.normal(loc=rng.normal(size=d) * (2.0 if m == 0 else 1.0), scale=0.5, size=(N, d))
        blocks.append(np.hstack([Delta.reshape(N, d * d), b]))
    U = rng.uniform(-0.2, 0.3, size=M)  # right-hand sides, drawn at random
    return np.hstack(blocks), U


def _quadratic(m: int, d: int) -> ss.SampleFunction:
    width = d * d + d
    lo = m * width

    def parts(R):
        Delta = R[:, lo:lo + d * d].reshape(-1, d, d)
        return Delta, R[:, lo + d * d:lo + width]

    def value(w, R, y):
        Delta, b = parts(R)
        return 0.5 * (w @ w + np.einsum("i,nij,j->n", w, Delta, w)) + b @ w

    def grad(w, R, y):
        Delta, b = parts(R)
        return w + Delta.mean(0) @ w + b.mean(0)

    return ss.SampleFunction(value, grad, name="f0" if m == 0 else f"f{m}")


def stochastic_qcqp(data: ss.FederatedData, U, d: int) -> ss.Problem:
    """The problem on rows made by :func:`make_samples`."""
    fns = [_quadratic(m, d) for m in range(len(U) + 1)]
    return ss.Problem(fns[0], [f <= float(u) for f, u in zip(fns[1:], U)], dim=d, data=data)


def pooled_reference(R, U, d: int):
    """The convex QCQP on the pooled sample averages, by CVXPY + Clarabel: (w, value, duals)."""
    w = cp.Variable(d)
    width = d * d + d

    def F(m):
        Delta = R[:, m * width:m * width + d * d].reshape(-1, d, d).mean(0)
        b = R[:, m * width + d * d:(m + 1) * width].mean(0)
        Q = np.eye(d) + 0.5 * (Delta + Delta.T)
        return 0.5 * cp.quad_form(w, Q) + b @ w

    cons = [F(m + 1) <= U[m] for m in range(len(U))]
    prob = cp.Problem(cp.Minimize(F(0)), cons)
    prob.solve(solver="CLARABEL")
    return w.value, prob.value, np.array([float(np.ravel(c.dual_value)[0]) for c in cons])
