"""Record-level differential privacy of method "ssca" (``privacy=ss.Privacy(...)``,
:mod:`ssca_solver.methods.ssca.privacy`).

* Options that would read the data without noise, or that the accountant cannot follow, are
  refused with a message; a request whose rounds exceed the budget at a given noise is refused
  before round 1, naming the rounds that fit.
* The noise: the multiplier is the accountant's calibration (dp-accounting), the epsilon
  reported is the accountant's over the rounds that ran, round by round in the history; the
  noise's standard deviation is z C max_i N_i / (B_i N), drawn as the mechanism says.
* Clipping bounds every row's contribution (against a row-by-row reference), and
  ``per_sample_grad`` agrees with central differences.
* Every message the server receives under privacy is a round's clipped statistics (no probe,
  evaluation or gradient check), on every transport installed here; without privacy the same
  inspection finds contributions above C (the check can fail).
* A membership test on a tiny problem: at epsilon = 0.1 an attacker who sees the result does
  no better than chance within its confidence interval; without privacy it always wins.
"""

from __future__ import annotations

import math
import re

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.federated import accounting
from ssca_solver.federated.gather import Gatherer
from ssca_solver.federated.messages import aggregation_weight
from ssca_solver.methods.ssca import privacy as dp
from ssca_solver.methods.ssca.client import DP_CLIP, TASK

pytest.importorskip("dp_accounting")

D = 3


def _data(sizes=(40, 60, 80), scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for n in sizes:
        X = rng.standard_normal((n, D)) * scale
        X[:, -1] = 1.0
        y = (X[:, 0] - X[:, 1] + 0.3 * rng.standard_normal(n) > 0).astype(float)
        clients.append(ss.ClientData(X, y))
    return ss.FederatedData(clients)


def _problem(data=None, constrained=True):
    from problems.logistic import logistic_loss

    data = data or _data()
    f = logistic_loss(name="logistic")
    energy = ss.SampleFunction(lambda w, X, y: (X @ w) ** 2 / 10.0,
                               lambda w, X, y: 2.0 * X.T @ (X @ w) / (10.0 * X.shape[0]),
                               name="energy")
    return ss.Problem(f, constraints=[energy <= 1.0] if constrained else [], dim=D, data=data)


PRIVATE = dict(batch_size=10, tau=0.1, max_iter=20, seed=0)


# -- options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({}, "epsilon .* or noise_multiplier"),
    ({"epsilon": -1.0}, "epsilon must be a positive"),
    ({"epsilon": 1.0, "delta": 1.0}, "delta must be in"),
    ({"epsilon": 1.0, "clip": 0.0}, "clip must be a positive"),
    ({"noise_multiplier": float("inf")}, "noise_multiplier must be a positive"),
])
def test_bad_privacy_values_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ss.Privacy(**kwargs)


@pytest.mark.parametrize("options, match", [
    ({"batch_size": "auto"}, "batch_size='auto' grows"),
    ({"tau": "auto"}, "tau='auto' measures"),
    ({"eval_every": 5}, "eval_every"),
    ({"check_gradients": True}, "gradient check"),
    ({"hessian": "lbfgs"}, "curvature of the data"),
    ({"on_client_failure": "drop"}, "renormalises"),
    ({"clients_per_round": 2, "participation": "proportional"}, "proportional"),
])
def test_options_that_read_the_data_in_clear_are_refused(options, match):
    opts = {**PRIVATE, **options}
    with pytest.raises(ValueError, match=match):
        _problem().solve(method="ssca", privacy=ss.Privacy(epsilon=1.0), **opts)


def test_other_surrogates_and_types_are_refused():
    prob = _problem()
    prob.objective.surrogate = ss.DiagonalCurvature(lambda w, X, y: np.ones(D))
    with pytest.raises(ss.ModelError, match="proximal-linear"):
        prob.solve(method="ssca", privacy=ss.Privacy(epsilon=1.0), **PRIVATE)
    with pytest.raises(TypeError, match="ss.Privacy"):
        _problem().solve(method="ssca", privacy={"epsilon": 1.0}, **PRIVATE)
    with pytest.raises(TypeError, match="unknown solve option 'privacy'"):
        _problem().solve(method="fedavg", privacy=ss.Privacy(epsilon=1.0))


