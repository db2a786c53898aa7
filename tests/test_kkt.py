"""KKT diagnostics, checked at points whose KKT status is known from CVXPY."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson, pooled_reference
from conftest import ssca_clients
from ssca_solver.diagnostics.evaluation import Evaluator, ProblemTerms
from ssca_solver.diagnostics.kkt import MULTIPLIER_REGULARIZATION, kkt_report
from ssca_solver.federated import InProcessTransport
from ssca_solver.model.deterministic import DeterministicPart


def _report(prob, w):
    transport = InProcessTransport(ssca_clients(prob, 0))
    ev = Evaluator(prob).evaluate(transport, w, with_grad=True)
    terms = ProblemTerms(prob.objective is not None, prob.bounds, prob.deterministic)
    return kkt_report(w, ev, terms)


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
    assert rep.stationarity_kind == "linearized step"
    assert rep.stationarity < 1e-6 and rep.domain_violation < 1e-8
    assert np.sum(np.isclose(np.abs(v.value), 0.3, atol=1e-6)) >= 3  # the box is active
    rep2 = _report(prob, np.clip(v.value * 0.5, -0.3, 0.3))
    assert rep2.stationarity > 1e-3
    rep3 = _report(prob, v.value * 2)
    assert rep3.domain_violation > 0.2


def _evaluation(g0, G, values):
    from ssca_solver.diagnostics.evaluation import Evaluation

    grads = np.vstack([g0, G.T])
    return Evaluation(np.asarray(values, dtype=float), grads, 0, 0)


def test_complementarity_is_the_product_of_multiplier_and_constraint():
    """At a point where the constraint is violated and the fit gives mu > 0, the report's
    complementarity is |mu (F - U)|, not 0."""
    det = ss.Problem(lambda w: cp.sum_squares(w), dim=2,
                     data=None).deterministic
    terms = ProblemTerms(True, np.array([1.0]), det)
    w = np.array([0.5, -0.25])
    g1 = np.array([1.0, 2.0])
    g0 = -2 * w - 0.7 * g1                     # stationary with mu = 0.7 if cons = 0
    rep = kkt_report(w, _evaluation(g0, g1[:, None], [0.0, 1.3]), terms)
    cons = 0.3
    mu = rep.multipliers[0]
    assert mu > 0.1
    assert rep.complementarity[0] == pytest.approx(mu * cons, rel=1e-12)
    assert rep.feasibility[0] == pytest.approx(cons, rel=1e-12)


def test_gradients_whose_squares_overflow_fail_the_report_instead_of_raising():
    """A point far out where the constraints' gradients are finite but their squares are not
    (S2MPJ's BOXBOD: entries of 7.5e235, an exp grown large): the fit cannot be computed
    (SciPy's nnls refused the infinite column norms and the run ended in an exception), so
    the report says so and fails the test, with the feasibility it could still compute."""
    det = ss.Problem(lambda w: cp.sum_squares(w), dim=2, data=None).deterministic
    terms = ProblemTerms(True, np.array([0.0, 0.0]), det)
    w = np.array([3.0, -2.0])
    G = np.array([[7.5e235, 1.0], [2.0e200, 1.0]])
    rep = kkt_report(w, _evaluation(np.array([1.0, 0.5]), G, [0.0, 3e234, -1.0]), terms)
    assert rep.failed and "overflow" in rep.multiplier_source
    assert not rep.passed(1e-4, 1e-4)
    np.testing.assert_allclose(rep.feasibility, [3e234, 0.0])
    # gradients of ordinary size at the same point: a fit, no failure
    ok = kkt_report(w, _evaluation(np.array([1.0, 0.5]), np.eye(2), [0.0, 0.1, -1.0]), terms)
    assert not ok.failed and np.all(np.isfinite(ok.multipliers))


def test_multiplier_fit_includes_complementarity_rows():
    """Stationarity alone would give mu = 1; with the complementarity row mu^2 (F - U)^2 the
    fit is mu = |g|^2 / (|g|^2 + (F - U)^2 + eps^2 |g|^2) for an inactive constraint
    (F - U = -1; eps: the regularisation row)."""
    det = ss.Problem(lambda w: cp.sum_squares(w), dim=3, data=None).deterministic
    terms = ProblemTerms(True, np.array([0.0]), det)
    w = np.zeros(3)                            # grad of |w|^2 is 0 here
    g1 = np.array([0.6, 0.0, 0.8])             # |g1| = 1
    rep = kkt_report(w, _evaluation(-g1, g1[:, None], [0.0, -1.0]), terms)
    # with the regularisation row eps |g1| mu: mu = 1 / (1 + 1 + eps^2)
    eps2 = MULTIPLIER_REGULARIZATION ** 2
    assert rep.multipliers[0] == pytest.approx(1.0 / (2.0 + eps2), rel=1e-12)
    assert rep.stationarity == pytest.approx(1.0 - 1.0 / (2.0 + eps2), rel=1e-12)


def test_multipliers_with_a_domain_come_from_the_kkt_conditions(cancer, cancer_data):
    """With a box domain, the stochastic constraint's multiplier and the box's come from the
    linearised KKT step at the point: at CVXPY's optimum they are CVXPY's duals."""
    from problems.neyman_pearson import pooled_reference as reference

    X, y = cancer
    w, _, _, mu = reference(X, y, 0.1, lam=1e-2, box=0.4)
    prob = neyman_pearson(cancer_data, 0.1, lam=1e-2, box=0.4)
    rep = _report(prob, w)
    assert rep.multiplier_source == "linearized" and mu > 0.1
    assert rep.multipliers[0] == pytest.approx(mu, rel=1e-4)
    assert rep.stationarity_rel < 1e-5 and rep.passed(1e-5, 1e-5)   # CVXPY solves to ~1e-7
    (box,) = rep.domain_multipliers                     # one array: |w|_inf <= 0.4
    active = np.isclose(np.abs(w), 0.4, atol=1e-6)
    assert active.any() and np.all(box >= -1e-9)
    assert rep.complementarity_rel[0] < 1e-6


def test_a_solve_with_a_domain_reports_the_kkt_multiplier(cancer, cancer_data):
    from problems.neyman_pearson import pooled_reference as reference

    X, y = cancer
    _, ref, _, mu = reference(X, y, 0.1, lam=1e-2, box=0.4)
    res = neyman_pearson(cancer_data, 0.1, lam=1e-2, box=0.4).solve(seed=0)
    assert res.subproblem == "cvxpy" and res.kkt.multiplier_source == "linearized"
    assert res.status == "converged"
    assert res.kkt.multipliers[0] == pytest.approx(mu, rel=1e-2)
    assert abs(res.fun - ref) / ref <= 1e-3


def test_cancelling_multipliers_of_an_equality_written_twice_do_not_certify():
    """h(w) = 0 written as h <= 0 and -h' <= 0 with h' a hair away from h (its gradient
    differs by 1e-6 along what the constraint cannot balance): a least-squares fit uses the hair to absorb the part of the objective's
    gradient that the constraint cannot balance, with two huge, nearly equal multipliers. The
    scale of the relative stationarity must not grow with them (it did: 'converged' at points
    whose absolute stationarity was 0.74); here the point is not a KKT point, and the report
    must say so, with a scale a reader can recompute as |g|."""
    det = ss.Problem(lambda w: 0 * cp.sum_squares(w), dim=2, data=None).deterministic
    terms = ProblemTerms(True, np.array([0.0, 0.0]), det)
    w = np.array([-1.2, -np.sqrt(2 - 1.44)])         # on the circle |w|^2 = 2, not optimal
    g0 = np.array([1.0, 1.0])                        # minimise w1 + w2
    gh = 2 * w                                       # grad of h = |w|^2 - 2
    lam = -(g0 @ gh) / (gh @ gh)
    r = g0 + lam * gh                                # what no multiplier of h balances
    G = np.column_stack([gh, -gh - 1e-6 * r / np.linalg.norm(r)])
    rep = kkt_report(w, _evaluation(g0, G, [0.0, 0.0, 0.0]), terms)
    # a plain least-squares fit absorbs the unbalanced 0.32 with multipliers of 3e5 that
    # cancel (measured: 319378.36 and 319377.88, stationarity 4e-11); the regularised fit
    # keeps the forces small and the residual honest
    assert np.max(rep.multipliers) < 10 and rep.stationarity > 0.3
    assert rep.scale == pytest.approx(np.linalg.norm(g0), rel=1e-12)
    assert rep.stationarity_rel == pytest.approx(rep.stationarity / rep.scale, rel=1e-12)
    assert rep.stationarity_rel > 1e-2 and not rep.passed(1e-4, 1e-4)
    # at the KKT point w = (-1, -1), mu = 1/2 on h, the same report passes
    w = np.array([-1.0, -1.0])
    G = np.column_stack([2 * w, -2 * w - 1e-6 * r / np.linalg.norm(r)])
    ok = kkt_report(w, _evaluation(g0, G, [0.0, 0.0, 0.0]), terms)
    assert ok.passed(1e-4, 1e-4)
    assert ok.multipliers[0] - ok.multipliers[1] == pytest.approx(0.5, rel=1e-6)


def test_genuine_forces_far_above_the_objectives_gradient_certify():
    """A minimax point (S2MPJ's POLAK2): minimise t subject to f_1(x) <= t and f_2(x) <= t,
    whose gradients (218 in x, nearly opposite) cancel: mu = (1/2, 1/2), forces 109 times
    |g| = 1. The regularised fit leaves eps^2 (force / |g|)^2 ~ 2.4e-4 of residual at this
    KKT point (the run was refused at 210 rounds, independent KKT residual 3e-8); the plain
    fit balances g exactly and its forces are within FORCE_LIMIT, so the report passes. The
    hair of the test above needs forces of 6e5: still refused."""
    from ssca_solver.diagnostics.kkt import FORCE_LIMIT

    det = ss.Problem(lambda w: 0 * cp.sum_squares(w), dim=3, data=None).deterministic
    terms = ProblemTerms(True, np.array([0.0, 0.0]), det)
    a = np.array([150.0, 158.0])                     # |a| = 218
    g0 = np.array([0.0, 0.0, 1.0])                   # variables (x1, x2, t): minimise t
    G = np.column_stack([np.append(a, -1.0), np.append(-a, -1.0)])
    rep = kkt_report(np.zeros(3), _evaluation(g0, G, [1.0, 0.0, 0.0]), terms)
    np.testing.assert_allclose(rep.multipliers, [0.5, 0.5], rtol=1e-9)
    assert rep.stationarity_rel < 1e-9 and rep.passed(1e-4, 1e-4)
    forces = rep.multipliers * np.linalg.norm(G, axis=0) / rep.scale
    assert 100 < forces.max() <= FORCE_LIMIT


def test_the_linearised_step_measures_stationarity_not_the_violation_within_feas_tol():
    """S2MPJ's ALLINITA mechanism: an equality h = 0.01 w1 + w2 - 1 violated by 8e-5 (within
    feas_tol) at a point where the bound w2 >= 1 pins the coordinate h mostly moves; the
    objective -w1 + 50 w2 is balanced there by mu = 100 on h and 150 on the bound (an exact
    KKT point of the linearisation through w). Asked to remove the violation as well, the
    step moved 8e-3 along w1 (relative stationarity 8e-3: refused); the violation is the
    feasibility test's to judge, and the report passes with the multipliers."""
    from ssca_solver.diagnostics.evaluation import Evaluation

    det = ss.Problem(lambda w: 0 * cp.sum_squares(w), dim=2, data=None,
                     domain=lambda w: [w[1] >= 1.0]).deterministic
    terms = ProblemTerms(True, np.array([0.0]), det, equality=np.array([True]))
    w = np.array([8e-3, 1.0])
    g0, gh = np.array([-1.0, 50.0]), np.array([0.01, 1.0])
    ev = Evaluation(np.array([0.0, 8e-5]), np.vstack([g0, gh]), 0, 0)
    rep = kkt_report(w, ev, terms, feas_tol=1e-4)
    assert rep.multiplier_source == "linearized"
    assert rep.feasibility_rel[0] == pytest.approx(8e-5, rel=1e-9)
    assert rep.stationarity_rel < 1e-6, rep.stationarity_rel
    assert rep.passed(1e-4, 1e-4)
    assert rep.multipliers[0] == pytest.approx(100.0, rel=1e-4)
    # beyond feas_tol the step has to remove the excess again (its force is the multiplier
    # estimate the penalty continuation reads), and the report fails
    ev = Evaluation(np.array([0.0, 8e-3]), np.vstack([g0, gh]), 0, 0)
    far = kkt_report(np.array([0.8, 1.0]), ev, terms, feas_tol=1e-4)
    assert not far.passed(1e-4, 1e-4) and far.feasibility_rel[0] > 1e-4
    assert far.stationarity_rel > 1e-2 and far.multipliers[0] > 1e3
    # without feas_tol (no allowance) the step removes every violation: the point fails
    assert not kkt_report(w, Evaluation(np.array([0.0, 8e-5]), np.vstack([g0, gh]), 0, 0),
                          terms).passed(1e-4, 1e-4)


def test_the_fit_takes_the_near_active_set_when_the_full_fit_leans_on_an_inactive_constraint():
    """Issue 18: the regularised fit over all constraints gave a slightly inactive constraint
    (2e-3 from its bound) with a large, nearly parallel gradient part of the force, where the
    active one balances g exactly: complementarity 2e-3 at a KKT point (S2MPJ's EXPFITA: 22
    linear constraints in 5 variables, independent KKT residual 5e-12, not certified). The
    fit over the near-active set is also tried and the one with the smaller largest residual
    kept."""
    from ssca_solver.diagnostics.kkt import _best_fit, _fit_multipliers

    g = np.array([-1.0, 0.0])
    G = np.array([[1.0, 25.0], [0.0, 25e-3]])
    cons = np.array([0.0, -2e-3])
    eq = np.zeros(2, dtype=bool)
    col = np.linalg.norm(G, axis=0)

    def residuals(mu):
        return (float(np.linalg.norm(g + G @ mu)),
                float(np.max(np.minimum(mu * col, np.abs(cons)))))

    stat, comp = residuals(_fit_multipliers(g, G, cons, eq))
    assert comp > 1e-3                                    # what the full fit alone gave
    mu = _best_fit(g, G, cons, eq, 1.0, np.ones(2))
    stat, comp = residuals(mu)
    assert stat <= 1e-7 and comp == 0.0
    np.testing.assert_allclose(mu, [1.0, 0.0], atol=1e-7)


def test_the_linearised_kkt_step_is_solved_at_any_scale():
    """Issue 18: gradients of 1e6 (objective) and 5e4 (constraint) with bounds up to 1e4 left
    Clarabel "unbounded" at every attempt of the report's linearised KKT problem (S2MPJ's
    LAUNCH and HS84 lost their certificate to it); with each row divided by its gradient's
    norm and the objective by |g_0| it is solved, with the multipliers in the user's units."""
    d = 3
    lo, hi = np.array([0.0, 0.0, 1e-8]), np.array([1.0, 1e4, 1e4])
    det = DeterministicPart([], [lambda w: [w >= lo, w <= hi]], d)
    w = np.array([1.0, 3383.0, 437.8])
    g0 = np.array([-1e6, -1e4, 0.0])          # x1 pushed onto its bound, x2 against c
    G = np.array([[0.0], [5e4], [0.0]])       # c(x) = 5e4 (x2 - 3383) <= 0, active
    t = max(1.0, float(np.linalg.norm(w))) / float(np.linalg.norm(g0))
    u, mu, duals, elastic = det.linearized_step(w, g0, G, np.zeros(1), step=t)
    assert np.max(np.abs(u - w)) <= 1e-6 and elastic <= 1e-9
    np.testing.assert_allclose(mu, [0.2], rtol=1e-6)          # 1e4 / 5e4
    np.testing.assert_allclose(duals[1], [1e6, 0.0, 0.0], rtol=1e-6, atol=1e-3)


@pytest.mark.parametrize("far", [False, True])
def test_the_linearised_kkt_problem_compiled_once_agrees_with_a_fresh_build(far, monkeypatch):
    """Issue 19 (wall time): the report's linearised KKT problem is compiled once per
    structure with its data as CVXPY parameters (a fresh compile took 47 ms of a 2-variable
    problem's 60 ms). Every later test only refills the numbers: the same step, multipliers,
    domain duals and elastic sum as the problem built afresh with the data as constants (the
    form in u, and the form in the step v = u - w used far from the origin), on data that
    changes between calls, an equality among the constraints, a nonsmooth term (near) and a
    ball (far)."""
    d, M = 4, 3
    lo, hi = -2.0 * np.ones(d), np.array([1.0, 2.0, 3.0, 0.5])
    det = DeterministicPart([("l1", lambda w: 0.1 * cp.norm1(w))],
                            [lambda w: [w >= lo, w <= hi, cp.sum(w) <= 2.0]], d)
    eq = np.array([False, True, False])
    rng = np.random.default_rng(3)
    shift = 2e4 if far else 0.0          # |w| > RECENTRE_FIRST: the form in v goes first
    # far from the origin, a domain only (a term's parameter inside the form in the step is
    # not DPP: that form is built afresh, as before)
    det_far = DeterministicPart([], [lambda w: [w - shift >= lo, w - shift <= hi,
                                                cp.norm(w - shift) <= 3.0]], d)
    det = det_far if far else det
    fresh = []
    real = DeterministicPart._linearized_problem

    def fresh_only(self, recentred, eq_, data, cached):
        return None if cached else real(self, recentred, eq_, data, cached)

    for k in range(4):
        w = shift + np.clip(rng.standard_normal(d), lo, hi)
        g0 = rng.standard_normal(d) * (1.0 + k)
        G = rng.standard_normal((d, M))
        cons = rng.standard_normal(M) * 0.1
        got = det.linearized_step(w, g0, G, cons, equality=eq, step=0.7)
        monkeypatch.setattr(DeterministicPart, "_linearized_problem", fresh_only)
        want = det.linearized_step(w, g0, G, cons, equality=eq, step=0.7)
        monkeypatch.setattr(DeterministicPart, "_linearized_problem", real)
        fresh.append(want)
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-7 * max(1.0, shift))
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-7)
        for a, b in zip(got[2], want[2]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        assert abs(got[3] - want[3]) <= 1e-7
    # one parametrised problem, compiled at the first call and reused
    assert len(det._linearized) == 1 and all(det._linearized.values())
    assert max(det._linearized_uses.values()) == 4
    # and the steps differ between the calls: the parameters were refilled, not stale
    assert np.max(np.abs(fresh[0][0] - fresh[1][0])) > 1e-3


def test_the_deterministic_gradient_of_a_ridge_term_is_read_without_cvxpy():
    """lambda |w|^2 (with or without a domain) takes the gradient 2 lambda w; any other term
    CVXPY's; both against central differences of the terms' value."""
    from ssca_solver.model.deterministic import DeterministicPart

    rng = np.random.default_rng(3)
    cases = [(lambda w: 0.3 * cp.sum_squares(w), 0.3),
             (lambda w: 0.3 * cp.sum_squares(w) + cp.sum(w), None),
             (lambda w: cp.sum_squares(w - 1.0), None),
             (lambda w: 0.1 * cp.sum_squares(w) + 0.2 * cp.sum_squares(w), 0.3)]
    for term, lam in cases:
        for domain in ([], [lambda w: [w >= -5.0]]):
            det = DeterministicPart([("r", term)], domain, 6)
            expected = None if lam is None else pytest.approx(lam, rel=1e-12)
            assert det.ridge_coefficient() == expected
            w = rng.standard_normal(6)
            g = det.grad(w)
            fd = np.array([(det.value(w + 1e-6 * e) - det.value(w - 1e-6 * e)) / 2e-6
                           for e in np.eye(6)])
            np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_the_multiplier_fit_survives_nnls_running_out_of_iterations(monkeypatch):
    """SciPy's nnls raised "Maximum number of iterations reached" on a fit of 101 nearly
    active constraints in 3 variables, and the KKT report of two correct points failed: the
    fit now gives nnls more iterations and falls back to bounded-variable least squares."""
    from scipy.optimize import nnls

    from ssca_solver.diagnostics import kkt

    rng = np.random.default_rng(1)
    A, b = rng.standard_normal((40, 12)), rng.standard_normal(40)
    ref = nnls(A, b)[0]
    np.testing.assert_allclose(kkt.nonnegative_least_squares(A, b), ref, atol=1e-12)

    def runs_out(*args, **kwargs):
        raise RuntimeError("Maximum number of iterations reached.")

    monkeypatch.setattr(kkt, "nnls", runs_out)
    np.testing.assert_allclose(kkt.nonnegative_least_squares(A, b), ref, atol=1e-9)
    assert np.all(kkt.nonnegative_least_squares(A, b) >= 0.0)


def test_coordinates_of_1e4_cannot_hide_a_step_in_coordinates_of_10():
    """S2MPJ's HS114 mechanism: the linearised KKT step's length over max(1, |w|) is a relative
    change of w as a whole, which its largest coordinates set. Here -w_2 over the box
    0 <= w <= (2e4, 20) at w = (1e4, 19.99): the step moves w_2 to its bound, 0.01, which is
    1e-6 of |w| but 5e-4 of w_2; the objective is 0.01 above its minimum. The report refuses
    the point (the largest relative change of a coordinate, 5e-4) and passes it at the
    bound; with coordinates of one size the measure is the largest change over that size."""
    from ssca_solver.diagnostics.evaluation import Evaluation
    from ssca_solver.diagnostics.kkt import coordinate_step

    hi = np.array([2e4, 20.0])
    det = ss.Problem(lambda w: 0 * cp.sum_squares(w), dim=2, data=None,
                     domain=lambda w: [w >= 0, w <= hi]).deterministic
    terms = ProblemTerms(True, np.zeros(0), det)
    g = np.array([0.0, -1.0])

    def report(w):
        return kkt_report(np.asarray(w, float), Evaluation(np.array([-w[1]]), g[None, :], 0, 0),
                          terms)

    near = report([1e4, 19.99])
    assert near.stationarity / near.scale == pytest.approx(0.01 / np.hypot(1e4, 19.99), rel=1e-4)
    assert near.stationarity_rel == pytest.approx(0.01 / 19.99, rel=1e-4)
    assert not near.passed(1e-4, 1e-4)
    assert report([1e4, 20.0]).passed(1e-4, 1e-4)
    # at equal coordinates: the largest change over their size, never below the length
    # over |w| (equal to it for a step spread evenly, sqrt(d) times it along one coordinate)
    v, w = np.array([0.0, 0.01]), np.array([19.99, 19.99])
    assert coordinate_step(v, w) == pytest.approx(np.sqrt(2) * np.linalg.norm(v)
                                                  / np.linalg.norm(w))
    assert coordinate_step(np.full(2, 0.01), w) == pytest.approx(
        np.linalg.norm(np.full(2, 0.01)) / np.linalg.norm(w))
    # coordinates below 1 in size count as 1 (an absolute change there)
    assert coordinate_step(np.array([1e-5, 0.0]), np.array([1e-3, 5.0])) == pytest.approx(1e-5)


def _kkt_like_system(rng, n=60, m=80):
    """A KKT fit's system: [G; diag(d)] mu ~ [-g; 0] with a few constraints near active (small
    d) and the rest far from their bounds (large d)."""
    G = rng.standard_normal((n, m))
    d = np.where(rng.random(m) < 0.1, 1e-6, rng.uniform(0.5, 5.0, m))
    A = np.vstack([G, np.diag(d)])
    b = np.concatenate([-rng.standard_normal(n), np.zeros(m)])
    return A, b


def test_the_active_set_method_gives_nnls_answer_from_any_guess(monkeypatch):
    """nonnegative_least_squares's active-set iterations on a KKT fit's system: nnls's answer
    (rtol 1e-9) from the right support in one least-squares solve, and from wrong guesses (a
    column missing, one too many, none, no guess at all) in a few, with nnls not called; a
    fit with more columns than rows and no regularisation rows (force_multipliers' system),
    where a support can be rank deficient, still gives nnls's residual."""
    from scipy.optimize import nnls

    from ssca_solver.diagnostics import kkt

    rng = np.random.default_rng(3)
    calls, solves = [], []
    real, real_ls = kkt.nnls, kkt._least_squares_on
    monkeypatch.setattr(kkt, "nnls", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(kkt, "_least_squares_on",
                        lambda *a: solves.append(1) or real_ls(*a))
    for _ in range(5):
        A, b = _kkt_like_system(rng)
        ref = nnls(A, b, maxiter=50 * A.shape[1])[0]
        right = ref > 0.0
        assert 3 < right.sum() < A.shape[1] - 3
        del calls[:], solves[:]
        x = kkt.nonnegative_least_squares(A, b, right)
        assert calls == [] and solves == [1]
        np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-12)
        missing = right.copy()
        missing[np.flatnonzero(right)[0]] = False
        extra = right.copy()
        extra[np.flatnonzero(~right)[0]] = True
        for wrong in (missing, extra, np.zeros_like(right), None):
            del calls[:], solves[:]
            np.testing.assert_allclose(kkt.nonnegative_least_squares(A, b, wrong), ref,
                                       rtol=1e-9, atol=1e-12)
            assert calls == [] and 1 < len(solves) <= kkt.ACTIVE_SET_ITERATIONS
    wide = rng.standard_normal((20, 60))
    target = -rng.standard_normal(20)
    ref = nnls(wide, target, maxiter=50 * 60)[0]
    x = kkt.nonnegative_least_squares(wide, target)
    assert np.all(x >= 0.0)
    assert np.linalg.norm(wide @ x - target) == pytest.approx(
        np.linalg.norm(wide @ ref - target), rel=1e-9, abs=1e-12)


def test_a_cycling_active_set_hands_the_fit_to_nnls(monkeypatch):
    """Where the active-set iterations do not settle (here: allowed one support only, started
    from a wrong one), nnls gives the answer."""
    from scipy.optimize import nnls

    from ssca_solver.diagnostics import kkt

    rng = np.random.default_rng(5)
    A, b = _kkt_like_system(rng)
    ref = nnls(A, b, maxiter=50 * A.shape[1])[0]
    calls = []
    real = kkt.nnls
    monkeypatch.setattr(kkt, "nnls", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(kkt, "ACTIVE_SET_ITERATIONS", 1)
    x = kkt.nonnegative_least_squares(A, b, np.zeros(A.shape[1], dtype=bool))
    assert calls == [1]
    np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-12)


def test_the_fits_over_subsets_give_the_same_multipliers_with_the_guess(monkeypatch):
    """_best_fit guesses each later fit's support from the fit over all constraints: the
    multipliers it picks are those it picks with every fit left to nnls (inequalities and
    equalities, a few near active among many)."""
    from ssca_solver.diagnostics import kkt

    rng = np.random.default_rng(4)
    n, m = 50, 70
    for trial in range(4):
        G = rng.standard_normal((n, m))
        cons = np.where(rng.random(m) < 0.15, -rng.uniform(0, 1e-7, m), -rng.uniform(0.1, 2, m))
        eq = np.zeros(m, dtype=bool)
        if trial % 2:
            eq[:3] = True
            cons[:3] = 1e-9
        g = -G[:, :6] @ rng.uniform(0.5, 2.0, 6) + 1e-3 * rng.standard_normal(n)
        scale = max(1.0, float(np.linalg.norm(g)))
        bound_scale = np.ones(m)
        hits = []
        real = kkt._active_set

        def counted(*args):
            x = real(*args)
            if x is not None:
                hits.append(1)
            return x

        monkeypatch.setattr(kkt, "_active_set", counted)
        guessed = kkt._best_fit(g, G, cons, eq, scale, bound_scale)
        assert hits                        # the active-set method gave an answer
        monkeypatch.setattr(kkt, "_active_set", lambda *a: None)
        plain = kkt._best_fit(g, G, cons, eq, scale, bound_scale)
        monkeypatch.undo()
        np.testing.assert_allclose(guessed, plain, rtol=1e-8, atol=1e-12)


def _flat_valley(w):
    """1/2 (w - a)' H (w - a), H = diag(1e2, 1e2, 1e-3): gradient and Hessian."""
    H = np.diag([1e2, 1e2, 1e-3])
    a = np.array([0.5, -0.5, 1.0])
    return H @ (w - a), H


@pytest.mark.parametrize("boxed", [False, True])
def test_a_point_in_a_flat_valley_fails_with_the_models_hessian(boxed):
    """A point 0.3 from the minimiser along a direction of curvature 1e-3, where the gradient
    (3e-4) is within 1e-4 of the test's floor (the floor stands in for |g|: 1 % of a
    starting gradient of 1,000): without a Hessian the relative stationarity passes 1e-4, though the
    point is 15 % of |w| from the optimum; with the quasi-Newton model's matrix the test
    measures Newton's step (0.3 / max(1, |w|)) and fails. With a box domain (one coordinate at
    its upper bound, held by the step) the same, through the linearised step's branch. At the
    minimiser both pass."""
    lo, hi = np.full(3, -5.0), np.array([0.5, 5.0, 5.0])
    det = DeterministicPart([], [lambda w: [w >= lo, w <= hi]] if boxed else [], 3)
    terms = ProblemTerms(True, np.zeros(0), det)
    w = np.array([0.5, -0.5, 1.3])
    g, H = _flat_valley(w)
    ev = _evaluation(g, np.zeros((3, 0)), [0.0])
    floor = 10.0         # 1 % of a starting gradient of 1,000
    weak = kkt_report(w, ev, terms, floor=floor)
    assert weak.stationarity_rel <= 1e-4
    # a model of the Hessian (the quasi-Newton matrix) counts where the floor sets the scale,
    # as here; where the gradient itself does (no floor), it is not used
    strong = kkt_report(w, ev, terms, floor=floor, model_hessian=lambda: H)
    assert strong.stationarity_rel == pytest.approx(0.3 / np.linalg.norm(w), rel=1e-6)
    assert not strong.passed(1e-4, 1e-4)
    if not boxed:      # the Newton model's Hessian: the same step, floor or not
        exact = kkt_report(w, ev, terms, floor=floor, hessian=H)
        assert exact.stationarity_rel == pytest.approx(strong.stationarity_rel, rel=1e-12)
    no_floor = kkt_report(w, ev, terms, floor=1e-6, model_hessian=lambda: H)
    assert no_floor.stationarity_rel == pytest.approx(
        kkt_report(w, ev, terms, floor=1e-6).stationarity_rel, rel=1e-12)
    # nor with a constraint at its bound (there the floor also stands in where the
    # objective's gradient vanishes at a constrained solution)
    one = ProblemTerms(True, np.zeros(1), det)
    e1 = np.array([[1.0], [0.0], [0.0]])
    active = _evaluation(g, e1, [0.0, 0.0])
    assert kkt_report(w, active, one, floor=floor, model_hessian=lambda: H).stationarity_rel == \
        pytest.approx(kkt_report(w, active, one, floor=floor).stationarity_rel, rel=1e-12)
    inactive = _evaluation(g, e1, [0.0, -1.0])
    assert not kkt_report(w, inactive, one, floor=floor,
                          model_hessian=lambda: H).passed(1e-4, 1e-4)
    opt = np.array([0.5, -0.5, 1.0])
    g_opt, _ = _flat_valley(opt)
    at_opt = kkt_report(opt, _evaluation(g_opt, np.zeros((3, 0)), [0.0]), terms, floor=floor,
                        model_hessian=lambda: H)
    assert at_opt.passed(1e-4, 1e-4)


def test_newtons_step_holds_only_the_constraints_near_their_bound():
    """The flat valley's point 0.3 from the minimiser, with an inactive inequality (value -1,
    bound 0) whose gradient -e_3 opposes the objective's gradient along the flat direction:
    the fit gives it a small multiplier (about half of g_3 = 3e-4; its force passes the
    complementarity test). Held as active in Newton's step, it would take the flat direction
    out of the step, and the point would pass at a relative stationarity of 1e-5; Newton's
    step keeps only the constraints within MODEL_INACTIVE of their bound, so it measures the
    step along the flat direction, 0.15 (the residual 1.5e-4 over the curvature 1e-3), and the
    point fails. At the minimiser the same constraint changes nothing. At its bound the
    constraint is held (and the quasi-Newton model is not asked there: the gradient's test
    alone applies). Under the Newton model every constraint with a multiplier is still held
    (the comment above kkt._box_newton_step says why)."""
    det = DeterministicPart([], [], 3)
    one = ProblemTerms(True, np.zeros(1), det)
    w = np.array([0.5, -0.5, 1.3])
    g, H = _flat_valley(w)
    G = np.array([[0.0], [0.0], [-1.0]])
    floor = 10.0
    far = kkt_report(w, _evaluation(g, G, [0.0, -1.0]), one, floor=floor,
                     model_hessian=lambda: H)
    assert 0.0 < far.multipliers[0] < 3e-4
    assert far.stationarity / far.scale <= 1e-4 and far.complementarity_rel[0] <= 1e-4
    res = g + G[:, 0] * far.multipliers[0]
    assert far.stationarity_rel == pytest.approx(res[2] / 1e-3 / np.linalg.norm(w), rel=1e-6)
    assert not far.passed(1e-4, 1e-4)
    # the old rule (every constraint with a multiplier held) let the point pass
    from ssca_solver.diagnostics import kkt
    mu = far.multipliers
    assert kkt.newton_step(res, g, G, mu, np.array([False]), H, w) < 1e-4
    opt = np.array([0.5, -0.5, 1.0])
    g_opt, _ = _flat_valley(opt)
    assert kkt_report(opt, _evaluation(g_opt, G, [0.0, -1.0]), one, floor=floor,
                      model_hessian=lambda: H).passed(1e-4, 1e-4)
    # at its bound (value 0) the constraint is held, and the point is a KKT point: its
    # multiplier balances g_3, and Newton's step in the other directions is 0
    at_bound = kkt_report(w, _evaluation(g, G, [0.0, 0.0]), one, floor=floor,
                          model_hessian=lambda: H)
    assert at_bound.passed(1e-4, 1e-4)


def test_the_quasi_newton_model_is_the_kkt_tests_model_hessian():
    """With the quasi-Newton model on (a pair held), the KKT test gets its matrix B (d x d,
    B s = y for the newest pair) as its model of the Hessian; with the first-order surrogates,
    none."""
    from problems.classical import CLASSICAL, problem
    from ssca_solver.methods.ssca.algorithm import SSCA

    c = CLASSICAL["rosenbrock"]
    seen = []
    original = SSCA.kkt_model_hessian

    def spy(self, state):
        H = original(self, state)
        seen.append((H, state))
        return H

    SSCA.kkt_model_hessian = spy
    try:
        problem(c).solve(seed=0, x0=c.x0, max_iter=40, hessian="lbfgs")
        with_model = [(H, st) for H, st in seen if H is not None]
        assert with_model
        make, st = with_model[-1]
        H = make()                    # a function: the matrix is formed only where read
        assert H.shape == (2, 2) and np.allclose(H, H.T)
        np.testing.assert_allclose(H @ st.qn_s[-1], st.qn_y[-1], rtol=1e-8, atol=1e-10)
        seen.clear()
        problem(c).solve(seed=0, x0=c.x0, max_iter=5, hessian="none")
        assert seen and all(H is None for H, _ in seen)
    finally:
        SSCA.kkt_model_hessian = original


def test_the_active_set_method_runs_with_one_blas_thread(monkeypatch):
    """Its products (NumPy's BLAS) and factorisations (SciPy's) run inside one_blas_thread:
    both libraries' thread pools otherwise fight over the cores between the calls."""
    from ssca_solver import _blas
    from ssca_solver.diagnostics import kkt

    depths = []
    real = kkt._active_set_iterations
    monkeypatch.setattr(kkt, "_active_set_iterations",
                        lambda *a: depths.append(_blas._state["depth"]) or real(*a))
    A, b = _kkt_like_system(np.random.default_rng(6))
    kkt.nonnegative_least_squares(A, b)
    assert depths == [1] and _blas._state["depth"] == 0


@pytest.mark.parametrize("equalities", [0, 3])
def test_the_fits_normal_equations_from_the_shared_gram_are_their_own(monkeypatch, equalities):
    """_best_fit forms G'G and G'g once; each fit's normal equations built from their rows
    and columns (plus its diagonal rows, and the mu- columns of the equalities) equal A'A and
    A'b of the fit's own system (1e-14), and the fit over all constraints gives the
    multipliers it gives without them."""
    from ssca_solver.diagnostics import kkt

    rng = np.random.default_rng(8 + equalities)
    n, M = 40, 50
    G, g = rng.standard_normal((n, M)), rng.standard_normal(n)
    cons = np.where(rng.random(M) < 0.3, 0.0, -rng.uniform(0.0, 1.0, M))
    eq = np.zeros(M, dtype=bool)
    eq[:equalities] = True
    seen = []
    real = kkt.nonnegative_least_squares
    monkeypatch.setattr(kkt, "nonnegative_least_squares",
                        lambda A, b, support=None, normal=None:
                        seen.append((A, b, normal)) or real(A, b, support, normal))
    shared = kkt._fit_multipliers(g, G, cons, eq, gram=(G.T @ G, G.T @ g))
    own = kkt._fit_multipliers(g, G, cons, eq)
    A, b, (H, q) = seen[0]
    A, b = A.dense(b)
    assert seen[1][2] is None
    scale = float(np.max(np.abs(A.T @ A)))
    np.testing.assert_allclose(H.dense(), A.T @ A, rtol=0, atol=1e-14 * scale)
    np.testing.assert_allclose(q, A.T @ b, rtol=0, atol=1e-14 * scale)
    np.testing.assert_allclose(shared, own, rtol=1e-9, atol=1e-12)
    assert np.any(shared != 0.0)
    del seen[:]
    kkt._best_fit(g, G, cons, eq, 1.0, np.ones(M))
    assert seen and all(normal is not None for _, _, normal in seen)


@pytest.mark.parametrize("M", [12, 60])
def test_a_fit_with_its_diagonal_rows_kept_as_a_diagonal_is_the_dense_fit(M):
    """DiagonalRows [G; diag(D)] (the KKT fit's matrix, its diagonal block kept as a vector):
    its residual and transposed products equal the dense matrix's (1e-14), the least-squares
    problem on a set of columns is the dense one's, and nonnegative_least_squares gives the
    dense system's answer through the active-set method (M >= SUPPORT_MIN_COLUMNS) and through
    nnls (below it), both checked against nnls on the dense matrix."""
    from scipy.optimize import nnls

    from ssca_solver.diagnostics import kkt

    rng = np.random.default_rng(M)
    n = 40
    G, r = rng.standard_normal((n, M)), -rng.standard_normal(n)
    D = np.where(rng.random(M) < 0.3, 1e-6, rng.uniform(0.5, 3.0, M))
    A = kkt.DiagonalRows(G, D)
    dense, b = A.dense(r)
    assert A.shape == dense.shape == (n + M, M)
    x = rng.standard_normal(M)
    res = A.residual(r, x)
    np.testing.assert_allclose(np.concatenate(res), b - dense @ x, rtol=0, atol=1e-14 * n)
    np.testing.assert_allclose(A.transposed(res), dense.T @ (b - dense @ x), rtol=1e-13,
                               atol=1e-13)
    idx = np.flatnonzero(rng.random(M) < 0.5)
    H, q = kkt.GramBlocks(dense.T @ dense), dense.T @ b
    z = kkt._least_squares_on(A, r, H, q, idx, np.full(idx.size, 1e-8))
    np.testing.assert_allclose(z, np.linalg.lstsq(dense[:, idx], b, rcond=None)[0],
                               rtol=1e-9, atol=1e-12)
    ref = nnls(dense, b, maxiter=50 * M)[0]
    got = kkt.nonnegative_least_squares(A, r)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(kkt.nonnegative_least_squares(dense, b), ref, rtol=1e-9,
                               atol=1e-12)


def test_a_fit_over_many_constraints_in_few_variables_is_solved_in_the_rows_space(monkeypatch):
    """A KKT fit's system with 300 columns over 9 rows (a problem with n = 9 and m = 300:
    gradients above the diagonal block of complementarity and regularisation rows, a few
    columns stiff: an active constraint's row near 0): the supports go to the n x n
    solve (kkt._by_rows), and the answer is SciPy nnls's on the dense system (rtol 1e-9); a
    support's least-squares solution is NumPy lstsq's."""
    from scipy.optimize import nnls

    from ssca_solver.diagnostics import kkt

    rng = np.random.default_rng(5)
    used = []
    real = kkt._by_rows
    monkeypatch.setattr(kkt, "_by_rows", lambda *a: used.append(1) or real(*a))
    for stiff in (0, 4):
        G = rng.standard_normal((9, 300))
        D = np.hypot(rng.uniform(0.0, 2.0, 300), 1e-4 * np.linalg.norm(G, axis=0))
        D[:stiff] = 1e-13
        b = rng.standard_normal(9)
        A = kkt.DiagonalRows(G, D)
        Ad, bd = A.dense(b)
        ref = nnls(Ad, bd, maxiter=50 * 300)[0]
        del used[:]
        x = kkt.nonnegative_least_squares(A, b)
        assert used, "the row-space solve was not tried"
        np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-12)
        idx = np.arange(0, 300, 2)
        z = real(A, b, idx)
        AS, bS = A.columns(idx).dense(b)
        np.testing.assert_allclose(z, np.linalg.lstsq(AS, bS, rcond=None)[0], rtol=1e-9,
                                   atol=1e-12)


