"""Equality constraints ``f == b`` (issue 18): the closed form's free-sign multipliers against
CVXPY + Clarabel, Algorithm 2 with default options against pooled references (CVXPY for a
convex problem, SciPy SLSQP for a nonconvex one), the KKT report's free-sign multiplier, and
the errors a user can meet."""

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import minimize

import ssca_solver as ss
from ssca_solver.datasets import breast_cancer
from ssca_solver.subproblems import solve_closed_form


def _problem5_cvxpy(a0, b0, c0, a, bs, cs, U, c, eq):
    """Problem 5 with an equality's two-sided slack, by CVXPY + Clarabel: (w, s, nu, value)."""
    d = b0.size
    w, s = cp.Variable(d), cp.Variable(len(bs), nonneg=True)
    up, down = [], []
    for m in range(len(bs)):
        p = a[m] * cp.sum_squares(w) + bs[m] @ w + cs[m] - U[m]
        up.append(p <= s[m])
        if eq[m]:
            down.append(-p <= s[m])
    prob = cp.Problem(cp.Minimize(a0 * cp.sum_squares(w) + b0 @ w + c0 + c * cp.sum(s)),
                      up + down)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    nu = np.array([float(np.squeeze(con.dual_value)) for con in up])
    k = 0
    for m in range(len(bs)):
        if eq[m]:
            nu[m] -= float(np.squeeze(down[k].dual_value))
            k += 1
    return w.value, s.value, nu, prob.value


@pytest.mark.parametrize("seed", range(12))
def test_closed_form_with_equalities_matches_clarabel(seed):
    """M = 1 to 3 constraints, equalities among them (affine surrogates), penalties small
    enough that some multipliers sit at -c or c: the closed form's answer satisfies Problem
    5's KKT conditions exactly (stationarity, the multiplier boxes [-c, c] / [0, c] and their
    sign conditions), its value is no larger than Clarabel's, and its point and signed
    multipliers equal Clarabel's to Clarabel's accuracy (at seed 1 Clarabel stops with an
    inaccuracy warning 2e-5 away, at a value 1e-8 above the closed form's)."""
    rng = np.random.default_rng(seed)
    d, M = 6, 1 + seed % 3
    eq = rng.random(M) < 0.6
    eq[0] = True
    a0, b0, c0 = 0.5 + rng.random(), rng.standard_normal(d), rng.standard_normal()
    a = np.where(eq, 0.0, rng.random(M))
    bs = [rng.standard_normal(d) for _ in range(M)]
    cs, U = rng.standard_normal(M), rng.standard_normal(M)
    c = float(rng.choice([0.3, 3.0, 30.0]))
    sol = solve_closed_form(a0, b0, c0, a, bs, cs, U, c, equality=eq)
    x, nu = sol.w, sol.multipliers
    excess = np.array([a[m] * x @ x + bs[m] @ x + cs[m] - U[m] for m in range(M)])
    # stationarity of the Lagrangian in w
    grad = 2 * a0 * x + b0 + sum(nu[m] * (bs[m] + 2 * a[m] * x) for m in range(M))
    assert np.linalg.norm(grad) <= 1e-9 * (1 + np.linalg.norm(b0))
    for m in range(M):
        lo = -c if eq[m] else 0.0
        assert lo - 1e-12 <= nu[m] <= c + 1e-12
        if lo + 1e-9 < nu[m] < c - 1e-9:           # interior: the constraint holds
            assert (abs(excess[m]) if eq[m] else max(excess[m], 0.0)) <= 1e-9
        elif nu[m] >= c - 1e-9:
            assert excess[m] >= -1e-9
        elif eq[m]:
            assert excess[m] <= 1e-9
        else:
            assert excess[m] <= 1e-9                # nu = 0: inactive or feasible
        expect = abs(excess[m]) if eq[m] else max(excess[m], 0.0)
        assert sol.slack[m] == pytest.approx(expect, abs=1e-12)
    w, s, ref_nu, value = _problem5_cvxpy(a0, b0, c0, a, bs, cs, U, c, eq)
    assert sol.value <= value + 1e-9 * (1 + abs(value))
    np.testing.assert_allclose(sol.w, w, atol=1e-4)
    np.testing.assert_allclose(nu, ref_nu, atol=1e-4 * (1 + c))


