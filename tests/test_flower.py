"""transport="flower": the runner's requests as Flower messages, in Flower's Simulation Runtime
(a ServerApp in a thread, ClientApps in Ray actors). Skipped when flwr is not installed
(pip install 'ssca-solver[flower]'). The deployment runtime is tested in
tests/test_flower_deployment.py (slow)."""

import dataclasses
import os
import time

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is an optional extra: pip install 'ssca-solver[flower]'")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import ssca_solver as ss  # noqa: E402
from ssca_solver.model.data import ClientData  # noqa: E402
from ssca_solver.errors import ClientError, UserFunctionError  # noqa: E402
from ssca_solver.federated import Client, Reply, Request  # noqa: E402
from ssca_solver.federated import flower  # noqa: E402



def _same(a, b):
    """Equal field by field: arrays equal with the same dtype and shape, scalars of one type."""
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
        elif isinstance(x, dict) and x and isinstance(next(iter(x.values())), np.ndarray):
            assert list(x) == list(y)
            for k in x:
                assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
                np.testing.assert_array_equal(x[k], y[k])
        elif isinstance(x, float) and np.isnan(x):
            assert isinstance(y, float) and np.isnan(y)
        else:
            assert x == y and type(x) is type(y), (f.name, x, y)
            if isinstance(x, dict):
                for k in x:
                    assert type(x[k]) is type(y[k]), (k, x[k], y[k])


def test_every_field_of_a_request_and_a_reply_crosses_exactly():
    rng = np.random.default_rng(0)
    config = {"batch_size": None, "tau": 0.1 + 1e-17, "noise": True, "name": "x",
              "big": 2 ** 62 + 1, "tiny": 5e-324, "inf": float("inf"), "neg": -3}
    request = Request("ssca.round", 7, rng.standard_normal(11), config)
    request = dataclasses.replace(request, arrays={"mask": np.arange(4, dtype=np.uint64),
                                                   "key": np.frombuffer(b"abc", np.uint8)})
    back, extra = flower.unpack(flower.pack(request, {"client": 3}))
    _same(request, back)
    assert extra == {"client": 3}
    nan_config = Request("t", 1, np.zeros(1), {"v": float("nan")})
    assert np.isnan(flower.unpack(flower.pack(nan_config))[0].config["v"])

    arrays = {"s": rng.standard_normal((3, 5)),
              "masked": np.array([0, 2 ** 64 - 1, 12345678901234567890], dtype=np.uint64),
              "i8": np.array([-128, 127], dtype=np.int8), "flags": np.array([True, False]),
              "scalar": np.array(2.5), "empty": np.zeros((0, 4)),
              "fortran": np.asfortranarray(rng.standard_normal((4, 3))),
              "f32": rng.standard_normal(6).astype(np.float32)}
    reply = Reply(2, "ssca.round", 7, 113, 20, arrays, weight=2.5)
    _same(reply, flower.unpack(flower.pack(reply))[0])
    _same(Reply(1, "t", 1, 3, 3, {}), flower.unpack(flower.pack(Reply(1, "t", 1, 3, 3, {})))[0])
    dropout = flower.Dropout(4, "ssca.round", 9, "its node died")
    _same(dropout, flower.unpack(flower.pack(dropout))[0])


def test_what_cannot_cross_is_an_error_not_a_silent_change():
    with pytest.raises(TypeError, match=r"config\['w'\].*cannot cross"):
        flower.pack(Request("t", 1, np.zeros(2), {"w": (1, 2)}))
    with pytest.raises(TypeError, match="cannot send"):
        flower.pack(object())


def _iterates(prob, transport, **opts):
    xs = []
    res = prob.solve(transport=transport, callback=lambda it: xs.append(it.x.copy()), **opts)
    return np.array(xs), res


def test_solve_on_flower_gives_the_in_process_iterates_bit_for_bit():
    """Algorithm 2 (min |w|^2 s.t. cross-entropy <= U: the paper's prob:class-con on a
    784-32-10 network, its matrix products large enough for multi-threaded BLAS) for 20 rounds
    over two penalty stages on 4 nodes: every iterate equal, to the last bit."""
    from problems.mlp import MLP, classification_con

    rng = np.random.default_rng(0)
    X, y = rng.random((1600, 784)), rng.integers(0, 10, 1600)
    net = MLP(784, 32, 10)
    prob = classification_con(ss.FederatedData.split(X, y, num_clients=4, seed=0), net, U=2.0)
    opts = dict(max_iter=20, penalty=(10.0, 100.0), batch_size=100, tau=0.1, seed=5,
                eval_every=5, x0=net.init(0), check_gradients=False)
    xa, a = _iterates(prob, "inprocess", **opts)
    xb, b = _iterates(prob, "flower", **opts)
    assert xa.shape == (20, net.dim) and np.array_equal(xa, xb)      # every iterate, exactly
    assert np.array_equal(a.x, b.x) and a.fun == b.fun
    assert np.array_equal(a.history.constraints, b.history.constraints)
    assert a.communication == b.communication and b.nit == 20


