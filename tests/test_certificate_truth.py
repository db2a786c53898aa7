"""Cases from the public S2MPJ collection (benchmarks/nlp_collection.py) that fooled the KKT
test or lost a run, rebuilt here from their published formulas or as the smallest program
with the same mechanism (issue 18): a stationarity floor a far start or a curved valley
inflates, a linearised step measured in the units of w over a gradient scale, a diagonal
metric that pins rejected trial steps, a start outside the domain, difference steps that
leave a function's domain, a gradient check across a kink."""

import warnings

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.diagnostics.evaluation import Evaluation, ProblemTerms
from ssca_solver.diagnostics.kkt import START_FLOOR, VALUE_FLOOR, StationarityFloor, kkt_report
from ssca_solver.model.deterministic import DeterministicPart

ONE_ROW = ss.FederatedData([np.zeros((1, 1))])


def fn(value, grad, name):
    """A SampleFunction of w only, on the one dummy row."""
    return ss.SampleFunction(lambda w, X, y: np.full(X.shape[0], value(w)),
                             lambda w, X, y: np.asarray(grad(w), dtype=float), name=name)


# -- the stationarity floor -----------------------------------------------------------------------

def test_the_floor_is_the_smallest_of_its_candidates():
    """Start gradient 3.3e7 (LUKVLE4's): 1 % of it is 3.3e5, far above |g| = 78 at the
    tested points. The secant between the last two tested points (curvature 98) and the
    objective's size each bring the floor down; the floor is their minimum."""
    fl = StationarityFloor()
    w0 = np.array([5.0, 0.0])
    fl.start(w0, np.array([3.3e7, 0.0]), 5.8e6)
    assert fl.grad_scale == pytest.approx(3.3e7)
    w1, g1 = np.array([3.0, 0.0]), np.array([78.0, 0.0])
    first = fl.at(w1, g1, 20.0)
    L_start = (3.3e7 - 78.0) / 2.0                   # |(g1 - g0).d| / |d|^2
    value = max(20.0, VALUE_FLOOR * (5.8e6 - 20.0)) / 3.0
    assert first == pytest.approx(min(START_FLOOR * 3.3e7, L_start * 3.0, value))
    w2, g2 = np.array([2.9, 0.0]), np.array([68.2, 0.0])
    second = fl.at(w2, g2, 19.0)
    L_local = (78.0 - 68.2) / 0.1
    assert fl.local_curvature == pytest.approx(L_local)
    assert second == pytest.approx(min(START_FLOOR * 3.3e7, L_start * 2.9, L_local * 2.9,
                                       max(19.0, VALUE_FLOOR * (5.8e6 - 19.0)) / 2.9))
    # the same point again: no secant, the last local curvature stays
    assert fl.at(w2, g2, 19.0) == pytest.approx(second)
    # kept in checkpoints
    again = StationarityFloor.from_meta(fl.meta())
    assert again.meta() == fl.meta()


def test_a_point_in_a_curved_valley_is_not_certified_by_a_start_floor():
    """The relative gradient |g| max(1,|w|) / |f| of Dennis and Schnabel: at f = 1.42,
    |w| = 11.5, |g| = 3e-3 (S2MPJ's SINROSNB, whose optimum is 0) the point is not
    stationary, although |g| is 6e-7 of the start gradient and the secant curvature across
    the valley is 4e3."""
    fl = StationarityFloor()
    fl.start(np.full(4, 15.0), np.full(4, 2426.0), 1351.0)
    w = np.full(4, 5.75)
    floor = fl.at(w, np.full(4, 1.5e-3), 1.42)
    g = np.full(4, 1.5e-3)
    assert np.linalg.norm(g) / max(np.linalg.norm(g), floor) > 1e-4     # fails kkt_tol
    assert START_FLOOR * fl.grad_scale > 1e4 * np.linalg.norm(g)        # the old floor passed