def test_closed_form_refuses_a_curved_equality():
    with pytest.raises(ValueError, match="affine surrogate"):
        solve_closed_form(1.0, np.ones(3), 0.0, np.array([0.5]), [np.ones(3)],
                          np.zeros(1), np.zeros(1), 10.0, equality=[True])


def _cancer_regression():
    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y.astype(float), num_clients=5, seed=0)
    return X, y.astype(float), data


def _squares(name="squared error"):
    def value(w, X, y):
        return 0.5 * (X @ w - y) ** 2

    def grad(w, X, y):
        return X.T @ (X @ w - y) / len(y)

    return ss.SampleFunction(value, grad, name=name)


def _mean_prediction(name="mean prediction on class 0"):
    """F(w) = mean over all rows of 1{y = 0} x.w / pi_0: the mean prediction on class 0."""
    def value(w, X, y):
        return (y == 0) * (X @ w) / PI0

    def grad(w, X, y):
        return X.T @ ((y == 0) / PI0) / len(y)

    return ss.SampleFunction(value, grad, name=name)


X_, Y_ = breast_cancer()
PI0 = float(np.mean(Y_ == 0))


@pytest.mark.parametrize("target", [0.3, -0.2])
def test_convex_problem_with_an_equality_matches_cvxpy(target):
    """Least squares with the equality 'mean prediction on class 0 == target', default
    options: certified, and the point, objective and (signed) multiplier equal CVXPY's on the
    pooled data; the two targets give multipliers of opposite signs."""
    X, y, data = _cancer_regression()
    lam = 1e-2
    prob = ss.Problem(_squares(), [_mean_prediction() == target], dim=X.shape[1], data=data,
                      regularizer=lambda w: lam * cp.sum_squares(w))
    res = prob.solve(seed=0)
    assert res.status == "converged", res.message
    w = cp.Variable(X.shape[1])
    con = cp.sum(X[y == 0] @ w) / (y == 0).sum() == target
    ref = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - y) / len(y)
                                 + lam * cp.sum_squares(w)), [con])
    ref.solve(solver="CLARABEL")
    # a certificate at relative stationarity 1e-4 on this ill-conditioned problem (cond(X)
    # ~ 1e3): the objective to ~1e-6, the point to ~1e-2 of its size (measured 1.1e-6 and
    # 7.6e-4 absolute in the worst coordinate)
    assert res.fun == pytest.approx(ref.value, rel=1e-5)
    np.testing.assert_allclose(res.x, w.value, atol=1e-2 * np.linalg.norm(w.value))
    assert abs(res.constraints[0]) <= 1e-4
    # CVXPY's dual of 'expr == target' is the multiplier of expr - target
    assert res.kkt.multipliers[0] == pytest.approx(float(con.dual_value), rel=1e-2, abs=1e-6)
    assert "==" in res.constraint_names[0] and "==" in res.report()


def test_equality_multiplier_signs_differ_with_the_side_of_the_unconstrained_optimum():
    X, y, data = _cancer_regression()
    signs = []
    for target in (0.3, -0.2):
        prob = ss.Problem(_squares(), [_mean_prediction() == target], dim=X.shape[1],
                          data=data, regularizer=lambda w: 1e-2 * cp.sum_squares(w))
        signs.append(np.sign(prob.solve(seed=0).kkt.multipliers[0]))
    assert signs[0] == -signs[1] != 0


