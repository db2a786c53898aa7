"""The Newton model of the full-batch phase (methods/ssca/newton.py): the clients' Hessians,
weighted like statistics, give the Hessian of the Lagrangian, and the rounds are Newton SQP
steps whose count does not grow with the conditioning; against CVXPY + Clarabel on the pooled
rows, under secure aggregation, across a checkpoint, and the option's rules."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.methods.ssca import SSCA
from ssca_solver.methods.ssca.newton import NewtonModel
from conftest import model_subproblem
from problems import least_squares


def ill_conditioned(cond: float, **sizes):
    """The ill-conditioned family of problems/least_squares.py and its pooled optimum
    (:func:`problems.least_squares.ill_conditioned_reference`)."""
    prob, X, y, target, r = least_squares.ill_conditioned(cond, **sizes)
    return prob, least_squares.ill_conditioned_reference(X, y, target, r)


@pytest.mark.parametrize("cond", [1e2, 1e6])
def test_the_reference_is_the_pooled_optimum(cond):
    """The elimination + SVD reference: feasible to rounding, its objective at most CVXPY +
    Clarabel's (tolerances 1e-10), which it matches at cond 1e2, and a KKT point: the
    gradient a multiple of the equality's row plus a nonnegative multiple of w."""
    _, X, y, target, r = least_squares.ill_conditioned(cond)
    x = least_squares.ill_conditioned_reference(X, y, target, r)
    a, n = X.mean(0), len(y)
    assert abs(a @ x - target) <= 1e-12 * max(1.0, abs(target)) and x @ x <= r * (1 + 1e-12)
    w = cp.Variable(X.shape[1])
    cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - y) / n),
               [a @ w == target, cp.sum_squares(w) <= r]).solve(
        solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)

    def f(v):
        return 0.5 * np.sum((X @ v - y) ** 2) / n

    assert f(x) <= f(w.value) + 1e-13
    if cond == 1e2:
        assert np.linalg.norm(x - w.value) <= 1e-4 * np.linalg.norm(x)
    g = X.T @ (X @ x - y) / n
    coef, *_ = np.linalg.lstsq(np.column_stack([a, x]), -g, rcond=None)
    assert coef[1] >= -1e-12
    assert np.linalg.norm(g + np.column_stack([a, x]) @ coef) <= 1e-8 * np.linalg.norm(g)


@pytest.mark.parametrize("cond", [1e2, 1e4])
def test_ill_conditioned_least_squares_in_few_rounds(cond):
    """Certified in few rounds whatever the conditioning, and near x*: under the Newton model
    the KKT test also bounds Newton's step to the KKT point (relative stationarity alone passed
    1.1e-3 from x* at cond 1e4); a tolerance of 1e-8 takes a round or two more."""
    prob, x_ref = ill_conditioned(cond)
    res = prob.solve(seed=0, batch_size="full")
    assert res.status == "converged" and res.nit <= 30, (res.nit, res.message)
    assert np.linalg.norm(res.x - x_ref) <= 1e-4 * np.linalg.norm(x_ref)
    tight = prob.solve(seed=0, batch_size="full", kkt_tol=1e-8)
    assert tight.status == "converged" and tight.nit <= 50, (tight.nit, tight.message)
    assert np.linalg.norm(tight.x - x_ref) <= 1e-4 * np.linalg.norm(x_ref)
    # the curvature is counted: three functions' packed Hessians per client per round
    d = prob.dim
    assert res.communication.up_per_client_round >= 3 * d * (d + 1) // 2
    quasi = prob.solve(seed=0, batch_size="full", hessian="lbfgs")
    assert quasi.nit > 2 * res.nit, (quasi.nit, res.nit)


def test_the_newton_model_in_the_closed_form_matches_cvxpy():
    """Problem 5 with the model (w - x)' B (w - x) / 2 of a NewtonModel (an indefinite H
    made positive definite): the closed form's solution equals the CVXPY path's."""
    from ssca_solver.model.deterministic import DeterministicPart
    from ssca_solver.subproblems import ClosedFormSubproblem, CvxpySubproblem

    rng = np.random.default_rng(3)
    d, M, c = 6, 2, 50.0
    A = rng.standard_normal((d, d))
    model = NewtonModel(A + A.T)                      # indefinite: floored eigenvalues
    assert np.all(np.linalg.eigvalsh(model.B) > 0)
    builders = [ss.ProximalLinear()] * (1 + M)
    # an independent reference: the problem written out in CVXPY, solved tightly
    stats, x, U, w_ref, value_ref = model_subproblem(rng, d, M, model.B, c)
    closed = ClosedFormSubproblem(d, builders, True, U, 0.0)
    det = DeterministicPart([], [], d)
    cvx = CvxpySubproblem(d, builders, True, U, det,
                          solver_options={"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11,
                                          "tol_feas": 1e-11})
    a = closed.with_model(model, x).solve(stats, c, 1)
    b = cvx.with_model(model, x).solve(stats, c, 1)
    np.testing.assert_allclose(a.w, w_ref, atol=1e-7)
    assert a.value == pytest.approx(value_ref, rel=1e-9)
    # the library's CVXPY path, to its solver's accuracy (two eigenvalues near 0: the
    # proximal term alone makes the problem strongly convex along them)
    np.testing.assert_allclose(b.w, w_ref, atol=2e-5)
    np.testing.assert_allclose(a.multipliers, b.multipliers, atol=1e-4 * c)
    assert b.value == pytest.approx(value_ref, rel=1e-8)


