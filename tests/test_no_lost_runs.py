"""No exception loses a run (issue 18, item 3).

A subproblem the solver cannot solve is retried (Clarabel's fallback settings, the problem
recentred, another installed solver), each retry counted; when every attempt fails the solve
returns the last good point with status "error", its history and a message naming the round,
the solver and its statuses. A KKT report that cannot be computed is marked failed and the run
keeps the status it earned. User errors still raise at once.

Failures are forced by wrapping ``cvxpy.Problem.solve``: the subproblem of the rounds has a
variable named "w", or "dw" in the local form the rounds use (a step from the round's point),
and its recentred retries one named "v", which tells the attempts apart.
"""

import warnings

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver import status as st
from ssca_solver.model.deterministic import DeterministicPart
from ssca_solver.subproblems import cvxpy_backend
from problems.neyman_pearson import neyman_pearson

ORIGINAL_SOLVE = cp.Problem.solve
OPTS = dict(subproblem="cvxpy", batch_size=20, seed=0, eval_every=5, penalty=[100.0])


def _names(problem):
    return {v.name() for v in problem.variables()}


def _round_subproblem(problem) -> bool:
    """The model of the rounds (not its recentred retry, nor a diagnostic's problem)."""
    return bool({"w", "dw"} & _names(problem))


class Forced:
    """Wraps ``cp.Problem.solve``: ``fail(problem, kwargs)`` returns None (solve normally),
    "raise" (a SolverError) or a status to report without a point (e.g. "unbounded"); only
    while ``active``."""

    def __init__(self, fail):
        self.fail, self.active, self.calls = fail, False, []

    def __call__(self, problem, *args, **kwargs):
        what = self.fail(problem, kwargs) if self.active else None
        self.calls.append((tuple(sorted(_names(problem))), kwargs.get("solver"), what))
        if what is None:
            return ORIGINAL_SOLVE(problem, *args, **kwargs)
        if what == "raise":
            raise cp.error.SolverError("forced failure")
        ORIGINAL_SOLVE(problem, *args, **kwargs)
        problem._status = what
        for v in problem.variables():
            v.value = None
        return None


def _on_rounds(monkeypatch, rounds, fail) -> Forced:
    """Force ``fail`` on the CVXPY solves of the subproblem of every round t with
    ``rounds(t)`` (it stays active after such a round, for the diagnostics)."""
    forced = Forced(fail)
    original = cvxpy_backend.CvxpySubproblem.solve

    def solve(self, stats, penalty, round, nu0=None, center=None):
        forced.active = bool(rounds(round))
        return original(self, stats, penalty, round, nu0, center=center)

    monkeypatch.setattr(cvxpy_backend.CvxpySubproblem, "solve", solve)
    monkeypatch.setattr(cp.Problem, "solve",
                        lambda problem, *args, **kwargs: forced(problem, *args, **kwargs))
    return forced


def _from_round(monkeypatch, first: int, fail) -> Forced:
    return _on_rounds(monkeypatch, lambda t: t >= first, fail)


@pytest.fixture(scope="module")
def np_problem(cancer_data):
    return neyman_pearson(cancer_data, alpha=0.2)


@pytest.fixture(scope="module")
def reference(np_problem):
    """An unforced run and its iterates (the callback's x after every round)."""
    xs = []
    res = np_problem.solve(max_iter=8, callback=lambda it: xs.append(it.x.copy()), **OPTS)
    return res, xs


