"""A suite of federated problems, each with an independent reference, on which the solver with
default options (no tuning) is measured against stated accuracy targets (:data:`TARGETS`).

Every problem is a function returning ``(problem, reference)``: ``problem`` is an
:class:`ssca_solver.Problem` on federated data, ``reference`` a dict with

* ``kind``: "convex", "nonconvex" or "infeasible";
* ``x``, ``fun``: the reference point and its objective (F_0 + deterministic terms, the same
  quantity as ``Result.fun``); None for an infeasible problem;
* ``multipliers``: the multipliers of the stochastic constraints, in order (M,);
* ``source``: how the reference was computed;
* for nonconvex problems ``kkt_points``: every distinct KKT point the multi-start search found
  (the solver is measured against the nearest one), and ``stationarity`` at ``x``;
* for the infeasible problem ``min_violation``: min_w max_m (F_m(w) - U_m) on the pooled data
  by CVXPY (> 0 certifies that the constraints cannot be met).

The references never call the library's solver: convex problems are solved on the pooled data
by CVXPY + Clarabel with tight tolerances (1e-10), nonconvex ones by SciPy SLSQP from several
starting points (ftol 1e-14), with the multipliers from the KKT conditions at the SLSQP point
(nonnegative least squares over the active constraints).

``PROBLEMS`` maps each name to its function; :func:`build` caches the (problem, reference)
pairs, since some references take seconds.
"""

from __future__ import annotations

import functools
import math

import cvxpy as cp
import numpy as np
from scipy.optimize import minimize, nnls
from scipy.special import expit, logsumexp

import ssca_solver as ss
from ssca_solver.datasets import breast_cancer

from problems import fairness, qcqp
from problems.least_squares import diabetes_regression
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson

#: Clarabel's tolerances for the references, tightest first (its defaults are 1e-8): the first
#: that ends "optimal" is kept
CLARABEL_LADDER = (dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, tol_ktratio=1e-8,
                        max_iter=400),
                   dict(tol_gap_abs=1e-9, tol_gap_rel=1e-9, tol_feas=1e-9, max_iter=400),
                   {})


# -- reference helpers ----------------------------------------------------------------------------

def solve_pooled(problem: cp.Problem) -> str:
    """Solve a CVXPY problem by Clarabel, tightest tolerances first (:data:`CLARABEL_LADDER`);
    returns a description of the status and tolerance kept."""
    import warnings

    for opts in CLARABEL_LADDER:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)      # "solution may be inaccurate"
            problem.solve(solver="CLARABEL", **opts)
        if problem.status == cp.OPTIMAL:
            return f"optimal at tol {opts.get('tol_feas', 1e-8):g}"
    if problem.status == cp.OPTIMAL_INACCURATE:
        return "optimal_inaccurate at Clarabel's default tolerances"
    raise RuntimeError(f"the CVXPY reference did not solve: {problem.status}")


def _duals(constraints) -> np.ndarray:
    return np.array([float(np.ravel(c.dual_value)[0]) for c in constraints])


def _convex_ref(w, prob, cons, source) -> dict:
    status = solve_pooled(prob)
    return {"kind": "convex", "x": np.array(w.value, dtype=float), "fun": float(prob.value),
            "multipliers": _duals(cons), "source": f"CVXPY+Clarabel on the pooled data "
            f"({status}); {source}"}


def kkt_multipliers(g0: np.ndarray, G: np.ndarray, cons: np.ndarray, active_tol: float = 1e-7):
    """Multipliers at a point from its KKT conditions: NNLS of g0 + G mu = 0 over the active
    constraints (|F_m - U_m| <= active_tol), 0 on the others. Returns (mu, |g0 + G mu|)."""
    M = cons.size
    mu = np.zeros(M)
    act = np.flatnonzero(np.abs(cons) <= active_tol)
    if act.size:
        mu[act], _ = nnls(G[:, act], -g0)
    return mu, float(np.linalg.norm(g0 + G @ mu))