def test_under_secure_aggregation_the_newton_model_works_as_in_the_clear():
    """The clients' Hessians go through the masked sums (fixed-point words) like every
    statistic: the secure run certifies the same point in as few rounds (its start differs a
    little: under secure aggregation the probe sees no client's gradient norm)."""
    prob, x_ref = ill_conditioned(1e3, d=6, n=400, clients=4)
    plain = prob.solve(seed=0, batch_size="full")
    secure = prob.solve(seed=0, batch_size="full", secure_aggregation=True)
    assert plain.status == secure.status == "converged"
    assert secure.nit <= plain.nit + 5 and secure.nit <= 30, (secure.nit, plain.nit)
    assert secure.fun == pytest.approx(plain.fun, rel=1e-7)
    # (the fixed-point words of the masked sums bound what the KKT test can reach under
    # secure aggregation: kkt_tol=1e-8 stops at a relative stationarity of about 1e-6)
    assert secure.communication.up_per_client_round > plain.communication.up_per_client_round


def test_a_resumed_run_takes_the_uninterrupted_runs_steps(tmp_path):
    prob, _ = ill_conditioned(1e3, d=8, n=400, clients=4)
    whole = prob.solve(seed=0, batch_size="full", kkt_tol=1e-8)
    assert whole.nit > 5
    path = str(tmp_path / "run.npz")
    first = prob.solve(seed=0, batch_size="full", kkt_tol=1e-8, checkpoint=path,
                       callback=lambda it: it.t == 3)
    assert first.status == "stopped"
    rest = prob.solve(seed=0, batch_size="full", kkt_tol=1e-8, resume=path)
    assert rest.nit == whole.nit and rest.status == whole.status
    np.testing.assert_array_equal(rest.x, whole.x)


def test_the_option_picks_newton_where_the_hessians_are_given_or_cheap_to_difference():
    prob, _ = ill_conditioned(10.0, d=5, n=100, clients=2)
    assert SSCA.parse(prob, {}).hessian == "newton"
    assert SSCA.parse(prob, {"hessian": "lbfgs"}).hessian == "lbfgs"
    data = prob.data
    plain = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                              lambda w, X, y: X.T @ (X @ w - y) / len(X), name="plain")
    without = ss.Problem(plain, dim=5, data=data)
    # no hess: differences of the gradient, 2 d calls on 50 rows of 5 columns, are cheap
    assert SSCA.parse(without, {}).hessian == "newton"
    assert SSCA.parse(without, {"hessian": "newton"}).hessian == "newton"
    # at d = 200 and 210 rows, 2 d N d = 1.7e7 row-parameters exceed FULL_PASS_WORK: "lbfgs";
    # with a hess the same problem runs the Newton model
    rng = np.random.default_rng(1)
    rows = ss.FederatedData([(rng.normal(size=(210, 200)), rng.normal(size=210))])
    assert SSCA.parse(ss.Problem(plain, dim=200, data=rows), {}).hessian == "lbfgs"
    given = ss.SampleFunction(plain.value, plain.grad, hess=lambda w, X, y: X.T @ X / len(X))
    assert SSCA.parse(ss.Problem(given, dim=200, data=rows), {}).hessian == "newton"
    # above 256 variables "auto" keeps the quasi-Newton model (the floats of a Hessian; the
    # sketch only when asked for, tests/test_sketch.py)
    rng = np.random.default_rng(0)
    wide = ss.FederatedData([(rng.normal(size=(3, 300)), rng.normal(size=3))])
    big = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                            lambda w, X, y: X.T @ (X @ w - y) / len(X),
                            hess=lambda w, X, y: X.T @ X / len(X))
    assert SSCA.parse(ss.Problem(big, dim=300, data=wide), {}).hessian == "lbfgs"


