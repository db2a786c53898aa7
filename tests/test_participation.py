"""Partial participation (clients_per_round) and dropouts (on_client_failure="drop").

* The combined statistics of K sampled clients are unbiased: at a fixed w, their mean over many
  rounds equals the full-participation value within a CLT bound (uniform and proportional).
* Only the sampled clients are sent a round's request and counted.
* A client that fails is left out of its round, the others' weights are renormalised (checked
  against the mean over the answering clients' rows), the dropout is recorded in the result and
  in checkpoints, and a client killed mid-run on the process transport does not stop the run.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.methods.ssca.step import combine
from ssca_solver.federated import Dropout, InProcessTransport
from ssca_solver.federated.gather import Gatherer
from ssca_solver.federated.sampling import Sampler
from ssca_solver.engine.options import seed_entropy

from conftest import kill_process_client_at, round_request, ssca_clients

D = 3
SIZES = [12, 30, 7, 21, 50, 16]       # unequal: proportional sampling differs from uniform
MARK = 0.123456789


def _data(marker_client=None):
    rng = np.random.default_rng(3)
    clients = []
    for i, n in enumerate(SIZES):
        X = 0.3 * rng.normal(size=(n, D)) + 0.2 * (i - 2.5)   # non-IID: the client matters
        y = X @ np.arange(1.0, D + 1) + 0.1 * rng.normal(size=n)
        if i == marker_client:
            X[:, 0] = MARK                              # a hook can tell this client's rows
        clients.append((X, y))
    return ss.FederatedData(clients)


def _lsq(fail=lambda X, t: False):
    def value(w, X, y):
        return 0.5 * (X @ w - y) ** 2

    def grad(w, X, y):
        if fail(X, None):
            raise RuntimeError("this client's disk is gone")
        return X.T @ (X @ w - y) / len(y)

    return ss.SampleFunction(value, grad, name="lsq")


def _problem(**kw):
    return ss.Problem(_lsq(**kw), dim=D, data=_data())


def _flat(stats):
    return np.concatenate([np.ravel(v) for st in stats for v in st.values()])


@pytest.mark.parametrize("scheme", ["uniform", "proportional"])
def test_sampled_statistics_are_unbiased_at_a_fixed_point(scheme):
    """Full batches at a fixed w: the full-participation statistics are one fixed vector; the
    mean of R sampled rounds must match it within 4 standard errors of that mean, and the
    unweighted sum (h_i = 1) must not."""
    prob = _problem()
    clients = ssca_clients(prob, 0)
    w = np.array([0.3, -0.2, 0.5])
    N = prob.data.num_samples
    full = _flat(combine(InProcessTransport(clients).exchange(round_request(1, w, None)), N))
    sampler = Sampler(SIZES, 2, scheme, seed_entropy(5))
    gatherer = Gatherer(InProcessTransport(clients), SIZES)
    R = 3000
    est, naive = np.empty((R, full.size)), np.empty((R, full.size))
    for t in range(1, R + 1):
        who, h = sampler.draw(t)
        replies = list(gatherer.collect(round_request(t, w, None), who, h))
        est[t - 1] = _flat(combine(replies, N))
        naive[t - 1] = _flat(combine([r.__class__(**{**vars(r), "weight": 1.0})
                                      for r in replies], N))
    mean, se = est.mean(axis=0), est.std(axis=0, ddof=1) / np.sqrt(R)
    assert np.all(np.abs(mean - full) <= 4 * se + 1e-12), (mean, full, se)
    assert np.any(np.abs(naive.mean(axis=0) - full) > 10 * se)     # the test can fail


def test_the_draw_is_a_function_of_seed_and_round():
    a = Sampler(SIZES, 3, "uniform", seed_entropy(1))
    b = Sampler(SIZES, 3, "uniform", seed_entropy(1))
    c = Sampler(SIZES, 3, "uniform", seed_entropy(2))
    assert [a.draw(t)[0] for t in range(1, 20)] == [b.draw(t)[0] for t in range(19, 0, -1)][::-1]
    assert [a.draw(t)[0] for t in range(1, 20)] != [c.draw(t)[0] for t in range(1, 20)]
    who, h = a.draw(4)
    assert len(who) == 3 and who == sorted(set(who)) and np.all(h == 2.0)
    who, h = Sampler(SIZES, 4, "proportional", 7).draw(1)
    assert 1 <= len(who) <= 4


def test_only_the_participants_are_asked_and_counted(tmp_path):
    prob = _problem()
    asked = []
    opts = dict(method="ssca", batch_size=5, tau=0.1, seed=2, max_iter=12, eval_every=4,
                clients_per_round=2, callback=lambda it: asked.append(it.t))
    res = prob.solve(**opts)
    per_reply = res.communication.up_per_client_round
    assert res.communication.up_total == 12 * 2 * per_reply
    assert res.communication.down_total == 12 * 2 * D
    assert res.communication.clients_per_round == 2
    assert "total over 2 of 6 clients per round x 12 rounds" in res.report()
    # evaluations still ask every client: 3 in the rounds, the probe, the scale, the final one
    assert res.communication.eval_down_total == (3 + 3) * len(SIZES) * D
    assert np.isfinite(res.fun) and res.fun < 1.0
    again = prob.solve(**opts)
    np.testing.assert_array_equal(res.x, again.x)
    full = prob.solve(**{**opts, "clients_per_round": None})
    assert not np.array_equal(res.x, full.x)
    # resumed mid-run: the same clients are drawn after the checkpoint
    first = prob.solve(**{**opts, "checkpoint": tmp_path / "c.npz",
                          "callback": lambda it: it.t == 5})
    assert first.status == "stopped"
    resumed = prob.solve(**{**opts, "resume": tmp_path / "c.npz", "callback": None})
    np.testing.assert_array_equal(resumed.x, res.x)
    with pytest.raises(ValueError, match="clients_per_round = 2, this solve has "
                                         "clients_per_round = 3"):
        prob.solve(**{**opts, "resume": tmp_path / "c.npz", "clients_per_round": 3})


@pytest.mark.parametrize("bad, match", [
    (dict(clients_per_round=0), "clients_per_round .* must be an integer >= 1"),
    (dict(clients_per_round=7), r"between 1 and the number of clients \(6\), got 7"),
    (dict(clients_per_round=True), "clients_per_round"),
    (dict(clients_per_round=2.0), "clients_per_round"),
    (dict(participation="random"), "participation must be one of 'uniform', 'proportional'"),
    (dict(on_client_failure="ignore"), "on_client_failure must be one of 'raise', 'drop'"),
    (dict(secure_aggregation="yes"), "secure_aggregation must be True or False"),
    (dict(secure_aggregation=True, clients_per_round=1), "at least 2 clients per round"),
    (dict(secure_range=0), "secure_range must be"),
])
def test_participation_options_are_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        _problem().solve(method="ssca", max_iter=2, **bad)
    with pytest.raises(ValueError, match=match):
        _problem().solve(method="fedavg", batch_size=5, max_iter=2, **bad)


def test_sampled_clients_make_the_default_options_run_the_schedules():
    """With K < I even full batches are random: no unit steps (which, with backtracking on a
    sampled merit, stopped at a wrong 'settled' point 0.15 from the solution, measured)."""
    res = _problem().solve(max_iter=6, seed=0, clients_per_round=3, eval_every=None)
    assert np.all(res.history.rho < 1) and np.all(res.history.rejected == 0)
    full = _problem().solve(max_iter=6, seed=0, clients_per_round=6, eval_every=None)
    assert np.all(full.history.rho == 1)
    drawn = _problem().solve(max_iter=6, seed=0, clients_per_round=6, eval_every=None,
                             participation="proportional")      # with replacement: random
    assert np.all(drawn.history.rho < 1)


def test_drop_without_failures_gives_the_same_iterates_as_raise():
    prob = _problem()
    opts = dict(method="ssca", batch_size=5, seed=1, max_iter=15, eval_every=5)
    a = prob.solve(**opts)
    b = prob.solve(on_client_failure="drop", **opts)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.history.objective, b.history.objective)
    assert b.dropouts == ()


def test_a_dropped_client_is_left_out_and_the_others_renormalised():
    """Full batch at a fixed w: with client 2 failing, the combined gradient statistic is the
    mean gradient over the other clients' rows (computed here directly)."""
    data = _data(marker_client=2)
    prob = ss.Problem(_lsq(fail=lambda X, t: X[0, 0] == MARK), dim=D, data=data)
    clients = ssca_clients(prob, 0)
    w = np.array([0.3, -0.2, 0.5])
    gatherer = Gatherer(InProcessTransport(clients), SIZES, drop=True)
    replies = list(gatherer.collect(round_request(1, w, None)))
    assert [r.client for r in replies] == [0, 1, 3, 4, 5]
    (drop,) = gatherer.take()
    assert (drop.client, drop.round, drop.task) == (2, 1, "ssca.round")
    assert drop.error.startswith("UserFunctionError: lsq.grad raised on client 2")
    assert "this client's disk is gone" in drop.error
    stats = combine(replies, data.num_samples)[0]
    rows = [c for i, c in enumerate(data.clients) if i != 2]
    X = np.vstack([c.X for c in rows])
    y = np.concatenate([c.y for c in rows])
    lin = stats["lin"] if "lin" in stats else None
    grad_ref = X.T @ (X @ w - y) / len(y)
    # proximal-linear statistics: lin = grad - 2 tau w
    np.testing.assert_allclose(lin, grad_ref - 2 * 0.1 * w, rtol=1e-12, atol=1e-12)