# -- retries --------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["raise", cp.UNBOUNDED])
def test_a_failing_round_is_solved_recentred_and_the_retries_are_counted(
        np_problem, reference, monkeypatch, how):
    """Clarabel fails ("solver_error" / "unbounded") on rounds 3 and 5 at every setting of
    the round's model; the recentred problem (the same problem in w = centre + v) is solved
    accurately: the run goes on, equal to the unforced one, with the retries counted."""
    ref, _ = reference
    rounds = {3, 5}
    forced = _on_rounds(monkeypatch, lambda t: t in rounds,
                        lambda p, kw: how if _round_subproblem(p) else None)
    res = np_problem.solve(max_iter=8, **OPTS)
    assert res.status == ref.status and res.nit == ref.nit == 8
    retries = res.history.retries
    for t in rounds:
        # 4 settings of Clarabel (tight, defaults, two fallbacks), then the recentred one
        assert retries[t - 1] == 4, retries
        assert res.history.inaccurate[t - 1] == 0
    # before round 3 the runs are the same (later, the recentred answers differ from the
    # first model's in the last digits, and so may a later round's need of a retry)
    np.testing.assert_array_equal(retries[:2], ref.history.retries[:2])
    # the same problem, solved to Clarabel's tolerances through another epigraph (r >= |v|^2):
    # measured 5e-6 apart after 8 rounds
    np.testing.assert_allclose(res.x, ref.x, rtol=0, atol=1e-4 * max(1, np.abs(ref.x).max()))
    assert any("v" in names for names, _, _ in forced.calls)


def test_when_clarabel_always_fails_another_solver_answers_flagged_inaccurate(
        np_problem, monkeypatch):
    """Every Clarabel solve fails from round 2 on: SCS answers each round, the round is
    flagged inaccurate (a first-order method) and counted as 6 retries (4 Clarabel settings, 2
    recentred); the run is not lost."""
    _from_round(monkeypatch, 2, lambda p, kw: "raise"
                if str(kw.get("solver")).upper() == "CLARABEL" else None)
    with pytest.warns(RuntimeWarning, match="flagged inaccurate"):
        res = np_problem.solve(max_iter=4, **OPTS)
    assert res.status != st.ERROR and res.nit == 4
    np.testing.assert_array_equal(res.history.retries[1:], [6, 6, 6])
    np.testing.assert_array_equal(res.history.inaccurate, [0, 1, 1, 1])
    assert res.solver_info["inaccurate_rounds"] == (2, 3, 4)
    assert np.isfinite(res.fun) and np.all(np.isfinite(res.x))


# -- every attempt fails: status "error" -------------------------------------------------------
def test_total_failure_returns_the_last_good_point_with_status_error(
        np_problem, reference, monkeypatch):
    ref, ref_xs = reference
    _from_round(monkeypatch, 4, lambda p, kw: "raise")
    xs = []
    with pytest.warns(RuntimeWarning, match="status 'error'"):
        res = np_problem.solve(max_iter=8, callback=lambda it: xs.append(it.x.copy()), **OPTS)
    assert res.status == st.ERROR == "error" and not res.success
    assert res.nit == 3 and len(res.history.t) == 3 and list(res.history.t) == [1, 2, 3]
    np.testing.assert_array_equal(res.x, xs[-1])
    np.testing.assert_allclose(res.x, ref_xs[2], rtol=0, atol=1e-12)
    for name in ("round 4", "CLARABEL", "solver_error", "SCS", "recentred",
                 "last good point, after round 3"):
        assert name in res.message, res.message
    assert isinstance(res.extras["error"], ss.SubproblemError)
    # the point was evaluated on the full data: honest values and a KKT report
    assert np.isfinite(res.fun) and np.all(np.isfinite(res.constraints))
    assert not res.kkt.failed and np.isfinite(res.kkt.stationarity)
    # the start point's evaluation only (eval_every=5: none scheduled within 3 rounds)
    assert res.history.eval_t.tolist() == [0]
    assert res.communication.rounds == 3
    text = res.report()
    assert "status        error" in text and "rounds        3" in text


def test_failure_at_round_1_returns_the_start_point(np_problem, monkeypatch):
    _from_round(monkeypatch, 1, lambda p, kw: cp.UNBOUNDED)
    x0 = np.full(np_problem.dim, 0.01)
    with pytest.warns(RuntimeWarning, match="status 'error'"):
        res = np_problem.solve(max_iter=5, x0=x0, **OPTS)
    assert res.status == "error" and res.nit == 0 and len(res.history.t) == 0
    np.testing.assert_array_equal(res.x, x0)
    assert "round 1" in res.message and "'unbounded'" in res.message
    assert np.isfinite(res.fun)
    res.report()
    repr(res)