def test_a_budget_the_rounds_exceed_is_refused_before_round_1(monkeypatch):
    asked = []
    monkeypatch.setattr(Gatherer, "collect", lambda self, request, *a, **k: asked.append(1))
    sizes, B = (40, 60, 80), 10
    with pytest.raises(ValueError, match=r"spend epsilon = .* > the budget 1 .*at most (\d+) "
                                         r"rounds") as err:
        _problem().solve(method="ssca", privacy=ss.Privacy(epsilon=1.0, noise_multiplier=2.0),
                         **{**PRIVATE, "max_iter": 500})
    assert asked == []                       # no client was asked anything
    fit = int(re.search(r"at most (\d+) rounds", str(err.value)).group(1))
    assert accounting.record_epsilon(2.0, sizes, [B] * fit, 1e-5) <= 1.0
    assert accounting.record_epsilon(2.0, sizes, [B] * (fit + 1), 1e-5) > 1.0


# -- the noise and the accountant ------------------------------------------------------------------
def test_noise_is_calibrated_and_the_spent_epsilon_accounted():
    sizes, B, T = (40, 60, 80), 10, 20
    res = _problem().solve(method="ssca", privacy=ss.Privacy(epsilon=2.0, clip=2.0, seed=3),
                           **PRIVATE)
    assert res.status == ss.status.PRIVATE and not res.success
    p = res.privacy
    z = accounting.calibrate_noise(2.0, 1e-5, sizes, [B] * T)
    assert p["noise_multiplier"] == pytest.approx(z, rel=1e-12)
    spent = accounting.record_epsilon(z, sizes, [B] * res.nit, 1e-5)
    assert p["epsilon"] == pytest.approx(spent, rel=1e-9) and p["epsilon"] <= 2.0
    assert (p["rounds"], p["planned"], p["batch_size"], p["clip"]) == (T, T, B, 2.0)
    eps = res.history.epsilon
    assert np.all(np.diff(eps) > 0) and eps[-1] == pytest.approx(p["epsilon"], rel=1e-12)
    for t in (1, 7):
        assert eps[t - 1] == pytest.approx(
            accounting.record_epsilon(z, sizes, [B] * t, 1e-5), rel=1e-9)
    # nothing was evaluated, and the report says so
    assert math.isnan(res.fun) and np.all(np.isnan(res.constraints)) and res.kkt.failed
    assert res.communication.eval_up_total == 0 and res.communication.eval_down_total == 0
    assert "privacy" in res.report() and "epsilon = " in res.message


def test_the_noise_scale_follows_the_largest_row_weight():
    sizes, B = (40, 60, 8), 10
    plan = dp.Plan(ss.Privacy(noise_multiplier=1.5, clip=0.5, seed=0), sizes, B, 30)
    N = sum(sizes)
    # the 8-row client reads all its rows: weight 8 / (8 N); the others N_i / (10 N)
    assert plan.sigma == pytest.approx(1.5 * 0.5 * max(40 / 10, 60 / 10, 8 / 8) / N)
    half = dp.Plan(ss.Privacy(noise_multiplier=1.5, clip=0.5, seed=0), sizes, B, 30,
                   weight_factor=2.0)
    assert half.sigma == pytest.approx(2.0 * plan.sigma)


def test_the_noise_is_the_gaussian_mechanism_on_the_sums():
    rng = np.random.default_rng(0)
    w = np.array([0.5, -1.0, 2.0])
    zero = ({"const": np.array(0.0), "lin": np.zeros(D), "quad": np.array(1.0)},)
    draws = [dp.add_noise(zero, w, 2.0, 0.25, rng)[0] for _ in range(20000)]
    lin = np.array([d["lin"] for d in draws])
    const = np.array([float(d["const"]) for d in draws])
    # lin += rho xi_g; const += rho (xi_v - xi_g . w): std rho sigma and rho sigma sqrt(1+|w|^2)
    assert np.std(lin, axis=0) == pytest.approx([0.5] * D, rel=0.03)
    assert np.std(const) == pytest.approx(0.5 * math.sqrt(1 + w @ w), rel=0.03)
    assert np.corrcoef(lin[:, 0], const)[0, 1] == pytest.approx(
        -w[0] / math.sqrt(1 + w @ w), abs=0.03)
    assert all(float(d["quad"]) == 1.0 for d in draws[:10])


