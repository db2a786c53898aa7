"""Clients in shards (``shards=``, :mod:`ssca_solver.federated.shards`).

* The iterates, rounds and status equal those of one client at a time up to rounding, on
  full batches, growing and fixed mini-batches (the noise numbers go client by client),
  partial participation (uniform and proportional), a custom surrogate builder and method
  "fedavg".
* A shard evaluates each function once per distinct client weight: on full batches one call
  per shard and round, not one per client.
* A client whose function raises is named (and with ``on_client_failure="drop"`` left out
  alone, its shard's other clients still counted); a trial point outside a function's domain
  is rejected as without shards.
* The rows are held once: a shard of a split's clients is a view of the split's rows.
* Bad values of the option are refused with a message naming it.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.federated import Request, build_clients
from ssca_solver.federated.shards import Shard, ShardedTransport, shard_bounds, stack_rows
from ssca_solver.methods.ssca.client import NONFINITE, REJECT_NONFINITE, TASK, SSCARoundTask

D = 4


def _rows(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, D))
    X[:, -1] = 1.0
    y = (X @ np.array([1.0, -2.0, 0.5, 0.3]) + rng.standard_normal(n) > 0).astype(float)
    return X, y


class Counted:
    """A logistic loss whose calls are counted (and which can fail on one client's rows)."""

    def __init__(self, fail_on=None):
        self.calls = 0
        self.fail_on = fail_on

    def value(self, w, X, y):
        z = X @ w
        return np.logaddexp(0.0, z) - y * z

    def grad(self, w, X, y):
        self.calls += 1
        if self.fail_on is not None and np.any(np.all(X == self.fail_on, axis=1)):
            raise RuntimeError("this client's disk is gone")
        z = X @ w
        return X.T @ (1.0 / (1.0 + np.exp(-z)) - y) / X.shape[0]


def _problem(num_clients=60, fail_on=None, builder=None, data=None):
    X, y = _rows()
    data = data or ss.FederatedData.split(X, y, num_clients=num_clients, seed=0)
    loss = Counted(fail_on)
    kw = {} if builder is None else {"surrogate": builder}
    f = ss.SampleFunction(loss.value, loss.grad, name="logistic", **kw)
    c = ss.SampleFunction(lambda w, X, y: (X @ w) ** 2,
                          lambda w, X, y: 2.0 * X.T @ (X @ w) / X.shape[0], name="energy")
    prob = ss.Problem(f, constraints=[c <= 2.0], dim=D, data=data,
                      regularizer=lambda w: 1e-3 * cp.sum_squares(w))
    return prob, loss


def _same(a, b, rounds_equal=True):
    assert (a.status, a.nit) == (b.status, b.nit)
    scale = max(1.0, float(np.max(np.abs(a.x))))
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-10 * scale)


@pytest.mark.parametrize("opts", [
    dict(batch_size="full"),
    dict(),                                          # the default schedule
    dict(batch_size=16),                             # sampled rounds: noise client by client
    dict(clients_per_round=20),
    dict(clients_per_round=20, participation="proportional"),
    dict(batch_size=16, clients_per_round=20),
], ids=["full", "default", "fixed-batch", "uniform-K", "proportional-K", "batch-and-K"])
@pytest.mark.parametrize("shards", [1, 7])
def test_same_iterates_as_one_client_at_a_time(opts, shards):
    prob, _ = _problem()
    # the quasi-Newton model (d = 4: "auto" would difference the gradients, whose Hessians
    # carry the rounding of the shard's sums 1 / h = 1.6e5 times larger: the Newton model's
    # run under shards is test_differenced_hessians_under_shards_reach_the_same_point)
    opts = {"hessian": "lbfgs", **opts}
    a = prob.solve(seed=3, max_iter=30, **opts)
    b = prob.solve(seed=3, max_iter=30, shards=shards, **opts)
    _same(a, b)
    # messages counted as the clients' own: the same as without shards
    assert a.communication == b.communication
    # the history's full-data evaluations too
    np.testing.assert_allclose(b.history.objective, a.history.objective, rtol=1e-12,
                               equal_nan=True)



