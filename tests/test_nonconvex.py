"""A small nonconvex constrained problem: SSCA finds the KKT point SLSQP finds from the same
start (robust Cauchy regression subject to a nonconvex saturation constraint)."""

import numpy as np
import pytest
from scipy.optimize import minimize

import ssca_solver as ss

N, D, U = 200, 3, 0.5


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    y = X @ np.array([1.5, -2.0, 1.0]) + 0.3 * rng.standard_cauchy(N)

    def cauchy(w, X, y):
        return np.log1p((X @ w - y) ** 2)

    def cauchy_grad(w, X, y):
        r = X @ w - y
        return X.T @ (2 * r / (1 + r ** 2)) / len(y)

    def saturation(w, X, y):
        return np.tanh((X @ w) ** 2 / 4)

    def saturation_grad(w, X, y):
        z = X @ w
        return X.T @ ((1 - np.tanh(z ** 2 / 4) ** 2) * z / 2) / len(y)

    f0 = ss.SampleFunction(cauchy, cauchy_grad, name="cauchy")
    f1 = ss.SampleFunction(saturation, saturation_grad, name="saturation")
    for f in (f0, f1):
        assert ss.check_grad(f, np.array([0.3, -0.2, 0.5]), X, y) < 1e-6
    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    prob = ss.Problem(f0, [f1 <= U], dim=D, data=data)
    ref = minimize(lambda w: cauchy(w, X, y).mean(), np.zeros(D), method="SLSQP",
                   jac=lambda w: cauchy_grad(w, X, y),
                   constraints=[{"type": "ineq", "fun": lambda w: U - saturation(w, X, y).mean(),
                                 "jac": lambda w: -saturation_grad(w, X, y)}],
                   options={"ftol": 1e-14, "maxiter": 1000})
    assert ref.success
    g0, g1 = cauchy_grad(ref.x, X, y), saturation_grad(ref.x, X, y)
    mu = -(g0 @ g1) / (g1 @ g1)  # least-squares multiplier of the reference point
    assert mu > 0.1 and np.linalg.norm(g0 + mu * g1) < 1e-6  # a KKT point, constraint active
    return prob, ref, mu


def test_full_batch_ssca_matches_slsqp(problem):
    prob, ref, mu = problem
    res = prob.solve(batch_size="full", max_iter=400, tau=0.5, rho=1.0, gamma=0.5,
                     penalty=[10.0], x0=np.zeros(D), eval_every=None)
    assert res.status == "max_iter"           # no evaluation, no stopping test
    np.testing.assert_allclose(res.x, ref.x, atol=1e-6)
    assert res.kkt.multipliers[0] == pytest.approx(mu, rel=1e-4)
    assert res.kkt.stationarity < 1e-6 and res.kkt.max_residual < 1e-6


def test_mini_batch_ssca_reaches_the_same_kkt_point(problem):
    prob, ref, mu = problem
    res = prob.solve(batch_size=10, max_iter=1500, tau=0.5, penalty=[10.0], x0=np.zeros(D),
                     seed=0, eval_every=None)
    assert res.status == "max_iter"
    np.testing.assert_allclose(res.x, ref.x, atol=3e-2)
    assert abs(res.constraints[0]) < 1e-2
    assert res.kkt.multipliers[0] == pytest.approx(mu, rel=0.1)
    assert res.kkt.stationarity < 1e-2


def test_default_options_certify_the_slsqp_kkt_point(problem):
    prob, ref, mu = problem
    res = prob.solve(x0=np.zeros(D), seed=0)
    assert res.status == "converged" and res.kkt.passed(1e-4, 1e-4)
    np.testing.assert_allclose(res.x, ref.x, atol=1e-3)
    assert res.kkt.multipliers[0] == pytest.approx(mu, rel=1e-2)
