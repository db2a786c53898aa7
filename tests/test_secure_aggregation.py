"""Secure aggregation: the server sees only masked messages and learns only their sum.

* At B = 1 a plain round message gives the client's sample away (reconstructed to < 1e-6);
  the masked messages look uniform on [0, 2^64) (chi-square on the top byte, KS) and the same
  reconstruction applied to them is garbage.
* The masked sum equals the plain weighted sum within the quantisation error n 2^-(f+1), with
  and without partial participation, and after a client dropped out at the masked step (its
  pairwise masks rebuilt from the Shamir shares of its key).
* A whole run stays within 1e-8 of the plain run (measured: about 1e-11), on the in-process and
  process transports (bit for bit the same between them: the masks cancel exactly); a client
  killed mid-run is dropped and recorded; a value beyond secure_range is an error, not a clip.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as sps

import ssca_solver as ss
from ssca_solver.methods.ssca.step import combine
from ssca_solver.federated import InProcessTransport, Transport, build_clients
from ssca_solver.federated import secagg
from ssca_solver.federated.gather import Gatherer
from ssca_solver.engine.options import seed_entropy

from conftest import kill_process_client_at, round_request

D = 4
SIZES = [20, 35, 15, 30, 25]
MARK = 0.123456789


def _data(marker_client=None):
    rng = np.random.default_rng(7)
    clients = []
    for i, n in enumerate(SIZES):
        X = np.column_stack([np.ones(n), 0.5 * rng.normal(size=(n, D - 1)) + 0.1 * i])
        y = X @ np.array([0.5, 1.0, -2.0, 3.0]) + 0.1 * rng.normal(size=n)
        if i == marker_client:
            X[:, 1] = MARK
        clients.append((X, y))
    return ss.FederatedData(clients)


def _lsq(fail=lambda X: False, sign=1.0):
    def value(w, X, y):
        return 0.5 * (X @ w - y) ** 2

    def grad(w, X, y):
        if fail(X):
            raise RuntimeError("client lost its rows")
        return sign * X.T @ (X @ w - y) / len(y)

    return ss.SampleFunction(value, grad, name="lsq")


def _problem(**kw):
    return ss.Problem(_lsq(**kw), dim=D, data=_data(kw.pop("marker", None)))


class Spy(Transport):
    """An in-process transport that keeps every reply that reaches the server."""

    def __init__(self, clients):
        self.inner = InProcessTransport(clients)
        self.num_clients = self.inner.num_clients
        self.seen = []

    def stream(self, request, participants=None, tolerate_failures=False):
        for r in self.inner.stream(request, participants, tolerate_failures):
            self.seen.append(r)
            yield r


def _clients(prob, secure, seed=0):
    from ssca_solver.methods.ssca.algorithm import SSCARoundTask

    tasks = {"ssca.round": SSCARoundTask(prob.functions, prob.builders)}
    if secure:
        tasks = secagg.client_tasks(tasks)
    return build_clients(prob.data, seed_entropy(seed), tasks)


def _reconstruct(lin, w, tau):
    """The client's row (x, y) from one B = 1 message: g = lin + 2 tau w = x (x.w - y) and
    x_0 = 1 (the intercept), so x = g / g_0 and y = x.w - g_0."""
    g = lin + 2 * tau * w
    x = g / g[0]
    return x, x @ w - g[0]


def test_b1_plain_message_gives_the_sample_away_and_a_masked_one_does_not():
    prob = _problem()
    w, tau = np.array([0.2, -0.1, 0.4, 0.3]), 0.1
    # plain: the server reads each client's message
    spy = Spy(_clients(prob, secure=False))
    errors = []
    for t in range(1, 21):
        for reply in spy.exchange(round_request(t, w, 1, tau)):
            x, y = _reconstruct(np.asarray(reply.arrays["0:lin"]), w, tau)
            c = prob.data.clients[reply.client]
            idx = np.random.default_rng(np.random.SeedSequence(
                seed_entropy(0), spawn_key=(reply.client, t, 0))).choice(c.X.shape[0], 1,
                                                                          replace=False)
            errors.append(max(np.linalg.norm(x - c.X[idx[0]]) / np.linalg.norm(c.X[idx[0]]),
                              abs(y - c.y[idx[0]]) / abs(c.y[idx[0]])))
    assert np.median(errors) < 1e-12 and max(errors) < 1e-6
    # masked: the same 20 rounds through secure aggregation
    spy = Spy(_clients(prob, secure=True))
    gatherer = Gatherer(spy, SIZES, secure=secagg.SecureAggregation(SIZES, 2.0 ** 20))
    for t in range(1, 21):
        (agg,) = gatherer.collect(round_request(t, w, 1, tau))
    words = np.concatenate([np.asarray(r.arrays["masked"]) for r in spy.seen
                            if "masked" in r.arrays])
    assert words.dtype == np.uint64 and words.size == 20 * len(SIZES) * (D + 2)
    top = (words >> np.uint64(56)).astype(int)
    chi2 = sps.chisquare(np.bincount(top, minlength=256))
    ks = sps.kstest(words.astype(float) / 2.0 ** 64, "uniform")
    # the masks come from os.urandom, so this can fail by chance with probability 2e-6; plain
    # fixed-point words (top byte 0 or 255) give p ~ 0
    assert chi2.pvalue > 1e-6 and ks.pvalue > 1e-6, (chi2, ks)
    # the reconstruction from a masked message read as if it were plain
    f = secagg.fraction_bits(2.0 ** 20, len(SIZES))
    bad = []
    for r in spy.seen:
        if "masked" in r.arrays:
            lin = np.asarray(r.arrays["masked"]).view(np.int64)[1:1 + D] * 2.0 ** -f
            x, _ = _reconstruct(lin, w, tau)
            c = prob.data.clients[r.client]
            i = np.random.default_rng(np.random.SeedSequence(
                seed_entropy(0), spawn_key=(r.client, r.round, 0))).choice(c.X.shape[0], 1,
                                                                          replace=False)[0]
            bad.append(np.linalg.norm(x - c.X[i]) / np.linalg.norm(c.X[i]))
    assert np.median(bad) > 0.5, np.median(bad)       # measured: about 1.6


def _fixed_point(prob, secure_kw, plain_kw, participants=None, factors=None):
    w = np.array([0.2, -0.1, 0.4, 0.3])
    N = prob.data.num_samples
    plain = Gatherer(InProcessTransport(_clients(prob, False)), SIZES, **plain_kw)
    secure = Gatherer(InProcessTransport(_clients(prob, True)), SIZES,
                      secure=secagg.SecureAggregation(SIZES, 2.0 ** 20), **secure_kw)
    req = round_request(3, w, 5)
    a = combine(list(plain.collect(req, participants, factors)), N)[0]
    (agg,) = secure.collect(req, participants, factors)
    b = combine([agg], N)[0]
    return a, b, plain.take(), secure.take()


@pytest.mark.parametrize("participants, factors", [(None, None), ([0, 2, 3], [5 / 3] * 3)])
def test_masked_sum_equals_plain_sum_within_the_quantisation_error(participants, factors):
    prob = _problem()
    a, b, _, _ = _fixed_point(prob, {}, {}, participants, factors)
    n = len(participants or SIZES)
    step = 2.0 ** -(secagg.fraction_bits(2.0 ** 20, n) + 1)
    for k in a:
        err = np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))
        assert err <= n * step + 1e-15 * np.max(np.abs(a[k])), (k, err)
    assert np.max(np.abs(a["lin"] - b["lin"])) > 0     # quantised: not the same floats


def test_a_client_dropped_at_the_masked_step_is_recovered_from_the_shares():
    """Client 3 fails inside its task, after the keys and shares went round: the survivors'
    pairwise masks with it are rebuilt from the Shamir shares of its mask key; the sum over
    the survivors, renormalised, matches the plain drop path's."""
    prob = ss.Problem(_lsq(fail=lambda X: X[0, 1] == MARK), dim=D, data=_data(marker_client=3))
    a, b, pd, sd = _fixed_point(prob, {"drop": True}, {"drop": True})
    step = 2.0 ** -(secagg.fraction_bits(2.0 ** 20, len(SIZES)) + 1)
    for k in a:
        assert np.max(np.abs(a[k] - b[k])) <= len(SIZES) * step * 1.5 + 1e-14
    assert [d.client for d in pd] == [d.client for d in sd] == [3]
    assert sd[0].task == "ssca.round" and "client lost its rows" in sd[0].error


