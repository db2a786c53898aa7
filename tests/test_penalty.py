"""Algorithm 2's penalty continuation (Theorem 2 and the paragraph after it), and statuses."""

import numpy as np
import pytest

import ssca_solver as ss
from problems.neyman_pearson import neyman_pearson


def test_continuation_drives_the_slack_to_zero(cancer_data):
    # mu* = 0.74 at alpha = 0.1: c = 0.1 and 0.3 are below it, so the penalised problem prefers
    # to violate the constraint; c = 10 is exact and the slack vanishes.
    res = neyman_pearson(cancer_data, alpha=0.1).solve(
        batch_size=50, tau=0.1, max_iter=900, penalty=[0.1, 0.3, 10.0], seed=0,
        eval_every=None)
    norms = [s.slack_norm for s in res.stages]
    assert [s.penalty for s in res.stages] == [0.1, 0.3, 10.0]
    assert norms[0] > 1e-2 and norms[1] > 1e-3 and norms[0] > norms[1]
    assert norms[2] <= 1e-3
    # no evaluation, so no stopping test: whatever the slack, no success is claimed
    assert res.status == "max_iter" and not res.success and res.penalty == 10.0
    assert res.constraints[0] < 5e-3
    assert np.all(np.diff(res.history.penalty) >= 0)  # c only increases, stage after stage
    assert res.nit == 900


def test_a_penalty_large_enough_is_kept_and_the_kkt_test_stops_the_run(cancer_data):
    res = neyman_pearson(cancer_data, alpha=0.1).solve(penalty=[0.1, 10.0, 1000.0],
                                                       max_iter=900, seed=0)
    assert res.status == "converged" and res.penalty == 10.0
    assert [s.penalty for s in res.stages] == [0.1, 10.0]
    assert res.nit < 600 and res.kkt.passed(1e-4, 1e-4)


def test_a_small_slack_keeps_c_for_the_next_stage(cancer_data):
    """Once a stage's slack is small, c is exact: the remaining stages keep it."""
    res = neyman_pearson(cancer_data, alpha=0.2).solve(
        batch_size=50, tau=0.1, max_iter=300, penalty=[10.0, 100.0, 1000.0], seed=0,
        eval_every=None)
    assert [s.penalty for s in res.stages] == [10.0, 10.0, 10.0]


def test_an_infimum_at_infinity_is_not_called_infeasible_while_the_violation_falls(
        cancer_data):
    """The logistic loss is positive, so mean loss <= -0.05 cannot hold; but its infimum 0 is
    approached only as |w| -> infinity, the violation keeps falling, and that is no evidence
    of infeasibility yet (the suite's infeasible problem, whose violation settles, is reported
    "infeasible": tests/test_suite.py)."""
    res = neyman_pearson(cancer_data, alpha=-0.05).solve(max_iter=200, penalty=[1.0, 10.0],
                                                         seed=0, hessian="none")
    assert res.status == "max_iter" and not res.success
    assert "no feasible point was found" in res.message
    assert "still decreasing" in res.message and "no evidence of infeasibility" in res.message
    assert res.constraints[0] > 0.04 and res.kkt.feasibility[0] > 0.04


def test_a_penalised_optimum_that_violates_asks_for_a_larger_penalty(cancer_data):
    """The same with the quasi-Newton model: the full-batch phase solves the penalised problem
    at the largest c = 10 (its violation settles at 0.0614 while |w| = 8.2), which is not a
    minimiser of the violation: no evidence of infeasibility, and the advice is a larger c,
    not a fixed mini-batch's (the run's batches are not fixed)."""
    res = neyman_pearson(cancer_data, alpha=-0.05).solve(max_iter=200, penalty=[1.0, 10.0],
                                                         seed=0)
    assert res.status == "max_iter" and not res.success
    assert "no evidence of infeasibility" in res.message
    assert "larger penalties" in res.message and "mini-batch" not in res.message
    assert res.constraints[0] > 0.04


