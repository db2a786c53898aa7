"""Evaluations cost what they must (issue 19): a full-batch round's own statistics are the
full-data evaluation at the point it accepted (the KKT test runs on them without a second pass
over the data), and on sampled rounds the scheduled evaluations keep to ``eval_budget`` of the
clients' work (``eval_budget``: by default 0.15 while the batches of batch_size="auto" grow,
None -- every ``eval_every`` rounds -- at a fixed B)."""

import numpy as np
import pytest

import ssca_solver as ss
from problems.classical import CLASSICAL, problem
from problems.neyman_pearson import neyman_pearson


def test_full_batch_rounds_are_their_own_evaluations():
    c = CLASSICAL["rosenbrock"]
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=2000)
    assert res.status == "converged"
    one = 2 * c.dim + 2            # floats up of one evaluation (values and gradients) ...
    # ... of which there are two: the scale at the start and the returned point
    assert res.communication.eval_up_total <= 2 * (one + 8)
    # the test ran between multiples of eval_every, on the rounds' own evaluations
    assert res.nit % 10 != 0 or np.any(res.history.eval_t % 10 != 0)
    assert len(res.history.eval_t) > res.nit // 10
    # the returned point is the one the passing test evaluated: its full-data report agrees
    assert res.kkt.passed(1e-4, 1e-4)


def test_the_first_order_path_has_them_too():
    """hessian="none" keeps the first-order surrogates; its full-batch rounds still serve as
    evaluations (the same iterates as before, a test at every round)."""
    c = CLASSICAL["quartic"]
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=2000, hessian="none")
    assert res.status == "converged"
    assert len(res.history.eval_t) > res.nit // 10


@pytest.fixture(scope="module")
def cancer_data():
    from ssca_solver.datasets import breast_cancer

    X, y = breast_cancer()
    return ss.FederatedData.split(X, y, num_clients=5, seed=0)


def test_sampled_rounds_keep_the_evaluations_within_budget(cancer_data):
    """B = 10 on 5 clients reads 50 rows a round; an evaluation reads all 569 (with
    gradients). With eval_budget 0.15 one runs once the rounds since the last read
    569 (0.85 / 0.15) = 3224 rows, i.e. every 70 rounds at eval_every = 10; None: every 10."""
    prob = neyman_pearson(cancer_data, 0.2)
    budget = prob.solve(seed=0, batch_size=10, tau=0.5, max_iter=200, eval_budget=0.15)
    every = prob.solve(seed=0, batch_size=10, tau=0.5, max_iter=200)
    # (round 0: the start point's evaluation, which measures the stationarity scale)
    np.testing.assert_array_equal(budget.history.eval_t, [0, 70, 140])
    np.testing.assert_array_equal(every.history.eval_t, np.r_[0, np.arange(10, 201, 10)])
    np.testing.assert_array_equal(budget.x, every.x)       # evaluations do not move iterates
    rows = 569 * (len(budget.history.eval_t) + 1)          # and the final one
    assert budget.communication.eval_up_total < every.communication.eval_up_total
    assert rows <= 0.2 * (200 * 50 + rows)


def test_by_default_only_the_growing_batches_evaluations_are_thinned(cancer_data):
    """eval_budget="auto" (the default): with batch_size="grow" the sampled rounds' scheduled
    evaluations keep to 15 % of the rows read (B = 32 on 5 clients reads 160 rows a round, an
    evaluation 569: rounds 1-10 read too few for one at round 10), then the full-batch
    rounds are their own evaluations; the iterates are those of eval_budget=None. At a fixed
    B, with eval_every given, or when only some clients take part, every eval_every rounds."""
    prob = neyman_pearson(cancer_data, 0.2)
    auto = prob.solve(seed=0, batch_size="grow")
    none = prob.solve(seed=0, eval_budget=None, batch_size="grow")
    assert auto.status == none.status == "converged"
    np.testing.assert_array_equal(auto.x, none.x)           # evaluations do not move iterates
    sampled = np.flatnonzero(auto.history.batch_size < 569 / 5)
    first_full = int(auto.history.t[sampled[-1] + 1])
    paid = auto.history.eval_t[(auto.history.eval_t > 0) & (auto.history.eval_t < first_full)]
    assert 10 in none.history.eval_t and 10 not in paid and len(paid) >= 1
    read = 5 * auto.history.batch_size[sampled].sum()
    assert 569 * (len(paid) - 1) <= 0.15 * (read + 569 * len(paid))
    assert auto.communication.eval_up_total < none.communication.eval_up_total
    fixed = prob.solve(seed=0, batch_size=10, tau=0.5, max_iter=30)
    np.testing.assert_array_equal(fixed.history.eval_t, [0, 10, 20, 30])
    asked = prob.solve(seed=0, eval_every=5, max_iter=20, batch_size="grow")
    np.testing.assert_array_equal(asked.history.eval_t[1:5], [5, 10, 15, 20])
    some = prob.solve(seed=0, clients_per_round=3, max_iter=20)
    np.testing.assert_array_equal(some.history.eval_t[1:3], [10, 20])