def test_rounds_noise_is_independent_and_seeded():
    plan = dp.Plan(ss.Privacy(noise_multiplier=1.0, seed=7), (50,), 5, 10)
    again = dp.Plan(ss.Privacy(noise_multiplier=1.0, seed=7), (50,), 5, 10)
    fresh = dp.Plan(ss.Privacy(noise_multiplier=1.0), (50,), 5, 10)
    assert plan.rng(3).normal() == again.rng(3).normal()
    assert plan.rng(3).normal() != plan.rng(4).normal()
    assert plan.rng(3).normal() != fresh.rng(3).normal()


# -- clipping --------------------------------------------------------------------------------------
def _rows_reference(functions, w, X, y, C):
    """Each row's contribution, its own grad on one row, clipped: the sums by a loop."""
    v_sum, g_sum = np.zeros(len(functions)), np.zeros((len(functions), w.size))
    for i in range(X.shape[0]):
        vals = np.array([f.value(w, X[i:i + 1], y[i:i + 1])[0] for f in functions])
        grads = np.array([f.grad(w, X[i:i + 1], y[i:i + 1]) for f in functions])
        norm = math.sqrt(vals @ vals + np.sum(grads * grads))
        s = min(1.0, C / norm)
        assert s * norm <= C * (1 + 1e-12)
        v_sum += s * vals
        g_sum += s * grads
    return v_sum, g_sum


@pytest.mark.parametrize("C", [0.05, 1.0, 1e6])
def test_clipping_bounds_every_row(C):
    prob = _problem(_data(scale=3.0))
    X, y = prob.data.clients[1].X, prob.data.clients[1].y
    w = np.array([0.3, -0.7, 0.2])
    fns = prob.functions
    v, g, clipped = dp.clipped_sums(fns, w, X, y, C, "test")
    v_ref, g_ref = _rows_reference(fns, w, X, y, C)
    np.testing.assert_allclose(v, v_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-12)
    assert math.sqrt(v @ v + np.sum(g * g)) <= X.shape[0] * C * (1 + 1e-12)
    assert (clipped == X.shape[0]) if C == 0.05 else (clipped == 0) if C == 1e6 else True
    if C == 1e6:                          # nothing clipped: the plain sums
        np.testing.assert_allclose(g[0], X.shape[0] * fns[0].grad(w, X, y), rtol=1e-10)


def test_per_sample_grad_matches_central_differences():
    from problems.logistic import logistic_loss

    f = logistic_loss(only_label=1, class_fraction=0.4)
    X, y = _data().clients[0].X, _data().clients[0].y
    w = np.array([0.2, 0.1, -0.4])
    G = f.per_sample_grad(w, X, y)
    h = 1e-6
    for j in range(D):
        e = np.zeros(D)
        e[j] = h
        fd = (f.value(w + e, X, y) - f.value(w - e, X, y)) / (2 * h)
        np.testing.assert_allclose(G[:, j], fd, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(G.mean(axis=0), f.grad(w, X, y), rtol=1e-12)
    np.testing.assert_allclose((-f).per_sample_grad(w, X, y), -G)


def test_a_wrong_per_sample_grad_is_named():
    f = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(axis=0),
                          name="lin", per_sample_grad=lambda w, X, y: X[:, :2])
    prob = ss.Problem(f, dim=D, data=_data(), regularizer=lambda w: cp.sum_squares(w))
    with pytest.raises(ss.UserFunctionError, match=r"lin.per_sample_grad must return one gradient per row"):
        prob.solve(method="ssca", privacy=ss.Privacy(epsilon=1.0), **PRIVATE)


# -- what reaches the server -----------------------------------------------------------------------
def _inspect(monkeypatch):
    """Record every request the server sends and every reply it receives."""
    seen = []
    collect = Gatherer.collect

    def spy(self, request, *args, **kwargs):
        for reply in collect(self, request, *args, **kwargs):
            seen.append((request, reply))
            yield reply

    monkeypatch.setattr(Gatherer, "collect", spy)
    return seen


def _contribution_norms(seen, N):
    """Per reply: its weight in the round's sum times the norm of the (value, gradient) sums
    it carries."""
    out = []
    for request, reply in seen:
        assert sorted(reply.arrays) == ["0:g", "0:quad", "0:v", "1:g", "1:quad", "1:v"]
        norm2 = sum(float(reply.arrays[f"{m}:v"]) ** 2 + float(np.sum(reply.arrays[f"{m}:g"]
                                                                       ** 2))
                    for m in range(2))
        out.append(aggregation_weight(reply, N) * math.sqrt(norm2))
    return np.array(out)


