import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.schedules import check_schedules, resolve, step_value


def test_powerstep_values():
    s = ss.PowerStep(0.6, 0.3)
    assert s(1) == 0.6
    assert np.isclose(s(10), 0.6 / 10 ** 0.3)


@pytest.mark.parametrize("a, alpha", [(0, 0.5), (-1, 0.5), (1, -0.1), (np.inf, 0.5)])
def test_powerstep_rejects_bad_parameters(a, alpha):
    with pytest.raises(ss.ScheduleError):
        ss.PowerStep(a, alpha)


def test_valid_pair_does_not_warn():
    assert check_schedules(ss.PowerStep(0.9, 0.4), ss.PowerStep(0.9, 0.55)) == []


def test_paper_section_vi_choice_violates_sum_gamma_squared():
    # Section VI: rho = a1/t^0.3, gamma = a2/t^0.35 (B = 10); sum gamma^2 diverges
    with pytest.warns(ss.ScheduleWarning, match="sum gamma_t\\^2"):
        issued = check_schedules(ss.PowerStep(0.6, 0.3), ss.PowerStep(0.9, 0.35))
    assert len(issued) == 1


def test_gamma_must_decay_faster_than_rho():
    with pytest.warns(ss.ScheduleWarning, match="gamma/rho"):
        check_schedules(ss.PowerStep(0.9, 0.7), ss.PowerStep(0.9, 0.6))


def test_rho_must_decay():
    with pytest.warns(ss.ScheduleWarning, match="rho"):
        check_schedules(ss.PowerStep(0.5, 0.0), ss.PowerStep(0.9, 0.6))


def test_values_outside_unit_interval_are_errors():
    with pytest.raises(ss.ScheduleError, match=r"rho\(1\) = 1.5"):
        step_value(ss.PowerStep(1.5, 0.5), 1, "rho")
    with pytest.raises(ss.ScheduleError, match="gamma"):
        step_value(lambda t: -0.1, 3, "gamma")
    with pytest.raises(ss.ScheduleError, match="raised at t=2"):
        step_value(lambda t: 1 / (t - 2), 2, "gamma")
    assert step_value(lambda t: 1 / t, 4, "rho") == 0.25


def test_epochstep_values_and_its_clock():
    s = ss.EpochStep(0.3, 0.55)
    assert s(1) == 0.3 and np.isclose(s(10), 0.3 / 10 ** 0.55)   # called directly: R = 1
    clock = s.per_epoch(60.0)                   # 60 rounds per epoch
    assert clock(1) == 0.3
    assert np.isclose(clock(61), 0.3 / 2 ** 0.55) and np.isclose(clock(31), 0.3 / 1.5 ** 0.55)
    with pytest.raises(ss.ScheduleError, match="first value"):
        ss.EpochStep(1.5, 0.5)
    with pytest.raises(ss.ScheduleError):
        ss.EpochStep(0.3, -1.0)
    with pytest.raises(ss.ScheduleError, match="rounds per epoch"):
        s.per_epoch(0.0)


def test_default_schedules_are_epoch_steps_that_satisfy_the_conditions():
    o = ss.SSCAOptions()
    assert o.rho == "auto" and o.gamma == "auto"
    for exact in (False, True):
        rho, gamma = resolve(o.rho, "rho", exact), resolve(o.gamma, "gamma", exact)
        assert isinstance(rho, ss.PowerStep if exact else ss.EpochStep)
        assert check_schedules(rho, gamma) == []
    with pytest.warns(ss.ScheduleWarning, match="sum gamma_t\\^2"):
        check_schedules(ss.EpochStep(0.3, 0.4), ss.EpochStep(0.3, 0.45))
    with pytest.warns(ss.ScheduleWarning, match="gamma/rho"):
        check_schedules(ss.EpochStep(0.3, 0.7), ss.PowerStep(0.9, 0.6))


@pytest.mark.parametrize("B, K", [(10, None), (40, None), (10, 2)])
def test_the_solver_runs_epoch_steps_on_passes_over_the_data(cancer_data, B, K):
    """rho_t = 0.15 / (1 + (t-1) R^-1)^0.4 with R = N / (rows read per round): sum_i min(B, N_i)
    rows, times K/I when K of the I clients take part."""
    from problems.logistic import logistic_loss
    dim = cancer_data.clients[0].X.shape[1]
    prob = ss.Problem(logistic_loss(), dim=dim, data=cancer_data)
    res = prob.solve(batch_size=B, tau=0.1, max_iter=30, seed=0, eval_every=None,
                     clients_per_round=K)
    sizes = cancer_data.client_sizes
    rows = sum(min(B, n) for n in sizes) * (1.0 if K is None else K / len(sizes))
    R = sum(sizes) / rows
    t = np.arange(1, 31)
    np.testing.assert_allclose(res.history.rho, 0.15 / (1 + (t - 1) / R) ** 0.4, rtol=1e-12)
    np.testing.assert_allclose(res.history.gamma, 0.3 / (1 + (t - 1) / R) ** 0.55, rtol=1e-12)
    # a PowerStep keeps counting rounds
    res = prob.solve(batch_size=B, tau=0.1, max_iter=5, seed=0, eval_every=None,
                     rho=ss.PowerStep(0.9, 0.4), gamma=ss.PowerStep(0.9, 0.55),
                     clients_per_round=K)
    np.testing.assert_allclose(res.history.gamma, 0.9 / np.arange(1, 6) ** 0.55, rtol=1e-12)