def test_a_start_where_the_objective_is_flat_leaves_the_local_secant_alone():
    """A start gradient of exactly 0 (the objective at its minimum, only the constraints
    move the iterates): 1 % of it, the secant from it and the objective's size (0 at both
    ends) measure nothing, and a floor of 0 made any rounding-level |g| fail at a ratio near
    1. The floor is the local secant candidate, 0 until two points are tested."""
    fl = StationarityFloor()
    fl.start(np.zeros(2), np.zeros(2), 0.0)
    assert fl.at(np.array([0.5, 0.5]), np.array([1e-16, -1e-16]), 0.0) == 0.0
    floor = fl.at(np.array([0.5, 0.5 + 1e-3]), np.array([-2e-3, 2e-3]), 1e-6)
    L_local = 2e-3 * 1e-3 / 1e-6                     # |(g2 - g1).d| / |d|^2
    assert fl.local_curvature == pytest.approx(L_local)
    assert floor == pytest.approx(L_local * 1.0)     # max(1, |w|) = 1
    # a nonzero start gradient keeps every candidate (the minimum)
    fl2 = StationarityFloor()
    fl2.start(np.zeros(2), np.array([1e-3, 0.0]), 0.0)
    assert fl2.at(np.array([0.5, 0.5]), np.array([1e-16, -1e-16]), 0.0) == 0.0


def test_a_zero_residual_objective_that_starts_at_zero_is_certified():
    """min (w1 - 3 w2)^2 s.t. w1 + w2 = 1 from (0, 0) (the mechanism of S2MPJ's TAME): the
    start is a minimum of the objective, the solution (3/4, 1/4) another, where |g| is the
    rounding of w1 - 3 w2 (2e-12 here; some other coefficients give exactly 0). The run
    ended 'max_iter ... the penalised problem is solved' at a relative stationarity near 1."""
    f = fn(lambda w: (w[0] - 3 * w[1]) ** 2,
           lambda w: 2 * (w[0] - 3 * w[1]) * np.array([1.0, -3.0]), "f")
    h = fn(lambda w: w[0] + w[1], lambda w: np.ones(2), "h")
    res = ss.Problem(f, [h == 1.0], dim=2, data=ONE_ROW).solve(x0=np.zeros(2), seed=0,
                                                             batch_size="full")
    assert res.status == "converged", res.message
    assert res.kkt.scale > 0.0 and res.kkt.stationarity <= 1e-4 * res.kkt.scale
    # what the certificate implies, checked independently: on the line w1 + w2 = 1 the
    # objective's curvature is 16, so |x - x*| = |grad f projected on the line| / 16, and
    # the test's stationarity is that projection (the multiplier takes the rest)
    x = res.x
    along = abs(2.0 * (x[0] - 3.0 * x[1]) * 4.0) / np.sqrt(2.0)
    assert abs(x[0] + x[1] - 1.0) <= 1e-12
    assert res.kkt.stationarity == pytest.approx(along, rel=1e-6, abs=1e-15)
    assert np.linalg.norm(x - [0.75, 0.25]) == pytest.approx(along / 16.0, rel=1e-6, abs=1e-15)
    assert np.linalg.norm(x - [0.75, 0.25]) <= 1e-4 * res.kkt.scale / 16.0


def test_the_linearised_step_is_measured_in_gradient_units():
    """min -5800 w over w <= 1 at w = 0.43: 0.57 from the bound its gradient pushes it to.
    With a unit step the residual |u - w| = 0.57 was divided by |g| = 5800 (9.8e-5: passed,
    S2MPJ's QC 15 % above its optimum); now the step has length max(1, |w|) / scale and the
    ratio is |u - w| / max(1, |w|)."""
    det = DeterministicPart((), (lambda w: [w <= 1.0],), 1)
    terms = ProblemTerms(True, np.zeros(0), det)
    w = np.array([0.43])
    ev = Evaluation(np.array([-5800 * 0.43]), np.array([[-5800.0]]), 0, 0, True)
    rep = kkt_report(w, ev, terms)
    assert rep.stationarity_kind == "linearized step"
    assert rep.stationarity_rel == pytest.approx(0.57, rel=1e-4)
    at_bound = kkt_report(np.array([1.0]), Evaluation(np.array([-5800.0]),
                                                      np.array([[-5800.0]]), 0, 0, True), terms)
    assert at_bound.stationarity_rel < 1e-6


# -- runs that ended wrongly or raised ------------------------------------------------------------