@pytest.mark.parametrize("shards", [1, 7])
def test_differenced_hessians_under_shards_reach_the_same_point(shards):
    """The default options on gradients only (d = 4): the clients difference them into the
    Newton model's Hessians, a shard on its pooled rows; the run is the same but for rounding
    (a shard's sum and its clients' differ in the last bits, which the differences' 1 / h
    amplifies): same status and rounds, the same point to 1e-8."""
    prob, _ = _problem()
    a = prob.solve(seed=3, max_iter=30, batch_size="full")
    b = prob.solve(seed=3, max_iter=30, batch_size="full", shards=shards)
    assert (a.status, a.nit) == (b.status, b.nit)
    assert a.communication == b.communication
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-8 * max(1.0, np.abs(a.x).max()))

def test_custom_builder_goes_client_by_client_with_the_same_iterates():
    builder = ss.DiagonalCurvature(lambda w, X, y: 0.25 * np.mean(X * X, axis=0))
    prob, _ = _problem(builder=builder)
    _same(prob.solve(seed=1, max_iter=15), prob.solve(seed=1, max_iter=15, shards=4))


@pytest.mark.parametrize("method", ["fedavg", "primal_dual"])
def test_other_methods_with_shards(method):
    prob, _ = _problem()
    if method == "fedavg":
        prob = ss.Problem(prob.objective, dim=D, data=prob.data)
    a = prob.solve(method=method, seed=2, max_iter=10)
    b = prob.solve(method=method, seed=2, max_iter=10, shards=5)
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-12)


def test_a_full_batch_round_calls_each_function_once_per_shard():
    prob, loss = _problem(num_clients=60)
    marks = []
    prob.solve(seed=0, batch_size="full", eval_every=None, max_iter=6, shards=3,
               hessian="lbfgs", callback=lambda it: marks.append(loss.calls))
    per_round = np.diff(marks)
    assert per_round.size >= 3
    # rounds without a stop test: 3 calls (one per shard); a round with the KKT test's
    # full-data evaluation: 3 more. Client by client it would be 60 and 120.
    assert set(per_round.tolist()) <= {3, 6}, per_round


def test_a_failing_client_is_named_and_dropped_alone():
    X, _ = _rows()
    data = ss.FederatedData.split(X, _rows()[1], num_clients=30, seed=0)
    bad_row = data.clients[17].X[0].copy()
    prob, _ = _problem(fail_on=bad_row, data=data)
    with pytest.raises(ss.UserFunctionError, match="client 17"):
        prob.solve(seed=0, max_iter=5, shards=4, batch_size="full", check_gradients=False)
    res = prob.solve(seed=0, max_iter=5, shards=4, batch_size="full",
                     on_client_failure="drop", check_gradients=False)
    assert res.dropouts and {d.client for d in res.dropouts} == {17}
    # the same run without shards drops the same client at the same rounds and lands on
    # the same point
    ref = prob.solve(seed=0, max_iter=5, batch_size="full", on_client_failure="drop",
                     check_gradients=False)
    assert [(d.client, d.round) for d in ref.dropouts] == [(d.client, d.round)
                                                           for d in res.dropouts]
    _same(ref, res)


