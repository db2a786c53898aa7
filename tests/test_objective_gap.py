"""The suboptimality bound of a convex problem (diagnostics.kkt.objective_gap): weak duality
with the KKT report's multipliers, checked against CVXPY + Clarabel's optimum on the pooled
rows; it must hold at every point (also far from the optimum) and be small at a certified one."""

import numpy as np
import pytest

import ssca_solver as ss
from problems.least_squares import ill_conditioned
from problems.neyman_pearson import neyman_pearson, pooled_reference


@pytest.fixture(scope="module")
def np_case(cancer, cancer_data):
    X, y = cancer
    return neyman_pearson(cancer_data, 0.2), pooled_reference(X, y, 0.2)[1]


def test_the_bound_holds_at_every_point_and_is_small_at_a_certified_one(np_case):
    prob, best = np_case
    assert prob.convex
    gaps = []
    for rounds in (1, 2, 3, 5, 8):
        res = prob.solve(seed=0, max_iter=rounds, progress=False)
        true = res.fun - best
        bound = res.kkt.objective_gap
        assert np.isfinite(bound), res.kkt.objective_gap_note
        assert bound >= true - 1e-9, (rounds, bound, true)
        gaps.append(bound)
    assert gaps[0] > 1e-3                           # a point far from the optimum: a loose bound
    res = prob.solve(seed=0, progress=False)
    assert res.status == "converged"
    assert res.fun - best - 1e-9 <= res.kkt.objective_gap <= 1e-6, res.kkt.objective_gap
    assert "optimality    objective " in res.report()


def test_a_box_domain_bounds_the_linearised_lagrangian(cancer, cancer_data):
    X, y = cancer
    prob = neyman_pearson(cancer_data, 0.2, lam=0.0, box=0.5)
    best = pooled_reference(X, y, 0.2, lam=0.0, box=0.5)[1]
    for rounds in (2, 400):
        res = prob.solve(seed=0, max_iter=rounds, progress=False)
        assert np.isfinite(res.kkt.objective_gap), res.kkt.objective_gap_note
        assert res.kkt.objective_gap >= res.fun - best - 1e-9
    assert res.kkt.objective_gap <= 1e-5


def test_no_bound_without_a_bounded_domain_or_a_strongly_convex_term():
    prob = ill_conditioned(1e2)[0]
    assert prob.convex                 # least squares, an affine equality, a convex ball
    res = prob.solve(seed=0, progress=False)
    assert np.isnan(res.kkt.objective_gap)
    assert "no minimum" in res.kkt.objective_gap_note
    assert "no bound on the objective's gap" in res.report()


def test_convexity_is_declared_and_follows_negation(cancer_data):
    def value(w, X, y):
        return X @ w

    def grad(w, X, y):
        return X.mean(0)

    f = ss.SampleFunction(value, grad, convexity="convex")
    assert (-f).convexity == "concave" and (-(-f)).convexity == "convex"
    assert (-ss.SampleFunction(value, grad, convexity="affine")).convexity == "affine"
    assert ss.SampleFunction(value, grad).convexity is None
    with pytest.raises(ValueError, match="convexity must be"):
        ss.SampleFunction(value, grad, convexity="linear")
    d = cancer_data.clients[0].X.shape[1]
    assert ss.Problem(f, [f <= 1.0], dim=d, data=cancer_data).convex
    assert not ss.Problem(f, [f >= 1.0], dim=d, data=cancer_data).convex   # -f concave
    assert not ss.Problem(f, [f == 1.0], dim=d, data=cancer_data).convex   # not affine
    a = ss.SampleFunction(value, grad, convexity="affine")
    assert ss.Problem(f, [a == 1.0, a >= -1.0], dim=d, data=cancer_data).convex
    assert not ss.Problem(ss.SampleFunction(value, grad), dim=d, data=cancer_data).convex


def test_an_undeclared_problem_reports_no_bound_line(cancer_data):
    from problems.fairness import parity_gap
    from problems.logistic import logistic_loss

    fn = logistic_loss()
    d = cancer_data.clients[0].X.shape[1]
    res = ss.Problem(ss.SampleFunction(fn.value, fn.grad), dim=d, data=cancer_data,
                     regularizer=lambda w: 1e-2 * __import__("cvxpy").sum_squares(w)).solve(
        seed=0, max_iter=5, progress=False)
    assert np.isnan(res.kkt.objective_gap) and res.kkt.objective_gap_note == ""
    assert "optimality" not in res.report()
    assert parity_gap(0.5).convexity is None


def test_the_bound_survives_a_result_file(np_case, tmp_path):
    prob, _ = np_case
    res = prob.solve(seed=0, max_iter=3, progress=False)
    back = ss.load_result(res.save(tmp_path / "r.npz"))
    assert back.kkt.objective_gap == res.kkt.objective_gap
    assert back.kkt.objective_gap_note == res.kkt.objective_gap_note