def test_maratos_with_a_linear_objective_converges():
    """S2MPJ's MARATOS: min -x1 + 1e-6 (|x|^2 - 1) s.t. |x|^2 = 1 from (1.1, 0.1). The
    diagonal metric from squared gradients gave x2 a proximal weight of 4e-14, the linearised
    equality pinned every trial step near (0, -1.1) however large tau became, and the run
    stopped with 'max_iter ... the penalised problem is solved' at violation 1.2."""
    a = 1e-6
    f = fn(lambda w: -w[0] + a * (w @ w - 1), lambda w: np.array([-1 + 2 * a * w[0],
                                                                   2 * a * w[1]]), "f")
    h = fn(lambda w: w @ w - 1, lambda w: 2 * w, "h")
    prob = ss.Problem(f, [h == 0.0], dim=2, data=ONE_ROW)
    res = prob.solve(x0=np.array([1.1, 0.1]), seed=0, batch_size="full", hessian="lbfgs")
    assert res.status == "converged", res.message
    # the certificate bounds the distance: the Lagrangian's Hessian along the circle is
    # 2 (a + mu) = 1 at the solution (mu = 0.5), so |x - x*| is about the stationarity residual
    # the report states (absolute; the quasi-Newton run stops at 4.6e-5 where the first-order
    # one went on to 1e-6 between two tests ten rounds apart)
    assert np.linalg.norm(res.x - [1.0, 0.0]) <= 2.0 * res.kkt.stationarity + 1e-9
    assert res.kkt.stationarity <= 1e-4
    # the default options difference the gradients: the Newton model's test also asks
    # Newton's step to the KKT point, the distance to second order, within kkt_tol (1e-4)
    newton = prob.solve(x0=np.array([1.1, 0.1]), seed=0, batch_size="full")
    assert newton.status == "converged", newton.message
    assert np.linalg.norm(newton.x - [1.0, 0.0]) <= 1e-4


def test_a_start_outside_the_domain_starts_from_its_projection():
    """min -log(w1) - log(w2) + |w|^2 over w >= 1e-3, from (-1, 2): log is not defined at
    x0 (the gradient check raised 'non-finite value'); the run starts from the projection
    (1e-3, 2), warns, and finds w = (1/sqrt 2, 1/sqrt 2)."""
    f = fn(lambda w: -np.sum(np.log(w)) + w @ w, lambda w: -1.0 / w + 2 * w, "f")
    prob = ss.Problem(f, dim=2, data=ONE_ROW, domain=lambda w: [w >= 1e-3])
    with pytest.warns(RuntimeWarning, match="outside the domain"):
        res = prob.solve(x0=np.array([-1.0, 2.0]), seed=0, batch_size="full")
    assert res.status == "converged", res.message
    # what the certificate states: f is 2-strongly convex (its Hessian is diag(1/w^2 + 2)) and
    # the point interior, so |x - x*| <= |grad f| / 2, the stationarity the report states
    # (measured: 1.8e-5 from x*, stationarity 7.3e-5)
    assert np.linalg.norm(res.x - np.sqrt(0.5)) <= res.kkt.stationarity / 2 + 1e-12
    assert res.kkt.stationarity <= 1e-4


#: S2MPJ's TENBARS1 box: x0 = 0 and x_i >= 0.645 on the last ten of 18 variables, x_i >= -50.8
#: on four others. Clarabel fails the projection at the tight tolerances and solves it at its
#: defaults, but only in a fresh solve: CVXPY's warm start re-solved with the first attempt's
#: settings, so the fallback failed too and the run started outside the domain (its steps
#: into the domain were then rejected at every tau up to 7e7)
TENBARS_LOWER = np.array([-np.inf, -50.8] * 4 + [0.645] * 10)


def _tenbars_box(w):
    lo = np.flatnonzero(np.isfinite(TENBARS_LOWER))
    return [w[lo] >= TENBARS_LOWER[lo]]


def test_the_projection_falls_back_to_a_fresh_solve_at_the_defaults():
    det = DeterministicPart((), (_tenbars_box,), 18)
    x = det.project(np.zeros(18))
    expected = np.maximum(0.0, TENBARS_LOWER)
    np.testing.assert_allclose(x, expected, atol=1e-7)


