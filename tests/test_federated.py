"""The federated boundary: what crosses it, who computes what, and the weights N_i/(B N)."""

import pickle

import numpy as np
import pytest

import ssca_solver as ss
from problems.neyman_pearson import neyman_pearson
from conftest import round_request, ssca_clients
from ssca_solver.diagnostics.evaluation import Evaluator
from ssca_solver.methods.ssca.step import combine, stat_key
from ssca_solver.federated import InProcessTransport, Reply


def test_messages_hold_only_declared_statistics(cancer_data):
    prob = neyman_pearson(cancer_data, alpha=0.2)
    d = prob.dim
    transport = InProcessTransport(ssca_clients(prob, seed=0))
    msgs = transport.exchange(round_request(1, np.zeros(d), 7))
    assert len(msgs) == cancer_data.num_clients
    for i, m in enumerate(msgs):
        assert isinstance(m, Reply) and m.client == i and m.batch_size == 7
        assert m.num_rows == cancer_data.client_sizes[i] and m.task == "ssca.round"
        specs = {stat_key(j, s.name): s.shape for j, builder in enumerate(prob.builders)
                 for s in builder.statistic_specs(d)}   # objective and one constraint
        assert {k: np.shape(v) for k, v in m.arrays.items()} == specs
        assert m.num_floats() == 2 * (d + 2)
        clone = pickle.loads(pickle.dumps(m))  # plain data: it can cross a process or network
        for k in m.arrays:
            np.testing.assert_array_equal(clone.arrays[k], m.arrays[k])
    ev = Evaluator(prob).evaluate(transport, np.zeros(d), with_grad=True)
    assert ev.values.shape == (2,) and ev.grads.shape == (2, d)


def test_combine_uses_weights_Ni_over_B_N():
    a = Reply(0, "ssca.round", 1, num_rows=3, batch_size=2, arrays={"0:x": np.array([1.0, 2.0])})
    b = Reply(1, "ssca.round", 1, num_rows=7, batch_size=2, arrays={"0:x": np.array([10.0, 0.0])})
    out = combine([a, b], num_samples=10)
    np.testing.assert_allclose(out[0]["x"], 3 / 20 * np.array([1.0, 2.0]) + 7 / 20 * np.array(
        [10.0, 0.0]))


def test_full_batch_estimate_is_the_full_data_surrogate(cancer):
    """With B = N_i every client sums its whole shard; the combination is the exact average."""
    X, y = cancer
    data = ss.FederatedData([(X[:100], y[:100]), (X[100:350], y[100:350]), (X[350:], y[350:])])
    prob = neyman_pearson(data, alpha=0.2)
    w = np.random.default_rng(0).normal(size=prob.dim) * 0.1
    msgs = InProcessTransport(ssca_clients(prob, 0)).exchange(round_request(1, w, None))
    est = combine(msgs, data.num_samples)
    f = prob.functions[1]
    assert np.isclose(prob.builders[1].evaluate(est[1], w), f.value(w, X, y).mean())
    np.testing.assert_allclose(est[1]["lin"], f.grad(w, X, y) - 2 * 0.1 * w, rtol=1e-12)


def test_communication_is_counted_from_messages(cancer_data):
    prob = neyman_pearson(cancer_data, alpha=0.2)
    res = prob.solve(batch_size=5, max_iter=4, penalty=[10.0], seed=0, eval_every=2)
    c = res.communication
    d, I = prob.dim, cancer_data.num_clients
    assert (c.up_per_client_round, c.down_per_client_round) == (2 * (d + 2), d)
    assert c.rounds == res.nit and c.up_total == res.nit * I * 2 * (d + 2)
    assert c.down_total == res.nit * I * d
    # the probe (4 numbers per function), the start point's gradient scale, two history
    # evaluations with the KKT test and the final one (values and gradients)
    assert c.eval_up_total == I * 2 * 4 + 4 * I * (2 + 2 * d)
    assert c.eval_down_total == 5 * I * d


def _poison_after_first_round(data, log):
    def callback(it):
        if it.t == 1:
            for c in data.clients:
                c.X[:] = np.nan
        log.append(it.t)
    return callback


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_server_never_reads_client_rows():
    """Run clients in their own processes, then overwrite every row the server process still
    holds with NaN after round 1. If the server read rows, the run would fail or change."""
    from ssca_solver.datasets import breast_cancer

    X, y = breast_cancer()

    def fresh():
        return ss.FederatedData.split(X, y, num_clients=3, seed=0)

    opts = dict(batch_size=10, max_iter=15, penalty=[10.0], seed=3, eval_every=5)
    reference = neyman_pearson(fresh(), 0.2).solve(**opts)
    data, log = fresh(), []
    res = neyman_pearson(data, 0.2, class_fractions=(np.mean(y == 0), np.mean(y == 1))).solve(
        transport="process", callback=_poison_after_first_round(data, log), **opts)
    assert np.isnan(data.clients[0].X).all() and log[-1] == 15
    np.testing.assert_allclose(res.x, reference.x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.history.objective, reference.history.objective, rtol=1e-10)
    assert res.kkt.stationarity == pytest.approx(reference.kkt.stationarity, rel=1e-8)
    # the same poisoning with in-process clients is caught: the poison is real
    data2 = fresh()
    with pytest.raises(ss.UserFunctionError, match="client 0, round 2"):
        neyman_pearson(data2, 0.2, class_fractions=(np.mean(y == 0), np.mean(y == 1))).solve(
            callback=_poison_after_first_round(data2, []), **opts)


def test_fused_average_equals_combine_then_average(cancer_data):
    from ssca_solver.methods.ssca import step as driver

    prob = neyman_pearson(cancer_data, alpha=0.2)
    msgs = InProcessTransport(ssca_clients(prob, 0)).exchange(
        round_request(1, np.full(prob.dim, 0.1), 7))
    prev = driver.init(np.zeros(prob.dim), prob.builders, 0.1, "tau").stats
    a = driver.average_with_messages(prev, msgs, cancer_data.num_samples, 0.3)
    b = driver.average_statistics(prev, combine(msgs, cancer_data.num_samples), 0.3)
    for x, z in zip(a, b):
        for k in x:
            np.testing.assert_allclose(x[k], z[k], rtol=1e-14, atol=1e-15)
