import os

import numpy as np
import pytest

import ssca_solver as ss
from cvxpy.reductions.solvers.solving_chain import SolvingChain
from ssca_solver.datasets import breast_cancer

#: wall-clock bounds that tests check (how long a timeout, a cleanup or an exit may take) are
#: multiplied by this, so that they hold on a busy machine: a 2-core machine at load 10 runs
#: a process several times slower than a quiet one. Set SSCA_TEST_TIME_SCALE to change it.
TIME_SCALE = float(os.environ.get("SSCA_TEST_TIME_SCALE", "5"))


def slack(seconds: float) -> float:
    """A wall-clock bound of ``seconds`` on a quiet machine, scaled for a busy one."""
    return seconds * TIME_SCALE


@pytest.fixture
def compiles(monkeypatch):
    """The problems CVXPY compiles (SolvingChain.apply) while the test runs, in order."""
    seen = []
    original = SolvingChain.apply

    def counting_apply(self, problem, verbose=False):
        seen.append(problem)
        return original(self, problem, verbose)

    monkeypatch.setattr(SolvingChain, "apply", counting_apply)
    return seen


@pytest.fixture(scope="session")
def cancer():
    return breast_cancer()


@pytest.fixture(scope="session")
def cancer_data(cancer):
    X, y = cancer
    return ss.FederatedData.split(X, y, num_clients=5, seed=0)


def quadratic_function(name="quad"):
    """f(w, x) = 0.5 |w - x|^2: F(w) = 0.5 mean |w - x_n|^2, a simple exact reference."""

    def value(w, X, y):
        return 0.5 * np.sum((w - X) ** 2, axis=1)

    def grad(w, X, y):
        return w - X.mean(axis=0)

    return ss.SampleFunction(value, grad, name=name)


def model_subproblem(rng, d: int, M: int, B: np.ndarray, c: float, tol: float = 1e-12):
    """A random Problem 5 with a model of the Hessian: proximal-linear statistics of 1 + M
    functions (curvature 0.3) at a random centre x, bounds U = 0, and its reference solution,
    the problem written out in CVXPY with (w - x)' B (w - x) / 2 added to the objective's
    surrogate and solved by Clarabel at tolerance ``tol``, 10 tol and 100 tol, the point of
    the lowest objective (with exact slacks: every point is feasible) kept: at 1e-12 Clarabel
    can stop "optimal_inaccurate" 2e-7 from the optimum (one seed of test_newton on an AMD
    EPYC, 1.4e-9 above the closed form's value; 1.5e-10 from it at 1e-11). Returns (stats, x,
    U, w_ref, value_ref)."""
    import cvxpy as cp

    x = rng.standard_normal(d)
    stats = []
    for m in range(1 + M):
        a, g, f = 0.3, rng.standard_normal(d), rng.normal() + (0.5 if m else 0.0)
        stats.append({"const": np.asarray(f - g @ x + a * x @ x), "lin": g - 2 * a * x,
                      "quad": np.asarray(a)})
    U = np.zeros(M)
    w, s = cp.Variable(d), cp.Variable(M, nonneg=True)

    def p(m):
        st = stats[m]
        return float(st["quad"]) * cp.sum_squares(w) + st["lin"] @ w + float(st["const"])

    ref = cp.Problem(cp.Minimize(p(0) + 0.5 * cp.quad_form(w - x, cp.psd_wrap(B))
                                 + c * cp.sum(s)),
                     [p(m) - U[m - 1] <= s[m - 1] for m in range(1, M + 1)])
    def exact(v):
        q = [float(stats[m]["quad"]) * v @ v + stats[m]["lin"] @ v + float(stats[m]["const"])
             for m in range(1 + M)]
        return (q[0] + 0.5 * (v - x) @ B @ (v - x)
                + c * sum(max(q[m] - U[m - 1], 0.0) for m in range(1, M + 1)))

    best = None
    for t in (tol, 10.0 * tol, 100.0 * tol):
        ref.solve(solver="CLARABEL", tol_gap_abs=t, tol_gap_rel=t, tol_feas=t)
        if w.value is not None and (best is None or exact(w.value) < exact(best)):
            best = w.value.copy()
    return stats, x, U, best, exact(best)


