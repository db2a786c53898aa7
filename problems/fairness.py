"""Fairness-constrained logistic regression: a demographic-parity gap bounded by epsilon.

    minimise   mean logistic loss + lam |w|^2
    subject to  DP(w) <= eps  and  -DP(w) <= eps,
    DP(w) = mean_{s=1} sigma(x.w) - mean_{s=0} sigma(x.w)

DP is a sample average of the per-sample function (1{s=1}/pi_1 - 1{s=0}/pi_0) sigma(x.w), so both
constraints are stochastic constraints of Problem 3 — and nonconvex (sigma is neither convex
nor concave). Data: scikit-learn's diabetes data (shipped inside the package): 442 patients, the
label is "disease progression above the median", the protected attribute is the recorded sex
(not used as a feature). Targets are passed as two columns (label, s).
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
from scipy.special import expit

import ssca_solver as ss


def diabetes_fairness():
    """(X (442, 10) standardised with an intercept column, Y (442, 2) = (label, s))."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    A, target = data.data, data.target
    sex_col = list(data.feature_names).index("sex")
    s = (A[:, sex_col] > A[:, sex_col].mean()).astype(float)
    feats = np.delete(A, sex_col, axis=1)
    feats = (feats - feats.mean(0)) / feats.std(0)
    X = np.hstack([feats, np.ones((len(s), 1))])
    label = (target > np.median(target)).astype(float)
    return X, np.column_stack([label, s])


def logistic(name="logistic") -> ss.SampleFunction:
    def value(w, X, Y):
        m = (2 * Y[:, 0] - 1) * (X @ w)
        return np.logaddexp(0.0, -m)

    def grad(w, X, Y):
        sgn = 2 * Y[:, 0] - 1
        return X.T @ (-sgn * expit(-sgn * (X @ w))) / len(X)

    return ss.SampleFunction(value, grad, name=name, convexity="convex")


def parity_gap(pi1: float, name="DP gap") -> ss.SampleFunction:
    """The per-sample form of DP(w): (1{s=1}/pi_1 - 1{s=0}/pi_0) sigma(x.w)."""
    def weights(Y):
        s = Y[:, 1]
        return s / pi1 - (1 - s) / (1 - pi1)

    def value(w, X, Y):
        return weights(Y) * expit(X @ w)

    def grad(w, X, Y):
        p = expit(X @ w)
        return X.T @ (weights(Y) * p * (1 - p)) / len(X)

    return ss.SampleFunction(value, grad, name=name)


def fair_logistic(data: ss.FederatedData, eps: float, lam: float = 1e-2,
                  pi1: float | None = None) -> ss.Problem:
    """The problem above on ``data``; ``pi1`` (share of s = 1) is counted from the clients."""
    if pi1 is None:
        pi1 = sum(float(c.y[:, 1].sum()) for c in data.clients) / data.num_samples
    gap = parity_gap(pi1)
    dim = data.clients[0].X.shape[1]
    reg = (lambda w: lam * cp.sum_squares(w)) if lam else None
    return ss.Problem(logistic(), [gap <= eps, gap >= -eps], dim=dim, data=data, regularizer=reg)


def accuracy_and_gap(w, X, Y):
    pred = (X @ w > 0).astype(float)
    s = Y[:, 1] == 1
    return float(np.mean(pred == Y[:, 0])), float(pred[s].mean() - pred[~s].mean())


def slsqp_reference(X, Y, eps, lam=1e-2, x0=None):
    """The pooled problem by SciPy SLSQP (a KKT point; the constraints are nonconvex)."""
    from scipy.optimize import minimize

    f, g = logistic(), parity_gap(float(Y[:, 1].mean()))
    obj = lambda w: f.value(w, X, Y).mean() + lam * w @ w  # noqa: E731
    jac = lambda w: f.grad(w, X, Y) + 2 * lam * w  # noqa: E731
    cons = [{"type": "ineq", "fun": lambda w: eps - g.value(w, X, Y).mean(),
             "jac": lambda w: -g.grad(w, X, Y)},
            {"type": "ineq", "fun": lambda w: eps + g.value(w, X, Y).mean(),
             "jac": lambda w: g.grad(w, X, Y)}]
    x0 = np.zeros(X.shape[1]) if x0 is None else x0
    return minimize(obj, x0, jac=jac, constraints=cons, method="SLSQP",
                    options={"ftol": 1e-12, "maxiter": 500})


def skewed_clients(X, Y, num_clients: int = 4, majority: float = 0.85, seed=0):
    """Clients that hold different groups: even-numbered clients draw ``majority`` of their rows
    from s = 1, odd-numbered ones from s = 0 (non-IID by the protected attribute)."""
    rng = np.random.default_rng(seed)
    ones = list(rng.permutation(np.flatnonzero(Y[:, 1] == 1)))
    zeros = list(rng.permutation(np.flatnonzero(Y[:, 1] == 0)))
    size = len(Y) // num_clients
    parts = []
    for i in range(num_clients):
        major, minor = (ones, zeros) if i % 2 == 0 else (zeros, ones)
        k = min(int(round(majority * size)), len(major))
        take = [major.pop() for _ in range(k)]
        take += [minor.pop() for _ in range(min(size - k, len(minor)))]
        parts.append(np.array(take))
    rest = ones + zeros
    if rest:
        parts[-1] = np.concatenate([parts[-1], np.array(rest, dtype=int)])
    return ss.FederatedData([(X[p], Y[p]) for p in parts])