def test_an_equality_constraint_runs_on_flower(cancer):
    """An equality f == b travels as statistics like any constraint: on Flower the iterates
    equal the in-process ones to the last bit, and the multiplier keeps its sign."""
    X, y = cancer
    y = y.astype(float)
    pi0 = float(np.mean(y == 0))
    squares = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                                lambda w, X, y: X.T @ (X @ w - y) / len(y), name="squares")
    mean0 = ss.SampleFunction(lambda w, X, y: (y == 0) * (X @ w) / pi0,
                              lambda w, X, y: X.T @ ((y == 0) / pi0) / len(y), name="mean0")
    prob = ss.Problem(squares, [mean0 == 0.3], dim=X.shape[1],
                      data=ss.FederatedData.split(X, y, num_clients=3, seed=0))
    opts = dict(max_iter=15, seed=2, eval_every=5)
    xa, a = _iterates(prob, "inprocess", **opts)
    xb, b = _iterates(prob, "flower", **opts)
    assert np.array_equal(xa, xb) and np.array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.kkt.multipliers, b.kkt.multipliers)


def test_a_newton_round_asking_for_some_functions_curvature_runs_on_flower():
    """The Newton model's rounds on many curved inequality constraints, whose requests list
    the functions whose curvature they ask for (an integer request array): on Flower the
    in-process iterates, bit for bit, and the same floats."""
    from test_newton import _many_curved_constraints

    prob = _many_curved_constraints(m=20)
    opts = dict(seed=0, x0=np.zeros(6))
    xa, a = _iterates(prob, "inprocess", **opts)
    xb, b = _iterates(prob, "flower", **opts)
    assert a.status == b.status == "converged", a.message
    assert np.array_equal(xa, xb) and np.array_equal(a.x, b.x)
    assert a.communication == b.communication


def test_secure_aggregation_with_partial_participation_runs_on_flower(cancer):
    """Secure aggregation keeps each client's secrets between the four messages of an
    aggregation: on Flower they live in the node's Context (a Ray actor or ClientApp process
    does not outlive a message). Same masked sums, so the same iterates as in process."""
    from problems.neyman_pearson import neyman_pearson

    X, y = cancer
    prob = neyman_pearson(ss.FederatedData.split(X, y, num_clients=4, seed=0), alpha=0.3)
    opts = dict(max_iter=6, penalty=(10.0,), batch_size=20, tau=0.1, seed=5, eval_every=3,
                secure_aggregation=True, clients_per_round=3, on_client_failure="drop")
    xa, a = _iterates(prob, "inprocess", **opts)
    xb, b = _iterates(prob, "flower", **opts)
    assert xa.shape == (6, 31) and np.array_equal(xa, xb)
    assert a.communication == b.communication


def test_flower_options_are_checked():
    prob = ss.Problem(ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0)),
                      dim=2, data=ss.FederatedData([np.ones((3, 2)), np.ones((3, 2))]))
    with pytest.raises(ValueError, match="flower_engine must be one of"):
        prob.solve(transport="flower", flower_engine="cloud")
    with pytest.raises(ValueError, match="needs flower_superlink"):
        prob.solve(transport="flower", flower_engine="deployment")
    with pytest.raises(ValueError, match="flower_superlink must be 'host:port'"):
        prob.solve(transport="flower", flower_engine="deployment", flower_superlink="local")
    with pytest.raises(ValueError, match="only apply to transport='flower'"):
        prob.solve(transport="process", flower_engine="simulation")
    with pytest.raises(ValueError, match="only apply to flower_engine='deployment'"):
        prob.solve(transport="flower", flower_superlink="127.0.0.1:9093")


# -- failures, on one simulation shared by the tests below ----------------------------------------

def _handler(client, request):
    cfg = request.config
    if cfg.get("raise") == client.index:
        raise ValueError(f"boom in {client.index}")
    if cfg.get("user") == client.index:
        raise UserFunctionError("f returned NaN")
    if cfg.get("sleep") == client.index:
        time.sleep(float(cfg["seconds"]))
    if cfg.get("die") == client.index:
        os._exit(9)                              # the node's process dies mid-run
    return client.reply(request, {"x": request.w * (client.index + 1),
                                  "w_writeable": np.array(request.w.flags.writeable)})


#: times the clients' task tables were pickled in this process (see _Counted)
PICKLED = [0]


class _Counted:
    """A task-table entry that counts its own pickling: Flower's Ray backend pickles the
    ClientApp (and with it every client) as an argument of each message."""

    def __call__(self, client, request):
        return _handler(client, request)

    def __reduce__(self):
        PICKLED[0] += 1
        return (_Counted, ())


def _children() -> set:
    """PIDs of this process's child processes (Ray's, once a simulation runs)."""
    me, out = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    out.add(int(pid))
        except (OSError, IndexError):
            pass
    return out


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