def test_dropouts_are_recorded_in_the_result_and_the_checkpoint(tmp_path):
    fail_at = {3, 7}
    state = {"t": 0}

    def fail(X, _):
        return state["t"] in fail_at and X[0, 0] == MARK

    prob = ss.Problem(_lsq(fail=fail), dim=D, data=_data(marker_client=4))

    def track(it):
        state["t"] = it.t + 1              # the next round's number, seen by the clients

    opts = dict(method="ssca", batch_size=5, tau=0.1, seed=0, max_iter=10, eval_every=None,
                on_client_failure="drop", callback=track, checkpoint=tmp_path / "d.npz",
                checkpoint_every=5)
    state["t"] = 1
    res = prob.solve(**opts)
    assert [(d.client, d.round, d.task) for d in res.dropouts] == [(4, 3, "ssca.round"),
                                                                   (4, 7, "ssca.round")]
    assert "dropouts      2 (client, round): (4, 3), (4, 7)" in res.report()
    # the checkpoint keeps them: a resume that extends the run reports them too
    state["t"] = 11
    more = prob.solve(**{**opts, "max_iter": 12, "resume": tmp_path / "d.npz"})
    assert [(d.client, d.round) for d in more.dropouts] == [(4, 3), (4, 7)]
    assert more.dropouts[0].error == res.dropouts[0].error