def test_an_error_result_names_its_checkpoint_and_resume_goes_on(np_problem, monkeypatch,
                                                                  tmp_path):
    path = str(tmp_path / "run.npz")
    forced = _from_round(monkeypatch, 3, lambda p, kw: "raise")
    with pytest.warns(RuntimeWarning):
        res = np_problem.solve(max_iter=6, checkpoint=path, **OPTS)
    assert res.status == "error" and res.nit == 2 and path in res.message
    monkeypatch.setattr(cp.Problem, "solve", ORIGINAL_SOLVE)
    forced.active = False
    more = np_problem.solve(max_iter=6, resume=path, **{k: v for k, v in OPTS.items()
                                                        if k != "seed"})
    assert more.nit == 6 and more.status != "error"


def test_every_method_gets_it_primal_dual_server_prox(cancer_data, monkeypatch):
    """The Lagrangian methods' server prox (a CVXPY problem with a domain) failing at round 3:
    status "error" after 2 rounds, through the same front door."""
    from problems.logistic import logistic_loss

    prob = ss.Problem(logistic_loss(), [logistic_loss() <= 0.5], dim=31, data=cancer_data,
                      domain=lambda w: [cp.norm(w, "inf") <= 5])
    from ssca_solver.methods.lagrangian import algorithm as lag

    original = lag.ServerProx.__call__
    count = {"n": 0}

    def prox(self, z, s):
        count["n"] += 1
        if count["n"] >= 3:
            raise ss.SubproblemError("the server's proximal step failed (forced)")
        return original(self, z, s)

    monkeypatch.setattr(lag.ServerProx, "__call__", prox)
    with pytest.warns(RuntimeWarning, match="status 'error'"):
        res = prob.solve(method="primal_dual", batch_size=10, max_iter=6, seed=0)
    assert res.status == "error" and res.nit == 2 and len(res.history.t) == 2
    assert "round 3" in res.message and "proximal step failed" in res.message


# -- the KKT diagnostic ------------------------------------------------------------------------
def _box_problem(cancer_data, constrained=False):
    """Logistic regression in a box (the KKT report's linearised step), certified at round
    130 with the default options; ``constrained``: Neyman-Pearson in a box, one stage."""
    from problems.logistic import logistic_loss

    if constrained:
        return neyman_pearson(cancer_data, 0.15, lam=1e-2, box=0.6)
    return ss.Problem(logistic_loss(name="loss"), dim=31, data=cancer_data,
                      domain=lambda w: [cp.norm(w, "inf") <= 0.05])


def test_a_failing_kkt_report_is_marked_failed_and_the_run_keeps_its_status(
        cancer_data, monkeypatch):
    def fail(self, *args, **kwargs):
        raise ss.SubproblemError("the linearised KKT problem failed at w: 'unbounded' (forced)")

    monkeypatch.setattr(DeterministicPart, "linearized_step", fail)
    res = _box_problem(cancer_data, constrained=True).solve(max_iter=20, seed=0,
                                                           penalty=[100.0])
    assert res.status == "max_iter" and res.nit == 20      # never certified on a failed report
    k = res.kkt
    assert k.failed and k.multiplier_source.startswith("failed: SubproblemError")
    assert np.isnan(k.stationarity) and np.all(np.isnan(k.multipliers))
    assert np.isnan(k.stationarity_rel) and not k.passed(1e-4, 1e-4)
    assert np.all(np.isfinite(k.feasibility)) and k.feasibility.shape == (1,)
    assert np.isnan(k.max_residual)
    assert k.residuals(1e-4, 1e-4)[0][0] == "stationarity"
    assert "could not be computed" in res.message and "'unbounded'" in res.message
    # a failing residual of a failed report is named as not computed, never quoted as a
    # value "stationarity = nan > 0.0001" (S2MPJ's TRUSPYR2 said so at stop 30)
    assert "= nan" not in res.message.lower(), res.message
    status, message = st.not_passed(20, k.residuals(1e-4, 1e-4)[0], "more rounds")
    assert "stationarity could not be computed at the returned point" in message, message
    text = res.report()
    assert "KKT           not computed (failed: SubproblemError" in text
    assert np.isfinite(res.fun) and len(res.history.t) == 20