def test_eval_budget_is_checked():
    c = CLASSICAL["quartic"]
    for bad in (0.0, 1.5, "a lot"):
        with pytest.raises(ValueError, match="eval_budget"):
            problem(c).solve(x0=c.x0, eval_budget=bad)


def test_a_rounds_statistics_serve_as_its_evaluation_only_when_exact_enough():
    """The values and gradients read from a round's statistics cancel terms as large as
    quad |w|^2: at tau = 6.5e8 and |w| = 1.2e3 they were 0.015 off, a violated constraint read
    as met and a point with relative stationarity 0.048 was certified (S2MPJ's HS75). Such a
    round is not its own evaluation: a paid one (the clients' own values) decides."""
    from types import SimpleNamespace

    from ssca_solver.methods.ssca import adaptive as ad
    from ssca_solver.methods.ssca.algorithm import round_evaluation_exact

    rng = np.random.default_rng(0)
    w = rng.uniform(500.0, 1000.0, size=4)                 # |w| ~ 1.5e3
    f, g = np.array([5142.5, 0.3]), rng.normal(size=(2, 4))

    def stats(tau):
        return [{"const": np.array(f[m] - g[m] @ w + tau * w @ w), "lin": g[m] - 2 * tau * w,
                 "quad": np.array(tau)} for m in range(2)]

    class _OwnEvaluate(ss.ProximalLinear):      # read function by function, not stacked
        def evaluate(self, stats, w):
            return super().evaluate(stats, w)

    for builder in (ss.ProximalLinear(), _OwnEvaluate()):
        fake = SimpleNamespace(options=SimpleNamespace(kkt_tol=1e-4, feas_tol=1e-4), first=1,
                               bound_scale=np.ones(1), builders=(builder, builder))
        for tau, exact in ((6.5e8, False), (1.0, True)):
            st = tuple(stats(tau))
            values = np.array([ss.ProximalLinear().evaluate(s, w) for s in st])
            grads = [ad.surrogate_gradient(s, w) for s in st]
            err = max(np.max(np.abs(values - f)), np.max(np.abs(np.array(grads) - g)))
            assert round_evaluation_exact(fake, st, w, values, grads) is exact
            # what the refusal is about: the read values are that far off (or exact to
            # rounding)
            assert (err > 1e-6) if not exact else (err < 1e-9), err


def test_every_full_batch_round_is_tested_and_the_iterates_do_not_depend_on_the_tolerance():
    """A round's own evaluation is tested at every round, not only once the step is short: at
    kkt_tol=0.1 the quartic's point passes at a round whose next step is still long (more
    than EVIDENCE_STEP |w|, not an eval_every-th round), and the run ends there. Testing
    adds no exchange and changes no iterate: the same rounds at kkt_tol=1e-3 take the same
    steps."""
    from ssca_solver.engine.runner import EVIDENCE_STEP

    c = CLASSICAL["quartic"]
    loose = problem(c).solve(seed=0, x0=c.x0, max_iter=300, kkt_tol=0.1)
    assert loose.status == "converged"
    t = loose.nit
    assert t % 10 != 0
    step = loose.history.step_norm
    assert step[-1] > EVIDENCE_STEP * max(1.0, float(np.linalg.norm(loose.x)))
    assert loose.kkt.passed(1e-4, 0.1) and not loose.kkt.passed(1e-4, 1e-3)
    tight = problem(c).solve(seed=0, x0=c.x0, max_iter=300, kkt_tol=1e-3)
    assert tight.status == "converged" and tight.nit > t
    np.testing.assert_array_equal(tight.history.step_norm[:t], step)
    np.testing.assert_array_equal(tight.history.tau[:t], loose.history.tau)


