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
    res = prob.solve(callback=lambda it: ws.append(it.x.copy()), **RUN, **kw)
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
    # agrees to 1e-6, and the run below against Clarabel polished each round agrees to 1e-6
    assert np.max(np.abs(wa - wb)) <= 1e-4 * max(1.0, np.max(np.abs(wa)))
    np.testing.assert_allclose(a.history.multipliers, b.history.multipliers, atol=1e-3)


class PolishedCvxpy:
    """The CVXPY path's answer refined on its own active set (tests/kkt_reference.py): the
    reference for whole runs at 1e-6, which Clarabel alone cannot give (see above)."""

    name = "cvxpy+polish"

    def __init__(self, cvx, cf):
        self.cvx, self.cf = cvx, cf      # cf only lends the problem's data: k, bounds, ridge

    def solve(self, stats, penalty, round, nu0=None, center=None):
        from kkt_reference import polished_reference
        from ssca_solver.subproblems.base import SubproblemSolution

        sol = self.cvx.solve(stats, penalty, round=round)
        forms = [b.quadratic_form(s) for b, s in zip(self.cf.builders, stats)]
        a0, b0, c0 = forms[0]
        cons = forms[1:]
        inst = (a0 + self.cf.ridge, b0, c0, np.array([f[0] for f in cons]),
                [f[1] for f in cons], np.array([f[2] for f in cons]), self.cf.bounds, penalty)
        w, slack, nu = polished_reference(inst, sol.w, sol.multipliers)
        return SubproblemSolution(w, slack, nu, sol.value)


def test_same_iterates_constrained_against_polished_clarabel(cancer_data):
    """The issue's 1e-6 for a whole constrained run: 40 rounds of Algorithm 2 through
    driver.step, closed form against CVXPY + Clarabel polished each round."""
    from ssca_solver.methods.ssca import step as driver
    from conftest import round_request, ssca_clients
    from ssca_solver.federated import InProcessTransport
    from ssca_solver.subproblems import make_subproblem

    prob = neyman_pearson(cancer_data, 0.2, lam=1e-2)
    cf = make_subproblem(prob, prob.builders, "closed_form")
    ref = PolishedCvxpy(make_subproblem(prob, prob.builders, "cvxpy"), cf)
    runs = []
    for sub in (cf, ref):
        transport = InProcessTransport(ssca_clients(prob, 0))
        state = driver.init(np.zeros(prob.dim), prob.builders, 0.1, "tau", 1, 10.0)
        ws, nus = [], []
        for t in range(1, 41):
            msgs = transport.stream(round_request(t, state.w, 20))
            state, info = driver.step(state, msgs, cancer_data.num_samples, 0.9 / t ** 0.4,
                                      0.9 / t ** 0.55, sub)
            ws.append(state.w)
            nus.append(info.solution.multipliers)
        runs.append((np.array(ws), np.array(nus)))
    (wa, na), (wb, nb) = runs
    # every case of Lemma 1 occurs (measured: 23 rounds nu = 0, 15 with 0 < nu < c, 2 nu = c)
    assert np.any(na == 0) and np.any((na > 0) & (na < 10.0)) and np.any(na == 10.0)
    assert np.max(np.abs(wa - wb)) <= 1e-6 * max(1.0, np.max(np.abs(wa)))
    np.testing.assert_allclose(na, nb, rtol=1e-6, atol=1e-8)