def test_a_weakly_active_constraint_is_curved_once():
    """The family's ball is active at the optimum with a multiplier far below the equality's
    (an 'inactive' share): its curvature goes into its own surrogate and not also into the
    Lagrangian's Hessian. Curved twice, the model's curvature along the flat directions, where
    the ball's term dominates the objective's, was double, the steps towards the optimum half
    of Newton's, and kkt_tol=1e-8 took 29 rounds at cond 1e4 with the distance halving each
    round; curved once, the quadratic problem's SQP step is exact."""
    from problems.least_squares import ill_conditioned as family, ill_conditioned_reference

    prob, X, y, target, r = family(1e4)
    x_ref = ill_conditioned_reference(X, y, target, r)
    path = []
    tight = prob.solve(seed=0, kkt_tol=1e-8, callback=lambda it: path.append(np.array(it.x)))
    assert tight.status == "converged" and tight.nit <= 15, (tight.nit, tight.message)
    assert np.linalg.norm(tight.x - x_ref) <= 1e-7 * np.linalg.norm(x_ref)
    dist = [np.linalg.norm(x - x_ref) / np.linalg.norm(x_ref) for x in path]
    # no run of linear convergence at rate 1/2: from 1e-3 to 1e-6 in at most 4 rounds
    first = next(i for i, v in enumerate(dist) if v <= 1e-3)
    assert min(dist[first:first + 5]) <= 1e-6, dist


def test_raising_a_subnormal_curvature_keeps_the_surrogate_finite_and_tangent():
    """Under the Newton model an inactive constraint's surrogate curvature is raised to half
    its Hessian's top eigenvalue. After hundreds of accepted steps tau had fallen to 1e-309
    (S2MPJ's HS106), the factor 0.5 top / quad overflowed, and the subproblem got NaN
    parameters ('Parameter value must be real'). raise_curvature adds instead: the value and
    gradient at w are kept, the curvature is the target."""
    from ssca_solver.methods.ssca import adaptive as ad

    rng = np.random.default_rng(0)
    w = rng.normal(size=3)
    stats = {"quad": np.asarray(1.37e-309), "lin": rng.normal(size=3), "const": np.asarray(2.0)}
    with np.errstate(all="ignore"):
        bad = ad.rescale_tau(stats, w, 0.5 * 2.0 / 1.37e-309)
    assert not all(np.all(np.isfinite(v)) for v in bad.values())
    got = ad.raise_curvature(stats, w, 1.0)

    def value(s, v):
        return float(s["quad"]) * (v @ v) + s["lin"] @ v + float(s["const"])

    def grad(s, v):
        return 2.0 * float(s["quad"]) * v + s["lin"]

    assert float(got["quad"]) == 1.0
    assert value(got, w) == pytest.approx(value(stats, w), rel=1e-12)
    np.testing.assert_allclose(grad(got, w), grad(stats, w), atol=1e-12)
    # a vector curvature: raised where below the target, kept where above
    vec = {"quad": np.array([0.1, 3.0, 1e-309]), "lin": stats["lin"], "const": stats["const"]}
    up = ad.raise_curvature(vec, w, 1.0)
    np.testing.assert_array_equal(up["quad"], [1.0, 3.0, 1.0])
    assert (float(up["quad"] @ (w * w)) + up["lin"] @ w + float(up["const"])
            == pytest.approx(float(vec["quad"] @ (w * w)) + vec["lin"] @ w + 2.0, rel=1e-12))


def test_newtons_step_is_the_distance_on_an_equality_constrained_quadratic():
    """kkt.newton_step on 1/2 (w - a)' H (w - a) s.t. c.w = t, H of condition number 1e8, at a
    feasible point: Newton's step with the equality linearised is exactly x* - w, whatever the
    multiplier the fit gives (its direction is projected out), where the gradient's residual
    says far less."""
    from ssca_solver.diagnostics.kkt import newton_step

    rng = np.random.default_rng(0)
    d = 12
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    H = (Q * np.logspace(0, -8, d)) @ Q.T
    a, c, t = rng.normal(size=d), rng.normal(size=d), 0.7
    K = np.block([[H, c[:, None]], [c[None, :], np.zeros((1, 1))]])
    x_star = np.linalg.solve(K, np.concatenate([H @ a, [t]]))[:d]
    flat = Q[:, -1] - (c @ Q[:, -1]) / (c @ c) * c     # along the flattest direction, c.dx = 0
    w = x_star + 1e-3 * flat / np.linalg.norm(flat)     # feasible, 1e-3 from x*
    g = H @ (w - a)
    mu = np.array([-(c @ g) / (c @ c)])                # any multiplier: projected out
    res = g + c * mu[0]
    got = newton_step(res, g, c[:, None], mu, np.array([True]), H, w)
    want = np.linalg.norm(x_star - w) / max(1.0, np.linalg.norm(w))
    # (x* from the KKT matrix, condition ~1e8, is itself accurate to ~1e-8 of |x*|, some 1e-5
    # of the distance 1e-3)
    assert got == pytest.approx(want, rel=1e-4)
    # the residual over the curvature's scale, the estimate a well-conditioned H would give,
    # falls short of the distance by over 100x
    assert np.linalg.norm(res) / np.linalg.norm(H, 2) < 1e-2 * np.linalg.norm(x_star - w)


