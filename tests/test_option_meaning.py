"""Options that mean what they say (issue 20, item 5; issue 21)."""

import warnings

import numpy as np

import ssca_solver as ss


def _least_squares(clients):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3))
    wt = np.array([1.0, -2.0, 0.5])
    y = X @ wt
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / X.shape[0], name="ls")
    parts = np.array_split(np.arange(20), clients)
    return ss.Problem(f, dim=3, data=ss.FederatedData([(X[p], y[p]) for p in parts])), wt


def test_a_batch_of_every_clients_rows_is_a_full_batch():
    """20 one-row clients with batch_size=1: every batch is all the data, so the rounds are
    full-batch rounds (exact statistics, unit steps, backtracking) and the run is certified;
    as a 'fixed mini-batch' it ended 2e-4 from the optimum with a message blaming a noise
    floor."""
    prob, wt = _least_squares(20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(batch_size=1, seed=0)
    assert res.status == "converged", res.message
    assert np.abs(res.x - wt).max() < 1e-5
    assert "noise floor" not in res.message
    # a B below some client's rows is still a mini-batch
    prob2, _ = _least_squares(4)
    res2 = prob2.solve(batch_size=2, seed=0, max_iter=20)
    assert res2.status == "max_iter" and "mini-batch" in res2.message


def test_diagonal_curvature_on_features_scaled_by_1e6_with_the_default_tau():
    """Least squares on features scaled by 1e6 with ss.DiagonalCurvature (the exact Hessian
    diagonal) and the default tau: the probe's curvature (1e12) was added to the builder's own
    h on every coordinate and never adapted (DiagonalCurvature's tau is not backtracked), the
    steps fell to 1e-13 and the run 'stopped moving ... the penalised problem is solved ...
    a kink' 1e-6 from the optimum (issue 20, item 5); the default tau is 0.1 for builders with
    their own curvature, and a step lost in rounding is not taken for a fixed point."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 4)) * 1e6
    wt = np.array([1.0, -2.0, 0.5, 3.0]) * 1e-6
    y = X @ wt + 0.1 * rng.standard_normal(200)
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / X.shape[0], name="ls",
                          surrogate=ss.DiagonalCurvature(lambda w, X, y: np.mean(X * X, axis=0)))
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ss.Problem(f, dim=4, data=ss.FederatedData.split(X, y, 4, seed=0)).solve(seed=0)
    assert res.status == "converged", res.message
    assert np.abs(res.x - ref).max() <= 1e-9 * np.abs(ref).max()
