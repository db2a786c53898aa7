"""Surrogate builders: statistics, eqs. (fs0bar)/(fsmbar), and the recursion (Fs0bar)."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss

D = 3


def tagged_quadratic(calls):
    """f(w, x) = 0.5 |w - x[:D]|^2 on rows whose last column is a global row id (recorded)."""

    def value(w, X, y):
        calls.append(X[:, D].astype(int).copy())
        return 0.5 * np.sum((w - X[:, :D]) ** 2, axis=1)

    def grad(w, X, y):
        return w - X[:, :D].mean(axis=0)

    return ss.SampleFunction(value, grad, name="tagged")


def test_proximal_linear_statistics_are_the_sum_of_fsmbar():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, D))
    f = ss.SampleFunction(lambda w, X, y: 0.5 * np.sum((w - X) ** 2, axis=1),
                          lambda w, X, y: w - X.mean(axis=0))
    wt, w, tau = rng.normal(size=D), rng.normal(size=D), 0.3
    q = ss.ProximalLinear().statistics(f, wt, X, None, tau, "test")
    literal = sum(0.5 * (wt - x) @ (wt - x) + (wt - x) @ (w - wt) + tau * (w - wt) @ (w - wt)
                  for x in X)
    assert np.isclose(ss.ProximalLinear().evaluate(q, w), literal, rtol=1e-12)
    assert q["lin"].shape == (D,) and np.isclose(q["quad"], 7 * tau)


@pytest.mark.parametrize("builder", [ss.ProximalLinear(),
                                     ss.DiagonalCurvature(logistic_loss().hess_diag)])
def test_surrogate_matches_value_and_gradient_at_wt(builder, cancer):
    """fbar(w_t, w_t) = f(w_t) and grad fbar(w_t, w_t) = grad f(w_t) (Assumption 2.1)."""
    X, y = cancer
    X, y = X[:40], y[:40]
    f = logistic_loss()
    wt = np.random.default_rng(2).normal(size=X.shape[1]) * 0.3
    q = builder.statistics(f, wt, X, y, 0.1, "test")
    assert np.isclose(builder.evaluate(q, wt), f.value(wt, X, y).sum(), rtol=1e-10)
    eps = 1e-6
    fd = np.array([(builder.evaluate(q, wt + eps * e) - builder.evaluate(q, wt - eps * e))
                   / (2 * eps) for e in np.eye(wt.size)])
    np.testing.assert_allclose(fd, 40 * f.grad(wt, X, y), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("builder", [ss.ProximalLinear(),
                                     ss.DiagonalCurvature(logistic_loss().hess_diag)])
def test_cvxpy_expression_equals_numeric_evaluation(builder, cancer):
    X, y = cancer
    wt = np.random.default_rng(3).normal(size=X.shape[1]) * 0.3
    w = np.random.default_rng(4).normal(size=X.shape[1])
    q = builder.statistics(logistic_loss(), wt, X[:30], y[:30], 0.2, "test")
    expr = builder.expression({k: cp.Constant(v) for k, v in q.items()}, cp.Constant(w),
                              cp.Constant(w @ w))
    assert np.isclose(expr.value, builder.evaluate(q, w), rtol=1e-12)


def test_diagonal_curvature_is_strongly_convex_and_clips_negative_curvature():
    f = ss.SampleFunction(lambda w, X, y: np.zeros(len(X)), lambda w, X, y: np.zeros(2))
    b = ss.DiagonalCurvature(lambda w, X, y: np.array([-5.0, 4.0]))
    q = b.statistics(f, np.zeros(2), np.ones((3, 1)), None, 0.1, "test")
    np.testing.assert_allclose(q["quad"], 3 * np.array([0.1, 2.1]))


@pytest.mark.parametrize("init", ["zero", "tau"])
def test_recursive_statistics_equal_the_weighted_sum_of_surrogates(init):
    """Eq. (Fs0bar) checked literally: Fbar^(T) is the rho-weighted sum over rounds of
    sum_i N_i/(B N) sum_{n in batch} fbar(w, w_s, x_n), plus prod(1 - rho) Fbar^(0)."""
    rng = np.random.default_rng(5)
    sizes, B, T, tau = (5, 8, 11), 2, 6, 0.25
    N = sum(sizes)
    Xall = np.hstack([rng.normal(size=(N, D)), np.arange(N)[:, None]])
    bounds = np.cumsum((0,) + sizes)
    data = ss.FederatedData([Xall[a:b] for a, b in zip(bounds[:-1], bounds[1:])])
    calls, ws, states = [], [], []
    f = tagged_quadratic(calls)
    x0 = rng.normal(size=D)
    res = ss.Problem(f, dim=D, data=data).solve(
        batch_size=B, max_iter=T, tau=tau, seed=7, surrogate_init=init, x0=x0,
        check_gradients=False,
        eval_every=None, callback=lambda it: (ws.append(it.state.w), states.append(it.state)))
    w_seq = [x0] + ws[:-1]                      # w_s used in round s
    rho = res.history.rho
    batches = [calls[s * 3:(s + 1) * 3] for s in range(T)]
    for s in range(T):                           # each client drew B distinct rows of its own
        for i, ids in enumerate(batches[s]):
            assert len(set(ids)) == B and all(bounds[i] <= ids) and all(ids < bounds[i + 1])

    def fbar(w, ws_, x):
        return 0.5 * (ws_ - x) @ (ws_ - x) + (ws_ - x) @ (w - ws_) + tau * (w - ws_) @ (w - ws_)

    def literal(w):
        total = np.prod(1 - rho) * (tau * w @ w if init == "tau" else 0.0)
        for s in range(T):
            weight = rho[s] * np.prod(1 - rho[s + 1:])
            est = sum(sizes[i] / (B * N) * sum(fbar(w, w_seq[s], Xall[n, :D]) for n in ids)
                      for i, ids in enumerate(batches[s]))
            total += weight * est
        return total

    final = states[-1].stats[0]
    builder = ss.ProximalLinear()
    for w in rng.normal(size=(4, D)):
        assert np.isclose(builder.evaluate(final, w), literal(w), rtol=1e-12, atol=1e-12)
    expected_quad = tau if init == "tau" else tau * (1 - np.prod(1 - rho))
    assert np.isclose(final["quad"], expected_quad, rtol=1e-12)


@pytest.mark.parametrize("curvature", [0.0, -0.5])
def test_the_exact_strong_convexity_check_refuses_statistics_without_curvature(curvature):
    """Proximal-linear statistics whose curvature a of a |w|^2 + b.w + c is not positive (a
    custom builder's, or corrupted ones) make Problem 2 unbounded: the exact check, which reads
    a from the quadratic form, refuses them with its message."""
    from ssca_solver.model.surrogates import check_strongly_convex

    stats = {"const": np.asarray(1.0), "lin": np.ones(D), "quad": np.asarray(curvature)}
    with pytest.raises(ss.ModelError, match=rf"the surrogate of f \(ProximalLinear\(tau=None\)\) "
                                            rf"is not strongly convex: its curvature is "
                                            rf"{curvature:g}\. Assumption 2 needs strong "
                                            rf"convexity"):
        check_strongly_convex(ss.ProximalLinear(), stats, D, "f")


def test_the_exact_strong_convexity_check_accepts_a_small_curvature_far_from_the_origin():
    """Statistics taken far from the origin carry const ~ a |w_t|^2, where a second
    difference through the expression would lose a to rounding: the exact check reads a and
    accepts them."""
    from ssca_solver.model.surrogates import check_strongly_convex

    tau, x = 1e-3, np.full(D, 1e9)
    stats = {"const": np.asarray(tau * float(x @ x)), "lin": -2.0 * tau * x,
             "quad": np.asarray(tau)}
    check_strongly_convex(ss.ProximalLinear(), stats, D, "f")      # no error