def slsqp_multistart(obj, jac, cons_fns, x0s, feas_tol=1e-9, stat_tol=1e-5):
    """SLSQP (ftol 1e-14) from every start in ``x0s``.

    ``cons_fns``: list of (F_m - U_m, grad F_m) callables (constraints F_m - U_m <= 0).
    Returns the KKT points found (sorted by objective, duplicates within 1e-5 merged), each a
    dict with x, fun, multipliers, stationarity, start.
    """
    points = []
    for k, x0 in enumerate(x0s):
        r = minimize(obj, x0, jac=jac, method="SLSQP",
                     constraints=[{"type": "ineq", "fun": (lambda w, f=f: -f(w)),
                                   "jac": (lambda w, g=g: -g(w))} for f, g in cons_fns],
                     options={"ftol": 1e-14, "maxiter": 2000})
        x = r.x
        cons = np.array([f(x) for f, _ in cons_fns])
        if np.max(cons, initial=-np.inf) > feas_tol:
            continue
        G = np.column_stack([g(x) for _, g in cons_fns]) if cons_fns else np.zeros((x.size, 0))
        mu, stat = kkt_multipliers(jac(x), G, cons)
        scale = max(1.0, float(np.linalg.norm(jac(x))), float(np.max(
            mu * np.linalg.norm(G, axis=0), initial=0.0)))
        if stat > stat_tol * scale:
            continue
        if any(np.max(np.abs(p["x"] - x)) < 1e-5 for p in points):
            continue
        points.append({"x": x, "fun": float(obj(x)), "multipliers": mu,
                       "stationarity": stat, "start": k})
    if not points:
        raise RuntimeError("no SLSQP start reached a feasible KKT point")
    return sorted(points, key=lambda p: p["fun"])


def _nonconvex_ref(points, source) -> dict:
    """The reference of a nonconvex problem: the KKT point reached from x0 = 0 (start 0: the
    solver's own start) when SLSQP found one from there, else the best; every point kept."""
    from_zero = [p for p in points if p["start"] == 0]
    main = from_zero[0] if from_zero else points[0]
    return {"kind": "nonconvex", "x": main["x"], "fun": main["fun"],
            "multipliers": main["multipliers"], "stationarity": main["stationarity"],
            "kkt_points": [{k: v for k, v in p.items()} for p in points],
            "source": f"SciPy SLSQP (ftol 1e-14) from {source}; multipliers by NNLS of the "
                      f"KKT conditions at the SLSQP point; {len(points)} distinct KKT point(s)"}


def _starts(d, n, seed, scale=0.3, extra=()):
    rng = np.random.default_rng(seed)
    return [np.zeros(d), *extra, *(rng.normal(scale=scale, size=d) for _ in range(n))]


# -- sample functions -----------------------------------------------------------------------------

def scaled(fn: ss.SampleFunction, k: float) -> ss.SampleFunction:
    """k * fn (objective and constraints in other units)."""
    return ss.SampleFunction(lambda w, X, y: k * fn.value(w, X, y),
                             lambda w, X, y: k * fn.grad(w, X, y), name=f"{k:g}*{fn.name}")


def log_cosh(target: int = 1, name: str = "log-cosh") -> ss.SampleFunction:
    """log cosh(x.w - y[:, target]) (a smooth robust loss)."""
    def value(w, X, Y):
        r = X @ w - Y[:, target]
        return np.logaddexp(r, -r) - math.log(2.0)

    def grad(w, X, Y):
        return X.T @ np.tanh(X @ w - Y[:, target]) / X.shape[0]

    return ss.SampleFunction(value, grad, name=name, convexity="convex")


def half_squares(target: int = 0, name: str = "squared loss") -> ss.SampleFunction:
    """(x.w - y[:, target])^2 / 2 (y may be 1-D: target ignored)."""
    def col(Y):
        return Y if Y.ndim == 1 else Y[:, target]

    def value(w, X, Y):
        return 0.5 * (X @ w - col(Y)) ** 2

    def grad(w, X, Y):
        return X.T @ (X @ w - col(Y)) / X.shape[0]

    return ss.SampleFunction(value, grad, name=name, convexity="convex")


def sigmoid_miss_rate(pi1: float, sharpness: float, name: str = "miss rate (sigmoid)"):
    """1{y = 1}/pi_1 sigmoid(-s x.w): its mean is the sigmoid surrogate of the miss rate (the
    fraction of class-1 rows scored negative). Nonconvex."""
    def value(w, X, y):
        return (y == 1) / pi1 * expit(-sharpness * (X @ w))

    def grad(w, X, y):
        p = expit(-sharpness * (X @ w))
        return X.T @ ((y == 1) / pi1 * (-sharpness) * p * (1 - p)) / X.shape[0]

    return ss.SampleFunction(value, grad, name=name)