def _two_bars():
    """S2MPJ's TWOBARS (a two-bar truss): min x1 sqrt(1 + x2^2) s.t.
    0.124 sqrt(1 + x2^2) (8 / x1 +- 1 / (x1 x2)) <= 1, 0.2 <= x1 <= 4, 0.1 <= x2 <= 1.6, from
    (1, 1); exact gradients and Hessians."""
    def obj(w):
        x, y = w
        a = np.sqrt(1.0 + y * y)
        return (x * a, np.array([a, x * y / a]),
                np.array([[0.0, y / a], [y / a, x / a ** 3]]))

    def con(w, s):
        x, y = w
        A = 1.0 + y * y
        ra = np.sqrt(A)
        b, db, d2b = 8.0 / x, -8.0 / x ** 2, 16.0 / x ** 3
        c, cx, cy = s / (x * y), -s / (x ** 2 * y), -s / (y ** 2 * x)
        cxx, cxy, cyy = 2 * s / (x ** 3 * y), s / (x * y) ** 2, 2 * s / (x * y ** 3)
        bc = b + c
        g = np.array([ra * (db + cx), y * bc / ra + ra * cy])
        hxy = ra * cxy + y * (db + cx) / ra
        hyy = (bc + 2 * y * cy - y * y * bc / A) / ra + ra * cyy
        H = np.array([[ra * (d2b + cxx), hxy], [hxy, hyy]])
        return 0.124 * ra * bc, 0.124 * g, 0.124 * H

    f = ss.SampleFunction(lambda w, X, y: np.full(len(X), obj(w)[0]),
                          lambda w, X, y: obj(w)[1], name="weight",
                          hess=lambda w, X, y: obj(w)[2])
    cons = [ss.SampleFunction((lambda s: lambda w, X, y: np.full(len(X), con(w, s)[0]))(s),
                              (lambda s: lambda w, X, y: con(w, s)[1])(s), name=f"c{i}",
                              hess=(lambda s: lambda w, X, y: con(w, s)[2])(s)) <= 1.0
            for i, s in enumerate((1.0, -1.0))]
    lo, hi = np.array([0.2, 0.1]), np.array([4.0, 1.6])
    prob = ss.Problem(f, cons, dim=2, data=ss.FederatedData([np.zeros((1, 1))]),
                      domain=lambda w: [w >= lo, w <= hi])
    return prob, obj, con, lo, hi


def _two_bars_slsqp(obj, con, lo, hi, x0):
    """SciPy's SLSQP on TWOBARS from ``x0``: the reference optimum."""
    from scipy.optimize import minimize

    return minimize(lambda w: obj(w)[0], x0, jac=lambda w: obj(w)[1], method="SLSQP",
                    bounds=list(zip(lo, hi)), options={"ftol": 1e-12},
                    constraints=[{"type": "ineq",
                                  "fun": (lambda s: lambda w: 1.0 - con(w, s)[0])(s),
                                  "jac": (lambda s: lambda w: -con(w, s)[1])(s)}
                                 for s in (1.0, -1.0)])


def test_a_correction_longer_than_its_step_is_refused_under_the_newton_model(monkeypatch):
    """Under the Newton model a rejected step's second-order correction that would move the
    trial point farther than the step itself is refused and tau raised instead (TWOBARS: the
    Newton run reaches SLSQP's optimum); under the quasi-Newton model every correction is
    tried (at_most None)."""
    from ssca_solver.methods.ssca import acceptance
    from ssca_solver.methods.ssca.adaptive import SOC_MOVE

    calls = []
    real = acceptance.second_order_correction

    def spy(cfg, state, stats, at_most=None):
        out = real(cfg, state, stats, at_most=at_most)
        calls.append((at_most, out is None))
        return out

    monkeypatch.setattr(acceptance, "second_order_correction", spy)
    prob, obj, con, lo, hi = _two_bars()
    x0 = np.ones(2)
    ref = _two_bars_slsqp(obj, con, lo, hi, x0)
    res = prob.solve(x0=x0, seed=0)
    assert res.status == "converged"
    np.testing.assert_allclose(res.x, ref.x, atol=1e-3)
    assert (SOC_MOVE, True) in calls and all(a == SOC_MOVE for a, _ in calls)
    del calls[:]
    quasi = prob.solve(x0=x0, seed=0, hessian="lbfgs")
    assert quasi.status == "converged"
    np.testing.assert_allclose(quasi.x, ref.x, atol=1e-3)
    assert all(a is None for a, _ in calls)


