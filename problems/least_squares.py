"""Least squares with a user-written surrogate that keeps the loss exact.

For f(w, x, y) = (x.w - y)^2 / 2 the loss is already a convex quadratic, so the best surrogate
is the loss itself (plus the proximal term): fbar(w, w_t, x) = f(w, x) + tau |w - w_t|^2. Its
statistics over a batch are sums of x x' (d x d), x y (d) and y^2 / 2, plus the proximal parts;
the surrogate is affine in them. This :class:`ExactQuadratic` builder is the worked example of
a custom builder in docs/examples/README.md: it goes through the CVXPY path (``cp.quad_form`` with a PSD
Parameter is not DPP, so CVXPY recompiles Problem 2 each round) and needs far fewer rounds than
the proximal-linear default, which only sees the gradient.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

import ssca_solver as ss
from ssca_solver import Statistic, SurrogateBuilder


class ExactQuadratic(SurrogateBuilder):
    """fbar = f + tau |w - w_t|^2 for f(w, x, y) = (x.w - y)^2 / 2 (needs X rows and targets)."""

    def statistic_specs(self, dim):
        return (Statistic("S", (dim, dim), psd=True), Statistic("lin", (dim,)),
                Statistic("const", ()), Statistic("quad", (), nonneg=True))

    def statistics(self, fn, w, X, y, tau, where):
        n = X.shape[0]
        # sum_n (x.w - y)^2/2 + tau |w - w_t|^2 = w'(S/2)w - (X'y).w + y'y/2 + n tau |w - w_t|^2
        return {"S": X.T @ X, "lin": -(X.T @ y) - 2.0 * n * tau * w,
                "const": np.asarray(0.5 * y @ y + n * tau * (w @ w)), "quad": np.asarray(n * tau)}

    def expression(self, stats, w, w_sq):
        return (0.5 * cp.quad_form(w, stats["S"]) + stats["lin"] @ w + stats["const"]
                + stats["quad"] * w_sq)

    def evaluate(self, stats, w):
        w = np.asarray(w, dtype=float)
        return float(0.5 * w @ stats["S"] @ w + stats["lin"] @ w + stats["const"]
                     + stats["quad"] * (w @ w))

    def __repr__(self):
        return "ExactQuadratic()"


def squared_loss(exact: bool = False) -> ss.SampleFunction:
    def value(w, X, y):
        return 0.5 * (X @ w - y) ** 2

    def grad(w, X, y):
        return X.T @ (X @ w - y) / len(y)

    def hess(w, X, y):
        return X.T @ X / len(y)

    def hessp(w, X, y, V):
        return X.T @ (X @ V) / len(y)

    return ss.SampleFunction(value, grad, name="squared loss",
                             surrogate=ExactQuadratic() if exact else None, hess=hess,
                             hessp=hessp, convexity="convex")


def diabetes_regression():
    """scikit-learn's diabetes data: standardised features with an intercept, standardised y."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return np.hstack([X, np.ones((len(y), 1))]), (y - y.mean()) / y.std()


def box_least_squares(data: ss.FederatedData, box: float, exact: bool) -> ss.Problem:
    """min mean (x.w - y)^2 / 2  s.t.  |w|_inf <= box (a deterministic set)."""
    dim = data.clients[0].X.shape[1]
    return ss.Problem(squared_loss(exact), dim=dim, data=data,
                      domain=lambda w: [cp.norm(w, "inf") <= box])


def pooled_reference(X, y, box: float):
    w = cp.Variable(X.shape[1])
    p = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - y) / len(y)),
                   [cp.norm(w, "inf") <= box])
    p.solve(solver="CLARABEL")
    return w.value, p.value