def test_auto_schedules_follow_the_rounds_regime(cancer_data):
    """Full rows of every client (exact statistics, a numeric tau): 0.9/t^0.4 and 0.9/t^0.55
    on rounds; K < I clients on full rows (sampled): the epoch defaults with R = I/K."""
    from problems.logistic import logistic_loss
    dim = cancer_data.clients[0].X.shape[1]
    prob = ss.Problem(logistic_loss(), dim=dim, data=cancer_data)
    t = np.arange(1, 11)
    res = prob.solve(batch_size="full", tau=0.1, max_iter=10, seed=0, eval_every=None)
    np.testing.assert_allclose(res.history.rho, 0.9 / t ** 0.4, rtol=1e-12)
    np.testing.assert_allclose(res.history.gamma, 0.9 / t ** 0.55, rtol=1e-12)
    res = prob.solve(batch_size="full", tau=0.1, max_iter=10, seed=0, eval_every=None,
                     clients_per_round=2)
    np.testing.assert_allclose(res.history.gamma, 0.3 / (1 + (t - 1) / 2.5) ** 0.55, rtol=1e-12)
    with pytest.raises(ss.ScheduleError):
        prob.solve(batch_size=10, rho="fast", max_iter=2)


def test_auto_is_resolved_once_from_the_options(cancer_data):
    """batch_size="grow" with only rho given: gamma "auto" is the sampled default for the whole
    run (the epoch clock at the batch in force), never switching to the round-counted one."""
    from problems.logistic import logistic_loss
    dim = cancer_data.clients[0].X.shape[1]
    prob = ss.Problem(logistic_loss(), dim=dim, data=cancer_data)
    res = prob.solve(rho=ss.EpochStep(0.3, 0.4), max_iter=150, seed=0, eval_every=None,
                     batch_size="grow")
    full = np.isnan(res.history.batch_size)
    assert full.any() and not full.all()           # the batch reached every row in the run
    g = res.history.gamma
    assert np.all(np.diff(g) <= 1e-15)             # never jumps up
    assert np.all(g <= 0.3) and g[0] == 0.3


def test_ssca_with_the_tau_start_is_heavy_ball(cancer_data):
    """Constant rho, gamma, tau, full batches, no domain: w_2 = (1 - gamma (1 - rho)) w_1 -
    eta g_1, then w_{t+1} = w_t + beta (w_t - w_{t-1}) - eta g_t with eta = gamma rho / (2 tau)
    and beta = (1 - rho)(1 - gamma) (docs/modelling.md, "Step sizes"), against NumPy."""
    from problems.logistic import logistic_loss
    fn = logistic_loss()
    X = np.vstack([c.X for c in cancer_data.clients])
    y = np.concatenate([c.y for c in cancer_data.clients])
    prob = ss.Problem(fn, dim=X.shape[1], data=cancer_data)
    r, g, tau = 0.4, 0.2, 0.7
    ws = []
    prob.solve(batch_size="full", tau=tau, rho=r, gamma=g, max_iter=12, eval_every=None,
               check_gradients=False, callback=lambda it: ws.append(it.x.copy()))
    eta, beta = g * r / (2 * tau), (1 - r) * (1 - g)
    w1 = np.zeros(X.shape[1])
    ref = [w1, (1 - g * (1 - r)) * w1 - eta * fn.grad(w1, X, y)]
    while len(ref) < 13:
        w, prev = ref[-1], ref[-2]
        ref.append(w + beta * (w - prev) - eta * fn.grad(w, X, y))
    np.testing.assert_allclose(ws, ref[1:], rtol=1e-9, atol=1e-12)