def test_a_feasible_problem_stopped_early_is_not_called_infeasible(cancer, cancer_data):
    """Started at a feasible point with far too small a c, the run ends violating the
    constraint; an evaluated iterate was feasible, so the status is max_iter, not infeasible."""
    from problems.neyman_pearson import pooled_reference

    X, y = cancer
    w, *_ = pooled_reference(X, y, 0.15, lam=1e-3)          # feasible for U = 0.2
    res = neyman_pearson(cancer_data, 0.2).solve(x0=w, penalty=[1e-4], max_iter=40,
                                                 eval_every=5, seed=0)
    assert res.history.constraints[0, 0] < 0 < res.constraints[0]
    assert res.status == "max_iter" and "larger penalties" in res.message
    assert "was feasible" in res.message                    # the evidence against infeasible


def _diabetes(U):
    from conftest import diabetes_older_group

    prob, X, Y, (_, old) = diabetes_older_group(U)
    return prob, X, Y, old


def test_a_noisy_point_outside_a_feasible_bound_is_not_called_infeasible():
    """The walkthrough's section 3: B = 20, tau = 0.5 scatters the iterates around a feasible
    bound (U = 0.228 > min 0.2236). Every other piece of evidence says "infeasible" (no
    feasible evaluation, violation stalled, slack above slack_tol at the largest c); the
    returned point is no stationary point of the violation (measured: gradient 0.03 of the
    start's), so the status is max_iter. Was a false "infeasible". The schedules are those
    of the walkthrough's run (rho = 0.9/t^0.4, gamma = 0.9/t^0.55 on rounds); with the
    default EpochStep ones the violation is still falling at the end (another piece of
    evidence against "infeasible"), checked too."""
    prob, X, Y, old = _diabetes(0.228)
    res = prob.solve(batch_size=20, tau=0.5, seed=0, max_iter=1200, penalty=[10.0, 100.0],
                     rho=ss.PowerStep(0.9, 0.4), gamma=ss.PowerStep(0.9, 0.55))
    assert res.status == "max_iter" and res.constraints[0] > 0
    assert "does not minimise the violation" in res.message
    r = np.linalg.norm(old.grad(res.x, X, Y)) / np.linalg.norm(old.grad(np.zeros(11), X, Y))
    assert r > 1e-2
    res = prob.solve(batch_size=20, tau=0.5, seed=0, max_iter=1200, penalty=[10.0, 100.0])
    assert res.status == "max_iter" and res.constraints[0] > 0
    assert "violation was still decreasing" in res.message


def test_an_unreachable_bound_is_infeasible_at_a_minimiser_of_the_violation():
    """U = 0.22 < min 0.2236: the point ends where grad F_1 ~ 0 (a minimiser of the convex
    violation), checked here with the function's own gradient on the pooled rows."""
    prob, X, Y, old = _diabetes(0.22)
    res = prob.solve(seed=0, max_iter=1600)
    assert res.status == "infeasible", res.message
    assert "stationary point of the violation" in res.message
    # the evaluations it names are the history's (on full batches most are the rounds' own,
    # not a schedule every eval_every rounds)
    assert f"none of the run's {len(res.history.eval_t)} full-data evaluations" in res.message
    r = np.linalg.norm(old.grad(res.x, X, Y)) / np.linalg.norm(old.grad(np.zeros(11), X, Y))
    assert r <= 1e-3


def test_violation_stationarity_with_a_box_domain_is_the_projected_step():
    """Against the projection onto a box done by hand (np.clip)."""
    import cvxpy as cp

    from ssca_solver.model.deterministic import DeterministicPart
    from ssca_solver.diagnostics.evaluation import Evaluation, ProblemTerms
    from ssca_solver.diagnostics.kkt import violation_stationarity

    det = DeterministicPart([], [lambda w: [cp.abs(w) <= 1.0]], 3)
    w = np.array([1.0, 0.2, -1.0])
    G = np.array([[-2.0, 0.5, 3.0]])      # outward at the two bounds, inward in between
    terms = ProblemTerms(False, np.array([0.0]), det)
    ev = Evaluation(np.array([0.5]), G, 0, 0)      # violated by 0.5
    r = violation_stationarity(w, ev, terms, 1e-4, scale=1.0)
    expected = np.linalg.norm(np.clip(w - G[0], -1, 1) - w)
    assert abs(r - expected) <= 1e-6 and abs(expected - 0.5) <= 1e-12