def softmax_loss(num_classes: int, only_class: int | None = None, class_fraction: float = 1.0,
                 name: str | None = None) -> ss.SampleFunction:
    """Multiclass cross-entropy, w = vec(W) with W (K, p) row-major (scores X W'); with
    ``only_class`` the rows of that class only (weights 1{y = k} / pi_k)."""
    K = num_classes

    def weights(y):
        if only_class is None:
            return np.ones(len(y))
        return (y == only_class) / class_fraction

    def value(w, X, y):
        Z = X @ w.reshape(K, -1).T
        yi = y.astype(int)
        return weights(y) * (logsumexp(Z, axis=1) - Z[np.arange(len(yi)), yi])

    def grad(w, X, y):
        Z = X @ w.reshape(K, -1).T
        P = np.exp(Z - logsumexp(Z, axis=1, keepdims=True))
        P[np.arange(len(y)), y.astype(int)] -= 1.0
        return ((weights(y)[:, None] * P).T @ X).ravel() / X.shape[0]

    def hessp(w, X, y, V):
        # the Hessian of the weighted mean times V's columns: row by row
        # (diag(P) - P P') (x) x x', applied to each column as a (K, p) matrix
        Z = X @ w.reshape(K, -1).T
        P = np.exp(Z - logsumexp(Z, axis=1, keepdims=True))               # (n, K)
        k = V.shape[1]
        dZ = np.einsum("np,jcp->njc", X, V.T.reshape(k, K, -1))            # (n, k, K)
        PdZ = P[:, None, :] * dZ
        R = PdZ - P[:, None, :] * PdZ.sum(axis=2, keepdims=True)
        R *= weights(y)[:, None, None]
        return np.einsum("njc,np->jcp", R, X).reshape(k, -1).T / X.shape[0]

    return ss.SampleFunction(value, grad, name=name or (
        "cross-entropy" if only_class is None else f"cross-entropy[class {only_class}]"),
        hessp=hessp)


# -- data -------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _cancer():
    return breast_cancer()


def _cancer_split(num_clients=5, seed=0):
    X, y = _cancer()
    return X, y, ss.FederatedData.split(X, y, num_clients=num_clients, seed=seed)


def _np_pooled(X, y, alpha, lam, k=1.0, box=None, l1=None):
    """Neyman-Pearson on the pooled data (k: units of objective and constraint)."""
    w = cp.Variable(X.shape[1])
    loss = cp.logistic(-cp.multiply(2 * y - 1, X @ w))
    m0, m1 = y == 0, y == 1
    obj = k * cp.sum(loss[m1]) / m1.sum() + k * lam * cp.sum_squares(w)
    con = k * cp.sum(loss[m0]) / m0.sum() <= k * alpha
    dom = [cp.norm(w, "inf") <= box] if box is not None else []
    prob = cp.Problem(cp.Minimize(obj), [con] + dom)
    return w, prob, [con]


# -- the problems -----------------------------------------------------------------------------------

def neyman_pearson_cancer():
    """Worked example: Neyman-Pearson on breast cancer (d = 31, 5 IID clients),
    class-1 logistic loss + 1e-2 |w|^2 s.t. class-0 loss <= 0.2 (active)."""
    X, y, data = _cancer_split()
    prob = neyman_pearson(data, 0.2, lam=1e-2)
    return prob, _convex_ref(*_np_pooled(X, y, 0.2, 1e-2), "logistic via exponential cones")


def fairness_diabetes():
    """Worked example: logistic regression + 1e-2 |w|^2 on diabetes with a demographic-parity
    gap |DP(w)| <= 0.05: two nonconvex constraints (one active), 4 clients skewed by the
    protected attribute."""
    X, Y = fairness.diabetes_fairness()
    data = fairness.skewed_clients(X, Y)
    prob = fairness.fair_logistic(data, 0.05)
    lam, eps = 1e-2, 0.05
    f, g = fairness.logistic(), fairness.parity_gap(float(Y[:, 1].mean()))
    obj = lambda w: f.value(w, X, Y).mean() + lam * w @ w  # noqa: E731
    jac = lambda w: f.grad(w, X, Y) + 2 * lam * w  # noqa: E731
    cons = [(lambda w: g.value(w, X, Y).mean() - eps, lambda w: g.grad(w, X, Y)),
            (lambda w: -g.value(w, X, Y).mean() - eps, lambda w: -g.grad(w, X, Y))]
    pts = slsqp_multistart(obj, jac, cons, _starts(X.shape[1], 8, 1))
    return prob, _nonconvex_ref(pts, "x0 = 0 and 8 random starts")