def test_nonconvex_equality_matches_slsqp():
    """A nonconvex equality: the mean squared prediction on class 0 equals 0.25 (a sphere-like
    set), objective least squares; default options certify a KKT point whose objective equals
    SLSQP's on the pooled data from the same start."""
    X, y, data = _cancer_regression()
    rows = X[y == 0]

    def value(w, Xb, yb):
        return (yb == 0) * (Xb @ w) ** 2 / PI0

    def grad(w, Xb, yb):
        return Xb.T @ ((yb == 0) * 2 * (Xb @ w) / PI0) / len(yb)

    sq = ss.SampleFunction(value, grad, name="mean squared prediction on class 0")
    prob = ss.Problem(_squares(), [sq == 0.25], dim=X.shape[1], data=data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    x0 = np.full(X.shape[1], 0.05)
    res = prob.solve(seed=0, max_iter=4000, x0=x0)
    assert res.status == "converged", res.message

    def f(w):
        return 0.5 * np.mean((X @ w - y) ** 2) + 1e-2 * w @ w

    def h(w):
        return np.mean((rows @ w) ** 2) - 0.25

    ref = minimize(f, x0, method="SLSQP",
                   jac=lambda w: X.T @ (X @ w - y) / len(y) + 2e-2 * w,
                   constraints=[{"type": "eq", "fun": h,
                                 "jac": lambda w: 2 * rows.T @ (rows @ w) / len(rows)}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert ref.success
    assert res.fun == pytest.approx(ref.fun, rel=1e-5)
    assert abs(res.constraints[0]) <= 1e-4


def test_kkt_report_gives_an_equality_a_free_sign_multiplier():
    """At the optimum of min |w - p|^2 s.t. a.w == 0 the multiplier is 2 a.p / |a|^2 (of
    either sign): the report finds it, with complementarity 0 and feasibility |a.w|."""
    from ssca_solver.diagnostics.evaluation import Evaluation, ProblemTerms
    from ssca_solver.diagnostics.kkt import kkt_report

    det = ss.Problem(lambda w: 0 * cp.sum_squares(w), dim=3, data=None).deterministic
    terms = ProblemTerms(True, np.array([0.0]), det, np.array([True]))
    a = np.array([1.0, 2.0, -1.0])
    for p in (np.array([1.0, 1.0, 1.0]), np.array([-1.0, 0.5, 2.0])):
        w = p - (a @ p) / (a @ a) * a                 # the projection onto a.w = 0
        g0 = 2 * (w - p)
        ev = Evaluation(np.array([float((w - p) @ (w - p)), float(a @ w)]),
                        np.vstack([g0, a]), 0, 0)
        rep = kkt_report(w, ev, terms)
        mu = 2 * (a @ p) / (a @ a)
        assert rep.multipliers[0] == pytest.approx(mu, rel=1e-6)
        assert rep.passed(1e-4, 1e-4) and rep.complementarity[0] == 0.0
        off = Evaluation(np.array([0.0, 0.3]), np.vstack([g0, a]), 0, 0)
        assert kkt_report(w, off, terms).feasibility[0] == pytest.approx(0.3)
        off = Evaluation(np.array([0.0, -0.3]), np.vstack([g0, a]), 0, 0)
        assert kkt_report(w, off, terms).feasibility[0] == pytest.approx(0.3)


def test_equality_errors_and_comparisons():
    f = _squares()
    g = ss.SampleFunction(f.value, f.grad, surrogate=ss.DiagonalCurvature(lambda w, X, y:
                                                                          np.ones(w.size)))
    X, y, data = _cancer_regression()
    with pytest.raises(ss.ModelError, match="affine surrogate ss.Linearization"):
        ss.Problem(_squares(), [g == 0.1], dim=X.shape[1], data=data)
    assert (f == f) is True and (f != f) is False and (f == "0.1") is False
    assert f in [f] and f not in [_squares()]
    with pytest.raises(ValueError, match="finite"):
        f == float("nan")
    c = f == np.float32(0.5)
    assert c.equality and c.bound == 0.5 and c.name == "squared error == 0.5"


@pytest.mark.parametrize("method", ["primal_dual", "augmented_lagrangian"])
def test_lagrangian_baselines_take_equalities(method):
    """The baselines' multipliers of an equality keep their sign (no projection on >= 0):
    on the convex problem with a negative multiplier their lambda ends negative, near the
    KKT multiplier. (The augmented Lagrangian runs with rho = 0.3: at its default rho = 1 the
    equality's unprojected multiplier oscillates through 0 and the run diverges at round 64,
    where the inequality version of the same constraint only oscillates, lambda 0.30 against
    0.15: docs/baselines.md.)"""
    X, y, data = _cancer_regression()
    prob = ss.Problem(_squares(), [_mean_prediction() == 0.3], dim=X.shape[1], data=data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    ref = prob.solve(seed=0)
    res = prob.solve(method=method, batch_size="full", lr=0.1, max_iter=3000, eval_every=100,
                     seed=0, **({"dual_lr": 0.5} if method == "primal_dual" else {"rho": 0.3}))
    lam = res.extras["multipliers"][0]
    assert ref.kkt.multipliers[0] < 0 and lam < 0
    assert lam == pytest.approx(ref.kkt.multipliers[0], rel=0.05)
    with pytest.raises(ValueError, match="either sign"):
        prob.solve(method=method, multipliers0=[-1.0, 2.0])
    prob.solve(method=method, multipliers0=[-1.0], max_iter=2, eval_every=None)


def test_an_equality_runs_under_secure_aggregation_and_resumes(tmp_path):
    """Nothing in the federated layer knows about equalities (they travel as statistics):
    masked sums give the plain run's iterates to the fixed-point encoding's precision (with a
    fixed tau: tau='auto' starts from the clients' mean curvature under secure aggregation and
    from their largest in the clear, by design), and a run stopped and resumed from its
    checkpoint equals the uninterrupted one."""
    X, y, data = _cancer_regression()
    prob = ss.Problem(_squares(), [_mean_prediction() == 0.3], dim=X.shape[1], data=data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    opts = dict(seed=3, max_iter=40, eval_every=10, batch_size=10, tau=0.5)
    plain = prob.solve(**opts)
    secure = prob.solve(secure_aggregation=True, **opts)
    np.testing.assert_allclose(secure.x, plain.x, rtol=0, atol=1e-7)
    first = prob.solve(checkpoint=tmp_path / "eq.npz", callback=lambda it: it.t == 15, **opts)
    assert first.status == "stopped"
    resumed = prob.solve(resume=tmp_path / "eq.npz", **{**opts, "seed": None})
    np.testing.assert_allclose(resumed.x, plain.x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(resumed.kkt.multipliers, plain.kkt.multipliers, atol=1e-12)


@pytest.mark.parametrize("target", [0.3, -0.2])
def test_the_cvxpy_path_and_a_domain_take_equalities(target):
    """The same equality on the CVXPY path (two-sided slack, signed dual), and with a box
    domain, where the KKT report's multipliers come from the linearised KKT step (the
    equality's elastic |.| <= e, signed dual): certified, with CVXPY's pooled optimum and
    multiplier."""
    X, y, data = _cancer_regression()
    box = 0.08
    for domain in (None, lambda w: [cp.norm(w, "inf") <= box]):
        prob = ss.Problem(_squares(), [_mean_prediction() == target], dim=X.shape[1],
                          data=data, regularizer=lambda w: 1e-2 * cp.sum_squares(w),
                          domain=domain)
        res = prob.solve(seed=0, subproblem="cvxpy", max_iter=2400)
        assert res.subproblem == "cvxpy" and res.status == "converged", res.message
        w = cp.Variable(X.shape[1])
        con = cp.sum(X[y == 0] @ w) / (y == 0).sum() == target
        ref = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - y) / len(y)
                                     + 1e-2 * cp.sum_squares(w)),
                         [con] + ([cp.norm(w, "inf") <= box] if domain else []))
        ref.solve(solver="CLARABEL")
        assert res.fun == pytest.approx(ref.value, rel=1e-5)
        assert abs(res.constraints[0]) <= 1e-4
        assert res.kkt.multipliers[0] == pytest.approx(float(con.dual_value), rel=1e-2,
                                                       abs=1e-6)
        assert res.kkt.multiplier_source == ("linearized" if domain else "nnls")