def test_a_converged_run_ends_with_the_report_that_passed_without_computing_it_again(
        cancer_data, monkeypatch):
    """The stop test passed at an evaluation: the run's final report is that test's report and
    evaluation (no second full-data pass and no second fit at the same point), so a fit that
    would fail if asked again at the end cannot turn the certificate into a NaN report."""
    original = DeterministicPart.linearized_step
    calls = {"n": 0, "limit": None}

    def step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["limit"] is not None and calls["n"] > calls["limit"]:
            raise ss.SubproblemError("forced")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DeterministicPart, "linearized_step", step)
    ref = _box_problem(cancer_data).solve(seed=0)
    assert ref.status == "converged" and not ref.kkt.failed
    calls["limit"], calls["n"] = calls["n"], 0     # one more fit would fail
    res = _box_problem(cancer_data).solve(seed=0)
    assert calls["n"] == calls["limit"]
    assert res.status == "converged" and res.nit == ref.nit and not res.kkt.failed
    assert res.kkt.stationarity == pytest.approx(ref.kkt.stationarity, rel=1e-6)
    assert "could not be computed" not in res.message
    assert res.fun == ref.fun and np.array_equal(res.x, ref.x)


def test_no_point_is_fitted_twice(cancer_data, monkeypatch):
    """The KKT fit runs once per tested point: the final report of a converged run does not
    repeat the passing test's."""
    from ssca_solver.engine.session import Session
    original, points = Session.kkt, []

    def kkt(self, state, ev, *args):
        points.append(np.array(state.w))
        return original(self, state, ev, *args)

    monkeypatch.setattr(Session, "kkt", kkt)
    res = _box_problem(cancer_data).solve(seed=0)
    assert res.status == "converged" and len(points) >= 1
    assert np.array_equal(points[-1], res.x)
    assert not any(np.array_equal(points[i], points[j])
                   for i in range(len(points)) for j in range(i))