def qcqp_three_constraints():
    """Worked example: the stochastic QCQP, d = 5, 3 quadratic constraints (2 active), 600
    samples on 6 clients."""
    d = 5
    R, U = qcqp.make_samples(N=600, d=d, M=3, seed=0)
    data = ss.FederatedData.split(R, None, num_clients=6, seed=0)
    prob = qcqp.stochastic_qcqp(data, U, d)
    w = cp.Variable(d)
    width = d * d + d

    def F(m):
        Delta = R[:, m * width:m * width + d * d].reshape(-1, d, d).mean(0)
        b = R[:, m * width + d * d:(m + 1) * width].mean(0)
        L = np.linalg.cholesky(np.eye(d) + 0.5 * (Delta + Delta.T))
        return 0.5 * cp.sum_squares(L.T @ w) + b @ w      # (Clarabel is "inaccurate" on the
                                                          # quad_form version at any tolerance)

    cons = [F(m + 1) <= U[m] for m in range(len(U))]
    return prob, _convex_ref(w, cp.Problem(cp.Minimize(F(0)), cons), cons,
                             "convex QCQP, quadratics as |L'w|^2 / 2 (Cholesky)")


def box_domain_cancer():
    """Worked example: Neyman-Pearson (U = 0.15) with the box |w|_inf <= 0.6 (active) next to
    the stochastic constraint (active); CVXPY subproblems."""
    X, y, data = _cancer_split()
    prob = neyman_pearson(data, 0.15, lam=1e-2, box=0.6)
    return prob, _convex_ref(*_np_pooled(X, y, 0.15, 1e-2, box=0.6), "box domain")


def badly_scaled_cancer():
    """Neyman-Pearson on breast cancer with feature column j multiplied by 10^(-3 + 6 j/29)
    (6 orders of magnitude; the intercept column is left at 1), class-1 loss + 1e-2 |w|^2
    s.t. class-0 loss <= 0.2 (active)."""
    X, y = _cancer()
    X = X.copy()
    p = X.shape[1] - 1
    X[:, :p] *= 10.0 ** (-3 + 6 * np.arange(p) / (p - 1))
    data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    prob = neyman_pearson(data, 0.2, lam=1e-2)
    return prob, _convex_ref(*_np_pooled(X, y, 0.2, 1e-2), "columns scaled 1e-3..1e3")


@functools.lru_cache(maxsize=None)
def _two_target_data(N=1200, d=20, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, d))
    w1 = np.zeros(d)
    w1[:5] = [1.5, -2.0, 1.0, 0.8, -1.2]
    w2 = w1.copy()
    w2[5:9] = [1.0, -1.0, 0.7, 0.5]
    w2[:2] *= 0.3
    noise = rng.standard_t(3, size=(N, 2)) * 0.5
    Y = np.column_stack([X @ w1, X @ w2]) + noise
    return X, Y


def l1_ball_logcosh():
    """Least squares on target 1 over the L1 ball |w|_1 <= 4 (active) s.t. the mean
    log cosh error on target 2 <= 0.9 (active); synthetic, N = 1200, d = 20, 8 clients of
    unequal sizes (30 to 300 rows)."""
    X, Y = _two_target_data()
    sizes = [30, 60, 90, 120, 150, 200, 250, 300]
    perm = np.random.default_rng(1).permutation(len(X))
    parts = np.split(perm, np.cumsum(sizes)[:-1])
    data = ss.FederatedData([(X[p], Y[p]) for p in parts])
    r, U = 4.0, 0.9
    prob = ss.Problem(half_squares(0), [log_cosh(1) <= U], dim=X.shape[1], data=data,
                      domain=lambda w: [cp.norm1(w) <= r])
    w = cp.Variable(X.shape[1])
    z = X @ w - Y[:, 1]
    lc = cp.sum(cp.logistic(2 * z) - z) / X.shape[0] - math.log(2.0)
    cons = [lc <= U]
    pooled = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - Y[:, 0]) / len(X)),
                        cons + [cp.norm1(w) <= r])
    return prob, _convex_ref(w, pooled, cons, "log cosh z = logistic(2z) - z - log 2")