def test_a_rejected_newton_step_is_retried_at_half_its_length(monkeypatch):
    """Under the Newton model a rejected step's retry takes the tau whose step is
    RADIUS_SHARE of the rejected one's (acceptance.radius_factor, a trust radius), not tau
    lifted to MODEL_REJECT times the model's scale, whose step is shorter (on TWOBARS 0.37 of
    the rejected one; on S2MPJ's HS109 orders of magnitude). The run still reaches SLSQP's
    optimum."""
    from ssca_solver.methods.ssca import acceptance
    from ssca_solver.methods.ssca.adaptive import RADIUS_SHARE, TAU_UP

    calls = []
    real = acceptance.radius_factor

    def spy(cfg, state, base_w, base, k_max):
        k = real(cfg, state, base_w, base, k_max)
        length = lambda f: acceptance._step_length(cfg, state, base_w, base, f)  # noqa: E731
        rejected = float(np.linalg.norm(state.w - base_w))
        calls.append((k, k_max, length(k) / rejected, length(k_max) / rejected))
        return k

    monkeypatch.setattr(acceptance, "radius_factor", spy)
    prob, obj, con, lo, hi = _two_bars()
    x0 = np.ones(2)
    ref = _two_bars_slsqp(obj, con, lo, hi, x0)
    res = prob.solve(x0=x0, seed=0)
    assert res.status == "converged"
    np.testing.assert_allclose(res.x, ref.x, atol=1e-3)
    inside = [c for c in calls if TAU_UP < c[0] < c[1]]
    assert inside, calls
    for k, k_max, share, share_max in inside:
        # the bisection's last bracket is below 1 % of log(k_max / TAU_UP) wide
        assert 0.5 * RADIUS_SHARE <= share <= RADIUS_SHARE * (1 + 1e-9), calls
        assert share_max < share, calls          # k_max's step: shorter


def _logistic_parts(rng, n=40, d=4):
    X = rng.normal(size=(n, d))
    y = rng.integers(0, 2, size=n).astype(float)

    def value(w, X, y):
        z = X @ w
        return np.logaddexp(0.0, z) - y * z

    def grad(w, X, y):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        return X.T @ (p - y) / len(X)

    def hess(w, X, y):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        return (X * (p * (1 - p))[:, None]).T @ X / len(X)

    return X, y, value, grad, hess


def test_differences_of_the_gradient_give_the_hessian_and_its_products():
    """difference_hessians / difference_products against the exact Hessian (a logistic loss
    and a cubic), to the accuracy of central differences; at a point whose lower difference
    step leaves the function's domain (its gradient NaN there) the one-sided difference."""
    from ssca_solver.model.functions import difference_hessians, difference_products

    rng = np.random.default_rng(0)
    X, y, value, grad, hess = _logistic_parts(rng)
    logistic = ss.SampleFunction(value, grad, name="logistic")
    cube = ss.SampleFunction(lambda w, X, y: np.full(len(X), w[0] ** 3 + w[0] * w[1] ** 2),
                             lambda w, X, y: np.array([3 * w[0] ** 2 + w[1] ** 2,
                                                       2 * w[0] * w[1], 0.0, 0.0]),
                             name="cube")
    w = rng.normal(size=4)
    H_log, H_cube = difference_hessians([logistic, cube], w, X, y, "test")
    exact_cube = np.zeros((4, 4))
    exact_cube[:2, :2] = [[6 * w[0], 2 * w[1]], [2 * w[1], 2 * w[0]]]
    np.testing.assert_allclose(H_log, hess(w, X, y), atol=1e-8 * np.abs(hess(w, X, y)).max())
    np.testing.assert_allclose(H_cube, exact_cube, atol=1e-8 * np.abs(exact_cube).max())
    V = rng.normal(size=(4, 3))
    (P,) = difference_products([logistic], w, X, y, V, "test")
    np.testing.assert_allclose(P, hess(w, X, y) @ V, atol=1e-8 * np.abs(hess(w, X, y) @ V).max())

    # a domain w_0 >= 1 (NaN below): at w_0 = 1 + 1e-7 the step below leaves it
    edge = ss.SampleFunction(
        lambda w, X, y: np.full(len(X), w[0] ** 3 if w[0] >= 1 else np.nan),
        lambda w, X, y: (np.array([3 * w[0] ** 2, 0.0]) if w[0] >= 1
                         else np.array([np.nan, 0.0])), name="edge")
    (H_edge,) = difference_hessians([edge], np.array([1.0 + 1e-7, 0.5]), X[:, :2], y, "test")
    assert H_edge[0, 0] == pytest.approx(6.0 * (1.0 + 1e-7), rel=1e-5)