def test_a_trial_point_outside_the_domain_is_rejected_as_a_stand_in_reply():
    X, y = _rows(200)
    data = ss.FederatedData.split(X, y, num_clients=8, seed=0)

    def value(w, X, y):
        with np.errstate(all="ignore"):
            return -np.log(1.0 - (X @ w) ** 2)

    def grad(w, X, y):
        z = X @ w
        return X.T @ (2.0 * z / (1.0 - z ** 2)) / X.shape[0]

    fn = ss.SampleFunction(value, grad, name="barrier")
    task = SSCARoundTask([fn], [ss.ProximalLinear()])
    clients = build_clients(data, 0, {TASK: task})
    shard = Shard(0, clients, data.num_samples)
    far = Request(TASK, 1, np.full(D, 5.0), {"tau": 1.0, "batch_size": None,
                                             REJECT_NONFINITE: True})
    got = shard.answer(far.read_only(), shard.members, [1.0] * 8)
    assert set(got.reply.arrays) == {NONFINITE}
    near = Request(TASK, 1, np.zeros(D), {"tau": 1.0, "batch_size": None,
                                          REJECT_NONFINITE: True})
    got = shard.answer(near.read_only(), shard.members, [1.0] * 8)
    assert NONFINITE not in got.reply.arrays and got.answered == list(range(8))


def test_the_shard_sum_equals_the_clients_weighted_replies():
    """One request, every path: the pooled sum (full and sampled batches, weights that
    differ between clients) equals sum_i N a_i x_i of the clients' own replies."""
    X, y = _rows(500)
    sizes = [30, 70, 45, 55, 100, 200]
    cuts = np.cumsum([0] + sizes)
    data = ss.FederatedData([(X[a:b], y[a:b]) for a, b in zip(cuts[:-1], cuts[1:])])
    prob, _ = _problem(data=data)
    f, c = prob.functions
    task = SSCARoundTask([f, c], [ss.ProximalLinear(), ss.ProximalLinear()])
    clients = build_clients(data, 11, {TASK: task})
    shard = Shard(0, clients, data.num_samples)
    h = [1.0, 2.5, 1.0, 0.5, 1.0, 2.5]
    N = data.num_samples
    for batch in (None, 20):
        req = Request(TASK, 4, np.array([0.3, -0.2, 0.1, 0.05]),
                      {"tau": 0.7, "batch_size": batch}).read_only()
        got = shard.answer(req, shard.members, h)
        for name, value in got.reply.arrays.items():
            want = 0.0
            for cl, hi in zip(clients, h):
                r = cl.handle(req)
                want = want + hi * r.num_rows / r.batch_size * np.asarray(r.arrays[name])
            np.testing.assert_allclose(value, want, rtol=1e-12, atol=1e-12 * N)


def test_rows_held_once():
    X, y = _rows(1000)
    data = ss.FederatedData.split(X, y, num_clients=50, seed=0)
    t = ShardedTransport(build_clients(data, 0, {}), 3)
    for s in t.shards:
        assert s.X.base is data.clients[0].X.base and not s.X.flags.writeable
        np.testing.assert_array_equal(
            s.X, np.concatenate([data.clients[i].X for i in s.members]))
    # clients whose arrays are not one block are concatenated once
    parts = [data.clients[3], data.clients[1]]
    assert not np.shares_memory(stack_rows([p.X for p in parts]), X)


def test_shard_bounds_cover_every_client_once():
    for n, k in [(10, 3), (1000, 7), (5, 5), (3, 1)]:
        b = shard_bounds(n, k)
        assert len(b) == k and b[0][0] == 0 and b[-1][1] == n
        assert all(x[1] == y[0] and x[1] > x[0] for x, y in zip(b[:-1], b[1:]))


@pytest.mark.parametrize("opts, match", [
    (dict(shards=0), "shards"),
    (dict(shards=True), "shards"),
    (dict(shards=61), "between 1 and the number of clients"),
])
def test_bad_shards_are_refused(opts, match):
    prob, _ = _problem()
    with pytest.raises((ValueError, TypeError), match=match):
        prob.solve(max_iter=1, **opts)