def dirichlet_noniid_cancer():
    """Logistic regression + 1e-2 |w|^2 on breast cancer s.t. class-0 loss <= 0.09 (active),
    10 label-skewed clients from FederatedData.dirichlet(alpha=0.3) (sizes 1 to ~200)."""
    X, y = _cancer()
    data = ss.FederatedData.dirichlet(X, y, num_clients=10, alpha=0.3, seed=0)
    pi0 = float(np.mean(y == 0))
    lam, U = 1e-2, 0.09
    prob = ss.Problem(logistic_loss(), [logistic_loss(0, pi0, name="loss[class 0]") <= U],
                      dim=X.shape[1], data=data, regularizer=lambda w: lam * cp.sum_squares(w))
    w = cp.Variable(X.shape[1])
    loss = cp.logistic(-cp.multiply(2 * y - 1, X @ w))
    cons = [cp.sum(loss[y == 0]) / np.sum(y == 0) <= U]
    pooled = cp.Problem(cp.Minimize(cp.sum(loss) / len(y) + lam * cp.sum_squares(w)), cons)
    return prob, _convex_ref(w, pooled, cons, "Dirichlet(0.3) clients")


def sigmoid_miss_rate_cancer():
    """Nonconvex constraint: logistic regression + 0.05 |w|^2 on breast cancer s.t. the sigmoid
    surrogate of the miss rate, mean over class-1 rows of sigmoid(-2 x.w), <= 0.03 (active);
    5 IID clients."""
    X, y, data = _cancer_split()
    pi1 = float(np.mean(y == 1))
    lam, U, s = 5e-2, 0.03, 2.0
    g = sigmoid_miss_rate(pi1, s)
    f = logistic_loss()
    prob = ss.Problem(f, [g <= U], dim=X.shape[1], data=data,
                      regularizer=lambda w: lam * cp.sum_squares(w))
    obj = lambda w: f.value(w, X, y).mean() + lam * w @ w  # noqa: E731
    jac = lambda w: f.grad(w, X, y) + 2 * lam * w  # noqa: E731
    cons = [(lambda w: g.value(w, X, y).mean() - U, lambda w: g.grad(w, X, y))]
    pts = slsqp_multistart(obj, jac, cons, _starts(X.shape[1], 8, 2))
    return prob, _nonconvex_ref(pts, "x0 = 0 and 8 random starts")


@functools.lru_cache(maxsize=None)
def _digits():
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    X = np.hstack([X / 16.0, np.ones((len(y), 1))])
    return X, y.astype(float)


def softmax_digits():
    """10-class softmax regression on scikit-learn digits (N = 1797, d = 10 x 65 = 650 with
    intercepts) + 1e-2 |w|^2 s.t. the cross-entropy on class 8 <= 0.25 (active); 5 IID
    clients."""
    X, y = _digits()
    K, lam, U, k = 10, 1e-2, 0.25, 8
    data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    pik = float(np.mean(y == k))
    prob = ss.Problem(softmax_loss(K), [softmax_loss(K, k, pik) <= U], dim=K * X.shape[1],
                      data=data, regularizer=lambda w: lam * cp.sum_squares(w))
    V = cp.Variable((X.shape[1], K))                 # W' : w = vec(W) row-major = vec(V')
    Z = X @ V
    onehot = np.eye(K)[y.astype(int)]
    per_row = cp.log_sum_exp(Z, axis=1) - cp.sum(cp.multiply(onehot, Z), axis=1)
    cons = [cp.sum(per_row[y == k]) / np.sum(y == k) <= U]
    pooled = cp.Problem(cp.Minimize(cp.sum(per_row) / len(y) + lam * cp.sum_squares(V)), cons)
    status = solve_pooled(pooled)
    return prob, {"kind": "convex", "x": np.asarray(V.value).T.ravel(), "fun": float(pooled.value),
                  "multipliers": _duals(cons),
                  "source": f"CVXPY+Clarabel on the pooled data ({status}); cp.log_sum_exp"}


def _np_scaled(k: float):
    X, y, data = _cancer_split()
    pi0, pi1 = float(np.mean(y == 0)), float(np.mean(y == 1))
    lam, alpha = 1e-2, 0.2
    obj = scaled(logistic_loss(1, pi1, name="loss[class 1]"), k)
    con = scaled(logistic_loss(0, pi0, name="loss[class 0]"), k)
    prob = ss.Problem(obj, [con <= k * alpha], dim=X.shape[1], data=data,
                      regularizer=lambda w: k * lam * cp.sum_squares(w))
    return prob, _convex_ref(*_np_pooled(X, y, alpha, lam, k=k),
                             f"objective, constraint and bound x {k:g}")