def _plain_norms(seen, N):
    """The same, for replies without privacy (proximal-linear statistics, read back)."""
    out = []
    for request, reply in seen:
        w = request.w
        norm2 = 0.0
        for m in range(2):
            lin, const = reply.arrays[f"{m}:lin"], float(reply.arrays[f"{m}:const"])
            nt = float(reply.arrays[f"{m}:quad"])
            g = lin + 2.0 * nt * w
            v = const + g @ w - nt * (w @ w)
            norm2 += v * v + g @ g
        out.append(aggregation_weight(reply, N) * math.sqrt(norm2))
    return np.array(out)


ENGINES = {
    "inprocess": {},
    "process": {"transport": "process"},
    "shards": {"shards": 2},
    "process shards": {"transport": "process", "shards": 2},
    "secure aggregation": {"secure_aggregation": True},
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_never_an_unprotected_message(monkeypatch, engine):
    if engine == "secure aggregation":
        pytest.importorskip("cryptography")
    data = _data(scale=3.0)
    N = data.num_samples
    C = 0.5
    seen = _inspect(monkeypatch)
    res = _problem(data).solve(method="ssca", privacy=ss.Privacy(epsilon=4.0, clip=C, seed=0),
                               **{**PRIVATE, "batch_size": 1, "max_iter": 6},
                               **ENGINES[engine])
    assert res.status == ss.status.PRIVATE and res.nit == 6
    assert seen and {r.task for r, _ in seen} == {TASK}          # rounds only
    assert all(r.config.get(DP_CLIP) == C for r, _ in seen)
    # one row per client and round: each client's contribution is at most C, so the weighted
    # sum of a round at most C sum_i N_i / N = C
    norms = _contribution_norms(seen, N)
    assert np.all(norms <= C * (1 + 1e-9))
    per_round = {}
    for (r, _), x in zip(seen, norms):
        per_round[r.round] = per_round.get(r.round, 0.0) + x
    assert max(per_round.values()) <= C * (1 + 1e-9) and len(per_round) == 6


def test_the_inspection_finds_contributions_above_the_clip_without_privacy(monkeypatch):
    data = _data(scale=3.0)
    seen = _inspect(monkeypatch)
    _problem(data).solve(method="ssca", **{**PRIVATE, "batch_size": 1, "max_iter": 6},
                         eval_every=0, check_gradients=False)
    rounds = [(r, rep) for r, rep in seen if r.task == TASK]
    assert max(_plain_norms(rounds, data.num_samples)) > 0.5


@pytest.mark.parametrize("engine", ["ray", "flower"])
def test_never_an_unprotected_message_on_optional_engines(monkeypatch, engine):
    pytest.importorskip("ray" if engine == "ray" else "flwr")
    data = _data(sizes=(20, 30), scale=3.0)
    seen = _inspect(monkeypatch)
    res = _problem(data).solve(method="ssca", privacy=ss.Privacy(epsilon=4.0, clip=0.5),
                               **{**PRIVATE, "batch_size": 1, "max_iter": 3},
                               transport=engine)
    assert res.status == ss.status.PRIVATE
    assert {r.task for r, _ in seen} == {TASK}
    assert np.all(_contribution_norms(seen, data.num_samples) <= 0.5 * (1 + 1e-9))


# -- membership ------------------------------------------------------------------------------------
def _mean_problem(outlier: float):
    """1-D mean estimation: f(w, x) = (w - x)^2 / 2 over 2 clients of 4 rows; the neighbouring
    data sets differ in one row (0 or ``outlier``)."""
    xs = [np.array([[-0.2], [0.1], [0.3], [0.0]]), np.array([[0.2], [-0.1], [0.05],
                                                              [outlier]])]
    data = ss.FederatedData([ss.ClientData(x, None) for x in xs])
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (w[0] - X[:, 0]) ** 2,
                          lambda w, X, y: np.array([np.mean(w[0] - X[:, 0])]), name="sq",
                          per_sample_grad=lambda w, X, y: (w[0] - X[:, :1]))
    return ss.Problem(f, dim=1, data=data)