def test_large_pools_go_in_pieces_with_the_same_iterates(monkeypatch):
    from ssca_solver.federated import shards

    prob, loss = _problem(num_clients=60)
    a = prob.solve(seed=0, batch_size="full", eval_every=None, max_iter=6, hessian="lbfgs")
    monkeypatch.setattr(shards, "POOL_FLOATS", 4 * 700)        # 700 rows of d = 4 a call
    marks = []
    b = prob.solve(seed=0, batch_size="full", eval_every=None, max_iter=6, shards=1,
                   hessian="lbfgs", callback=lambda it: marks.append(loss.calls))
    _same(a, b)
    # 3,000 rows in pieces of 700: 5 calls a round (10 with the stop test's evaluation)
    assert set(np.diff(marks).tolist()) <= {5, 10}, np.diff(marks)


# -- shards in other processes: forked workers (transport="process") and Ray actors ----------

class PidOf:
    """A gradient that, on the rows holding ``mark``, leaves a file named by its process's PID
    in ``folder`` (which process holds that client)."""

    def __init__(self, mark, folder):
        self.mark, self.folder = mark, str(folder)

    def __call__(self, X):
        import os

        if np.any(np.all(X == self.mark, axis=1)):
            open(os.path.join(self.folder, f"pid-{os.getpid()}"), "w").close()


def _marked_problem(tmp_path, num_clients=30):
    X, y = _rows()
    data = ss.FederatedData.split(X, y, num_clients=num_clients, seed=0)
    hook = PidOf(data.clients[num_clients - 1].X[0].copy(), tmp_path)
    loss = Counted()

    def grad(w, X, y):
        hook(X)
        return loss.grad(w, X, y)

    f = ss.SampleFunction(loss.value, grad, name="logistic")
    return ss.Problem(f, dim=D, data=data), data


def _kill_at(t, folder, killed):
    import os
    import signal

    def callback(it):
        if it.t == t:
            pid = int(sorted(p.name for p in folder.glob("pid-*"))[0].split("-")[1])
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)

    return callback


@pytest.mark.parametrize("opts", [dict(batch_size="full"), dict(batch_size=16),
                                  dict(clients_per_round=12)], ids=["full", "batch", "K"])
def test_process_shards_give_the_same_iterates(opts):
    prob, _ = _problem(num_clients=40)
    a = prob.solve(seed=4, max_iter=12, **opts)
    b = prob.solve(seed=4, max_iter=12, transport="process", shards=2, **opts)
    _same(a, b)
    assert a.communication == b.communication


def killed_worker_is_dropped_or_named(tmp_path, match, **engine):
    """A worker (process or actor) killed after round 3 holding shard 2 (clients 20..29):
    with on_client_failure="drop" all its clients are dropouts of round 4, alone, and the run
    goes on; otherwise a ClientError names them and the round, matching ``match``."""
    prob, _ = _marked_problem(tmp_path)
    killed = []
    opts = dict(seed=0, batch_size="full", max_iter=8, shards=3, check_gradients=False,
                **engine)
    res = prob.solve(on_client_failure="drop", callback=_kill_at(3, tmp_path, killed), **opts)
    assert killed
    at4 = sorted(d.client for d in res.dropouts if d.round == 4)
    assert at4 == list(range(20, 30)), res.dropouts
    assert all("worker" in d.error for d in res.dropouts) and res.nit == 8
    for p in tmp_path.glob("pid-*"):
        p.unlink()
    killed.clear()
    with pytest.raises(ss.ClientError, match=match):
        prob.solve(callback=_kill_at(3, tmp_path, killed), **opts)


def test_a_killed_worker_process_drops_its_clients_or_is_named(tmp_path):
    killed_worker_is_dropped_or_named(
        tmp_path, r"client 20\.\.29, round 4: the worker of shard 2 failed",
        transport="process")


def test_shards_refused_on_flower():
    prob, _ = _problem()
    with pytest.raises(ValueError, match="one client per node"):
        prob.solve(max_iter=1, shards=2, transport="flower")


