"""A small nonconvex constrained problem: SSCA finds the KKT point SLSQP finds from the same
start (robust Cauchy regression subject to a nonconvex saturation constraint)."""

import numpy as np
import pytest
from scipy.optimize import minimize

import ssca_solver as ss
from ssca_solver.methods.ssca import SSCA

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


def _equations(*pairs):
    """Constraints F_k(w) == 0 from (value, gradient) callables of w, on one client with one
    placeholder row (deterministic functions, as S2MPJ's problems are in
    benchmarks/nlp_collection.py)."""
    return [ss.SampleFunction((lambda v: lambda w, X, y: np.full(len(X), v(w)))(v),
                              (lambda g: lambda w, X, y: g(w))(g), name=f"F{k}") == 0.0
            for k, (v, g) in enumerate(pairs)]


@pytest.mark.parametrize("name, x0, pairs, rounds", [
    # S2MPJ's HYPCIR: x1 x2 = 1, x1^2 + x2^2 = 4 (13 rounds, 9 of them rejected, before the
    # line search: the first Newton step, which the two equalities fix whatever tau, was
    # retried at the same length with tau doubled; SLSQP: 4 iterations)
    ("HYPCIR", [0.0, 1.0], [(lambda w: w[0] * w[1] - 1.0, lambda w: np.array([w[1], w[0]])),
                            (lambda w: w @ w - 4.0, lambda w: 2.0 * w)], 6),
    # S2MPJ's HIMMELBC: x1^2 + x2 = 11, x1 + x2^2 = 7 (11 rounds, 6 rejected; SLSQP: 5)
    ("HIMMELBC", [1.0, 1.0], [(lambda w: w[0] ** 2 + w[1] - 11.0,
                               lambda w: np.array([2.0 * w[0], 1.0])),
                              (lambda w: w[0] + w[1] ** 2 - 7.0,
                               lambda w: np.array([1.0, 2.0 * w[1]]))], 8),
])
def test_a_rejected_first_order_step_is_retried_along_its_direction(name, x0, pairs, rounds):
    """A square system of equations without objective: a rejected step of the first-order
    rounds is retried at half its length along its direction (tau unchanged), so the run
    takes about SLSQP's iterations. The point is checked on the equations themselves, to
    the certificate's tolerance (feas_tol 1e-4 relative to max(1, |bound|))."""
    data = ss.FederatedData([np.zeros((1, 1))])
    zero = ss.SampleFunction(lambda w, X, y: np.zeros(len(X)), lambda w, X, y: np.zeros(2),
                             name="0")
    res = ss.Problem(zero, _equations(*pairs), dim=2, data=data).solve(
        seed=0, x0=np.array(x0))
    assert res.status == "converged", res.message
    assert max(abs(v(res.x)) for v, _ in pairs) <= 1e-4
    assert res.nit <= rounds, (name, res.nit)


def test_a_newton_step_that_tau_cannot_shorten_is_retried_along_its_direction():
    """S2MPJ's HIMMELBC with every function's Hessian (the Newton model): the two linearised
    equations fix the first Newton step whatever tau, so raising tau after its rejection
    retried the same step (16 rounds, 10 of them rejected; SLSQP: 5 iterations). The retry
    is now at half the rejected length along the step (a backtracking line search), and the
    run takes about SLSQP's iterations."""
    data = ss.FederatedData([np.zeros((1, 1))])
    zero = ss.SampleFunction(lambda w, X, y: np.zeros(len(X)), lambda w, X, y: np.zeros(2),
                             hess=lambda w, X, y: np.zeros((2, 2)), name="0")
    values = (lambda w: w[0] ** 2 + w[1] - 11.0, lambda w: w[0] + w[1] ** 2 - 7.0)
    grads = (lambda w: np.array([2.0 * w[0], 1.0]), lambda w: np.array([1.0, 2.0 * w[1]]))
    hessians = (np.diag([2.0, 0.0]), np.diag([0.0, 2.0]))
    equations = [ss.SampleFunction((lambda v: lambda w, X, y: np.full(len(X), v(w)))(v),
                                   (lambda g: lambda w, X, y: g(w))(g),
                                   hess=(lambda H: lambda w, X, y: H)(H), name=f"F{k}") == 0.0
                 for k, (v, g, H) in enumerate(zip(values, grads, hessians))]
    prob = ss.Problem(zero, equations, dim=2, data=data)
    assert SSCA.parse(prob, {}).hessian == "newton"
    res = prob.solve(seed=0, x0=np.array([1.0, 1.0]))
    assert res.status == "converged", res.message
    assert max(abs(v(res.x)) for v in values) <= 1e-4
    np.testing.assert_allclose(res.x, [3.0, 2.0], atol=1e-4)
    # a rejected step retried at half its length: the trial's step fraction is below 1
    assert np.any(np.asarray(res.history.gamma) < 1.0)
    assert res.nit <= 8, res.nit