def test_without_hess_the_newton_model_runs_on_differences_of_the_gradients():
    """S2MPJ's HIMMELBC (two equations) with gradients only: hessian="auto" differences them
    on the client and the run takes the rounds of the exact Hessians' run (the Newton
    model's retry along the step included), and sends the exact Hessians' floats."""
    data = ss.FederatedData([np.zeros((1, 1))])
    values = (lambda w: w[0] ** 2 + w[1] - 11.0, lambda w: w[0] + w[1] ** 2 - 7.0)
    grads = (lambda w: np.array([2.0 * w[0], 1.0]), lambda w: np.array([1.0, 2.0 * w[1]]))
    hessians = (np.diag([2.0, 0.0]), np.diag([0.0, 2.0]))

    def problem(with_hess):
        zero = ss.SampleFunction(lambda w, X, y: np.zeros(len(X)), lambda w, X, y: np.zeros(2),
                                 hess=(lambda w, X, y: np.zeros((2, 2))) if with_hess else None,
                                 name="0")
        eqs = [ss.SampleFunction((lambda v: lambda w, X, y: np.full(len(X), v(w)))(v),
                                 (lambda g: lambda w, X, y: g(w))(g),
                                 hess=(lambda H: lambda w, X, y: H)(H) if with_hess else None,
                                 name=f"F{k}") == 0.0
               for k, (v, g, H) in enumerate(zip(values, grads, hessians))]
        return ss.Problem(zero, eqs, dim=2, data=data)

    x0 = np.array([1.0, 1.0])
    exact = problem(True).solve(seed=0, x0=x0)
    differenced = problem(False).solve(seed=0, x0=x0)
    quasi = problem(False).solve(seed=0, x0=x0, hessian="lbfgs")
    for res in (exact, differenced):
        assert res.status == "converged", res.message
        np.testing.assert_allclose(res.x, [3.0, 2.0], atol=1e-4)
    assert differenced.nit == exact.nit
    # the Hessians' floats are sent and counted: 3 functions x d (d + 1) / 2 = 9 more a round
    assert (differenced.communication.up_per_client_round
            == exact.communication.up_per_client_round
            == quasi.communication.up_per_client_round + 9)


def test_differenced_hessians_keep_the_rounds_of_an_ill_conditioned_problem_flat():
    """The ill-conditioned least squares (condition number 1e4, an equality and a ball) with
    gradients only: the default options difference them and certify in about the exact
    Hessians' rounds, at the pooled optimum; the quasi-Newton model takes many more."""
    _, X, y, target, r = least_squares.ill_conditioned(1e4, d=8, n=400, clients=4)
    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    lsq = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                            lambda w, X, y: X.T @ (X @ w - y) / len(X), name="lsq")
    mean = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), name="mean")
    norm = ss.SampleFunction(lambda w, X, y: np.full(len(X), w @ w), lambda w, X, y: 2 * w,
                             name="norm")
    prob = ss.Problem(lsq, [mean == target, norm <= r], dim=8, data=data)
    exact_prob, _ = ill_conditioned(1e4, d=8, n=400, clients=4)
    x_ref = least_squares.ill_conditioned_reference(X, y, target, r)
    res = prob.solve(seed=0)
    exact = exact_prob.solve(seed=0)
    quasi = prob.solve(seed=0, hessian="lbfgs")
    assert res.status == exact.status == "converged", res.message
    assert np.linalg.norm(res.x - x_ref) <= 1e-3 * np.linalg.norm(x_ref)
    assert res.nit <= exact.nit + 2, (res.nit, exact.nit)
    assert quasi.nit >= 2 * res.nit, (quasi.nit, res.nit)