def test_a_shard_survives_pickling_with_its_rows_once():
    import pickle

    X, y = _rows(600)
    data = ss.FederatedData.split(X, y, num_clients=12, seed=0)
    t = ShardedTransport(build_clients(data, 5, {}), 2)
    shard = t.shards[1]
    blob = pickle.dumps(shard)
    assert len(blob) < 1.3 * (shard.X.nbytes + shard.y.nbytes)     # not twice the rows
    back = pickle.loads(blob)
    assert back.members == shard.members
    for i in shard.members:
        np.testing.assert_array_equal(back.clients[i].X, shard.clients[i].X)
        assert np.shares_memory(back.clients[i].X, back.X)
        assert back.clients[i].seed == shard.clients[i].seed
        np.testing.assert_array_equal(back.clients[i].rng(3).integers(0, 10**9, 4),
                                      shard.clients[i].rng(3).integers(0, 10**9, 4))


# -- secure aggregation between the shards ----------------------------------------------------

@pytest.mark.parametrize("opts", [dict(batch_size="full"),
                                  dict(batch_size=16, clients_per_round=12)], ids=["full", "K"])
def test_secure_aggregation_between_shards_equals_it_between_clients(opts):
    pytest.importorskip("cryptography")
    prob, _ = _problem(num_clients=40)
    a = prob.solve(seed=1, max_iter=12, secure_aggregation=True, **opts)
    b = prob.solve(seed=1, max_iter=12, secure_aggregation=True, shards=3, **opts)
    assert (a.status, a.nit) == (b.status, b.nit)
    # the same sums, each decoded from 2^-f fixed point (f about 40 here)
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-8)


def test_secure_shards_leave_out_a_failing_client_alone():
    pytest.importorskip("cryptography")
    X, y = _rows()
    data = ss.FederatedData.split(X, y, num_clients=30, seed=0)
    prob, _ = _problem(fail_on=data.clients[11].X[0].copy(), data=data)
    opts = dict(seed=0, max_iter=5, batch_size="full", on_client_failure="drop",
                check_gradients=False, secure_aggregation=True)
    ref = prob.solve(**opts)
    res = prob.solve(shards=3, **opts)
    assert {d.client for d in res.dropouts} == {11}
    assert [d.round for d in res.dropouts] == [d.round for d in ref.dropouts]
    np.testing.assert_allclose(res.x, ref.x, rtol=0, atol=1e-8)


def test_secure_shards_recover_from_a_killed_worker(tmp_path):
    pytest.importorskip("cryptography")
    prob, _ = _marked_problem(tmp_path)
    killed = []
    res = prob.solve(seed=0, batch_size="full", max_iter=8, transport="process", shards=3,
                     check_gradients=False, secure_aggregation=True, on_client_failure="drop",
                     callback=_kill_at(3, tmp_path, killed))
    assert killed and res.nit == 8
    assert sorted(d.client for d in res.dropouts if d.round == 4) == list(range(20, 30))


def test_checkpoint_and_resume_with_shards(tmp_path):
    prob, _ = _problem(num_clients=40)
    opts = dict(seed=5, batch_size=16, shards=3)
    whole = prob.solve(max_iter=20, **opts)
    path = tmp_path / "run.npz"
    first = prob.solve(max_iter=20, checkpoint=str(path), callback=lambda it: it.t == 8,
                       **opts)
    assert first.status == "stopped" and first.nit == 8
    resumed = prob.solve(max_iter=20, resume=str(path), **opts)
    assert resumed.nit == whole.nit
    np.testing.assert_array_equal(resumed.x, whole.x)


def test_ray_options_are_checked_before_anything_starts():
    prob, _ = _problem()
    with pytest.raises(ValueError, match="ray_address"):
        prob.solve(max_iter=1, transport="ray", ray_address=5)
    with pytest.raises(ValueError, match="only apply to transport='ray'"):
        prob.solve(max_iter=1, ray_address="auto")


def test_without_ray_the_transport_says_how_to_install_it():
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here (tests/test_ray.py runs the transport)")
    prob, _ = _problem()
    with pytest.raises(ImportError, match=r"ssca-solver\[ray\]"):
        prob.solve(max_iter=1, transport="ray")