def _attack(privacy, trials):
    """The membership attacker's accuracy: it sees x of runs on either data set (chosen by a
    fair coin) and guesses the one with the outlier when x is past the midpoint of the two
    noise-free results (the same rounds with a negligible noise: for Gaussian noise of one
    variance, the best cut). ``privacy(k, outlier)``: the Privacy of run k."""
    opts = dict(batch_size="full", tau=0.5, max_iter=5)
    runs = {}
    for outlier in (0.0, 4.0):
        prob = _mean_problem(outlier)
        runs[outlier] = np.array([prob.solve(method="ssca", seed=k, privacy=privacy(k, outlier),
                                             **opts).x[0] for k in range(trials)])
    clean = {o: _mean_problem(o).solve(method="ssca", privacy=ss.Privacy(
        noise_multiplier=1e-9, clip=1.0), **opts).x[0] for o in (0.0, 4.0)}
    cut = 0.5 * (clean[0.0] + clean[4.0])
    sign = 1.0 if clean[4.0] > clean[0.0] else -1.0
    right = np.sum(sign * (runs[4.0] - cut) > 0) + np.sum(sign * (runs[0.0] - cut) <= 0)
    return right / (2 * trials)


def test_membership_is_no_better_than_chance_at_small_epsilon():
    trials = 400
    acc = _attack(lambda k, o: ss.Privacy(epsilon=0.1, clip=1.0, seed=(k, int(o))), trials)
    se = math.sqrt(0.25 / (2 * trials))
    # (epsilon, delta)-DP bounds any attacker's accuracy by e^eps / (1 + e^eps) + delta
    # (0.525 at 0.1): within its 95 % interval the attack is at chance
    assert acc - 1.96 * se <= 0.5, acc
    assert acc <= math.exp(0.1) / (1 + math.exp(0.1)) + 1.96 * se
    # with a negligible noise the same attacker always wins
    assert _attack(lambda k, o: ss.Privacy(noise_multiplier=1e-6, clip=1.0,
                                           seed=(k, int(o))), 5) == 1.0


def test_batches_are_drawn_from_a_secret_not_from_the_run_seed():
    """Amplification by sampling needs the server not to know which rows a batch holds: it
    knows the run's seed, so under privacy the batches follow the mechanism's own secret."""
    prob = _problem(constrained=False)
    quiet = dict(PRIVATE, max_iter=5)

    def x(seed):
        return prob.solve(method="ssca", privacy=ss.Privacy(noise_multiplier=1e-9, clip=10.0,
                                                            seed=seed), **quiet).x

    assert not np.array_equal(x(None), x(None))          # same run seed, new secrets
    np.testing.assert_array_equal(x(5), x(5))             # a privacy seed reproduces the run
    assert not np.array_equal(x(5), x(6))
    plain = prob.solve(method="ssca", eval_every=0, check_gradients=False, **quiet).x
    assert not np.allclose(plain, x(5), atol=1e-6)        # other batches than the seed's


def test_unclipped_sums_give_the_statistics_of_a_round_without_privacy():
    prob = _problem(_data())
    X, y = prob.data.clients[0].X, prob.data.clients[0].y
    w = np.array([0.4, -0.3, 0.1])
    fns, builders = prob.functions, prob.builders
    arrays = dp.clipped_arrays(fns, builders, w, X, y, 0.3, 1e9, "test")
    template = [b.initial_statistics(D, 0.3, "tau") for b in builders]
    got = dp.to_statistics(arrays, w, template)
    for m, (f, b) in enumerate(zip(fns, builders)):
        want = b.statistics(f, w, X, y, 0.3, "test")
        for name in ("const", "lin", "quad"):
            np.testing.assert_allclose(got[f"{m}:{name}"], want[name], rtol=1e-10, atol=1e-12)


# -- the distributed mechanism ---------------------------------------------------------------------
def test_the_discrete_gaussian_has_its_law():
    rng = np.random.default_rng(1)
    s = 1.5
    x = accounting.discrete_gaussian(rng, s, 400_000)
    assert x.dtype == np.int64
    ks = np.arange(-60, 61)
    pmf = np.exp(-ks ** 2 / (2 * s * s))
    pmf /= pmf.sum()
    emp = np.array([(x == k).mean() for k in ks])
    assert np.max(np.abs(emp - pmf)) < 5 * math.sqrt(pmf.max() / x.size)
    big = accounting.discrete_gaussian(rng, 3e9, 100_000)
    assert abs(big.std() / 3e9 - 1) < 0.02 and abs(big.mean()) < 3e9 * 0.02
    assert accounting.sum_divergence(5.0, 100) < 1e-100
    assert accounting.sum_divergence(0.3, 10) > 1e-3