@pytest.mark.parametrize("name", ["linear_on_circle", "equality_as_two_inequalities"])
def test_the_fit_is_skipped_where_the_violation_alone_fails_the_test(monkeypatch, name):
    """Where a round's own evaluation violates a constraint by more than feas_tol and its
    report would not join the method's evidence, the KKT test cannot pass and its multiplier
    fit is not computed: fewer fits, the same iterates, the same status and final report as
    runs that fit at every round."""
    from ssca_solver.engine import session

    fits = []
    real, exceeds = session.kkt_report, session.feasibility_exceeds

    def counted(w, ev, terms, *args, **kwargs):
        fits.append(exceeds(ev, terms, 1e-4))
        return real(w, ev, terms, *args, **kwargs)

    monkeypatch.setattr(session, "kkt_report", counted)
    # this skip alone (the stationarity screen skips some of the same fits)
    monkeypatch.setattr(session, "stationarity_exceeds", lambda *args: False)
    c = CLASSICAL[name]
    runs = []
    for skip in (True, False):
        if not skip:
            monkeypatch.setattr(session, "feasibility_exceeds", lambda *args: False)
        fits.clear()
        res = problem(c).solve(seed=0, x0=c.x0, max_iter=300)
        runs.append((res, list(fits)))
    (skipped, fits_skipped), (full, fits_full) = runs
    assert skipped.status == full.status == "converged"
    assert skipped.nit == full.nit
    np.testing.assert_array_equal(skipped.history.step_norm, full.history.step_norm)
    np.testing.assert_array_equal(skipped.history.tau, full.history.tau)
    np.testing.assert_array_equal(skipped.x, full.x)
    np.testing.assert_array_equal(skipped.kkt.multipliers, full.kkt.multipliers)
    # the runs that fit every round met violated points; the skipping run fitted fewer
    assert any(fits_full)
    assert len(fits_skipped) < len(fits_full)


def _many_constraints(n=5, m=40):
    """min |w|^2 / 2 + c.w s.t. (a_m.w)^2 <= b_m, m = 1..M, one function per constraint
    (benchmarks/rounds.py's constraints case, smaller)."""
    rng = np.random.default_rng(0)
    A, b, c0 = rng.standard_normal((m, n)) / np.sqrt(n), rng.uniform(0.5, 1.0, m), \
        rng.standard_normal(n)
    f = ss.SampleFunction(lambda w, X, y: np.full(X.shape[0], 0.5 * w @ w + c0 @ w),
                          lambda w, X, y: w + c0, name="f", convexity="convex")
    cons = [ss.SampleFunction((lambda a: lambda w, X, y: np.full(X.shape[0], (a @ w) ** 2))(a),
                              (lambda a: lambda w, X, y: 2.0 * (a @ w) * a)(a),
                              convexity="convex") <= bi for a, bi in zip(A, b)]
    return ss.Problem(f, cons, dim=n, data=ss.FederatedData([np.zeros((1, 1))])), np.zeros(n)


@pytest.mark.parametrize("name", ["rosenbrock_disc", "sixth_power_equality", "two_equalities",
                                  "many_constraints"])
def test_the_fit_is_skipped_where_no_multipliers_can_pass_stationarity(monkeypatch, name):
    """Where a round's report would not join the method's evidence and a lower bound on the
    relative stationarity of any multipliers that pass complementarity exceeds kkt_tol
    (:func:`stationarity_exceeds`), the multiplier fit is not computed: fewer fits, the
    same iterates, the same status and final report as runs that fit at every round."""
    from ssca_solver.engine import session

    fits = []
    real = session.kkt_report

    def counted(*args, **kwargs):
        fits.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "kkt_report", counted)
    if name == "many_constraints":
        prob, x0 = _many_constraints()
    else:
        c = CLASSICAL[name]
        prob, x0 = problem(c), c.x0
    runs = []
    for skip in (True, False):
        if not skip:
            monkeypatch.setattr(session, "stationarity_exceeds", lambda *args: False)
        fits.clear()
        res = prob.solve(seed=0, x0=x0, max_iter=300)
        runs.append((res, len(fits)))
    (skipped, n_skipped), (full, n_full) = runs
    assert skipped.status == full.status == "converged"
    assert skipped.nit == full.nit
    np.testing.assert_array_equal(skipped.history.step_norm, full.history.step_norm)
    np.testing.assert_array_equal(skipped.x, full.x)
    np.testing.assert_array_equal(skipped.kkt.multipliers, full.kkt.multipliers)
    assert skipped.kkt.stationarity_rel == full.kkt.stationarity_rel
    assert n_skipped < n_full