def neyman_pearson_times_1e3():
    """Neyman-Pearson (U = 0.2) with objective, regulariser, constraint and bound multiplied by
    1e3: gradients of order 1e3 (bound 200)."""
    return _np_scaled(1e3)


def neyman_pearson_times_1e_3():
    """The same multiplied by 1e-3: gradients of order 1e-3 (bound 2e-4, below the absolute
    feasibility floor of feas_tol * max(1, |U|) = 1e-4)."""
    return _np_scaled(1e-3)


def two_active_cancer():
    """min |w|^2 (deterministic objective) s.t. class-0 logistic loss <= 0.15 and class-1
    logistic loss <= 0.1 (both active), breast cancer on 5 clients."""
    X, y, data = _cancer_split()
    pi0, pi1 = float(np.mean(y == 0)), float(np.mean(y == 1))
    U0, U1 = 0.15, 0.1
    prob = ss.Problem(lambda w: cp.sum_squares(w),
                      [logistic_loss(0, pi0, name="loss[class 0]") <= U0,
                       logistic_loss(1, pi1, name="loss[class 1]") <= U1],
                      dim=X.shape[1], data=data)
    w = cp.Variable(X.shape[1])
    loss = cp.logistic(-cp.multiply(2 * y - 1, X @ w))
    cons = [cp.sum(loss[y == 0]) / np.sum(y == 0) <= U0,
            cp.sum(loss[y == 1]) / np.sum(y == 1) <= U1]
    return prob, _convex_ref(w, cp.Problem(cp.Minimize(cp.sum_squares(w)), cons), cons,
                             "min |w|^2, two logistic constraints")


def logistic_unconstrained_unequal():
    """Unconstrained: logistic regression + 1e-2 |w|^2 on breast cancer, 4 clients of 60, 100,
    150 and 259 rows."""
    X, y = _cancer()
    perm = np.random.default_rng(0).permutation(len(y))
    cuts = np.split(perm, [60, 160, 310])
    data = ss.FederatedData([(X[c], y[c]) for c in cuts])
    lam = 1e-2
    prob = ss.Problem(logistic_loss(), dim=X.shape[1], data=data,
                      regularizer=lambda w: lam * cp.sum_squares(w))
    w = cp.Variable(X.shape[1])
    loss = cp.sum(cp.logistic(-cp.multiply(2 * y - 1, X @ w))) / len(y)
    return prob, _convex_ref(w, cp.Problem(cp.Minimize(loss + lam * cp.sum_squares(w))), [],
                             "no constraint")


def infeasible_diabetes():
    """Infeasible: mean log cosh error on diabetes (standardised target) s.t. the mean squared
    error / 2 <= 0.1, whose minimum over w is 0.24 (least squares, by CVXPY); 4 clients."""
    X, y = diabetes_regression()
    U = 0.1
    Y = np.column_stack([y, y])                   # targets of the constraint and the objective
    data = ss.FederatedData.split(X, Y, num_clients=4, seed=0)
    prob = ss.Problem(log_cosh(1, "log-cosh"), [half_squares(0, "half MSE") <= U],
                      dim=X.shape[1], data=data)
    w = cp.Variable(X.shape[1])
    best = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - Y[:, 0]) / len(y)))
    status = solve_pooled(best)
    return prob, {"kind": "infeasible", "x": None, "fun": None, "multipliers": None,
                  "min_violation": float(best.value - U),
                  "source": f"CVXPY+Clarabel ({status}): min half MSE = {best.value:.6f} > "
                            f"U = {U}"}


PROBLEMS = {
    "neyman_pearson": neyman_pearson_cancer,
    "fairness": fairness_diabetes,
    "qcqp3": qcqp_three_constraints,
    "box_domain": box_domain_cancer,
    "badly_scaled": badly_scaled_cancer,
    "l1_ball_logcosh": l1_ball_logcosh,
    "dirichlet_noniid": dirichlet_noniid_cancer,
    "sigmoid_miss_rate": sigmoid_miss_rate_cancer,
    "softmax_digits": softmax_digits,
    "np_times_1e3": neyman_pearson_times_1e3,
    "np_times_1e-3": neyman_pearson_times_1e_3,
    "two_active": two_active_cancer,
    "unconstrained": logistic_unconstrained_unequal,
    "infeasible": infeasible_diabetes,
}


