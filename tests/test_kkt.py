"""KKT diagnostics, checked at points whose KKT status is known from CVXPY."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson, pooled_reference
from conftest import ssca_clients
from ssca_solver.diagnostics import Evaluator, ProblemTerms, kkt_report
from ssca_solver.federated import InProcessTransport


def _report(prob, w, duals=None):
    transport = InProcessTransport(ssca_clients(prob, 0))
    ev = Evaluator(prob).evaluate(transport, w, with_grad=True)
    terms = ProblemTerms(prob.objective is not None, prob.bounds, prob.deterministic)
    duals = np.zeros(prob.num_constraints) if duals is None else duals
    return kkt_report(w, ev, terms, duals)


def test_kkt_report_at_the_pooled_optimum(cancer, cancer_data):
    X, y = cancer
    w, _, _, mu = pooled_reference(X, y, 0.1, lam=1e-2)
    rep = _report(neyman_pearson(cancer_data, 0.1, lam=1e-2), w)
    assert rep.multiplier_source == "nnls" and rep.stationarity_kind == "gradient"
    assert rep.multipliers[0] == pytest.approx(mu, rel=1e-4)
    assert rep.stationarity < 1e-6 and rep.max_residual < 1e-6


def test_kkt_report_flags_a_non_stationary_point(cancer, cancer_data):
    X, y = cancer
    w, *_ = pooled_reference(X, y, 0.1, lam=1e-2)
    rep = _report(neyman_pearson(cancer_data, 0.1, lam=1e-2), 0.5 * w)
    assert rep.stationarity > 1e-2 or rep.complementarity[0] > 1e-2


def test_inactive_constraint_gets_no_multiplier(cancer, cancer_data):
    X, y = cancer
    w, _, con, mu = pooled_reference(X, y, 5.0, lam=1e-2)  # bound far from active
    assert con < 4.0 and mu < 1e-6
    rep = _report(neyman_pearson(cancer_data, 5.0, lam=1e-2), w)
    assert rep.multipliers[0] < 1e-6 and rep.feasibility[0] == 0
    assert rep.stationarity < 1e-6


def test_prox_gradient_residual_with_a_domain(cancer, cancer_data):
    """Box-constrained logistic regression: the residual vanishes at CVXPY's optimum only."""
    X, y = cancer
    v = cp.Variable(X.shape[1])
    loss = cp.sum(cp.logistic(-cp.multiply(2 * y - 1, X @ v))) / len(y)
    cp.Problem(cp.Minimize(loss), [v <= 0.3, v >= -0.3]).solve(
        solver="CLARABEL", tol_gap_abs=1e-9, tol_gap_rel=1e-9)
    prob = ss.Problem(logistic_loss(), dim=X.shape[1], data=cancer_data,
                      domain=lambda w: [cp.abs(w) <= 0.3])
    rep = _report(prob, v.value)
    assert rep.stationarity_kind == "prox-gradient"
    assert rep.stationarity < 1e-6 and rep.domain_violation < 1e-8
    assert np.sum(np.isclose(np.abs(v.value), 0.3, atol=1e-6)) >= 3  # the box is active
    rep2 = _report(prob, np.clip(v.value * 0.5, -0.3, 0.3))
    assert rep2.stationarity > 1e-3
    rep3 = _report(prob, v.value * 2)
    assert rep3.domain_violation > 0.2