def test_weak_duality_holds_for_any_point_and_any_nonnegative_multipliers(cancer, np_case):
    """objective_gap at random points (feasible or not) with random mu >= 0: never below
    (F_0 + R)(w) - p*; with the optimum's own point and multiplier, about 0."""
    from ssca_solver.diagnostics.evaluation import Evaluation, Evaluator
    from ssca_solver.diagnostics.kkt import objective_gap

    X, y = cancer
    prob, best = np_case
    terms = Evaluator(prob).terms
    assert terms.convex

    def evaluation(w):
        fs = prob.functions
        return Evaluation(np.array([f.value(w, X, y).mean() for f in fs]),
                          np.array([f.grad(w, X, y) for f in fs]), 0, 0)

    def objective(w):
        return prob.functions[0].value(w, X, y).mean() + prob.deterministic.value(w)

    rng = np.random.default_rng(0)
    below = 0
    for _ in range(20):
        w = rng.normal(0.0, 0.5, X.shape[1])
        mu = rng.uniform(0.0, 2.0, 1)
        gap, note = objective_gap(w, evaluation(w), terms, mu)
        assert np.isfinite(gap), note
        assert gap >= objective(w) - best - 1e-9, (gap, objective(w) - best)
        below += objective(w) - best < 0          # an infeasible point below the optimum
    w_star, value, _, mu_star = pooled_reference(X, y, 0.2)
    gap, _ = objective_gap(w_star, evaluation(w_star), terms, np.atleast_1d(mu_star))
    assert abs(gap) <= 1e-6 and abs(objective(w_star) - value) <= 1e-8
    # a feasible point strictly inside (the optimum at alpha = 0.15) with the multiplier of
    # alpha = 0.2: its objective is about mu* 0.05 above p*, which the term mu (F - U) < 0
    # of the bound accounts for
    w_in = pooled_reference(X, y, 0.15)[0]
    gap, _ = objective_gap(w_in, evaluation(w_in), terms, np.atleast_1d(mu_star))
    true = objective(w_in) - best
    assert true > 1e-3 and true - 1e-9 <= gap <= 5 * true, (gap, true)


def test_with_affine_functions_the_bound_is_the_exact_duality_gap():
    """min xbar.w + |w|^2 s.t. (s * xbar).w <= u (both stochastic functions affine): the
    linearisation is exact, so at any w and mu >= 0 the bound is (F_0 + R)(w) - g(mu), the
    dual function g(mu) = min_x L(x, mu) by CVXPY, to 1e-9; at mu* it is (F_0 + R)(w) - p*."""
    import cvxpy as cp
    from ssca_solver.diagnostics.evaluation import Evaluation, Evaluator
    from ssca_solver.diagnostics.kkt import objective_gap

    rng = np.random.default_rng(3)
    d = 5
    X = rng.normal(1.0, 1.0, (60, d))
    s = np.where(np.arange(d) % 2, -1.0, 1.0)
    u = -((X * s).mean(0) @ X.mean(0)) / 2 - 1.0     # below b.w at the free minimum -a/2
    f0 = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), name="f0",
                           convexity="affine")
    f1 = ss.SampleFunction(lambda w, X, y: (X * s) @ w, lambda w, X, y: (X * s).mean(0),
                           name="f1", convexity="affine")
    prob = ss.Problem(f0, [f1 <= u], dim=d, data=ss.FederatedData.split(X, None, 3, seed=0),
                      regularizer=lambda w: cp.sum_squares(w))
    terms = Evaluator(prob).terms
    a, b = X.mean(0), (X * s).mean(0)
    x = cp.Variable(d)
    con = b @ x <= u
    p_star = cp.Problem(cp.Minimize(a @ x + cp.sum_squares(x)), [con]).solve(solver="CLARABEL")
    mu_star = float(con.dual_value)
    assert mu_star > 0.1                                      # the constraint is active

    def dual(mu):                                             # g(mu), in closed form
        q = a + mu * b
        return -q @ q / 4 - mu * u

    for _ in range(5):
        w = rng.normal(0.0, 1.0, d)
        ev = Evaluation(np.array([a @ w, b @ w]), np.array([a, b]), 0, 0)
        for mu in (0.0, 0.5 * mu_star, mu_star, 3.0):
            gap, _ = objective_gap(w, ev, terms, np.array([mu]))
            assert gap == pytest.approx(a @ w + w @ w - dual(mu), abs=1e-9)
        gap, _ = objective_gap(w, ev, terms, np.array([mu_star]))
        assert gap == pytest.approx(a @ w + w @ w - p_star, abs=1e-7)