def test_a_round_in_which_every_client_fails_is_a_clear_error():
    prob = ss.Problem(_lsq(fail=lambda X, t: True), dim=D, data=_data())
    with pytest.raises(ss.RoundFailedError, match="every client asked in round 1 failed "
                                                  r"\(6 of them\).*disk is gone") as info:
        prob.solve(method="ssca", batch_size=5, tau=0.1, max_iter=3, eval_every=None,
                   check_gradients=False, on_client_failure="drop")
    assert len(info.value.dropouts) == 6 and info.value.state.t == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and fork")
@pytest.mark.parametrize("method", ["ssca", "fedavg", "primal_dual", "augmented_lagrangian"])
def test_a_client_killed_mid_run_is_dropped_and_the_run_finishes(method, tmp_path):
    """Every method records the dropout in res.dropouts and the checkpoint (the one front door
    assembles the Result; "primal_dual" used to leave res.dropouts empty)."""
    prob = _problem()
    killed = []
    kill_at_4 = kill_process_client_at(4, 3, killed)

    res = prob.solve(method=method, batch_size=5, seed=0, max_iter=8, eval_every=None,
                     transport="process", on_client_failure="drop", callback=kill_at_4,
                     client_timeout=30, checkpoint=tmp_path / "k.npz")
    assert res.nit == 8 and killed
    assert [(d.client, d.round) for d in res.dropouts] == [(3, 5)]
    assert "SIGKILL" in res.dropouts[0].error
    from ssca_solver.engine import checkpoint
    arrays, _ = checkpoint.load(tmp_path / "k.npz")
    assert list(arrays["dropouts/client"]) == [3] and list(arrays["dropouts/round"]) == [5]
    assert isinstance(res.dropouts[0], Dropout)


def test_an_evaluation_asks_a_failed_client_once_more():
    """A client that fails once (here: its first evaluation) answers the second time; one
    that always fails is left out and the evaluation renormalised."""
    calls = {"n": 0}

    def flaky(X, _):
        if X[0, 0] == MARK and len(X) == SIZES[4]:      # client 4, full data: evaluations
            calls["n"] += 1
            return calls["n"] == 1
        return False

    prob = ss.Problem(_lsq(fail=flaky), dim=D, data=_data(marker_client=4))
    from ssca_solver.diagnostics.evaluation import Evaluator
    clients = ssca_clients(prob, 0)
    g = Gatherer(InProcessTransport(clients), SIZES, drop=True)
    ev = Evaluator(prob).evaluate(lambda r: g.collect(r, kind="eval"), np.zeros(D), True)
    assert ev.complete and g.take() == [] and calls["n"] == 2
    ref = Evaluator(prob).evaluate(InProcessTransport(clients), np.zeros(D), True)
    np.testing.assert_array_equal(ev.grads, ref.grads)
    prob = ss.Problem(_lsq(fail=lambda X, _: X[0, 0] == MARK and len(X) == SIZES[4]), dim=D,
                      data=_data(marker_client=4))
    clients = ssca_clients(prob, 0)
    g = Gatherer(InProcessTransport(clients), SIZES, drop=True)
    ev = Evaluator(prob).evaluate(lambda r: g.collect(r, kind="eval"), np.zeros(D), True,
                                  round=7)
    (drop,) = g.take()
    assert not ev.complete and (drop.client, drop.task, drop.round) == (4, "evaluate", 7)
    rows = [c for i, c in enumerate(prob.data.clients) if i != 4]
    X = np.vstack([c.X for c in rows])
    y = np.concatenate([c.y for c in rows])
    np.testing.assert_allclose(ev.grads[0], X.T @ (X @ np.zeros(D) - y) / len(y),
                               rtol=1e-12, atol=1e-12)


def test_k_of_i_max_iter_message_names_the_random_client_draw(cancer_data):
    """With K < I clients the batches may be full but the rounds stay random: the advice must
    not call the steps deterministic SCA's."""
    from problems.logistic import logistic_loss
    dim = cancer_data.clients[0].X.shape[1]
    res = ss.Problem(logistic_loss(), dim=dim, data=cancer_data).solve(
        clients_per_round=2, max_iter=60, seed=0)
    assert res.status == "max_iter" and not res.success
    assert "random set of clients per round" in res.message
    assert "deterministic SCA" not in res.message