def test_too_few_survivors_for_the_threshold_is_a_clear_error():
    fails = {1, 2, 3}
    data = _data()
    for i in fails:
        data.clients[i].X[:, 1] = MARK
    prob = ss.Problem(_lsq(fail=lambda X: X[0, 1] == MARK), dim=D, data=data)
    with pytest.raises(ss.SecureAggregationError,
                       match="only 2 of the 5 clients answered the masked step, fewer than the "
                             "threshold 3"):
        _fixed_point(prob, {"drop": True}, {"drop": True})


def _run(prob, **kw):
    opts = dict(method="ssca", batch_size=5, tau=0.1, seed=3, max_iter=40, eval_every=10)
    return prob.solve(**{**opts, **kw})


def test_a_secure_run_stays_within_1e_8_of_the_plain_run_on_both_transports():
    prob = _problem()
    plain = _run(prob)
    a = _run(prob, secure_aggregation=True)
    b = _run(prob, secure_aggregation=True, transport="process")
    assert np.max(np.abs(a.x - plain.x)) < 1e-8
    assert np.max(np.abs(a.x - plain.x)) > 0                # it did go through the masks
    np.testing.assert_allclose(a.history.objective, plain.history.objective, rtol=1e-8)
    np.testing.assert_array_equal(a.x, b.x)                 # masks cancel exactly
    # the default options too (adaptive batch: the noise shares are summed securely; tau from
    # the mean of the clients' curvatures, not their max): both pass the KKT test, at the
    # pooled least-squares solution
    X = np.vstack([c.X for c in prob.data.clients])
    y = np.concatenate([c.y for c in prob.data.clients])
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    for kw in ({}, {"secure_aggregation": True}):
        res = prob.solve(max_iter=200, seed=1, **kw)
        assert res.status == "converged" and np.linalg.norm(res.x - ref) < 1e-4, kw
    # FedAvg: the models' weighted mean, summed securely
    fa = prob.solve(method="fedavg", batch_size=5, max_iter=20, seed=2, eval_every=None)
    fs = prob.solve(method="fedavg", batch_size=5, max_iter=20, seed=2, eval_every=None,
                    secure_aggregation=True)
    assert np.max(np.abs(fa.x - fs.x)) < 1e-8