def test_a_failed_projection_of_the_start_point_is_said(monkeypatch):
    """When the start point's projection onto the domain fails (simulated), the run starts
    from x0 outside the domain: a warning says so instead of nothing."""
    def fail(self, w, solver="CLARABEL"):
        raise ss.ModelError("the start point is outside the domain and its projection onto "
                            "the domain failed (simulated)")

    monkeypatch.setattr(DeterministicPart, "project", fail)
    f = fn(lambda w: w @ w, lambda w: 2 * w, "f")
    prob = ss.Problem(f, dim=2, data=ONE_ROW, domain=lambda w: [w >= 1.0])
    with pytest.warns(RuntimeWarning, match="projection onto the domain failed"):
        res = prob.solve(x0=np.zeros(2), seed=0, batch_size="full", max_iter=30)
    assert res.nit > 0


def test_the_kkt_step_falls_back_to_a_fresh_solve_at_the_defaults(monkeypatch):
    """The linearised KKT step's attempts (tight tolerances, then Clarabel's defaults) solve
    the same CVXPY problem twice: the second must be a fresh solve, since CVXPY's warm start
    would hand the data to the solver made with the first attempt's settings (S2MPJ's
    TRUSPYR2 lost its certificate at 714 rounds so: 'solver_error' on every attempt at a
    point whose independent KKT residual was 7e-12; with fresh solves it is certified). The
    tight attempt's failure is simulated (Clarabel refuses tolerances below 1e-10 here)."""
    import cvxpy.reductions.solvers.conic_solvers.clarabel_conif as conif
    real = conif.CLARABEL.solve_via_data
    calls = []

    def picky(self, data, warm_start, verbose, solver_opts, solver_cache=None):
        tight = min(solver_opts.get(k, 1.0) for k in ("tol_feas", "tol_gap_abs")) < 1e-10
        calls.append((tight, warm_start))
        out = real(self, data, warm_start, verbose, solver_opts, solver_cache)
        if tight:
            raise cp.error.SolverError("simulated failure at tight tolerances")
        return out

    monkeypatch.setattr(conif.CLARABEL, "solve_via_data", picky)
    det = DeterministicPart((), (lambda w: [w >= 0.0],), 2)
    # the CVXPY forms (a box goes to Clarabel directly first: they are its fallback)
    monkeypatch.setattr(det, "box_terms", lambda: None)
    # min (u1 - 1)^2 + u2^2 over u >= 0 linearised at w = (0.5, 0): the step to (1, 0)
    w = np.array([0.5, 0.0])
    u, mu, duals, elastic = det.linearized_step(w, np.array([-1.0, 0.0]), np.zeros((2, 0)),
                                                np.zeros(0), step=0.5)
    assert calls[0] == (True, False) and calls[1][0] is False
    assert calls[1][1] is False, "the fallback to the defaults reused the tight solver"
    # (Clarabel's defaults leave ~1e-4 in u: the answer is the defaults', not the tight one's)
    np.testing.assert_allclose(u, [1.0, 0.0], atol=1e-3)


def test_difference_steps_that_leave_the_domain_are_shortened():
    """At w1 = 1e-12 on the bound w1 >= 1e-12 of log w1 (S2MPJ's LIN), the probe's step of
    1e-6 leaves log's domain (NaN: 'f.value returned a non-finite value ... gradient check');
    the step is shortened until both sides are finite, and the correct gradient passes."""
    f = fn(lambda w: np.sum(w * np.log(w)), lambda w: np.log(w) + 1.0, "entropy")
    prob = ss.Problem(f, dim=2, data=ONE_ROW, domain=lambda w: [w >= 1e-12])
    res = prob.solve(x0=np.array([1e-12, 0.5]), seed=0, batch_size="full", max_iter=50)
    assert res.status in ("converged", "max_iter")
    assert res.nit > 0


def test_a_wrong_gradient_near_the_domain_edge_is_still_caught():
    f = fn(lambda w: np.sum(w * np.log(w)), lambda w: 2.0 * np.log(w) + 1.0, "entropy")
    prob = ss.Problem(f, dim=2, data=ONE_ROW, domain=lambda w: [w >= 1e-12])
    with pytest.raises(ss.UserFunctionError, match="does not match"):
        prob.solve(x0=np.array([1e-7, 0.5]), seed=0, batch_size="full", max_iter=5)