def ssca_clients(prob, seed=0):
    """The clients a solve of ``prob`` by method "ssca" would build (round and evaluation
    tasks), for tests that drive rounds by hand."""
    from ssca_solver.methods.ssca.algorithm import SSCARoundTask
    from ssca_solver.diagnostics.evaluation import Evaluator
    from ssca_solver.federated import build_clients
    from ssca_solver.engine.options import seed_entropy

    tasks = {"ssca.round": SSCARoundTask(prob.functions, prob.builders), **Evaluator(prob).tasks}
    return build_clients(prob.data, seed_entropy(seed), tasks)


def round_request(t, w, batch_size, tau=0.1):
    """The request of SSCA's round t at w (batch_size None: full batch)."""
    from ssca_solver.federated import Request

    return Request("ssca.round", t, w, {"batch_size": batch_size, "tau": tau})


def diabetes_older_group(U, column_scale=1.0):
    """The walkthrough's problem: least squares on diabetes s.t. the older group's mean error
    <= U (4 clients, ridge 1e-3 |w|^2), with column 3 multiplied by ``column_scale``.
    Returns (problem, X, Y, (loss, older_group_loss))."""
    import cvxpy as cp

    from problems.least_squares import diabetes_regression

    X, y = diabetes_regression()
    X = X.copy()
    X[:, 3] *= column_scale
    older = X[:, 0] > 0
    Y = np.column_stack([y, older])
    pi = older.mean()
    loss = ss.SampleFunction(lambda w, X, Y: 0.5 * (X @ w - Y[:, 0]) ** 2,
                             lambda w, X, Y: X.T @ (X @ w - Y[:, 0]) / len(X), name="error",
                             convexity="convex")
    old = ss.SampleFunction(lambda w, X, Y: Y[:, 1] / pi * 0.5 * (X @ w - Y[:, 0]) ** 2,
                            lambda w, X, Y: X.T @ (Y[:, 1] / pi * (X @ w - Y[:, 0])) / len(X),
                            name="older", convexity="convex")
    prob = ss.Problem(loss, [old <= U], dim=X.shape[1],
                      data=ss.FederatedData.split(X, Y, num_clients=4, seed=0),
                      regularizer=lambda w: 1e-3 * cp.sum_squares(w))
    return prob, X, Y, (loss, old)


def kill_process_client_at(t, client, killed):
    """A solve callback that SIGKILLs the process of ``client`` (process transport) after round
    ``t`` and appends its PID to ``killed``."""
    import multiprocessing as mp
    import os
    import signal

    def callback(it):
        if it.t == t:
            pids = {int(p.name.rsplit("-", 1)[1]): p.pid for p in mp.active_children()
                    if p.name.startswith("ssca-client-")}
            killed.append(pids[client])
            os.kill(pids[client], signal.SIGKILL)

    return callback


#: the first column of the marked client's rows in :func:`hooked_least_squares`
HOOK_MARK = 7.0


def hooked_lsq_function(hook=None, name="lsq", record=None) -> ss.SampleFunction:
    """f(w, x, y) = (x.w - y)^2 / 2; ``hook(X)`` runs first in every call (in the client's
    process, to misbehave); with a directory ``record``, every process that calls it leaves a
    file named by its PID there (test_faults, test_timeouts, test_flower_deployment)."""

    def before(X):
        if record is not None:
            (record / f"pid-{os.getpid()}").touch()
        if hook is not None:
            hook(X)

    def value(w, X, y):
        before(X)
        return 0.5 * (X @ w - y) ** 2

    def grad(w, X, y):
        before(X)
        return X.T @ (X @ w - y) / len(y)

    return ss.SampleFunction(value, grad, name=name)