def test_the_linearised_kkt_step_retries_recentred(monkeypatch):
    """The linearised KKT problem failing in its first form (both tolerances) is solved in
    the other (at |w| = 2e3, below RECENTRE_FIRST: in u first, then recentred at w), with the
    same step and multipliers; the step length the KKT report gives, max(1, |w|) / |g|."""
    d = 4
    det = DeterministicPart([], [lambda w: [w >= 1e3, w <= 1e3 + 1]], d)
    # the CVXPY forms (a box goes to Clarabel directly first: they are its fallback)
    monkeypatch.setattr(det, "box_terms", lambda: None)
    rng = np.random.default_rng(0)
    w = 1e3 + rng.uniform(0, 1, d)
    g0, G, cons = rng.normal(size=d), rng.normal(size=(d, 1)), np.array([-0.1])
    t = float(np.linalg.norm(w)) / float(np.linalg.norm(g0))
    u_ref, mu_ref, duals_ref, _ = det.linearized_step(w, g0, G, cons, step=t)
    calls = {"n": 0}

    def solve(problem, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise cp.error.SolverError("forced")
        return ORIGINAL_SOLVE(problem, *args, **kwargs)

    monkeypatch.setattr(cp.Problem, "solve", solve)
    u, mu, duals, _ = det.linearized_step(w, g0, G, cons, step=t)
    assert calls["n"] == 3
    np.testing.assert_allclose(u, u_ref, atol=1e-6)
    np.testing.assert_allclose(mu, mu_ref, atol=1e-6)
    calls["n"] = -100                                  # every attempt fails
    with pytest.raises(ss.SubproblemError, match="linearised KKT problem"):
        det.linearized_step(w, g0, G, cons, step=t)


def test_a_status_decision_whose_diagnostic_fails_gives_status_error(np_problem, monkeypatch):
    from ssca_solver.methods.ssca.algorithm import SSCA

    def status(self, outcome):
        raise cp.error.SolverError("forced in the status decision")

    monkeypatch.setattr(SSCA, "status", status)
    with pytest.warns(RuntimeWarning, match="status 'error'"):
        res = np_problem.solve(max_iter=3, **OPTS)
    assert res.status == "error" and res.nit == 3 and "status decision" in res.message
    assert np.isfinite(res.fun)


# -- a real badly scaled problem --------------------------------------------------------------
def test_a_badly_scaled_problem_with_bounds_runs_to_the_end():
    """HS114-like bounds (up to 16000) and start point: Clarabel answered "solver_error" at
    every setting from round 1 (SubproblemError before this change); the recentred retry solves
    it, so the run ends with a status of its own."""
    data = ss.FederatedData([(np.zeros((1, 1)), np.zeros(1))])
    lo = np.array([1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 85, 90, 3, 1.2, 145])
    hi = np.array([2000, 16000, 120, 5000, 2000, 93, 95, 12, 4, 162])
    x0 = np.array([1745, 12000, 110, 3048, 1974, 89.2, 92.8, 8, 3.6, 145.0])
    c = np.array([5.04, 0.035, 10, 0, 3.36, 0, 0, 0, 0, 0])

    def grad(w, X, y):
        g = c.copy()
        g[3] -= 0.063 * w[6]
        g[6] -= 0.063 * w[3]
        return g

    f = ss.SampleFunction(lambda w, X, y: np.full(len(X), c @ w - 0.063 * w[3] * w[6]), grad,
                          name="cost")
    cons = []
    for a, b in (([0, 0, 0, 0, 0, 0, 0, 0, -0.9, -0.222], 35.82),
                 ([0, 0, 0, 0, 0, 0, 3, 0, 0, -0.99], -133.0)):
        a = np.array(a, dtype=float)
        cons.append(ss.SampleFunction(lambda w, X, y, a=a, b=b: np.full(len(X), -(b + a @ w)),
                                      lambda w, X, y, a=a: -a, name=f"g{len(cons)}") <= 0.0)
    prob = ss.Problem(f, cons, dim=10, data=data, domain=lambda w: [w >= lo, w <= hi])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)        # inaccurate rounds
        res = prob.solve(x0=x0, check_gradients=False, hessian="lbfgs")
        default = prob.solve(x0=x0, check_gradients=False)
    assert res.status == default.status == "converged", (res.message, default.message)
    assert np.all(default.x >= lo - 1e-6) and np.all(default.x <= hi + 1e-6)
    # (the quasi-Newton model's rounds; "auto" runs the Newton model here on differenced
    # gradients, whose path differs)
    # the rounds are solved in the step from the round's point (the local form): the first
    # round, at the probe's tau, needs no retry at all (once tau is far below the bounds'
    # scale some rounds still take the recentred retry, and one or two end inaccurate)
    assert res.history.retries[0] == 0
    assert np.all(res.x >= lo - 1e-6) and np.all(res.x <= hi + 1e-6)
    # without the local form (it is what a builder that cannot recentre gets), the recentred
    # retries still rescue the rounds
    from ssca_solver.model.surrogates import ProximalLinear
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("ignore", RuntimeWarning)
        mp.setattr(ProximalLinear, "recentre", lambda self, stats, center: None)
        res = prob.solve(x0=x0, max_iter=5, check_gradients=False)
    assert res.status != "error" and res.nit >= 5
    assert res.history.retries.max() >= 4                      # the recentred retries ran
    assert np.all(res.x >= lo - 1e-6) and np.all(res.x <= hi + 1e-6)


# -- user errors still raise at once -------------------------------------------------------------
def test_an_empty_domain_is_the_users_error_and_raises(cancer_data):
    from problems.logistic import logistic_loss

    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data,
                      domain=lambda w: [w >= 1, w <= 0])
    with pytest.raises(ss.ModelError, match="domain alone .* is infeasible") as info:
        prob.solve(batch_size=5, max_iter=3)
    assert isinstance(info.value, ss.SubproblemError) and info.value.state.t == 0