def test_distributed_needs_secure_aggregation_and_inflates_for_rounding():
    with pytest.raises(ValueError, match="mechanism must be one of"):
        ss.Privacy(epsilon=1.0, mechanism="local")
    with pytest.raises(ValueError, match="secure_aggregation=True"):
        _problem().solve(method="ssca", privacy=ss.Privacy(epsilon=1.0, mechanism="distributed"),
                         **PRIVATE)
    from ssca_solver.federated.secagg import fraction_bits

    central = dp.Plan(ss.Privacy(noise_multiplier=2.0, clip=0.5), (40, 60), 10, 5)
    dist = dp.Plan(ss.Privacy(noise_multiplier=2.0, clip=0.5, mechanism="distributed"),
                   (40, 60), 10, 5, noised=8, secure_range=2.0 ** 20, parties=2)
    f = fraction_bits(2.0 ** 20, 2)
    assert dist.sigma == pytest.approx(central.sigma + 2.0 * math.sqrt(8) * 2.0 ** -f / 2)
    assert dist.sigma > central.sigma


@pytest.mark.parametrize("engine", [{}, {"shards": 2}, {"transport": "process"},
                                    {"transport": "flower"}], ids=str)
def test_distributed_noise_reaches_the_server_only_in_the_sum(monkeypatch, engine):
    """The unmasked sum differs from the clean weighted sum of the clipped sums by noise of
    standard deviation sigma (the participants' shares together), on every coordinate.

    The shares come from each client's own secret randomness (no seed reaches them), so this
    is a statistical test: 64 rounds give 512 draws, whose standard deviation is within 0.15
    of 1 and mean within 0.2 of 0 but for a chance below 1e-5 (4.5 standard errors), while a
    share scaled for the wrong number of parties (std 0.5 or 2 with 4 of them) fails."""
    rounds = 64
    pytest.importorskip("cryptography")
    if engine.get("transport") == "flower":
        pytest.importorskip("flwr")
    data = _data(sizes=(30, 40, 50, 60), scale=2.0)
    prob = _problem(data)
    N = data.num_samples
    seen = _inspect(monkeypatch)
    res = prob.solve(method="ssca", privacy=ss.Privacy(noise_multiplier=3.0, clip=0.7,
                                                       mechanism="distributed"),
                     secure_aggregation=True, batch_size="full", tau=0.2, max_iter=rounds, seed=0,
                     **engine)
    assert res.status == ss.status.PRIVATE and res.privacy["mechanism"] == "distributed"
    assert {r.task for r, _ in seen} == {TASK}
    plan = dp.Plan(ss.Privacy(noise_multiplier=3.0, clip=0.7, mechanism="distributed"),
                   data.client_sizes, None, rounds, noised=2 * (D + 1), parties=4)
    z = []
    for request, reply in seen:
        a = aggregation_weight(reply, N)
        clean = [dp.clipped_sums(prob.functions, request.w, c.X, c.y, 0.7, "t")
                 for c in data.clients]
        v = sum(s[0] for s in clean) / N          # full batches: a_i = 1 / N
        g = sum(s[1] for s in clean) / N
        for m in range(2):
            z.append((a * float(reply.arrays[f"{m}:v"]) - v[m]) / plan.sigma)
            z.extend((a * np.asarray(reply.arrays[f"{m}:g"]) - g[m]) / plan.sigma)
            # n tau carries no data: exact
            assert a * float(reply.arrays[f"{m}:quad"]) == pytest.approx(0.2, rel=1e-9)
    z = np.array(z)
    assert z.size == rounds * 2 * (D + 1)
    assert abs(np.std(z) - 1.0) < 0.15 and abs(np.mean(z)) < 0.2


