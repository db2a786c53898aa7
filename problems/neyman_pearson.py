"""Neyman-Pearson classification as a constrained federated problem.

    minimise   mean over class-1 rows of the logistic loss          (F_0)
               + lam |w|^2                                            (deterministic, exact)
    subject to mean over class-0 rows of the logistic loss <= alpha  (F_1 <= U)

Both class means are averages over all N rows of a per-sample function weighted by
1{y = k} / pi_k (:func:`problems.logistic.logistic_loss`), so they are sample averages as in
Problem 3 and every client computes its share on its own rows.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
from scipy.special import expit

import ssca_solver as ss

from problems.logistic import logistic_loss


def neyman_pearson(data: ss.FederatedData, alpha: float, lam: float = 1e-3,
                   class_fractions=None, box: float | None = None,
                   one_pass: bool = False) -> ss.Problem:
    """The Neyman-Pearson problem on ``data`` (labels 0/1) with type-I loss bound ``alpha``.

    Args:
      class_fractions: (pi_0, pi_1); by default counted from the clients' label counts (a
        two-number summary each client shares once).
      box: if given, the deterministic set |w|_inf <= box (a domain next to the stochastic
        constraint; the subproblem then goes to CVXPY).
      one_pass: the two class losses as the components of one
        :class:`~ssca_solver.VectorSampleFunction` (:func:`class_losses`): one product X w
        and one X' C per batch for both, where two SampleFunctions read the rows twice. The
        same problem; its sums are added in another order (the iterates agree up to
        rounding).
    """
    if class_fractions is None:
        counts = np.zeros(2)
        for c in data.clients:
            counts += [np.sum(c.y == 0), np.sum(c.y == 1)]
        class_fractions = counts / counts.sum()
    pi0, pi1 = class_fractions
    dim = data.clients[0].X.shape[1]
    if one_pass:
        both = class_losses(pi0, pi1)
        obj, con = both[1], both[0]
    else:
        obj = logistic_loss(only_label=1, class_fraction=pi1, name="loss[class 1]")
        con = logistic_loss(only_label=0, class_fraction=pi0, name="loss[class 0]")
    domain = (lambda w: [cp.norm(w, "inf") <= box]) if box is not None else None
    return ss.Problem(obj, [con <= alpha], dim=dim, data=data,
                      regularizer=lambda w: lam * cp.sum_squares(w), domain=domain)


def class_losses(pi0: float, pi1: float) -> ss.VectorSampleFunction:
    """Component k: the logistic loss weighted by 1{y = k} / pi_k (as
    ``logistic_loss(only_label=k, class_fraction=pi_k)``), both from one pass over the rows:
    the margins X w once, the two gradients as one product X' C with C (n, 2)."""
    pi = np.array([pi0, pi1], dtype=float)

    def parts(w, X, y):
        y = np.asarray(y, dtype=float)
        s = 2.0 * y - 1.0
        m = s * (X @ w)
        wt = np.stack([(y == 0) / pi[0], (y == 1) / pi[1]], axis=1)       # (n, 2)
        return s, m, wt

    def value(w, X, y):
        _, m, wt = parts(w, X, y)
        return wt * np.logaddexp(0.0, -m)[:, None]

    def value_and_jac(w, X, y):
        s, m, wt = parts(w, X, y)
        coef = wt * (-s * expit(-m))[:, None]
        return wt * np.logaddexp(0.0, -m)[:, None], (X.T @ coef).T / X.shape[0]

    def jac(w, X, y):
        return value_and_jac(w, X, y)[1]

    def hess(w, X, y):
        _, m, wt = parts(w, X, y)
        p = expit(m)
        return np.stack([(X * (wt[:, k] * p * (1 - p))[:, None]).T @ X / X.shape[0]
                         for k in range(2)])

    return ss.VectorSampleFunction(value, jac, 2, name="loss", value_and_jac=value_and_jac,
                                   hess=hess, convexity="convex")


def pooled_reference(X, y, alpha: float, lam: float = 1e-3, box: float | None = None):
    """The same problem on the pooled data, solved by CVXPY + Clarabel (the global optimum).

    Returns (w, objective value, constraint value, multiplier).
    """
    d = X.shape[1]
    w = cp.Variable(d)
    s = 2 * y - 1
    loss = cp.logistic(-cp.multiply(s, X @ w))
    m0, m1 = y == 0, y == 1
    obj = cp.sum(loss[m1]) / m1.sum() + lam * cp.sum_squares(w)
    con = cp.sum(loss[m0]) / m0.sum() <= alpha
    p = cp.Problem(cp.Minimize(obj), [con] + ([cp.norm(w, "inf") <= box] if box else []))
    p.solve(solver="CLARABEL")
    return w.value, p.value, float(con.expr.value + alpha), float(con.dual_value)
