"""Convex instances: SSCA reaches the optimum CVXPY + Clarabel finds on the pooled data."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson, pooled_reference

LAM = 1e-2


@pytest.fixture(scope="module")
def unequal_data(cancer):
    X, y = cancer
    perm = np.random.default_rng(0).permutation(len(y))
    cuts = np.split(perm, [60, 160, 310])  # clients of 60, 100, 150 and 259 rows
    return ss.FederatedData([(X[c], y[c]) for c in cuts])


@pytest.fixture(scope="module")
def logistic_optimum(cancer):
    X, y = cancer
    w = cp.Variable(X.shape[1])
    loss = cp.sum(cp.logistic(-cp.multiply(2 * y - 1, X @ w))) / len(y)
    p = cp.Problem(cp.Minimize(loss + LAM * cp.sum_squares(w)))
    p.solve(solver="CLARABEL")
    return p.value, w.value


@pytest.mark.parametrize("curvature", [False, True], ids=["proximal-linear", "diagonal"])
def test_regularised_logistic_regression_reaches_the_pooled_optimum(unequal_data,
                                                                     logistic_optimum, curvature):
    opt, _ = logistic_optimum
    prob = ss.Problem(logistic_loss(curvature=curvature), dim=31, data=unequal_data,
                      regularizer=lambda w: LAM * cp.sum_squares(w))
    res = prob.solve(batch_size=20, max_iter=300, tau=0.1, seed=1, eval_every=50)
    assert res.status == "max_iter" and res.slack.size == 0
    assert (res.fun - opt) / opt <= 1e-2
    assert res.fun >= opt - 1e-9  # nothing beats the global optimum
    assert res.kkt.stationarity < 0.05
    assert np.all(np.diff(res.history.eval_t) == 50)


def test_neyman_pearson_reaches_the_pooled_constrained_optimum(cancer, cancer_data):
    X, y = cancer
    alpha = 0.2
    _, ref_obj, ref_con, ref_mu = pooled_reference(X, y, alpha, lam=LAM)
    res = neyman_pearson(cancer_data, alpha, lam=LAM).solve(
        batch_size=50, max_iter=1000, tau=0.1, penalty=[10.0, 100.0], seed=0, eval_every=None)
    # the paper's settings with no evaluation: no stopping test ran, so no success claimed
    assert res.status == "max_iter" and not res.success and res.stages[0].slack_norm <= 1e-3
    assert abs(res.fun - ref_obj) / ref_obj <= 1e-2
    assert abs(res.constraints[0]) <= 5e-3                  # F(w) within 2.5 % of U = 0.2
    assert res.kkt.multipliers[0] == pytest.approx(ref_mu, rel=0.1)
    assert res.kkt.stationarity < 1e-2


def test_several_stochastic_constraints_stochastic_qcqp():
    """min E 0.5|w - x|^2  s.t.  E (a_m.w)^2 <= U_m for m = 1, 2 (both active), against CVXPY
    on the same sample averages."""
    rng = np.random.default_rng(3)
    N, d = 400, 4
    X = rng.normal(loc=[2.0, -1.0, 1.0, 0.5], size=(N, d))
    A1 = rng.normal(size=(N, d)) + [1, 0, 0, 0]
    A2 = rng.normal(size=(N, d)) + [0, 0, 1, 1]
    rows = np.hstack([X, A1, A2])
    data = ss.FederatedData.split(rows, None, num_clients=4, seed=0)

    def quad_on(block):
        def value(w, R, y):
            return (R[:, block] @ w) ** 2

        def grad(w, R, y):
            A = R[:, block]
            return 2 * A.T @ (A @ w) / len(A)
        return ss.SampleFunction(value, grad, name=f"(a{block.start // d}.w)^2")

    f0 = ss.SampleFunction(lambda w, R, y: 0.5 * np.sum((w - R[:, :d]) ** 2, axis=1),
                           lambda w, R, y: w - R[:, :d].mean(axis=0), name="0.5|w-x|^2")
    U = [1.0, 0.8]
    prob = ss.Problem(f0, [quad_on(slice(d, 2 * d)) <= U[0], quad_on(slice(2 * d, 3 * d)) <= U[1]],
                      dim=d, data=data)
    res = prob.solve(batch_size=25, max_iter=600, tau=0.5, penalty=[10.0, 100.0], seed=0,
                     eval_every=None)

    w = cp.Variable(d)
    cons = [cp.sum_squares(A1 @ w) / N <= U[0], cp.sum_squares(A2 @ w) / N <= U[1]]
    ref = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(w) - X.mean(0) @ w
                                 + 0.5 * np.mean(np.sum(X ** 2, 1))), cons)
    ref.solve(solver="CLARABEL")
    duals = np.array([np.ravel(c.dual_value)[0] for c in cons])
    assert np.all(duals > 0.1)  # both constraints active at the optimum
    assert res.status == "max_iter" and not res.success
    assert abs(res.fun - ref.value) / ref.value <= 1e-2
    np.testing.assert_allclose(res.x, w.value, atol=2e-2)
    assert np.all(np.abs(res.constraints) <= 2e-2)
    np.testing.assert_allclose(res.kkt.multipliers, duals, rtol=0.1)
    # default options: certified, and as accurate as the certificate says
    auto = prob.solve(seed=0, max_iter=1000)
    assert auto.status == "converged" and auto.success
    assert abs(auto.fun - ref.value) / ref.value <= 1e-3
    assert np.max(auto.kkt.feasibility_rel) <= 1e-4
    np.testing.assert_allclose(auto.kkt.multipliers, duals, rtol=1e-2)


def test_defaults_certify_the_neyman_pearson_optimum(cancer, cancer_data):
    X, y = cancer
    _, ref_obj, _, ref_mu = pooled_reference(X, y, 0.2, lam=LAM)
    res = neyman_pearson(cancer_data, 0.2, lam=LAM).solve(seed=0)
    assert res.status == "converged" and res.success
    assert abs(res.fun - ref_obj) / ref_obj <= 1e-3
    assert res.kkt.feasibility_rel[0] <= 1e-4 and res.kkt.stationarity_rel <= 1e-4
    assert res.kkt.multipliers[0] == pytest.approx(ref_mu, rel=1e-2)