def test_a_saddle_of_the_violation_is_not_called_infeasible():
    """F(w) = mean_n 1 + x_n (w_1^2 - w_2^2) <= 0.5 is feasible (any |w_2| >= 0.71), but from
    w = 0 its gradient is 0 and SSCA cannot move: every piece of evidence says "infeasible",
    including a vanishing gradient of the violation. The second difference along random
    directions drops (negative curvature along w_2): a saddle, so the status is max_iter."""
    import cvxpy as cp

    import ssca_solver as ss

    rng = np.random.default_rng(0)
    x = 1.0 + 0.1 * rng.standard_normal((200, 1))
    F = ss.SampleFunction(lambda w, X, y: 1.0 + X[:, 0] * (w[0] ** 2 - w[1] ** 2),
                          lambda w, X, y: X[:, 0].mean() * np.array([2 * w[0], -2 * w[1]]),
                          name="saddle")
    prob = ss.Problem(lambda w: cp.sum_squares(w), [F <= 0.5], dim=2,
                      data=ss.FederatedData.split(x, None, num_clients=4, seed=0))
    res = prob.solve(seed=0, x0=np.zeros(2), max_iter=200, batch_size=10, tau=1.0)
    assert np.allclose(res.x, 0.0) and res.constraints[0] > 0.4
    assert res.status == "max_iter", res.message
    assert "saddle of the violation" in res.message


def test_too_few_evaluations_to_judge_the_violation_say_so(cancer_data):
    """A last stage with fewer than 4 evaluations: the message said 'smallest nan in the first
    half ...'; it now says there were too few evaluations. (A fixed batch: sampled rounds are
    evaluated only every eval_every rounds; with batch_size="auto" the batch is full from
    round 21 since GROW_EVERY = 10, and full-batch rounds are evaluations of their own.)"""
    res = neyman_pearson(cancer_data, alpha=0.01).solve(max_iter=40, eval_every=10,
                                                        penalty=[1.0, 10.0], seed=0,
                                                        batch_size=16)
    assert res.status == "max_iter"
    assert "nan" not in res.message and "fewer than 4" in res.message, res.message


def test_the_forces_that_balance_the_gradients():
    """force_multipliers: min |g + G mu| over mu >= 0 (free sign for an equality), with no
    complementarity rows; checked against the balance written out."""
    from ssca_solver.diagnostics.kkt import force_multipliers

    a, b = np.array([1.0, 2.0, 0.0]), np.array([0.0, 1.0, -1.0])
    g = -3.0 * a + 2.0 * b
    # b pushes the wrong way for an inequality: its force is 0, and a's is the projection
    mu = force_multipliers(g, np.column_stack([a, b]))
    assert mu[1] == 0.0 and mu[0] == pytest.approx(-(g @ a) / (a @ a), rel=1e-12)
    # as an equality b balances exactly: the residual vanishes
    mu = force_multipliers(g, np.column_stack([a, b]), equality=[False, True])
    np.testing.assert_allclose(mu, [3.0, -2.0], rtol=1e-12)


def test_a_stage_far_below_the_multiplier_is_ended_by_the_forces(cancer_data):
    """At c = 0.01 against a multiplier of 0.41 the full-batch rounds settle at a point that
    violates the constraint (slack 0.29); there the KKT fit, which also asks mu (F - U) = 0,
    stayed below c / 2, and the stage ran 58 rounds before c was raised; the forces that
    balance the gradients there are c, and end it in a few."""
    res = neyman_pearson(cancer_data, alpha=0.1).solve(
        batch_size="full", penalty=[0.01, 0.1, 1.0, 10.0], max_iter=900, seed=0)
    assert res.status == "converged" and res.kkt.passed(1e-4, 1e-4)
    assert res.stages[0].penalty == 0.01 and res.stages[0].slack_norm > 0.2
    assert res.stages[0].rounds <= 20
    assert res.kkt.multipliers[0] == pytest.approx(0.4147, rel=1e-3)


