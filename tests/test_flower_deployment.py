"""transport="flower" with flower_engine="deployment": a SuperLink and two SuperNodes on
127.0.0.1 (free ports), each node loading its own rows from a .npz file named in its node
config. Slow (Flower 1.42 starts a fresh ClientApp process per message and polls every few
seconds): run with ``pytest -m slow tests/test_flower_deployment.py``. Every process is started
here, recorded by its PID and stopped by that PID."""

import os

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is an optional extra: pip install 'ssca-solver[flower]'")

import ssca_solver as ss  # noqa: E402
from problems.neyman_pearson import neyman_pearson  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def federation(tmp_path_factory, cancer):
    """(SuperLink address, the FederatedData whose blocks the nodes hold, the PIDs)."""
    from ssca_solver.federated.flower import LocalFederation

    X, y = cancer
    data = ss.FederatedData.split(X, y, num_clients=2, seed=0)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    with LocalFederation(data, tmp_path_factory.mktemp("federation")) as fed:
        assert len(fed.pids) == 3
        yield fed.superlink, data, fed.pids
        procs = fed.procs
    assert all(p.poll() is not None for p in procs)     # stopped, by their PIDs


def test_a_superlink_and_two_supernodes_give_the_in_process_iterates(federation):
    superlink, data, pids = federation
    prob = neyman_pearson(data, alpha=0.3)
    opts = dict(max_iter=4, penalty=(10.0,), batch_size=20, tau=0.1, seed=5, eval_every=2,
                check_gradients=False)
    runs = {}
    for transport, extra in (("inprocess", {}),
                             ("flower", dict(flower_engine="deployment", client_timeout=120,
                                             flower_superlink=superlink,
                                             flower_start_timeout=120))):
        xs = []
        res = prob.solve(transport=transport, callback=lambda it: xs.append(it.x.copy()),
                         **opts, **extra)
        runs[transport] = (np.array(xs), res)
    (xa, a), (xb, b) = runs["inprocess"], runs["flower"]
    assert xa.shape == (4, 31) and np.array_equal(xa, xb)
    assert np.array_equal(a.x, b.x) and a.communication == b.communication


def test_secure_aggregation_runs_on_the_deployment_runtime(federation):
    """The clients' secrets live in each node's Flower Context between the messages of one
    aggregation (Flower starts a fresh ClientApp process per message)."""
    superlink, data, pids = federation
    prob = neyman_pearson(data, alpha=0.3)
    opts = dict(max_iter=2, penalty=(10.0,), batch_size=20, tau=0.1, seed=5, eval_every=None,
                check_gradients=False, secure_aggregation=True)
    xs = {}
    for transport, extra in (("inprocess", {}),
                             ("flower", dict(flower_engine="deployment", client_timeout=120,
                                             flower_superlink=superlink,
                                             flower_start_timeout=120))):
        got = []
        prob.solve(transport=transport, callback=lambda it: got.append(it.x.copy()), **opts,
                   **extra)
        xs[transport] = np.array(got)
    assert xs["inprocess"].shape == (2, 31) and np.array_equal(xs["inprocess"], xs["flower"])