# -- client level ----------------------------------------------------------------------------------
def test_client_level_accounts_the_clients_and_their_sampling():
    data = _data(sizes=(40, 60, 80, 50, 70, 30))
    res = _problem(data).solve(method="ssca", privacy=ss.Privacy(epsilon=3.0, clip=1.5,
                                                                 level="client"),
                               clients_per_round=3, **PRIVATE)
    p = res.privacy
    assert (p["level"], p["clients_per_round"]) == ("client", 3)
    z = accounting.calibrate_client_noise(3.0, 1e-5, 6, 3, 20)
    assert p["noise_multiplier"] == pytest.approx(z, rel=1e-12)
    assert p["epsilon"] == pytest.approx(accounting.client_epsilon(z, 6, 3, 20, 1e-5),
                                         rel=1e-9)
    assert p["epsilon"] <= 3.0 and "client-level" in res.message
    # dp-accounting's own event: K of I without replacement around the Gaussian of z / 2
    import dp_accounting as dpa

    event = dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(
        6, 3, dpa.GaussianDpEvent(z / 2)), 20)
    assert p["epsilon"] == pytest.approx(accounting.epsilon_of(event, 1e-5), rel=1e-9)
    # drawing 3 of 6 clients amplifies: less noise than every client in every round
    assert z < accounting.calibrate_client_noise(3.0, 1e-5, 6, None, 20)
    plan = dp.Plan(ss.Privacy(noise_multiplier=z, clip=1.5, level="client"),
                   data.client_sizes, 10, 20, weight_factor=2.0, per_round=3)
    assert plan.sigma == pytest.approx(z * 1.5 * 2.0 * 80 / data.num_samples)


def test_client_level_clips_each_clients_mean_on_every_engine(monkeypatch):
    data = _data(scale=3.0)
    prob = _problem(data)
    X, y = data.clients[0].X, data.clients[0].y
    w = np.array([0.3, -0.2, 0.5])
    big = dp.client_arrays(prob.functions, prob.builders, w, X, y, 0.1, 1e9, "t")
    for m, f in enumerate(prob.functions):       # unclipped: the batch's plain sums
        np.testing.assert_allclose(big[f"{m}:g"], X.shape[0] * f.grad(w, X, y), rtol=1e-12)
        assert float(big[f"{m}:v"]) == pytest.approx(f.value(w, X, y).sum(), rel=1e-12)
    for engine in ({}, {"shards": 2}):
        seen = _inspect(monkeypatch)
        res = prob.solve(method="ssca", privacy=ss.Privacy(epsilon=4.0, clip=0.3,
                                                           level="client"),
                         **{**PRIVATE, "max_iter": 4}, **engine)
        assert res.status == ss.status.PRIVATE
        norms = _contribution_norms(seen, data.num_samples)
        # a client's mean contribution is at most C, weighted N_i / N: the round's sum <= C
        assert norms.max() <= 0.3 * (1 + 1e-9)
        if not engine:
            sizes = np.array([rep.num_rows for _, rep in seen], dtype=float)
            assert np.all(norms <= 0.3 * sizes / data.num_samples * (1 + 1e-9))
        monkeypatch.undo()


# -- results and checkpoints -----------------------------------------------------------------------
def test_a_private_result_saves_and_a_private_run_resumes(tmp_path):
    prob = _problem()
    opts = dict(PRIVATE, privacy=ss.Privacy(epsilon=2.0, clip=1.0))
    path = str(tmp_path / "run.npz")
    stopped = prob.solve(method="ssca", checkpoint=path, callback=lambda it: it.t == 8,
                         **opts)
    assert stopped.status == ss.status.STOPPED and stopped.nit == 8
    assert stopped.privacy["rounds"] == 8 and stopped.privacy["epsilon"] < 2.0
    res = prob.solve(method="ssca", resume=path, **opts)
    assert res.status == ss.status.PRIVATE and res.nit == 20
    z = res.privacy["noise_multiplier"]
    assert z == stopped.privacy["noise_multiplier"]
    assert res.privacy["epsilon"] == pytest.approx(
        accounting.record_epsilon(z, (40, 60, 80), [10] * 20, 1e-5), rel=1e-9)
    assert len(res.history.epsilon) == 20 and np.all(np.diff(res.history.epsilon) > 0)
    # another budget is another run: refused
    with pytest.raises(ss.CheckpointError):
        prob.solve(method="ssca", resume=path, **dict(opts, privacy=ss.Privacy(epsilon=3.0)))
    saved = ss.load_result(res.save(str(tmp_path / "res.npz")))
    assert saved.status == ss.status.PRIVATE and saved.privacy == res.privacy
