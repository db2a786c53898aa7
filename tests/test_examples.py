"""The worked examples of problems/ against independent references (CVXPY, SciPy)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ssca_solver as ss
from problems import fairness, least_squares, qcqp
from problems.neyman_pearson import neyman_pearson, pooled_reference


@pytest.fixture(scope="module")
def diabetes_fair():
    X, Y = fairness.diabetes_fairness()
    return X, Y, fairness.skewed_clients(X, Y)


def test_fairness_clients_hold_different_groups(diabetes_fair):
    _, _, data = diabetes_fair
    shares = [c.y[:, 1].mean() for c in data.clients]
    assert max(shares) > 0.8 and min(shares) < 0.2


def test_parity_gap_gradient(diabetes_fair):
    X, Y, _ = diabetes_fair
    g = fairness.parity_gap(float(Y[:, 1].mean()))
    assert ss.check_grad(g, np.random.default_rng(0).normal(size=X.shape[1]) * 0.3, X, Y) < 1e-6


def test_fairness_full_batch_matches_slsqp(diabetes_fair):
    """Nonconvex constraints: the same KKT point as SLSQP from the same start."""
    X, Y, data = diabetes_fair
    ref = fairness.slsqp_reference(X, Y, 0.05)
    # full batches: deterministic SCA, constant steps are standard (and draw no warning)
    res = fairness.fair_logistic(data, 0.05).solve(
        batch_size="full", max_iter=400, rho=1.0, gamma=0.5, tau=0.5, penalty=[10.0],
        eval_every=None)
    assert res.status == "max_iter"            # no evaluation, no stopping test
    assert res.fun == pytest.approx(ref.fun, rel=1e-5)
    assert res.constraints[0] == pytest.approx(0.0, abs=1e-6)  # DP(w) = eps is active
    assert res.kkt.stationarity < 1e-3
    auto = fairness.fair_logistic(data, 0.05).solve(seed=0)   # default options
    assert auto.status == "converged" and auto.kkt.passed(1e-4, 1e-4)
    assert auto.fun == pytest.approx(ref.fun, rel=1e-3)
    np.testing.assert_allclose(auto.x, ref.x, atol=1e-3)


def test_fairness_constraint_closes_the_gap(diabetes_fair):
    X, Y, data = diabetes_fair
    g = fairness.parity_gap(float(Y[:, 1].mean()))
    res = fairness.fair_logistic(data, 0.05).solve(batch_size=50, max_iter=1500,
                                                   penalty=[10.0, 100.0], seed=0,
                                                   eval_every=None)
    free = fairness.fair_logistic(data, 10.0).solve(batch_size=50, max_iter=1500, seed=0,
                                                    penalty=[10.0], eval_every=None)
    dp = lambda w: g.value(w, X, Y).mean()  # noqa: E731
    assert dp(free.x) > 0.12                       # measured 0.139 without the constraint
    assert abs(dp(res.x)) <= 0.05 + 5e-3            # measured 0.0447
    ref = fairness.slsqp_reference(X, Y, 0.05)
    assert res.fun == pytest.approx(ref.fun, rel=2e-2)  # measured +0.6 %


def test_stochastic_qcqp_with_three_constraints():
    d = 5
    R, U = qcqp.make_samples(N=600, d=d, M=3, seed=0)
    w, value, duals = qcqp.pooled_reference(R, U, d)
    assert np.sum(duals > 0.1) == 2 and np.sum(duals < 1e-6) == 1  # two active, one not
    data = ss.FederatedData.split(R, None, num_clients=6, seed=0)
    gaps = []
    # 600 rounds of B = 20 end at the mini-batch noise floor: one run's gap varies with the
    # batches (measured over seeds 0-5: 0.02 % to 1.01 %), so the 1 % is asserted on the mean
    # of three seeds (measured 0.49 %); each run's point and multipliers as before
    for seed in range(3):
        res = qcqp.stochastic_qcqp(data, U, d).solve(batch_size=20, max_iter=600, tau=0.5,
                                                     penalty=[10.0, 100.0], seed=seed,
                                                     eval_every=None)
        assert res.status == "max_iter" and res.subproblem == "closed_form"
        gaps.append(abs(res.fun - value) / abs(value))
        np.testing.assert_allclose(res.x, w, atol=5e-3)
        np.testing.assert_allclose(res.kkt.multipliers, duals, atol=2e-2)
    assert np.mean(gaps) <= 1e-2
    auto = qcqp.stochastic_qcqp(data, U, d).solve(seed=0)     # default options: certified
    assert auto.status == "converged" and abs(auto.fun - value) <= 1e-3 * abs(value)
    active = duals > 0.1
    np.testing.assert_allclose(auto.kkt.multipliers[active], duals[active], rtol=1e-2)
    # the inactive constraint's multiplier: as small as complementarity certifies (the test
    # runs at every full-batch round since issue 19 and stops at the first point that passes;
    # measured 1.8e-6 there, 1e-10 when it ran ten rounds later)
    inactive = ~active
    assert np.all(auto.kkt.multipliers[inactive] * np.abs(auto.constraints[inactive])
                  <= 1e-4 * auto.kkt.scale)
    assert np.all(auto.kkt.multipliers[inactive] <= 1e-4)


def test_exact_quadratic_builder_is_the_loss_plus_proximal_term():
    X, y = least_squares.diabetes_regression()
    rng = np.random.default_rng(0)
    wt, w = rng.normal(size=X.shape[1]), rng.normal(size=X.shape[1])
    b = least_squares.ExactQuadratic()
    q = b.statistics(least_squares.squared_loss(), wt, X[:30], y[:30], 0.2, "test")
    literal = np.sum(0.5 * (X[:30] @ w - y[:30]) ** 2) + 30 * 0.2 * (w - wt) @ (w - wt)
    assert b.evaluate(q, w) == pytest.approx(literal, rel=1e-12)
    assert ss.SurrogateBuilder.evaluate(b, q, w) == pytest.approx(literal, rel=1e-10)


@pytest.mark.filterwarnings("ignore:the subproblem is not DPP")
def test_custom_surrogate_beats_the_default():
    X, y = least_squares.diabetes_regression()
    data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    _, best = least_squares.pooled_reference(X, y, box=0.3)
    out = {}
    for exact in (False, True):
        res = least_squares.box_least_squares(data, 0.3, exact).solve(
            batch_size=20, max_iter=150, tau=0.1, seed=0, eval_every=5)
        assert res.subproblem == "cvxpy"
        gaps = (res.history.objective - best) / best
        out[exact] = (next(int(t) for t, g in zip(res.history.eval_t, gaps) if g < 3e-3),
                      (res.fun - best) / best)
    assert out[True][0] < out[False][0]      # measured 60 vs 120 rounds to a 0.3 % gap
    assert 0 <= out[True][1] <= 2e-3 < out[False][1]     # measured 9.8e-4 vs 3.8e-3


def test_box_domain_next_to_a_stochastic_constraint(cancer, cancer_data):
    X, y = cancer
    w, obj, con, mu = pooled_reference(X, y, 0.15, lam=1e-2, box=0.6)
    assert mu > 0.1 and np.any(np.abs(w) > 0.6 - 1e-6)  # both kinds of constraint active
    res = neyman_pearson(cancer_data, 0.15, lam=1e-2, box=0.6).solve(
        batch_size=50, max_iter=600, penalty=[10.0], seed=0, eval_every=None)
    assert res.subproblem == "cvxpy" and res.status == "max_iter"
    assert np.max(np.abs(res.x)) <= 0.6 + 1e-7 and res.kkt.domain_violation <= 1e-7
    assert abs(res.fun - obj) <= 2e-2 * obj              # measured +1.2 %
    assert abs(res.constraints[0]) <= 5e-3
    auto = neyman_pearson(cancer_data, 0.15, lam=1e-2, box=0.6).solve(seed=0)
    assert abs(auto.fun - obj) <= 1e-3 * obj                  # measured -6e-8
    assert auto.kkt.multipliers[0] == pytest.approx(mu, rel=1e-2)


def test_box_domain_default_run_is_certified(cancer, cancer_data):
    """Was a strict xfail: with Clarabel's default tolerances the run stalled at relative
    stationarity 1.7e-4 after 800 rounds; Problem 5 solved to 1e-9 (CLARABEL_TOLERANCES)
    certifies it."""
    w, obj, con, mu = pooled_reference(*cancer, 0.15, lam=1e-2, box=0.6)
    auto = neyman_pearson(cancer_data, 0.15, lam=1e-2, box=0.6).solve(seed=0)
    assert auto.status == "converged" and auto.success, auto.message
    assert abs(auto.fun - obj) <= 1e-3 * obj
    assert auto.kkt.multipliers[0] == pytest.approx(mu, rel=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["neyman_pearson", "fairness", "qcqp", "custom_surrogate",
                                    "box_domain"])
def test_example_scripts_run(script):
    root = Path(__file__).resolve().parents[1]
    # the repository on the path, so the scripts run from a checkout that is not installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run([sys.executable, str(root / "docs" / "examples" / f"{script}.py")],
                         capture_output=True, text=True, cwd=root, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "status" in out.stdout or "rounds to a 1 %" in out.stdout


def test_box_constrained_logistic_regression_is_certified(cancer, cancer_data):
    """modelling.md's domain example (Algorithm 1 on the CVXPY path): with the backtracking's
    merit tolerance at 1e-7 it crawled at relative stationarity 7.6e-4 after 2000 rounds
    (112 rejected steps); at 1e-10 it passes at round 220. Checked against CVXPY."""
    import cvxpy as cp

    from problems.logistic import logistic_loss

    X, y = cancer
    prob = ss.Problem(logistic_loss(name="loss"), dim=X.shape[1], data=cancer_data,
                      domain=lambda w: [cp.norm(w, "inf") <= 0.5])
    res = prob.solve(seed=0, max_iter=1000)
    assert res.status == "converged", res.message
    w = cp.Variable(X.shape[1])
    z = X @ w
    ref = cp.Problem(cp.Minimize(cp.sum(cp.logistic(z) - cp.multiply(y, z)) / len(y)),
                     [cp.norm(w, "inf") <= 0.5])
    ref.solve(solver="CLARABEL")
    assert abs(res.fun - ref.value) <= 1e-6 * abs(ref.value)


def test_neyman_pearson_in_one_pass_is_the_same_problem(cancer, cancer_data):
    """``one_pass=True`` (both class losses from one VectorSampleFunction): the values,
    gradients (against central differences) and Hessians of the two SampleFunctions, and
    the same run up to rounding."""
    X, y = cancer
    two = neyman_pearson(cancer_data, 0.15, lam=1e-2)
    one = neyman_pearson(cancer_data, 0.15, lam=1e-2, one_pass=True)
    w = np.random.default_rng(0).normal(scale=0.1, size=X.shape[1])
    for a, b in zip(two.functions, one.functions):
        np.testing.assert_allclose(b.value(w, X, y), a.value(w, X, y), rtol=1e-13)
        np.testing.assert_allclose(b.grad(w, X, y), a.grad(w, X, y), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(b.hess(w, X, y), a.hess(w, X, y), rtol=1e-12, atol=1e-15)
        assert ss.check_grad(b, w, X, y) < 1e-6
    r2, r1 = two.solve(seed=0, max_iter=60), one.solve(seed=0, max_iter=60)
    assert (r1.status, r1.nit) == (r2.status, r2.nit)
    np.testing.assert_allclose(r1.x, r2.x, rtol=0, atol=1e-8 * np.max(np.abs(r2.x)))