def test_the_forces_of_dependent_equalities_are_a_least_squares_balance():
    """Equalities with dependent gradients (rank 5 of 29, as in a system of equations): the
    forces reach the least-squares residual of the balance, whatever the split."""
    from ssca_solver.diagnostics.kkt import force_multipliers

    rng = np.random.default_rng(0)
    G = rng.normal(size=(29, 5)) @ rng.normal(size=(5, 29))
    g = rng.normal(size=29)
    mu = force_multipliers(g, G, equality=np.ones(29, dtype=bool))
    best = np.linalg.norm(g + G @ np.linalg.lstsq(G, -g, rcond=None)[0])
    assert np.linalg.norm(g + G @ mu) == pytest.approx(best, rel=1e-8)
    np.testing.assert_array_equal(force_multipliers(np.zeros(29), G, np.ones(29, bool)), 0.0)


def test_a_failed_force_fit_is_no_evidence_and_loses_no_run(cancer_data, monkeypatch):
    """SciPy's nnls ran out of iterations inside the forces' fit on two S2MPJ systems of
    equations (HYDCAR6, POWERSUMNE) and the runs raised; a fit that fails is now no evidence
    and the run goes on as if there were none."""
    from ssca_solver.methods.ssca import continuation

    calls = []

    def fails(*_):
        calls.append(1)
        raise RuntimeError("Maximum number of iterations reached.")

    opts = dict(batch_size="full", penalty=[0.01, 0.1, 1.0, 10.0], max_iter=900, seed=0,
                hessian="lbfgs")
    monkeypatch.setattr(continuation, "kkt_forces", fails)
    res = neyman_pearson(cancer_data, alpha=0.1).solve(**opts)
    # the fit was asked for and failed; without its evidence the first stage (c = 0.01, far
    # below the multiplier 0.41) ends on the KKT fit's or the violation's, and the run is
    # still certified, with c raised past the multiplier
    assert calls
    assert res.status == "converged" and res.penalty > 0.41
    assert res.stages[0].penalty == 0.01 and len(res.stages) >= 2


def test_a_saturated_stage_raises_c_after_two_rounds():
    """S2MPJ's HS72 (Hock & Schittkowski's optimal sample sizing, written out): the
    multipliers at the optimum (f* = 727.67937) are far above the first c = 100, so the
    quasi-Newton subproblems keep a slack at multiplier c; with the full-data forces above
    c / 2 two such rounds in a row end the stage (with five the run took 68 rounds, 41 of
    them in the stage at c = 1e4; SLSQP: 25 iterations)."""
    data = ss.FederatedData([np.zeros((1, 1))])
    f = ss.SampleFunction(lambda w, X, y: np.full(len(X), 1.0 + w.sum()),
                          lambda w, X, y: np.ones(4), name="f")

    def at_most(c, u):          # sum_j c_j / w_j <= u, as S2MPJ writes it: u - sum >= 0
        return ss.SampleFunction(lambda w, X, y: np.full(len(X), u - c @ (1.0 / w)),
                                 lambda w, X, y: c / w ** 2, name="g") >= 0.0

    hi = np.array([4e5, 3e5, 2e5, 1e5])
    res = ss.Problem(f, [at_most(np.array([4.0, 2.25, 1.0, 0.25]), 0.0401),
                         at_most(np.array([0.16, 0.36, 0.64, 0.64]), 0.010085)],
                     dim=4, data=data, domain=lambda w: [w >= 1e-3, w <= hi]).solve(
        seed=0, x0=np.ones(4))
    assert res.status == "converged", res.message
    assert res.fun == pytest.approx(727.67937, rel=1e-4)
    assert np.max(res.constraints) <= 1e-4
    assert res.nit <= 30, [(s.penalty, s.rounds) for s in res.stages]