def _many_curved_constraints(n=6, m=40, with_hess=True, calls=None):
    """min |w|^2 / 2 + c.w s.t. (a_j.w)^2 <= b_j, j = 1..m (a few active at the optimum),
    each constraint its own function; ``calls`` counts the constraints' gradient calls."""
    rng = np.random.default_rng(3)
    A = rng.standard_normal((m, n)) / np.sqrt(n)
    b = rng.uniform(0.5, 1.0, m)
    c = rng.standard_normal(n)

    def grad_of(a):
        def grad(w, X, y):
            if calls is not None:
                calls.append(1)
            return 2.0 * (a @ w) * a
        return grad

    f = ss.SampleFunction(lambda w, X, y: np.full(len(X), 0.5 * w @ w + c @ w),
                          lambda w, X, y: w + c,
                          hess=(lambda w, X, y: np.eye(n)) if with_hess else None, name="f")
    cons = [ss.SampleFunction((lambda a: lambda w, X, y: np.full(len(X), (a @ w) ** 2))(a),
                              grad_of(a),
                              hess=(lambda a: lambda w, X, y: 2.0 * np.outer(a, a))(a)
                              if with_hess else None, name=f"c{j}") <= b[j]
            for j, a in enumerate(A)]
    return ss.Problem(f, cons, dim=n, data=ss.FederatedData([np.zeros((1, 1))]))


@pytest.mark.parametrize("with_hess", [True, False])
def test_a_round_asks_for_the_curvature_the_model_reads(monkeypatch, with_hess):
    """After the first round a round asks for the curvature of the objective and of the
    active constraints or those near their bound only (acceptance.curvature_wanted):
    the Hessians that weigh 0 in the model are neither computed nor sent. On constraints of
    constant curvature the run is the one that asks for every function's (the same rounds and
    point; bit for bit with exact Hessians), with far fewer floats uploaded and, without
    hess, far fewer gradient calls for the differences."""
    from ssca_solver.methods.ssca import acceptance

    x0 = np.zeros(6)
    calls_some, calls_all = [], []
    some = _many_curved_constraints(with_hess=with_hess, calls=calls_some).solve(seed=0, x0=x0)
    monkeypatch.setattr(acceptance, "curvature_wanted", lambda cfg, state: None)
    every = _many_curved_constraints(with_hess=with_hess, calls=calls_all).solve(seed=0, x0=x0)
    assert some.status == every.status == "converged", some.message
    assert some.nit == every.nit
    if with_hess:
        np.testing.assert_array_equal(some.x, every.x)
    else:
        np.testing.assert_allclose(some.x, every.x, atol=1e-9)
        assert len(calls_some) < 0.5 * len(calls_all), (len(calls_some), len(calls_all))
    # (the first round asks for every function's: no constraint's curvature is known yet)
    assert some.communication.up_total < 0.6 * every.communication.up_total


def test_an_interior_point_subproblems_tiny_multipliers_are_inactive(monkeypatch):
    """A CVXPY (interior-point) subproblem leaves multipliers of the order of its tolerance
    on constraints that are not active (~1e-15 of the penalty c): they count as inactive
    (acceptance.inactive_inequalities, below NEGLIGIBLE_MULTIPLIER c), so after the first
    round a round asks for the curvature of the constraints near their bound only, not of
    every one as when the tiny multipliers all counted as active by their share; the run
    reaches the optimum (CVXPY + Clarabel on the same problem)."""
    from ssca_solver.methods.ssca import acceptance

    cfg = type("Cfg", (), {"M": 4, "equality": np.zeros(4, dtype=bool)})()
    tiny = np.array([5e-13, 4.8e-13, 5.1e-13, 5e-13])
    assert acceptance.inactive_inequalities(cfg, tiny, 100.0).all()
    assert not acceptance.inactive_inequalities(cfg, tiny).any()      # by share alone
    real = np.array([0.0, 2.0, 1e-6, 5e-3])        # the share rule where c is no bound
    assert acceptance.inactive_inequalities(cfg, real, 100.0).tolist() == [True, False,
                                                                           True, False]
    rng = np.random.default_rng(0)
    A = rng.standard_normal((12, 4))
    target = np.array([0.3, -0.2, 0.1, 0.05])
    cons = [ss.SampleFunction((lambda a: lambda w, X, y: np.full(len(X), (a @ w) ** 2))(a),
                              (lambda a: lambda w, X, y: 2.0 * (a @ w) * a)(a),
                              name=f"c{j}") <= 50.0 for j, a in enumerate(A)]
    # an objective in CVXPY (deterministic): the subproblem goes to the interior point
    prob = ss.Problem(lambda w: cp.sum_squares(w - target), cons, dim=4,
                      data=ss.FederatedData([np.zeros((1, 1))]))
    by_round = {}              # (the server reads the list when it asks and when it adds up)
    wanted = acceptance.curvature_wanted

    def recorded(cfg, state):
        got = wanted(cfg, state)
        by_round.setdefault(state.t, got)
        return got

    monkeypatch.setattr(acceptance, "curvature_wanted", recorded)
    res = prob.solve(seed=0, x0=np.full(4, 0.5))
    asked = [by_round[t] for t in sorted(by_round)]
    assert res.status == "converged", res.message
    w = cp.Variable(4)
    ref = cp.Problem(cp.Minimize(cp.sum_squares(w - target)),
                     [cp.square(A @ w) <= 50.0]).solve(solver=cp.CLARABEL)
    assert abs(res.fun - ref) <= 1e-6
    assert asked[0] is None                             # round 1: every function's
    assert all(r is not None and r.size < len(cons) for r in asked[1:]), asked