def hooked_least_squares(hook, num_clients=3):
    """Least squares on ``num_clients`` clients of 20 rows; client 1's rows have the first
    column HOOK_MARK, and every call of the functions first runs ``hook(X)`` (in the client's
    process): a function made to hang, spin or compile on one client (test_timeouts,
    test_flower_deployment)."""
    rng = np.random.default_rng(0)
    blocks = []
    for i in range(num_clients):
        X = rng.normal(size=(20, 3))
        if i == 1:
            X[:, 0] = HOOK_MARK
        blocks.append((X, X @ np.ones(3)))
    return ss.Problem(hooked_lsq_function(hook), dim=3, data=ss.FederatedData(blocks))


def register_thread_pool_transport(name: str, workers: int = 3) -> str:
    """Register (under ``name``) a transport whose clients answer from a thread pool, the
    kind docs/architecture.md sketches: several clients' functions run at once in one
    process. Returns the name."""
    from concurrent.futures import ThreadPoolExecutor

    from ssca_solver.federated import Transport, register_transport

    class ThreadPool(Transport):
        def __init__(self, clients, timeout):
            self.clients, self.timeout = list(clients), timeout
            self.num_clients = len(self.clients)
            self.pool = ThreadPoolExecutor(max_workers=workers)

        def stream(self, request):
            request = request.read_only()
            futures = [self.pool.submit(c.handle, request) for c in self.clients]
            for f in futures:
                yield f.result(timeout=self.timeout)

        def close(self):
            self.pool.shutdown()

    register_transport(name, ThreadPool)
    return name


def softmax_hessp_contract(f):
    """The contract of an automatic-differentiation ``hessp`` (from_jax, from_torch), on a
    softmax cross-entropy ``f`` over 10 classes with w = vec(W) row-major: the Hessian of the
    batch mean times V against central differences of ``grad`` along each column and
    ``hess @ V``; NaN on an empty batch; a wrong V named; the same after a pickle; and a
    d = 300 run with hessian="sketch" that takes the steps of the same model written in NumPy
    with its exact ``hessp`` (problems.suite.softmax_loss)."""
    import pickle

    import cvxpy as cp
    from problems.suite import softmax_loss

    K, p, n = 10, 30, 600
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, p))
    y = np.argmax(X @ rng.normal(size=(K, p)).T * 0.5 + rng.gumbel(size=(n, K)),
                  axis=1).astype(float)
    w, V = 0.1 * rng.normal(size=K * p), rng.normal(size=(K * p, 3))
    P = f.hessp(w, X[:37], y[:37], V)
    h = 1e-6
    fd = np.column_stack([(f.grad(w + h * v, X[:37], y[:37])
                           - f.grad(w - h * v, X[:37], y[:37])) / (2 * h) for v in V.T])
    np.testing.assert_allclose(P, fd, atol=1e-7)
    np.testing.assert_allclose(P, f.hess(w, X[:37], y[:37]) @ V, atol=1e-13)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(f)).hessp(w, X[:37], y[:37], V), P)
    assert np.isnan(f.hessp(w, X[:0], y[:0], V)).all()
    with pytest.raises(ss.UserFunctionError, match="shape"):
        f.hessp(w, X, y, V[:5])
    data = ss.FederatedData.split(X, y, num_clients=3, seed=0)
    runs = [ss.Problem(g, dim=K * p, data=data,
                       regularizer=lambda v: 1e-3 * cp.sum_squares(v)
                       ).solve(seed=0, hessian="sketch", batch_size="full")
            for g in (f, softmax_loss(K, name=f.name))]
    assert runs[0].status == runs[1].status == "converged"
    assert runs[0].nit == runs[1].nit
    np.testing.assert_allclose(runs[0].x, runs[1].x, rtol=0, atol=1e-10)