def test_a_gradient_check_across_a_kink_warns_and_runs():
    """f = 5 max(w1, 0) + w1 + (w2 - 1)^2 at w1 = 0: the central difference along the
    gradient averages both sides of the kink and disagrees with the (right-sided) gradient;
    1e-3 away it agrees, so the function has a kink at x0 and the run goes on (S2MPJ's
    HELIXNE and S365 raised)."""
    f = fn(lambda w: 5 * max(w[0], 0.0) + w[0] + (w[1] - 1) ** 2,
           lambda w: np.array([6.0 if w[0] >= 0 else 1.0, 2 * (w[1] - 1)]), "kinked")
    c = fn(lambda w: -w[0], lambda w: np.array([-1.0, 0.0]), "c")
    prob = ss.Problem(f, [c <= 1.0], dim=2, data=ONE_ROW)
    with pytest.warns(RuntimeWarning, match="kink or a jump"):
        res = prob.solve(x0=np.array([0.0, 0.0]), seed=0, batch_size="full", max_iter=100)
    assert res.nit > 0


def test_a_gradient_wrong_everywhere_still_raises_after_the_second_point():
    f = fn(lambda w: 5 * max(w[0], 0.0) + w[0] + (w[1] - 1) ** 2,
           lambda w: np.array([3.0, 2 * (w[1] - 1)]), "wrong")
    prob = ss.Problem(f, dim=2, data=ONE_ROW)
    with pytest.raises(ss.UserFunctionError, match="does not match"):
        prob.solve(x0=np.array([0.5, 0.0]), seed=0, batch_size="full", max_iter=5)


def test_iterates_that_stop_moving_at_an_unsatisfiable_point_say_so():
    """|x|^2 + 1 <= 0.5 from x = 0 with F_0 = 0: the linearised constraint cannot be met, the
    step is zero from round 1, and every stage settles after a few rounds, too few for four
    evaluations. That ended 'max_iter: the penalised problem is solved' (S2MPJ's EIGENB);
    the settled iterates are the stalled violation the 'infeasible' rule asks for, with its
    other evidence (a minimiser of the violation, not a saddle). The constraint declared
    convex: "infeasible"; undeclared, the same point is only a local minimum of the violation
    as far as the library knows: "max_iter", saying so."""
    zero = fn(lambda w: 0.0, lambda w: np.zeros(2), "0")
    for convexity in ("convex", None):
        c = ss.SampleFunction(lambda w, X, y: np.full(X.shape[0], w @ w + 1.0),
                              lambda w, X, y: 2 * w, name="c", convexity=convexity)
        res = ss.Problem(zero, [c <= 0.5], dim=2, data=ONE_ROW).solve(
            x0=np.zeros(2), seed=0, batch_size="full")
        assert "stopped moving" in res.message and "penalised problem is solved" not in res.message
        assert res.nit < 100
        if convexity:
            assert res.status == "infeasible", res.message
            assert "declared convex, so they cannot be met at all" in res.message
        else:
            assert res.status == "max_iter", res.message
            assert "local minimum of the violation" in res.message
            assert "not declared convex" in res.message and "another x0" in res.message