def test_bad_options_raise(np_problem):
    with pytest.raises(ValueError, match="not an installed CVXPY solver"):
        np_problem.solve(subproblem="cvxpy", solver="NO_SUCH_SOLVER", max_iter=2)
    with pytest.raises(ValueError, match="tau"):
        np_problem.solve(tau=0)
    with pytest.raises(TypeError, match="max_iters"):
        np_problem.solve(max_iters=3)
    with pytest.raises(TypeError, match="bogus"):           # passed through to Clarabel
        np_problem.solve(subproblem="cvxpy", solver_options={"bogus": 1}, max_iter=2)


def test_a_bad_gradient_and_a_bad_shape_raise(cancer_data):
    from problems.logistic import logistic_loss

    loss = logistic_loss()
    nan = ss.SampleFunction(loss.value, lambda w, X, y: np.full(31, np.nan), name="nan grad")
    with pytest.raises(ss.UserFunctionError, match="nan grad"):
        ss.Problem(nan, dim=31, data=cancer_data).solve(max_iter=3, subproblem="cvxpy")
    bad = ss.SampleFunction(lambda w, X, y: np.ones(3), loss.grad, name="bad")
    with pytest.raises(ss.UserFunctionError, match="shape"):
        ss.Problem(bad, dim=31, data=cancer_data).solve(max_iter=2)


def test_divergence_raises(cancer, cancer_data):
    sq = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                           lambda w, X, y: X.T @ (X @ w - y) / len(y), name="squared error")
    with pytest.raises(ss.DivergenceError):
        ss.Problem(sq, dim=cancer[0].shape[1], data=cancer_data).solve(tau=0.1, seed=0,
                                                                         batch_size="grow")


def test_a_client_error_with_on_client_failure_raise_raises(np_problem):
    from ssca_solver.federated import InProcessTransport, register_transport

    class FailingAtRound3(InProcessTransport):
        def stream(self, request, *args, **kwargs):
            if request.task == "ssca.round" and request.round == 3:
                raise ss.ClientError(1, 3, "forced")
            yield from super().stream(request, *args, **kwargs)

    register_transport("failing_at_round_3", lambda clients, timeout: FailingAtRound3(clients))
    with pytest.raises(ss.ClientError, match="client 1, round 3") as info:
        np_problem.solve(max_iter=5, transport="failing_at_round_3", **OPTS)
    assert info.value.state.t == 2


def test_a_runtime_error_in_the_callback_raises(np_problem):
    def callback(it):
        raise RuntimeError("the user's own bug")

    with pytest.raises(RuntimeError, match="the user's own bug") as info:
        np_problem.solve(max_iter=3, callback=callback, **OPTS)
    assert info.value.state.t == 1


