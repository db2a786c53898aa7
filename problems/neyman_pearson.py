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

import ssca_solver as ss

from problems.logistic import logistic_loss


def neyman_pearson(data: ss.FederatedData, alpha: float, lam: float = 1e-3,
                   class_fractions=None, box: float | None = None) -> ss.Problem:
    """The Neyman-Pearson problem on ``data`` (labels 0/1) with type-I loss bound ``alpha``.

    Args:
      class_fractions: (pi_0, pi_1); by default counted from the clients' label counts (a
        two-number summary each client shares once).
      box: if given, the deterministic set |w|_inf <= box (a domain next to the stochastic
        constraint; the subproblem then goes to CVXPY).
    """
    if class_fractions is None:
        counts = np.zeros(2)
        for c in data.clients:
            counts += [np.sum(c.y == 0), np.sum(c.y == 1)]
        class_fractions = counts / counts.sum()
    pi0, pi1 = class_fractions
    dim = data.clients[0].X.shape[1]
    obj = logistic_loss(only_label=1, class_fraction=pi1, name="loss[class 1]")
    con = logistic_loss(only_label=0, class_fraction=pi0, name="loss[class 0]")
    domain = (lambda w: [cp.norm(w, "inf") <= box]) if box is not None else None
    return ss.Problem(obj, [con <= alpha], dim=dim, data=data,
                      regularizer=lambda w: lam * cp.sum_squares(w), domain=domain)


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