def test_auto_tau_with_a_fixed_batch_is_the_heavy_ball_stability_bound(cancer):
    """tau="auto" with a fixed B: max(0.05, gamma_1 rho_1 L / (4 (1 + beta_1))) with L the
    probe's curvature, which batch_size="grow" takes as its tau (both probe 32 rows a client):
    0.05 on the unscaled data, the bound on features x10 and x100 (100x apart: L ~ scale^2)."""
    from problems.logistic import logistic_loss
    X, y = cancer
    r, g = 0.15, 0.3
    coef = g * r / (4 * (1 + (1 - r) * (1 - g)))
    taus = {}
    for scale in (1, 10, 100):
        data = ss.FederatedData.split(X * scale, y, num_clients=5, seed=0)
        prob = ss.Problem(logistic_loss(), dim=X.shape[1], data=data)
        L = prob.solve(max_iter=1, eval_every=None, seed=0,
                       batch_size="grow").history.tau[0]
        taus[scale] = prob.solve(batch_size=32, max_iter=1, eval_every=None,
                                 seed=0).history.tau[0]
        assert taus[scale] == pytest.approx(max(0.05, coef * L), rel=1e-12)
    assert taus[1] == 0.05 and taus[10] > 0.05
    assert taus[100] / taus[10] == pytest.approx(100.0, rel=0.01)    # curvature ~ scale^2


def test_auto_tau_with_k_of_i_clients_is_the_stability_bound_too(cancer):
    """K < I clients per round (batch "grow"): the rounds are sampled, the schedules run, and
    tau="auto" is the same bound as with a fixed B, from the same probe (every client answers
    it); with every client the probe's curvature itself."""
    from problems.logistic import logistic_loss
    X, y = cancer
    data = ss.FederatedData.split(X * 10, y, num_clients=5, seed=0)
    prob = ss.Problem(logistic_loss(), dim=X.shape[1], data=data)
    L = prob.solve(max_iter=1, eval_every=None, seed=0, batch_size="grow").history.tau[0]
    res = prob.solve(max_iter=3, eval_every=None, seed=0, clients_per_round=2,
                     batch_size="grow")
    r, g = 0.15, 0.3
    assert res.history.tau[0] == pytest.approx(g * r * L / (4 * (1 + (1 - r) * (1 - g))),
                                               rel=1e-12)
    assert np.all(res.history.tau == res.history.tau[0])     # not adapted: the steps decay


# -- batch_size="auto": full batches where a full pass is cheap, else "grow" --------------------

def test_auto_reads_every_row_where_a_full_pass_is_cheap_and_grows_above(cancer_data,
                                                                          monkeypatch):
    """Every client's rows times d at most FULL_PASS_WORK (the cancer data: 114 x 30): every
    round of "auto" reads every row, in fewer rounds than "grow"; one row-parameter below
    that (the threshold lowered), "auto" is "grow", iterate for iterate."""
    from problems.logistic import logistic_loss
    from ssca_solver.methods.ssca import adaptive

    dim = cancer_data.clients[0].X.shape[1]
    work = max(cancer_data.client_sizes) * dim
    assert work <= adaptive.FULL_PASS_WORK
    prob = ss.Problem(logistic_loss(), dim=dim, data=cancer_data,
                      regularizer=lambda w: 1e-2 * __import__("cvxpy").sum_squares(w))

    def run(**options):
        xs = []
        res = prob.solve(seed=0, max_iter=200, callback=lambda it: xs.append(it.x.copy()),
                         **options)
        return res, np.array(xs)

    (auto, _), (grow, grow_xs) = run(), run(batch_size="grow")
    assert auto.status == grow.status == "converged"
    assert np.all(np.isnan(auto.history.batch_size))          # every row, from round 1
    assert grow.history.batch_size[0] == 32
    assert auto.nit < grow.nit, (auto.nit, grow.nit)
    np.testing.assert_allclose(auto.x, grow.x, atol=1e-4 * max(1.0, np.abs(grow.x).max()))

    monkeypatch.setattr(adaptive, "FULL_PASS_WORK", work)
    assert np.all(np.isnan(run()[0].history.batch_size))
    monkeypatch.setattr(adaptive, "FULL_PASS_WORK", work - 1)
    above, above_xs = run()
    assert above.nit == grow.nit and above.history.batch_size[0] == 32
    np.testing.assert_array_equal(above_xs, grow_xs)


def test_the_first_batch_of_the_adaptive_schedules():
    from ssca_solver.methods.ssca import adaptive
    from ssca_solver.methods.ssca.settings import first_batch

    big = adaptive.FULL_PASS_WORK // 10
    assert first_batch("auto", (3, 200), 10) == 200
    assert first_batch("grow", (3, 200), 10) == adaptive.START_BATCH == 32
    assert first_batch("grow", (3, 5), 10) == 5               # all of the largest client's
    assert first_batch("auto", (big, 7), 10) == big           # exactly at the threshold
    assert first_batch("auto", (big + 1, 7), 10) == 32


def test_grow_is_an_option_and_a_wrong_batch_size_names_it(cancer_data):
    from problems.logistic import logistic_loss

    prob = ss.Problem(logistic_loss(), dim=cancer_data.clients[0].X.shape[1], data=cancer_data)
    with pytest.raises(ValueError, match="'full', 'auto' or 'grow', got 'grown'"):
        prob.solve(batch_size="grown")