@functools.lru_cache(maxsize=None)
def build(name: str):
    """(problem, reference) of the suite's problem ``name`` (cached)."""
    return PROBLEMS[name]()


# -- measuring a result against the reference ---------------------------------------------------

#: what the solver with default options must reach on every problem of the suite
TARGETS = {"gap": 1e-3, "multipliers": 1e-2, "violation": 1e-4, "kkt": 1e-4, "x": 1e-3}


def pooled_constraints(problem, x) -> np.ndarray:
    """F_m(x) - U_m on the pooled data, from the problem's SampleFunctions (not the solver)."""
    X, y = problem.data.pooled()
    return np.array([float(np.mean(c.function.value(x, X, y))) - c.bound
                     for c in problem.constraints])


def measure(problem, reference: dict, res) -> dict:
    """The accuracy of ``res`` (a Result of ``problem``) against ``reference``.

    gap: (fun - fun_ref) / |fun_ref| (signed); violation: max_m max(F_m - U_m, 0) / max(1, |U_m|)
    computed here on the pooled data (violation_U: the same over |U_m|); multiplier_error:
    |mu - mu_ref|_inf / |mu_ref|_inf; x_error: |x - x_ref|_inf (nonconvex: to the nearest KKT
    point the reference found); the KKT residuals as the solver reports them.
    """
    kind = reference["kind"]
    bounds = problem.bounds
    cons = pooled_constraints(problem, res.x)
    viol = np.maximum(cons, 0.0)
    out = {"status": res.status, "success": bool(res.success), "rounds": int(res.nit),
           "time": float(res.time), "fun": float(res.fun),
           "violation": float(np.max(viol / np.maximum(1.0, np.abs(bounds)), initial=0.0)),
           "violation_U": float(np.max(viol / np.maximum(np.abs(bounds), 1e-300), initial=0.0)),
           "multipliers": np.asarray(res.kkt.multipliers, dtype=float).tolist(),
           "stationarity_rel": float(res.kkt.stationarity_rel),
           "stationarity": float(res.kkt.stationarity),
           "kkt_scale": float(res.kkt.scale),
           "complementarity_rel": float(np.max(res.kkt.complementarity_rel, initial=0.0)),
           "feasibility_rel": float(np.max(res.kkt.feasibility_rel, initial=0.0)),
           "domain_violation": float(res.kkt.domain_violation),
           "kkt_passed": bool(res.kkt.passed(TARGETS["violation"], TARGETS["kkt"]))}
    if kind == "infeasible":
        out.update(gap=None, multiplier_error=None, x_error=None)
        return out
    out["gap"] = float((res.fun - reference["fun"]) / max(abs(reference["fun"]), 1e-300))
    ref_mu = np.asarray(reference["multipliers"], dtype=float)
    out["multiplier_error"] = (float(np.max(np.abs(res.kkt.multipliers - ref_mu))
                                     / max(float(np.max(np.abs(ref_mu))), 1e-300))
                               if ref_mu.size else None)
    points = reference.get("kkt_points") or [{"x": reference["x"]}]
    out["x_error"] = float(min(np.max(np.abs(res.x - p["x"])) for p in points))
    return out


def meets_targets(kind: str, m: dict) -> list[str]:
    """The :data:`TARGETS` that the measurement ``m`` misses (empty: all met)."""
    T = TARGETS
    if kind == "infeasible":
        return [] if m["status"] == "infeasible" else [f"status {m['status']} != infeasible"]
    miss = []
    if m["status"] != "converged":
        miss.append(f"status {m['status']}")
    if m["violation"] > T["violation"]:
        miss.append(f"violation {m['violation']:.2g} > {T['violation']:g}")
    if kind == "convex":
        if abs(m["gap"]) > T["gap"]:
            miss.append(f"gap {m['gap']:.2g} > {T['gap']:g}")
        if m["multiplier_error"] is not None and m["multiplier_error"] > T["multipliers"]:
            miss.append(f"multiplier error {m['multiplier_error']:.2g} > {T['multipliers']:g}")
    else:
        worst = max(m["stationarity_rel"], m["complementarity_rel"])
        if worst > T["kkt"]:
            miss.append(f"KKT residual {worst:.2g} > {T['kkt']:g}")
        if m["x_error"] > T["x"]:
            miss.append(f"|x - x_ref|_inf {m['x_error']:.2g} > {T['x']:g}")
    return miss