def test_secure_partial_participation_matches_the_plain_one():
    prob = _problem()
    plain = _run(prob, clients_per_round=3, participation="proportional")
    sec = _run(prob, clients_per_round=3, participation="proportional",
               secure_aggregation=True)
    assert np.max(np.abs(plain.x - sec.x)) < 1e-8


def test_the_key_agreement_secrets_do_not_come_from_the_seed():
    prob = _problem()
    runs = []
    for _ in range(2):
        spy = Spy(_clients(prob, True, seed=0))
        g = Gatherer(spy, SIZES, secure=secagg.SecureAggregation(SIZES, 2.0 ** 20))
        (agg,) = g.collect(round_request(1, np.zeros(D), 5))
        runs.append((agg, [r for r in spy.seen if "masked" in r.arrays or "s_pk" in r.arrays]))
    (a, seen_a), (b, seen_b) = runs
    for k in a.arrays:
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k])     # the same sum
    for ra, rb in zip(seen_a, seen_b):                               # other keys, masks
        for k in set(ra.arrays) - {"layout"}:
            assert not np.array_equal(ra.arrays[k], rb.arrays[k]), k


def test_a_value_out_of_range_is_an_error_never_a_clip():
    with pytest.raises(ss.SecureAggregationError,
                       match=r"weighted value .* in array '.*' of task .* outside "
                             r"secure_range = 0.001; values are never clipped"):
        _run(_problem(), secure_aggregation=True, secure_range=1e-3)


def test_the_gradient_check_runs_in_the_clients_under_secure_aggregation():
    prob = _problem(sign=-1.0)
    with pytest.raises(ss.UserFunctionError, match="(a sign error?)"):
        prob.solve(max_iter=3, secure_aggregation=True)


def test_a_masked_client_answers_only_masked_requests():
    prob = _problem()
    t = InProcessTransport(_clients(prob, True))
    with pytest.raises(ss.SecureAggregationError, match="only as a masked sum"):
        t.exchange(round_request(1, np.zeros(D), 5))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and fork")
def test_a_client_killed_mid_run_is_dropped_under_secure_aggregation(tmp_path):
    prob = _problem()
    killed = []
    kill_at_4 = kill_process_client_at(4, 1, killed)

    res = _run(prob, max_iter=8, eval_every=None, transport="process",
               on_client_failure="drop", secure_aggregation=True, callback=kill_at_4,
               checkpoint=tmp_path / "k.npz")
    assert res.nit == 8 and killed
    assert [(d.client, d.round, d.task) for d in res.dropouts] == [(1, 5, "ssca.round")]
    assert "key exchange" in res.dropouts[0].error and "SIGKILL" in res.dropouts[0].error
    assert np.all(np.isfinite(res.x))


def test_a_method_that_reads_single_replies_refuses_secure_aggregation(monkeypatch):
    # a method without the declaration (primal_dual with it taken away)
    from ssca_solver.methods.lagrangian.algorithm import Lagrangian
    monkeypatch.setattr(Lagrangian, "supports_secure_aggregation", False)
    prob = ss.Problem(_lsq(), dim=D, data=_data(), constraints=[_lsq() <= 5.0])
    with pytest.raises(ValueError, match="method 'primal_dual' does not support "
                                         "secure_aggregation"):
        prob.solve(method="primal_dual", max_iter=2, secure_aggregation=True)