def ill_conditioned(cond: float, d: int = 20, n: int = 2000, clients: int = 8, seed: int = 0):
    """Least squares whose features have condition number ``cond`` (singular values
    cond^(-k/(d-1)) times sqrt(n)), over ``clients`` clients, subject to the mean prediction
    equal to a target and |w|^2 <= r, every function with its Hessian (the Newton model's
    test family). Returns (problem, X, y, target, r): the pooled rows for a reference."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    X = (U * cond ** np.linspace(0.0, -1.0, d)) @ V.T * np.sqrt(n)
    wstar = rng.standard_normal(d)
    y = X @ wstar + 0.1 * rng.standard_normal(n)
    data = ss.FederatedData.split(X, y, num_clients=clients, seed=seed)
    lsq = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                            lambda w, X, y: X.T @ (X @ w - y) / len(X), name="lsq",
                            hess=lambda w, X, y: X.T @ X / len(X), convexity="convex")
    mean = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), name="mean",
                             hess=lambda w, X, y: np.zeros((len(w), len(w))), convexity="affine")
    norm = ss.SampleFunction(lambda w, X, y: np.full(len(X), w @ w), lambda w, X, y: 2 * w,
                             name="norm", hess=lambda w, X, y: 2 * np.eye(len(w)),
                             convexity="convex")
    target, r = float(X.mean(0) @ (0.5 * wstar)), 0.8 * float(wstar @ wstar)
    prob = ss.Problem(lsq, [mean == target, norm <= r], dim=d, data=data)
    return prob, X, y, target, r


def spiked(d: int = 600, n: int = 2000, spikes: int = 6, cond: float = 1e3, clients: int = 4,
           seed: int = 0, products: bool = True):
    """Least squares whose features have ``spikes`` directions of variance up to ``cond``
    above a flat bulk of variance 1 (a Hessian of low effective rank: the sketch's family),
    with the same equality and ball as :func:`ill_conditioned`; every function gives its
    Hessian's products with a matrix (``hessp``; with ``products=False`` the objective its
    whole ``hess`` instead). Returns (problem, X, y, target, r)."""
    rng = np.random.default_rng(seed)
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    scale = np.ones(d)
    scale[:spikes] = np.sqrt(cond) * np.linspace(1.0, 0.3, spikes)
    X = (rng.standard_normal((n, d)) * scale) @ V.T
    wstar = rng.standard_normal(d) / np.sqrt(d)
    y = X @ wstar + 0.1 * rng.standard_normal(n)
    data = ss.FederatedData.split(X, y, num_clients=clients, seed=seed)
    curv = ({"hessp": lambda w, X, y, V: X.T @ (X @ V) / len(X)} if products
            else {"hess": lambda w, X, y: X.T @ X / len(X)})
    lsq = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                            lambda w, X, y: X.T @ (X @ w - y) / len(X), name="lsq",
                            convexity="convex", **curv)
    mean = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), name="mean",
                             hessp=lambda w, X, y, V: np.zeros_like(V), convexity="affine")
    norm = ss.SampleFunction(lambda w, X, y: np.full(len(X), w @ w), lambda w, X, y: 2 * w,
                             name="norm", hessp=lambda w, X, y, V: 2.0 * V,
                             convexity="convex")
    target, r = float(X.mean(0) @ (0.5 * wstar)), 0.8 * float(wstar @ wstar)
    prob = ss.Problem(lsq, [mean == target, norm <= r], dim=d, data=data)
    return prob, X, y, target, r


def ill_conditioned_reference(X, y, target: float, r: float) -> np.ndarray:
    """The pooled optimum of :func:`ill_conditioned`, to the precision the rows allow: the
    equality is eliminated (w = w0 + Z z, Z an orthonormal basis of a's null space, a the mean
    row), and for the ball's multiplier lam >= 0 the rest is the least-squares problem
    min |X Z z - (y - X w0)|^2 / (2 n) + lam |w0 + Z z|^2, solved by an SVD (no normal
    equations, whose condition number is the square of X's); lam = 0 when that point is
    inside the ball, else the root of |w(lam)|^2 = r (Brent's method; |w(lam)| falls with
    lam). CVXPY + Clarabel's interior point stops at about 1e-3 relative error at condition
    number 1e6 here."""
    from scipy.linalg import null_space
    from scipy.optimize import brentq

    n = len(y)
    a = X.mean(0)
    w0 = a * (target / (a @ a))
    Z = null_space(a[None, :])
    A, b = X @ Z / np.sqrt(n), (y - X @ w0) / np.sqrt(n)

    def point(lam: float) -> np.ndarray:
        # min |A z - b|^2 / 2 + lam |w0 + Z z|^2 = ... + lam |z|^2 (Z' w0 = 0, |Z z| = |z|)
        M = np.vstack([A, np.sqrt(2.0 * lam) * np.eye(Z.shape[1])])
        rhs = np.concatenate([b, np.zeros(Z.shape[1])])
        return w0 + Z @ np.linalg.lstsq(M, rhs, rcond=None)[0]

    free = point(0.0)
    if free @ free <= r:
        return free
    hi = 1.0
    while point(hi) @ point(hi) > r:
        hi *= 10.0
    lam = brentq(lambda t: point(t) @ point(t) - r, 0.0, hi, xtol=1e-300,
                 rtol=4 * np.finfo(float).eps, maxiter=500)
    return point(lam)