def _box_volume(inequality: bool):
    """Max x1 x2 x3 s.t. x1 + 2 x2 + 2 x3 = 72 (Hock & Schittkowski's HS37 family; <= with
    x >= 0 for ``inequality``): x* = (24, 12, 12), f* = -3456, multiplier 144. The objective
    is cubic: at c below 144 the exact penalty has no minimiser, and from x0 = (1, 1, 1) the
    accepted steps run away geometrically (|w| 24 -> 702 -> 8.5e4 at c = 100)."""
    data = ss.FederatedData([np.zeros((1, 1))])

    def fn(value, grad, name):
        return ss.SampleFunction(lambda w, X, y: np.full(len(X), value(w)),
                                 lambda w, X, y: grad(w), name=name)

    f = fn(lambda w: -w[0] * w[1] * w[2],
           lambda w: -np.array([w[1] * w[2], w[0] * w[2], w[0] * w[1]]), "f")
    budget = fn(lambda w: w[0] + 2 * w[1] + 2 * w[2], lambda w: np.array([1.0, 2.0, 2.0]),
                "budget")
    if not inequality:
        return ss.Problem(f, [budget == 72.0], dim=3, data=data)
    positive = [fn((lambda i: lambda w: -w[i])(i), (lambda i: lambda w: -np.eye(3)[i])(i),
                   f"x{i}") <= 0.0 for i in range(3)]
    return ss.Problem(f, [budget <= 72.0] + positive, dim=3, data=data)


@pytest.mark.parametrize("inequality, start", [(False, 1.0), (False, 20.7), (True, 1.0)])
def test_a_stage_whose_iterates_ran_away_is_restarted_from_the_anchor(monkeypatch, inequality,
                                                                       start):
    """At c = 100, below the multiplier 144, the penalised cubic has no minimiser and the
    iterates run away (without the restart: a DivergenceError at round 6 to 10 however c
    rose; from (20.7, 20.7, 20.7) the inequality version stays bounded and needs none); the
    stage ends on the saturation evidence and the next c starts from the run's least-violated
    accepted point, not from |w| ~ 1e4, and reaches x*."""
    from ssca_solver.methods.ssca import continuation

    restarts = []
    original = continuation.restart_point

    def spy(cfg, state):
        point = original(cfg, state)
        restarts.append(point is not None)
        return point

    monkeypatch.setattr(continuation, "restart_point", spy)
    # the quasi-Newton model's run (under "auto" the clients difference the gradients here,
    # and the Newton model's iterates reach x* without running away: checked below)
    res = _box_volume(inequality).solve(seed=0, x0=np.full(3, start), hessian="lbfgs")
    assert res.status == "converged", res.message
    assert res.x == pytest.approx([24.0, 12.0, 12.0], rel=1e-3)
    assert res.fun == pytest.approx(-3456.0, rel=1e-4)
    assert any(restarts)
    assert res.stages[0].penalty == 100.0 and res.penalty > 144.0
    default = _box_volume(inequality).solve(seed=0, x0=np.full(3, start))
    assert default.status == "converged", default.message
    assert default.x == pytest.approx([24.0, 12.0, 12.0], rel=1e-3)


@pytest.mark.parametrize("inequality, start", [(True, 15.0), (True, 18.0), (True, 20.7)])
def test_a_saturated_stage_that_stays_bounded_goes_on_from_where_it_ended(monkeypatch,
                                                                         inequality, start):
    """The restart is for runaways only: from these starts c = 100 is too small as well (the
    stage ends on saturation and c rises to 1000), but the iterates stay bounded and the next
    stage starts where the last one ended. (From x0 = 10, and with the equality from every
    start tried, 5 to 20.7, the stage at c = 1000 runs away as well and the third stage
    restarts from the anchor: the runaway tests' path.)"""
    from ssca_solver.methods.ssca import continuation

    restarts = []
    original = continuation.restart_point

    def spy(cfg, state):
        point = original(cfg, state)
        restarts.append(point)
        return point

    monkeypatch.setattr(continuation, "restart_point", spy)
    res = _box_volume(inequality).solve(seed=0, x0=np.full(3, start))
    assert res.status == "converged", res.message
    assert res.x == pytest.approx([24.0, 12.0, 12.0], rel=1e-3)
    assert [s.penalty for s in res.stages] == [100.0, 1000.0]
    assert restarts and all(r is None for r in restarts)