def test_the_second_order_correction_pulls_a_trial_point_back_to_a_curved_constraint():
    """SSCA._second_order_correction (the rejected step's retry when doubling tau does not
    shorten the trial steps: S2MPJ's ALLINITC lost its run at tau 2e13): from the feasible
    base (1, 0) of |w|^2 = 1 a trial step (0, -0.5) along the tangent leaves the circle by
    0.25 where the linearisation said 0. Shifted by that model error, the linearised
    constraint asks 2 (w1 - 1) + 0.25 = 0, and the corrected trial point violates by 0.016
    (an SQP second-order correction), with the base point and statistics kept for further
    backtracking."""
    from ssca_solver.methods.ssca import SSCA, acceptance
    from ssca_solver.methods.ssca.state import SSCAState

    f = fn(lambda w: w[1], lambda w: np.array([0.0, 1.0]), "f")
    h = fn(lambda w: w @ w - 1.0, lambda w: 2 * w, "h")
    prob = ss.Problem(f, [h == 0.0], dim=2, data=ONE_ROW)
    options = {"seed": 0, "batch_size": "full"}
    opts = SSCA.parse(prob, options)
    method = SSCA.build(prob, opts, options)
    X, y = np.zeros((1, 1)), None
    tau = 1.0

    def stats_at(w):
        return tuple(b.statistics(g, w, X, y, tau if b.tau is None else b.tau, "test")
                     for b, g in zip(method.builders, prob.functions))

    base_w, trial = np.array([1.0, 0.0]), np.array([1.0, -0.5])
    state = SSCAState(t=1, w=trial, stats=stats_at(trial), penalty=100.0, tau=tau,
                      prev_w=base_w, prev_stats=stats_at(base_w), merit=0.0)
    new, info = acceptance.second_order_correction(method.config, state, stats_at(trial))
    violation = abs(new.w @ new.w - 1.0)
    assert violation < 0.02 < 0.25                      # the plain trial's 0.25
    assert new.w[0] == pytest.approx(0.875, abs=1e-6)   # on the shifted linearisation
    np.testing.assert_array_equal(new.prev_w, base_w)
    assert new.prev_stats is state.prev_stats and new.rejects == 1
    # a trial whose violation did not grow is not corrected
    same = state._replace(w=np.array([0.99, 0.0]), stats=stats_at(np.array([0.99, 0.0])))
    assert acceptance.second_order_correction(method.config, same, same.stats) is None
    # at_most: the correction above moves the trial point by 0.125, a quarter of its step
    assert acceptance.second_order_correction(method.config, state, stats_at(trial),
                                              at_most=1.0) is not None
    # a tangent step six times as long leaves the circle by 9: the shifted linearisation
    # 2 (w1 - 1) + 9 = 0 moves the trial point by 4.5 > 3, no second-order term: refused
    # with at_most=1 (the Maratos path; the backtracking then raises tau), taken without it
    far = np.array([1.0, -3.0])
    long = state._replace(w=far, stats=stats_at(far))
    moved = acceptance.second_order_correction(method.config, long, long.stats)
    assert np.linalg.norm(moved[0].w - far) > 3.0
    assert acceptance.second_order_correction(method.config, long, long.stats,
                                              at_most=1.0) is None


def test_eight_rejections_of_long_trial_steps_do_not_settle_the_point():
    """Logistic regression on iris (5 clients) with the nonconvex equality |w|^2 = 4: the
    quasi-Newton steps along the linearised sphere were rejected 8 times in a row while the
    trial steps were still 0.6 of |w| long (every other rejection a second-order correction
    at the same tau, so tau grew only 16-fold), and the run ended 'max_iter' at objective
    0.99 where SLSQP on the pooled rows finds 0.245. Rejections settle the point only once
    the trial steps are short (or after 24)."""
    from scipy.optimize import minimize
    from sklearn.datasets import load_iris

    X, t = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    X = np.hstack([X, np.ones((len(X), 1))])
    y = (t == 2).astype(float)
    d = X.shape[1]

    def lv(w, X, y):
        return np.logaddexp(0, -(2 * y - 1) * (X @ w))

    def lg(w, X, y):
        s = 2 * y - 1
        return X.T @ (-s / (1 + np.exp(s * (X @ w)))) / len(X)

    loss = ss.SampleFunction(lv, lg, name="loss")
    norm = ss.SampleFunction(lambda w, X, y: np.full(len(X), w @ w), lambda w, X, y: 2 * w,
                             name="|w|^2")
    data = ss.FederatedData.split(X, y, num_clients=5, seed=1)
    # the quasi-Newton model's path ("auto" differences the gradients here: checked below)
    prob = ss.Problem(loss, [norm == 4.0], dim=d, data=data)
    res = prob.solve(seed=0, hessian="lbfgs")
    ref = minimize(lambda w: lv(w, X, y).mean(), np.full(d, 0.5), jac=lambda w: lg(w, X, y),
                   method="SLSQP", options={"ftol": 1e-12, "maxiter": 500},
                   constraints=[{"type": "eq", "fun": lambda w: w @ w - 4.0,
                                 "jac": lambda w: 2 * w}])
    assert ref.success
    assert res.status == "converged", res.message
    assert res.fun == pytest.approx(ref.fun, abs=1e-6)
    assert abs(res.x @ res.x - 4.0) <= 1e-6
    # the Newton model on differenced gradients: certified at SLSQP's point, the equality
    # within feas_tol (1e-4 of max(1, 4))
    newton = prob.solve(seed=0)
    assert newton.status == "converged", newton.message
    assert newton.fun == pytest.approx(ref.fun, abs=1e-6)
    assert abs(newton.x @ newton.x - 4.0) <= 4e-4


