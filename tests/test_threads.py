"""client_threads: clients in other processes limit their BLAS/OpenMP/Numba thread pools
(issue 21), so N client processes do not start N x cores threads on one machine.

Every ProcessTransport here is closed by its ``with`` block, which stops exactly the client
processes it forked (their PIDs are checked to be gone)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.federated import Request, build_clients
from ssca_solver.federated import transports as tr
from ssca_solver.federated.registry import check_transport_options


def _pools(client, request):
    """A client's view of its own thread pools: the BLAS count, Numba's, and OMP_NUM_THREADS."""
    from threadpoolctl import threadpool_info
    import numba

    blas = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    omp = os.environ.get("OMP_NUM_THREADS", "")
    return client.reply(request, {
        "blas": np.array(blas, dtype=float),
        "numba": np.array([numba.get_num_threads()], dtype=float),
        "omp": np.array([float(omp) if omp.isdigit() else -1.0]),
        "pid": np.array([float(os.getpid())])})


def _ask(num_clients, **kwargs):
    data = ss.FederatedData.split(np.ones((4 * num_clients, 2)), num_clients=num_clients, seed=0)
    clients = build_clients(data, 1, {"pools": _pools})
    with tr.ProcessTransport(clients, timeout=60, **kwargs) as t:
        replies = t.exchange(Request("pools", 1, np.zeros(2)))
        pids, chosen = t.pids, t.client_threads
    for pid in pids:            # close() stopped exactly the processes it forked
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    return replies, chosen


def _blas_threads_here():
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]


def test_auto_shares_the_cpus_out_among_the_client_processes(monkeypatch):
    monkeypatch.setattr(tr, "available_cpus", lambda: 8)
    assert tr.client_thread_count("auto", 4) == (2, True)
    assert tr.client_thread_count("auto", 3) == (2, True)
    assert tr.client_thread_count("auto", 16) == (1, True)      # at least one
    assert tr.client_thread_count("auto", 1) == (8, True)
    assert tr.client_thread_count(3, 16) == (3, False)          # a number: exactly that
    assert tr.client_thread_count(None, 4) is None              # None: left alone
    for bad in (0, -1, 1.5, "1", True, "many"):
        with pytest.raises(ValueError, match="client_threads"):
            tr.client_thread_count(bad, 4)


def test_available_cpus_follows_the_affinity_mask():
    if hasattr(os, "sched_getaffinity"):
        assert tr.available_cpus() == len(os.sched_getaffinity(0))
    assert tr.available_cpus() >= 1


def test_process_clients_limit_their_pools_and_the_server_keeps_its_own():
    here = _blas_threads_here()
    replies, chosen = _ask(4, client_threads=1)
    assert chosen == 1
    for r in replies:
        assert r.arrays["blas"].size == 0 or set(r.arrays["blas"]) == {1.0}
        assert r.arrays["numba"][0] == 1.0 and r.arrays["omp"][0] == 1.0
    assert _blas_threads_here() == here                  # the user's process is untouched


def test_the_default_is_auto_and_none_leaves_the_pools_as_inherited():
    cpus = tr.available_cpus()
    here = _blas_threads_here()
    replies, chosen = _ask(4)
    assert chosen == max(1, cpus // 4)
    for r in replies:
        assert all(k <= chosen for k in r.arrays["blas"])
        assert r.arrays["numba"][0] <= chosen
    replies, chosen = _ask(2, client_threads=None)
    assert chosen is None
    for r in replies:
        assert sorted(r.arrays["blas"]) == sorted(here)


def test_auto_never_raises_a_pool_the_user_made_smaller(monkeypatch):
    """With OMP_NUM_THREADS=1 set by the user and a pool of 1 thread, "auto" on a machine it
    believes has 64 CPUs keeps 1 (an explicit number would set exactly that)."""
    from threadpoolctl import threadpool_limits

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(tr, "available_cpus", lambda: 64)
    with threadpool_limits(1):          # the forked clients inherit the 1-thread pool
        replies, chosen = _ask(2)
    assert chosen == 32
    for r in replies:
        assert all(k == 1 for k in r.arrays["blas"]) and r.arrays["omp"][0] == 1.0


def test_solve_option_reaches_the_client_processes(tmp_path, cancer):
    """``solve(transport="process", client_threads=1)``: the user's functions run under the
    limit; the iterates equal the in-process ones (these matrices are too small to be split
    over threads, so the thread count does not change a bit)."""
    X, y = cancer
    out = str(tmp_path)

    def value(w, X, y):
        from threadpoolctl import threadpool_info

        n = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
        with open(os.path.join(out, f"{os.getpid()}"), "w") as f:
            f.write(",".join(map(str, n)))
        return 0.5 * (X @ w - y) ** 2

    fn = ss.SampleFunction(value, lambda w, X, y: X.T @ (X @ w - y) / len(y), name="sq")
    prob = ss.Problem(fn, dim=X.shape[1],
                      data=ss.FederatedData.split(X, y.astype(float), num_clients=3, seed=0))
    opts = dict(max_iter=5, seed=0, eval_every=0, batch_size=20, check_gradients=False)
    a = prob.solve(transport="process", client_threads=1, **opts)
    seen = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert len(seen) == 3            # one process per client, each pool at 1 thread
    assert all(set(v.split(",")) <= {"", "1"} for v in seen.values()), seen
    b = prob.solve(**opts)
    assert np.array_equal(a.x, b.x)


def test_client_threads_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match=r"only apply to transport='process' or 'flower'.*"
                                         r"threadpool_limits"):
        check_transport_options("inprocess", {"client_threads": 1})
    assert check_transport_options("process", {}) == {"client_threads": "auto"}
    assert check_transport_options("process", {"client_threads": None}) == {
        "client_threads": None}
    with pytest.raises(ValueError, match="client_threads must be"):
        check_transport_options("process", {"client_threads": 0})
    flower = check_transport_options("flower", {})
    assert flower["client_threads"] is None and flower["flower_engine"] == "simulation"
    assert check_transport_options("flower", {"client_threads": "auto"})["client_threads"] \
        == "auto"
    with pytest.raises(ValueError, match="node config"):
        check_transport_options("flower", {"client_threads": 1, "flower_engine": "deployment",
                                           "flower_superlink": "127.0.0.1:9093"})


def test_flower_clients_carry_the_limit_to_their_app():
    """The simulation's clients travel to the ClientApp in its closure: set_client_threads
    marks them, and the app's handler finds the limit there (or in a deployment node's
    config, ``client-threads``)."""
    pytest.importorskip("flwr")
    from ssca_solver.federated.flower import clientapp

    data = ss.FederatedData.split(np.ones((8, 2)), num_clients=4, seed=0)
    clients = build_clients(data, 1, {})

    class Ctx:
        node_config: dict = {}

    assert clientapp.set_client_threads(clients, 2) == (2, False)
    assert all(clientapp._threads_for(c, Ctx()) == (2, False) for c in clients)
    assert clientapp.set_client_threads(clients, None) is None
    assert all(clientapp._threads_for(c, Ctx()) is None for c in clients)
    node = Ctx()
    node.node_config = {"partition-id": 0, "client-threads": "3"}
    assert clientapp._threads_for(clients[0], node) == (3, False)
    auto = clientapp.set_client_threads(clients, "auto")
    assert auto == (max(1, tr.available_cpus() // min(4, tr.available_cpus())), True)


@pytest.mark.slow
def test_flower_simulation_clients_run_under_the_limit(tmp_path, cancer):
    """transport="flower" with client_threads=1: the user's function runs in the Ray actors
    with every BLAS pool at one thread (the simulation is closed by the solve)."""
    pytest.importorskip("flwr")
    X, y = cancer
    out = str(tmp_path)

    def value(w, X, y):
        from threadpoolctl import threadpool_info

        n = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
        with open(os.path.join(out, f"{os.getpid()}"), "w") as f:
            f.write(",".join(map(str, n)))
        return 0.5 * (X @ w - y) ** 2

    fn = ss.SampleFunction(value, lambda w, X, y: X.T @ (X @ w - y) / len(y), name="sq")
    prob = ss.Problem(fn, dim=X.shape[1],
                      data=ss.FederatedData.split(X, y.astype(float), num_clients=2, seed=0))
    prob.solve(transport="flower", client_threads=1, max_iter=3, seed=0, eval_every=0,
               batch_size=20, check_gradients=False)
    seen = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert seen and all(set(v.split(",")) <= {"", "1"} for v in seen.values()), seen