def test_a_malformed_curvature_list_is_refused():
    """A request whose list of functions names one the client does not have is malformed."""
    from ssca_solver.federated.messages import Request
    from ssca_solver.methods.ssca.client import CURVATURE_OF, curvature_of

    request = Request("ssca.round", 1, np.zeros(2), {"curvature": True},
                      {CURVATURE_OF: np.array([0, 3])})
    with pytest.raises(ValueError, match="function indices in \\[0, 3\\)"):
        curvature_of(request, 3)
    assert curvature_of(Request("ssca.round", 1, np.zeros(2), {"curvature": True}), 3) == {0, 1, 2}
    assert curvature_of(Request("ssca.round", 1, np.zeros(2), {}), 3) == frozenset()


def test_a_vector_functions_components_are_differenced_from_one_jacobian_a_point():
    """difference_hessians of a VectorSampleFunction's components: one Jacobian call per
    difference point (2 d), the same matrices as the components' own gradients give; a
    component whose gradient is not finite at a point takes the one-sided difference."""
    from ssca_solver.model.functions import difference_hessians

    calls = []
    A = np.array([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0], [3.0, 0.0, 1.0]])

    def jac(w, X, y):
        calls.append(1)
        J = 2.0 * (A @ w)[:, None] * A
        if w[0] < 0.5:                   # component 2 outside its domain there
            J[2] = np.nan
        return J

    vec = ss.VectorSampleFunction(lambda w, X, y: np.tile((A @ w) ** 2, (len(X), 1)), jac, 3,
                                  name="sq")
    w = np.array([0.5 + 1e-7, -0.3, 0.2])
    X = np.zeros((1, 1))
    H = difference_hessians(list(vec.components), w, X, None, "test")
    assert len(calls) == 2 * 3 + 1      # 2 d points, and w itself for the one-sided one
    for k in range(3):
        exact = 2.0 * np.outer(A[k], A[k])
        tol = 1e-8 if k < 2 else 1e-4   # one-sided: first-order accurate
        np.testing.assert_allclose(H[k], exact, atol=tol * np.abs(exact).max())


def test_the_replies_curvature_rows_are_the_functions_asked_for():
    """A round's curvature arrives as one array, a row per function the round asked for
    (newton.CurvatureSum): rows summed with the replies' weights and unpacked to each
    function's Hessian (the same floats as function by function); a reply with another
    number of rows is a ReplyError naming its client."""
    from ssca_solver.federated import Reply
    from ssca_solver.methods.ssca.client import CURVATURE, pack_symmetric, unpack_symmetric
    from ssca_solver.methods.ssca.newton import CurvatureSum

    rng = np.random.default_rng(4)
    H = rng.standard_normal((2, 3, 4, 4))
    H = H + np.swapaxes(H, -1, -2)                     # (client, function, d, d), symmetric
    total = CurvatureSum([1, 4, 7], 4)
    for i, weight in enumerate((0.25, 0.75)):
        total.add(Reply(i, "ssca.round", 3, 10, 10, {CURVATURE: pack_symmetric(H[i])}), weight)
    got = total.by_function()
    assert sorted(got) == [1, 4, 7]
    for j, m in enumerate([1, 4, 7]):
        want = 0.25 * unpack_symmetric(pack_symmetric(H[0, j]), 4)
        want = want + 0.75 * unpack_symmetric(pack_symmetric(H[1, j]), 4)
        np.testing.assert_array_equal(got[m], want)
        np.testing.assert_allclose(got[m], 0.25 * H[0, j] + 0.75 * H[1, j], rtol=1e-14)
    with pytest.raises(ss.ReplyError, match="client 5.*curvature of 3 functions"):
        total.add(Reply(5, "ssca.round", 3, 10, 10, {CURVATURE: pack_symmetric(H[0, :2])}),
                  1.0)
    assert CurvatureSum([0], 4).by_function() == {}
