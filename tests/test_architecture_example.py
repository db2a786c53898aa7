"""The new method of docs/architecture.md (docs/examples/new_method.py) runs on the runner
like the built-in ones: same batches, transports, callbacks and checkpoints."""

import importlib.util
from pathlib import Path

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "new_method.py"


@pytest.fixture(scope="module")
def gd():
    spec = importlib.util.spec_from_file_location("new_method", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)          # registers method "gd"
    return module


def ridge_logistic(data):
    return ss.Problem(logistic_loss(), dim=31, data=data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))


@pytest.mark.parametrize("batch_size", ["full", 15])
def test_gradient_descent_equals_fedsgd_on_the_same_batches(gd, cancer_data, batch_size):
    """FedSGD's E = 1 local step draws the batch of (seed, client, round, 0), as the new
    method's task does: both are w - lr (sum_i N_i/(B N) g_i + 2 lambda w)."""
    prob = ridge_logistic(cancer_data)
    a, b = [], []
    ra = prob.solve(method="gd", batch_size=batch_size, lr=0.3, max_iter=6, seed=9,
                    eval_every=2, callback=lambda it: a.append(it.x.copy()))
    prob.solve(method="fedavg", batch_size=batch_size, lr=0.3, max_iter=6, seed=9,
               eval_every=None, callback=lambda it: b.append(it.x.copy()))
    np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-12, atol=1e-14)
    assert ra.method == "gd" and ra.status == "max_iter" and not ra.success
    assert ra.communication.up_total == 6 * 5 * 31 and list(ra.history.eval_t) == [2, 4, 6]


def test_the_new_method_gets_stop_resume_and_processes_for_free(gd, cancer_data, tmp_path):
    prob = ridge_logistic(cancer_data)
    opts = dict(method="gd", batch_size=10, lr=0.3, max_iter=12, eval_every=None)
    full = prob.solve(seed=4, **opts)
    first = prob.solve(seed=4, checkpoint=tmp_path / "gd.npz",
                       callback=lambda it: it.t == 5, **opts)
    assert first.status == "stopped" and first.nit == 5
    resumed = prob.solve(resume=tmp_path / "gd.npz", transport="process", **opts)
    np.testing.assert_allclose(resumed.x, full.x, rtol=1e-12, atol=1e-14)
    with pytest.raises(TypeError, match="unknown solve option 'tau' for method 'gd'"):
        prob.solve(method="gd", tau=0.1)


def test_the_new_method_gets_secure_aggregation_by_declaring_it(gd, cancer_data):
    """GradientDescent declares supports_secure_aggregation (it reads replies only through
    aggregation_weight): the masked sums give the plain run's iterates to the fixed-point
    encoding's precision."""
    prob = ridge_logistic(cancer_data)
    opts = dict(method="gd", batch_size=10, lr=0.3, max_iter=5, seed=2, eval_every=None)
    plain = prob.solve(**opts)
    secure = prob.solve(secure_aggregation=True, **opts)
    np.testing.assert_allclose(secure.x, plain.x, rtol=0, atol=1e-9)
    assert secure.communication.up_total > plain.communication.up_total


def test_the_new_method_gets_the_certificate_by_declaring_certifies(gd, cancer_data):
    """A subclass that declares ``certifies = True`` (and the tolerances in its options) is
    stopped by the runner's full-data KKT test and reports "converged" at the optimum; without
    it the same run is "max_iter"."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class CertifiedOptions(gd.GDOptions):
        feas_tol: float = 1e-4
        kkt_tol: float = 1e-4

    class CertifiedGD(gd.GradientDescent):
        name = "gd_kkt"
        Options = CertifiedOptions

        @classmethod
        def build(cls, problem, o, given):
            method = super().build(problem, o, given)
            method.opts = o
            return method

        certifies = True

        status = ss.Method.status           # the shared rules: "converged" only from the test

    ss.register_method("gd_kkt", CertifiedGD)
    prob = ridge_logistic(cancer_data)
    res = prob.solve(method="gd_kkt", batch_size="full", lr=0.5, max_iter=3000, eval_every=10)
    assert res.status == "converged" and res.success and res.nit < 3000
    assert res.kkt.passed(1e-4, 1e-4)
    ref = prob.solve(method="ssca", seed=0)
    assert ref.success and abs(res.fun - ref.fun) <= 1e-6 * abs(ref.fun)
    plain = prob.solve(method="gd", batch_size="full", lr=0.5, max_iter=res.nit)
    assert plain.status == "max_iter" and not plain.success


def test_a_registered_transport_runs_every_method(cancer_data):
    """The transport sketch of docs/architecture.md: clients in a thread pool."""
    from concurrent.futures import ThreadPoolExecutor

    from ssca_solver.federated import Transport, register_transport

    class ThreadTransport(Transport):
        def __init__(self, clients, timeout):
            self.clients, self.timeout = list(clients), timeout
            self.num_clients = len(self.clients)
            self.pool = ThreadPoolExecutor(max_workers=2)

        def stream(self, request):
            request = request.read_only()        # one read-only broadcast copy
            futures = [self.pool.submit(c.handle, request) for c in self.clients]
            for f in futures:                    # client order
                yield f.result(timeout=self.timeout)

        def close(self):
            self.pool.shutdown()

    register_transport("threads", ThreadTransport)
    prob = ridge_logistic(cancer_data)
    for method in ("ssca", "fedavg"):
        ref = prob.solve(method=method, batch_size=10, max_iter=8, seed=1, eval_every=4)
        res = prob.solve(method=method, batch_size=10, max_iter=8, seed=1, eval_every=4,
                         transport="threads")
        np.testing.assert_array_equal(res.x, ref.x)
        np.testing.assert_array_equal(res.history.objective, ref.history.objective)
    with pytest.raises(ValueError, match="transport must be one of 'inprocess', 'process'"):
        prob.solve(transport="pigeon")