def test_the_fits_gram_blocks_are_the_whole_matrix_entries():
    """A KKT report's fits read G'G + diag(D^2) over a subset of the columns by blocks
    (kkt.GramBlocks) instead of copying the whole matrix for each fit: every block, the
    diagonal and the whole matrix hold exactly the entries of the matrix formed whole."""
    from ssca_solver.diagnostics.kkt import GramBlocks

    rng = np.random.default_rng(7)
    G = rng.standard_normal((9, 60))
    GG = G.T @ G
    keep = np.flatnonzero(rng.random(60) < 0.6)
    D2 = rng.random(keep.size)
    H = GG[np.ix_(keep, keep)].copy()
    H[np.diag_indices(keep.size)] += D2
    lazy = GramBlocks(GG).columns(keep).plus_diagonal(D2)
    np.testing.assert_array_equal(lazy.diagonal(), np.diag(H))
    idx = np.sort(rng.choice(keep.size, 12, replace=False))
    np.testing.assert_array_equal(lazy.block(idx), H[np.ix_(idx, idx)])
    np.testing.assert_array_equal(lazy.dense(), H)
    np.testing.assert_array_equal(GG, G.T @ G)            # the shared matrix is untouched


def _screen_case(rng, tol_exponent):
    """A random point (n coordinates, M constraints, some equalities) near a KKT point: g
    balanced by the near-active constraints' gradients up to a perturbation of random size,
    the others inactive (below their bounds) or within ``10**tol_exponent`` of them; in half
    the cases the inactive ones carry forces of that size too."""
    from ssca_solver.diagnostics.evaluation import Evaluation

    n, M = int(rng.integers(2, 9)), int(rng.integers(1, 31))
    G = rng.standard_normal((n, M)) * np.exp(rng.uniform(-2, 2, M))
    eq = rng.random(M) < 0.2
    bounds = rng.choice([0.0, 1.0, -3.0, 20.0], M)
    kind = rng.integers(0, 3, M)          # 0: active, 1: within the tolerance, 2: inactive
    cons = np.where(kind == 0, 0.0, np.where(
        kind == 1, -rng.uniform(0, 10.0 ** tol_exponent, M) * np.maximum(1.0, np.abs(bounds)),
        -rng.uniform(1e-3, 1.0, M)))
    cons[eq] = 0.0
    active = (kind < 2) | eq
    mu = np.where(active, rng.uniform(0, 2, M), 0.0) * (rng.random(M) < 0.8)
    mu[eq] = rng.standard_normal(int(eq.sum()))
    if rng.random() < 0.5:
        # the inactive ones with forces within the tolerance: complementarity lets a fit
        # use them, and the screen's bound must allow for them
        col = np.linalg.norm(G, axis=0)
        mu = np.where(active, mu, 10.0 ** tol_exponent * rng.uniform(0, 1, M) / col)
    g0 = -G @ mu + 10.0 ** rng.uniform(-10, 0) * rng.standard_normal(n)
    values = np.concatenate([[0.0], cons + bounds])
    ev = Evaluation(values, np.vstack([g0, G.T]), 0, 0)
    det = ss.Problem(lambda w: 0 * cp.sum_squares(w), dim=n, data=None).deterministic
    terms = ProblemTerms(True, bounds, det, equality=eq if eq.any() else None)
    return rng.standard_normal(n), ev, terms


