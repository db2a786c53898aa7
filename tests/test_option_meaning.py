"""Options that mean what they say (issue 20, item 5; issue 21)."""

import warnings

import numpy as np
import pytest

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


def test_max_iter_bounds_the_whole_run_of_algorithm_2():
    """max_iter counts the rounds of the whole run, every penalty stage included (as scipy's
    maxiter): 30 rounds over three penalties are three stages of 10 (equal shares of what
    is left), not 3 x 30; the default budget of Algorithm 2 is 200 per penalty value."""
    prob, _ = _least_squares(4)
    c = ss.SampleFunction(lambda w, X, y: np.full(X.shape[0], w @ w),
                          lambda w, X, y: 2 * w, name="norm2")
    con = ss.Problem(prob.objective, [c <= 0.5], dim=3, data=prob.data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = con.solve(batch_size=2, tau=0.5, penalty=[0.001, 0.01, 0.1], max_iter=30,
                        seed=0)
    assert res.nit == 30 and [s.rounds for s in res.stages] == [10, 10, 10]
    assert len(res.history.t) == 30
    # a budget that does not divide: the last stage takes what is left
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = con.solve(batch_size=2, tau=0.5, penalty=[0.001, 0.01, 0.1], max_iter=32,
                        seed=0)
    assert res.nit == 32 and [s.rounds for s in res.stages] == [10, 11, 11]
    from ssca_solver.methods.ssca import SSCA
    assert SSCA.parse(con, {}).max_iter == 800 and SSCA.parse(prob, {}).max_iter == 200


def test_the_full_batch_advice_does_not_guess_at_the_model():
    """The max_iter message on full batches advised standardising features and
    ss.DiagonalCurvature on a standardised convex problem (issue 21): it now says only what
    the run shows."""
    prob, _ = _least_squares(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(batch_size="full", max_iter=2, seed=0, eval_every=1)
    assert res.status == "max_iter"
    assert "standardise" not in res.message and "DiagonalCurvature" not in res.message


def test_a_slack_tol_below_feas_tol_says_what_it_does():
    """slack_tol=1e-10 was accepted silently and had no effect on the stop ('converged' at a
    violation of 3.9e-5, within feas_tol): it only decides when c is raised between stages.
    Given below feas_tol it draws a warning naming what to set instead (issue 20); it still
    works as documented (slack_tol=0: c raised after every stage with a positive slack)."""
    import pytest
    prob, _ = _least_squares(4)
    c = ss.SampleFunction(lambda w, X, y: np.full(X.shape[0], w @ w),
                          lambda w, X, y: 2 * w, name="norm2")
    con = ss.Problem(prob.objective, [c <= 0.5], dim=3, data=prob.data)
    with pytest.warns(UserWarning, match="lower feas_tol"):
        con.solve(slack_tol=1e-10, max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        con.solve(slack_tol=1e-3, feas_tol=1e-4, max_iter=2)        # the defaults' order
        con.solve(feas_tol=1e-2, max_iter=2)      # slack_tol not given: no warning


def test_a_fixed_tau_below_the_stability_bound_warns_before_round_1():
    """A fixed tau of 1e-3 on full batches (curvature about 1): the probe's curvature says
    before round 1 that the first steps are too long; on full batches the steps that raise
    the objective are taken back and shortened (issue 20, item 5: it raised DivergenceError
    at round 6), so the run converges, with the user's tau."""
    import pytest
    prob, wt = _least_squares(2)
    with pytest.warns(RuntimeWarning, match="below .* the smallest tau.*taken back"):
        res = prob.solve(batch_size="full", tau=1e-3, seed=0)
    assert res.status == "converged", res.message
    np.testing.assert_allclose(res.x, wt, atol=1e-4)


def test_a_fixed_tau_below_the_stability_bound_is_named_when_the_run_diverges():
    """Issue 20 item 5: tau=1e-3 fixed on sampled rounds (B = 5) of a curvature-1 least
    squares problem diverges (the warning before round 1 said it might; full batches are
    guarded, tests/test_full_batch_guard.py); the DivergenceError says the fixed tau did it
    and by how much, not that it is the solver's failure."""
    import warnings

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = X @ np.array([1.0, -1.0, 0.5])
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / len(X), name="ls")
    prob = ss.Problem(f, dim=3, data=ss.FederatedData.split(X, y, num_clients=3, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ss.DivergenceError, match=r"the fixed tau=0\.001 is .* times below"):
            prob.solve(batch_size=5, tau=1e-3, seed=0, max_iter=200)
