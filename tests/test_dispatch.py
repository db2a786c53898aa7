"""subproblem="auto" picks the closed form exactly when it applies; both paths give the same
iterates."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson

RUN = dict(batch_size=20, max_iter=40, seed=0, eval_every=None)


def iterates(prob, **kw):
    ws = []
    res = prob.solve(callback=lambda state, info: ws.append(state.w.copy()), **RUN, **kw)
    return res, np.array(ws)


@pytest.mark.parametrize("make, expected", [
    (lambda d: ss.Problem(logistic_loss(), dim=31, data=d), "closed_form"),
    (lambda d: neyman_pearson(d, 0.2), "closed_form"),
    (lambda d: ss.Problem(lambda w: cp.sum_squares(w), [logistic_loss() <= 0.3], dim=31,
                          data=d), "closed_form"),
    (lambda d: ss.Problem(logistic_loss(), dim=31, data=d,
                          regularizer=lambda w: 0.1 * cp.norm1(w)), "cvxpy"),
    (lambda d: ss.Problem(logistic_loss(), dim=31, data=d,
                          domain=lambda w: [cp.norm(w, "inf") <= 1]), "cvxpy"),
    (lambda d: ss.Problem(logistic_loss(curvature=True), dim=31, data=d), "cvxpy"),
])
def test_auto_dispatch(cancer_data, make, expected):
    res = make(cancer_data).solve(subproblem="auto", batch_size=10, max_iter=2, eval_every=None)
    assert res.subproblem == expected


def test_closed_form_refuses_what_it_cannot_solve(cancer_data):
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data,
                      domain=lambda w: [cp.norm(w, "inf") <= 1])
    with pytest.raises(ss.ModelError, match="closed_form' does not apply: the problem has a "
                                            "domain"):
        prob.solve(subproblem="closed_form", **RUN)


def test_same_iterates_unconstrained(cancer_data):
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    a, wa = iterates(prob, subproblem="closed_form")
    b, wb = iterates(prob, subproblem="cvxpy")
    assert (a.subproblem, b.subproblem) == ("closed_form", "cvxpy")
    assert np.max(np.abs(wa - wb)) <= 1e-6 * max(1.0, np.max(np.abs(wa)))


def test_same_iterates_constrained(cancer_data):
    prob = neyman_pearson(cancer_data, 0.2, lam=1e-2)
    a, wa = iterates(prob, subproblem="closed_form", penalty=[10.0])
    b, wb = iterates(prob, subproblem="cvxpy", penalty=[10.0], solver_options=dict(
        tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10))
    # Problem 5 goes to Clarabel as a second-order cone program whose primal is accurate to
    # ~1e-5 relative even at tight tolerances (measured: max |w_cf - w_cvxpy| between 1.4e-5 and
    # 5.9e-5 with max |w| = 1.9 over 40 rounds, depending on the last bits of the inputs;
    # multipliers within 1.3e-4), so 1e-6 is out of reach here; the unconstrained run above
    # agrees to 1e-6, and test_closed_form.py certifies the closed form's optimality exactly
    assert np.max(np.abs(wa - wb)) <= 1e-4 * max(1.0, np.max(np.abs(wa)))
    np.testing.assert_allclose(a.history.multipliers, b.history.multipliers, atol=1e-3)
