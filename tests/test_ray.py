"""transport="ray" (:mod:`ssca_solver.federated.raytransport`): the clients in shards, each a
Ray actor on a local cluster (one cluster for the module, bound to 127.0.0.1, shut down at
its end). Skipped where Ray is not installed (the "ray" or "flower" extra brings it).

* The iterates, status and messages equal the in-process ones (one client at a time).
* Without ``shards``, one shard per CPU.
* An exception raised in a client's function arrives as itself, naming the client.
* A killed actor drops its shard's clients (``on_client_failure="drop"``; the actor is started
  afresh and the run goes on) or stops the solve with a ClientError naming them.
"""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import ssca_solver as ss  # noqa: E402
from ssca_solver.federated.threads import available_cpus  # noqa: E402

from test_shards import _problem, _same, killed_worker_is_dropped_or_named  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cluster():
    from ssca_solver.federated.raytransport import local_runtime_env

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             configure_logging=False, runtime_env=local_runtime_env())
    yield
    ray.shutdown()


def test_same_iterates_as_in_process():
    prob, _ = _problem(num_clients=40)
    for opts in (dict(batch_size="full"), dict(batch_size=16, clients_per_round=10)):
        a = prob.solve(seed=2, max_iter=10, **opts)
        b = prob.solve(seed=2, max_iter=10, transport="ray", shards=3, **opts)
        _same(a, b)
        assert a.communication == b.communication


def test_default_shards_one_per_cpu():
    from ssca_solver.federated.registry import make_transport
    from ssca_solver.federated import build_clients

    prob, _ = _problem(num_clients=40)
    opts = ss.SSCA.parse(prob, {"transport": "ray"})
    t = make_transport("ray", build_clients(prob.data, 0, {}), "auto", opts)
    try:
        assert len(t.shards) == min(40, available_cpus()) and len(t.carrier.pids) == len(t.shards)
    finally:
        t.close()


def test_a_clients_exception_arrives_as_itself():
    X = _problem(num_clients=20)[0].data.clients[13].X[0].copy()
    prob, _ = _problem(num_clients=20, fail_on=X)
    with pytest.raises(ss.UserFunctionError, match="client 13"):
        prob.solve(seed=0, max_iter=3, transport="ray", shards=2, batch_size="full",
                   check_gradients=False)


def test_a_killed_actor_drops_its_clients_or_is_named(tmp_path):
    killed_worker_is_dropped_or_named(
        tmp_path, r"client 20\.\.29, round 4: the worker of shard 2 failed: its Ray actor",
        transport="ray")


def test_secure_aggregation_between_actors():
    pytest.importorskip("cryptography")
    prob, _ = _problem(num_clients=30)
    opts = dict(seed=1, max_iter=8, batch_size="full", secure_aggregation=True)
    a = prob.solve(**opts)
    b = prob.solve(transport="ray", shards=3, **opts)
    assert (a.status, a.nit) == (b.status, b.nit)
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-8)