class FreshClients(Transport):
    """Each message answered by a fresh copy of its client (as an engine with a pool of
    workers would), the client's secrets carried between messages by export/import_state on
    the client's side only."""

    def __init__(self, prob):
        self.prob = prob
        self.num_clients = prob.data.num_clients
        self.kept = {}                       # client index -> its exported secrets

    def stream(self, request, participants=None, tolerate_failures=False):
        for i in (range(self.num_clients) if participants is None else participants):
            c = _clients(self.prob, True)[i]
            secagg.import_state(c, self.kept.get(i, {}))
            reply = c.handle(request.read_only())
            self.kept[i] = secagg.export_state(c)
            yield reply


def test_secrets_can_live_outside_the_client_object_between_messages():
    prob = _problem()
    a = combine(list(Gatherer(InProcessTransport(_clients(prob, True)), SIZES,
                              secure=secagg.SecureAggregation(SIZES, 2.0 ** 20)).collect(
        round_request(2, np.full(D, 0.1), 5))), prob.data.num_samples)[0]
    t = FreshClients(prob)
    b = combine(list(Gatherer(t, SIZES, secure=secagg.SecureAggregation(SIZES, 2.0 ** 20))
                     .collect(round_request(2, np.full(D, 0.1), 5))), prob.data.num_samples)[0]
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert all(not kept for kept in t.kept.values())     # the secrets go after unmasking
    with pytest.raises(ss.SecureAggregationError, match="no secrets for aggregation"):
        t.kept.clear()
        t2 = FreshClients(prob)
        t2.stream = lambda req, p=None, tol=False: (
            _clients(prob, True)[i].handle(req.read_only()) for i in range(len(SIZES)))
        list(Gatherer(t2, SIZES, secure=secagg.SecureAggregation(SIZES, 2.0 ** 20)).collect(
            round_request(2, np.full(D, 0.1), 5)))


class CuriousServer(Transport):
    """An in-process transport whose server, at the unmasking step, first asks two clients
    not listed as survivors for their shares: the one listed as dropped, with the server's
    request, and one survivor with a request whose survivors leave it out. What each answered
    (its Reply, or the error it raised) is kept in ``answers``."""

    def __init__(self, clients, dropped: int, left_out: int):
        self.inner = InProcessTransport(clients)
        self.clients = clients
        self.num_clients = self.inner.num_clients
        self.dropped, self.left_out = dropped, left_out
        self.answers = {}

    def stream(self, request, participants=None, tolerate_failures=False):
        if request.task == secagg.UNMASK:
            alive = np.asarray(request.arrays["survivors"])
            assert self.dropped in np.asarray(request.arrays["dropped"])
            assert self.left_out in alive
            left_out = replace(request, arrays={**request.arrays,
                                                "survivors": alive[alive != self.left_out]})
            for i, req in ((self.dropped, request), (self.left_out, left_out)):
                try:
                    self.answers[i] = self.clients[i].handle(req.read_only())
                except ss.SecureAggregationError as exc:
                    self.answers[i] = exc
        yield from self.inner.stream(request, participants, tolerate_failures)


def test_a_client_not_listed_as_a_survivor_never_reveals_its_shares():
    """Revealing the shares of a client's own self-mask seed b_u and mask key s_u would let
    the server unmask that client's input. Client 3 fails in its task, after the keys and
    shares went round, so the server lists it as dropped: asked to unmask, it refuses. Client
    4, which survived, refuses too when the list of survivors leaves it out. Both are still
    asked to unmask by the honest request afterwards (client 4 answers it), and the sum comes
    out."""
    prob = ss.Problem(_lsq(fail=lambda X: X[0, 1] == MARK), dim=D, data=_data(marker_client=3))
    transport = CuriousServer(_clients(prob, True), dropped=3, left_out=4)
    gatherer = Gatherer(transport, SIZES, secure=secagg.SecureAggregation(SIZES, 2.0 ** 20),
                        drop=True)
    (agg,) = gatherer.collect(round_request(3, np.array([0.2, -0.1, 0.4, 0.3]), 5))
    for i in (3, 4):
        assert isinstance(transport.answers[i], ss.SecureAggregationError), transport.answers
        assert f"client {i}: refusing to unmask" in str(transport.answers[i])
    assert [d.client for d in gatherer.take()] == [3]
    assert np.all(np.isfinite(agg.arrays["0:lin"]))