def test_a_coordinate_the_bounds_fix_is_left_out_of_the_probe():
    """S2MPJ's EQC and QCNEW: x log x at variables the bounds fix at 0, so the gradient's
    component along them is huge and the probe's curvature along the gradient was 9e15: tau
    9e15, statistics that carried nothing below the units digit, round 1 'error'. The probe's
    direction leaves out the coordinates the domain's simple bounds fix (read from the
    constraints, nothing solved), and the CVXPY answers are clipped into those bounds."""
    f = fn(lambda w: (w[0] - 1.0) ** 2 + 1e16 * w[1] ** 2 + 1e8 * w[1],
           lambda w: np.array([2.0 * (w[0] - 1.0), 2e16 * w[1] + 1e8]), "f")
    domain = lambda w: [w[1] == 0.0, w[0] <= 5.0]              # noqa: E731
    det = DeterministicPart((), (domain,), 2)
    assert det.bound_fixed(np.zeros(2)).tolist() == [1]
    lo, hi = det.simple_bounds()
    assert lo.tolist() == [-np.inf, 0.0] and hi.tolist() == [5.0, 0.0]
    assert det.clip(np.array([6.0, -1e-12])).tolist() == [5.0, 0.0]
    res = ss.Problem(f, dim=2, data=ONE_ROW, domain=domain).solve(x0=np.zeros(2), seed=0,
                                                                  batch_size="full")
    assert res.status == "converged", res.message
    np.testing.assert_allclose(res.x, [1.0, 0.0], atol=1e-6)
    assert res.nit <= 30


def test_the_linearised_step_survives_an_exponentially_flat_objective():
    """S2MPJ's HS54: an objective exp(-huge) whose gradient is 6e-86 at |w| = 5e7, so the
    step length t = max(1, |w|) / scale was 3e16 and the proximal weight 1 / (2 t |g_0|)
    2.5e68: Clarabel answered 'solver_error' at every attempt and the report was NaN. The
    objective is now divided by at least max(1, |w|) / t."""
    w = np.array([6.0e3, 2.9, 4.0e6, 2.1, -0.9999, 5.0e7])
    lo = np.array([0.0, -10.0, 0.0, 0.0, -1.0, 0.0])
    hi = np.array([2e4, 10.0, 1e7, 20.0, 1.0, 2e8])
    det = DeterministicPart((), (lambda u: [u >= lo, u <= hi],), 6)
    g0 = np.full(6, 6e-86 / np.sqrt(6.0))
    G = np.zeros((6, 1))
    G[0, 0] = 4000.0
    u, mu, duals, elastic = det.linearized_step(w, g0, G, np.array([0.0]), step=3.3e16)
    assert np.all(np.isfinite(u)) and np.linalg.norm(u - w) / 3.3e16 <= 1e-12
    assert elastic <= 1e-9


def test_passed_is_every_listed_residual_within_its_tolerance():
    """KKTReport.passed is the rule its residuals() lists: every relative residual at most its
    tolerance, a NaN (a failed report) never; on reports with 0 to 3 constraints whose
    residuals sit below, at and above the tolerances, some NaN, zero tolerances too; and
    largest() is that list's first row."""
    from ssca_solver.diagnostics.certificate import KKTReport

    rng = np.random.default_rng(0)
    values = [0.0, 1e-5, 1e-4, 2e-4, np.nan, 1.0]
    for _ in range(5000):
        M = int(rng.integers(0, 4))
        report = KKTReport(multipliers=np.zeros(M), multiplier_source="nnls", stationarity=0.0,
                           stationarity_kind="gradient", feasibility=np.zeros(M),
                           complementarity=np.zeros(M),
                           domain_violation=float(rng.choice(values)),
                           stationarity_rel=float(rng.choice(values)),
                           feasibility_rel=rng.choice(values, size=M),
                           complementarity_rel=rng.choice(values, size=M))
        feas_tol, kkt_tol = float(rng.choice([1e-4, 1e-5, 0.0])), float(rng.choice([1e-4, 0.0]))
        rows = report.residuals(feas_tol, kkt_tol)
        listed = all(v <= tol for _, v, tol in rows)
        assert report.passed(feas_tol, kkt_tol) == listed
        # the messages' largest residual: the sorted list's first row, found without it
        name, value, tol = report.largest(feas_tol, kkt_tol)
        assert (name, tol) == (rows[0][0], rows[0][2])
        assert value == rows[0][1] or (np.isnan(value) and np.isnan(rows[0][1]))