@pytest.mark.parametrize("where", ["subproblem", "callback"])
def test_ctrl_c_raises(np_problem, monkeypatch, where):
    if where == "subproblem":
        def interrupt(problem, *args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(cp.Problem, "solve", interrupt)
        callback = None
    else:
        def callback(it):
            if it.t == 2:
                raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        np_problem.solve(max_iter=4, callback=callback, **OPTS)


def test_library_failure_classifies_exceptions():
    from ssca_solver.engine.session import diagnostic_failure, library_failure

    assert library_failure(ss.SubproblemError("x"))
    assert library_failure(cp.error.SolverError("x"))
    assert not library_failure(RuntimeError("a callback's own error"))
    assert diagnostic_failure(RuntimeError("nnls: iteration limit"))
    assert not diagnostic_failure(ss.ClientError(0, 1, "x"))
    for exc in (cvxpy_backend.EmptyDomainError("x"), ss.UserFunctionError("x"),
                ss.ModelError("x"), ValueError("x"), TypeError("x"), ss.DivergenceError("x"),
                ss.ClientError(0, 1, "x"), KeyboardInterrupt(), ss.DataError("x")):
        assert not library_failure(exc), exc
    assert "error" in st.STATUSES and st.ERROR == "error"


def _barrier_problem(rows=1):
    """min -w - 0.01 log(2 - w): the minimum w* = 1.99 sits next to the edge of the
    function's domain, and the first full-batch steps (tau from the curvature 0.0025 at 0)
    jump past w = 2, where the value is NaN. ``rows`` per client."""
    data = ss.FederatedData([(np.zeros((rows, 1)), None), (np.zeros((rows, 1)), None)])

    def value(w, X, y):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.full(len(X), -w[0] - 0.01 * np.log(2.0 - w[0]))

    def grad(w, X, y):
        return np.array([-1.0 + 0.01 / (2.0 - w[0])])

    return ss.Problem(ss.SampleFunction(value, grad, name="barrier"), dim=1, data=data)


@pytest.mark.parametrize("x0", [0.0, 1.0, 1.9])
def test_a_trial_point_outside_a_functions_domain_is_a_rejected_step(x0):
    """Full batches with the default options: a backtracking trial point where the function
    is NaN is rejected (the clients say so instead of raising) and the step retried from the
    last accepted point with a larger tau; the scheduled evaluation at such a point is
    skipped. The run is certified at w* = 1.99 (it raised UserFunctionError at round 2)."""
    res = _barrier_problem().solve(seed=0, x0=np.array([x0]), max_iter=500)
    assert res.status == "converged", res.message
    assert res.x[0] == pytest.approx(1.99, abs=1e-6)
    assert res.history.rejected.sum() >= 1


def test_a_non_finite_value_still_raises_where_no_step_can_be_rejected():
    """With a fixed mini-batch (sampled rounds: B = 1 of 2 rows, no merit test) the same point
    is the iterate itself: a function that is not finite there is the user's error, as
    before. (On full batches, a fixed tau included, it is a rejected step:
    tests/test_full_batch_guard.py.)"""
    with pytest.raises(ss.UserFunctionError, match="non-finite"):
        _barrier_problem(rows=2).solve(seed=0, x0=np.array([0.0]), batch_size=1, tau=1e-3,
                                       max_iter=50)


@pytest.mark.parametrize("hessian", ["auto", "lbfgs"])
def test_a_penalised_problem_unbounded_below_is_named_as_such(hessian):
    """min -w^3 s.t. w^2 <= 1 from w = 30 with c = 10: the exact penalty -w^3 + c (w^2 - 1)_+
    falls without bound as w grows, every accepted step lowers it, and the iterates run away.
    The DivergenceError says the penalised problem has no minimiser (and what to do), not
    that the solver's steps were too long."""
    data = ss.FederatedData([np.zeros((2, 1)), np.zeros((3, 1))])
    cube = ss.SampleFunction(lambda w, X, y: np.full(len(X), -w[0] ** 3),
                             lambda w, X, y: np.array([-3 * w[0] ** 2]), name="cube",
                             hess=lambda w, X, y: np.array([[-6 * w[0]]]))
    sq = ss.SampleFunction(lambda w, X, y: np.full(len(X), w[0] ** 2),
                           lambda w, X, y: np.array([2 * w[0]]), name="square",
                           hess=lambda w, X, y: np.array([[2.0]]))
    prob = ss.Problem(cube, [sq <= 1.0], dim=1, data=data)
    with pytest.raises(ss.DivergenceError) as info:
        prob.solve(x0=[30.0], penalty=[10.0], seed=0, hessian=hessian)
    msg = str(info.value)
    assert "has no minimiser along this path" in msg and "domain=" in msg, msg
    assert "penalty=[...]" in msg and "please report" not in msg, msg


def test_sampled_rounds_keep_the_general_divergence_message(cancer, cancer_data):
    """Outside the backtracking regime (sampled rounds with a fixed tau far too small, which
    diverge from w = 0) nothing says every step lowered the merit: the message stays the
    general one."""
    sq = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                           lambda w, X, y: X.T @ (X @ w - y) / len(y), name="squared error")
    with pytest.raises(ss.DivergenceError) as info:
        ss.Problem(sq, dim=cancer[0].shape[1], data=cancer_data).solve(tau=0.1, seed=0,
                                                                         batch_size="grow")
    assert "has no minimiser" not in str(info.value)