@pytest.fixture(scope="module")
def transport():
    before = _children()
    counted = _Counted()
    clients = [Client(i, ClientData(np.ones((4, 2))), 7, {"t": _handler, "c": counted})
               for i in range(3)]
    with flower.FlowerTransport(clients, timeout=10.0) as tr:
        assert _children() - before            # Ray's processes run
        yield tr
    deadline = time.monotonic() + 120        # Ray's processes exit slowly on a loaded machine
    while _lasting(before) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {pid: _name(pid) for pid in _lasting(before)}
    assert not left, f"close() left processes of the simulation behind: {left}"


def _lasting(before: set) -> set:
    """New child processes that exist in two looks one second apart. A CI run once failed on a
    child that appeared after close() and was gone a moment later (its name unreadable): a
    process that has exited is not left behind."""
    first = _children() - before
    if not first:
        return set()
    time.sleep(1.0)
    return first & _children()


def _request(t, **config):
    return Request("t", t, np.arange(3.0), config)


def test_replies_come_in_the_order_asked_from_read_only_requests(transport):
    replies = transport.exchange(_request(1))
    assert [r.client for r in replies] == [0, 1, 2]
    np.testing.assert_array_equal(replies[2].arrays["x"], 3 * np.arange(3.0))
    assert not any(bool(r.arrays["w_writeable"]) for r in replies)
    some = list(transport.stream(_request(2), participants=[2, 0]))
    assert [r.client for r in some] == [2, 0]
    with pytest.raises(ValueError, match="participants must be distinct"):
        list(transport.stream(_request(3), participants=[0, 0]))


def test_the_clients_are_pickled_once_not_with_every_message(transport):
    """The simulation's clients (their rows, the problem's functions) reach the Ray actors once
    through Ray's object store (clientapp.ClientTable), not pickled again with every message:
    300 constraints as separate functions made a round 2x slower than one vector function."""
    before = PICKLED[0]
    for t in (21, 22, 23):
        replies = transport.exchange(Request("c", t, np.arange(3.0), {}))
        assert [r.client for r in replies] == [0, 1, 2]
        np.testing.assert_array_equal(replies[1].arrays["x"], 2 * np.arange(3.0))
    assert PICKLED[0] - before <= 1          # 9 messages: at most the one put


def test_a_client_error_names_the_client_and_the_transport_goes_on(transport):
    with pytest.raises(ClientError, match=r"client 1, round 4: raised builtins.ValueError: "
                       r"boom in 1") as err:
        transport.exchange(_request(4, **{"raise": 1}))
    assert err.value.client == 1 and "boom in 1" in err.value.remote_traceback
    with pytest.raises(UserFunctionError, match="f returned NaN"):     # keeps its type
        transport.exchange(_request(5, user=2))
    out = list(transport.stream(_request(6, **{"raise": 0}), tolerate_failures=True))
    assert isinstance(out[0], flower.Dropout) and out[0].client == 0 and out[0].round == 6
    assert "boom in 0" in out[0].error and [type(r) for r in out[1:]] == [Reply, Reply]
    assert len(transport.exchange(_request(7))) == 3


def test_a_client_that_does_not_answer_in_time(transport):
    transport.timeout = 1.0
    try:
        t0 = time.monotonic()
        with pytest.raises(ClientError, match=r"client 2, round 8: no answer within "
                           r"client_timeout=1 s"):
            transport.exchange(_request(8, sleep=2, seconds=3.0))
        assert time.monotonic() - t0 < 3
        time.sleep(3.0)        # the simulation's actors are shared: wait until it is free
        t0 = time.monotonic()
        out = list(transport.stream(_request(9, sleep=1, seconds=3.0), tolerate_failures=True))
        assert time.monotonic() - t0 < 3
        assert isinstance(out[1], flower.Dropout) and "no answer" in out[1].error
        assert isinstance(out[0], Reply) and isinstance(out[2], Reply)
    finally:
        transport.timeout = 10.0
    time.sleep(3.0)                        # the sleeper finishes; their late replies are dropped
    assert [r.round for r in transport.exchange(_request(10))] == [10, 10, 10]


def test_a_node_killed_mid_run_is_a_dropout_or_a_client_error(transport):
    """Runs last on the shared simulation: Flower 1.42 does not restart a dead Ray actor, and
    as a failing actor is free again at once, later messages (of any node) tend to land on it
    and fail too: each is a Dropout in its place, and the transport still answers in order."""
    out = list(transport.stream(_request(11, die=1), tolerate_failures=True))
    assert isinstance(out[1], flower.Dropout) and out[1].client == 1
    assert "failed" in out[1].error and "died" in out[1].error.lower()
    after = list(transport.stream(_request(12), tolerate_failures=True))
    assert [r.client for r in after] == [0, 1, 2] and all(r.round == 12 for r in after)
    assert all("died" in r.error.lower() for r in after if isinstance(r, flower.Dropout))
    with pytest.raises(ClientError, match=r"client 0, round 13: its Flower node \d+ failed"):
        transport.exchange(_request(13, die=0))