def test_the_stationarity_screen_never_refuses_a_report_that_passes():
    """:func:`stationarity_exceeds` lets the stop test skip the multiplier fit where no
    multipliers can pass: on 400 random points near KKT points (equalities, active, nearly
    active and inactive inequalities), at every tolerance at which the report itself passes
    (stationarity and every complementarity within it) the screen says it may pass; and the
    screen is no stand-in that never skips: it refuses most of the points at tolerances a
    hundred times below the report's."""
    from ssca_solver.diagnostics.kkt import stationarity_exceeds

    rng = np.random.default_rng(7)
    refused = tried = 0
    for _ in range(400):
        w, ev, terms = _screen_case(rng, rng.uniform(-9, -3))
        floor = float(10.0 ** rng.uniform(-12, 0))
        rep = kkt_report(w, ev, terms, floor=floor)
        assert not rep.failed
        needed = max(rep.stationarity_rel, float(np.max(rep.complementarity_rel, initial=0)))
        for factor in (1.0, 1.5, 10.0, 1e3):
            tol = needed * factor
            assert rep.stationarity_rel <= tol and np.all(rep.complementarity_rel <= tol)
            assert not stationarity_exceeds(w, ev, terms, tol, floor), (tol, needed)
        if needed > 1e-12:
            tried += 1
            refused += stationarity_exceeds(w, ev, terms, needed / 100.0, floor)
    assert tried > 100 and refused > 0.5 * tried, (refused, tried)
