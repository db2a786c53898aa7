"""ss.SampleFunction.from_jax (issue 22): per-sample functions by automatic differentiation.

Values and gradients against NumPy and finite differences, the bucket padding (exact means, one
compilation per power of two), pickling and the process transport (in a fresh interpreter: a
process that has started JAX cannot fork working JAX clients), checkpoints, secure
aggregation, the error messages, a constrained convex model against CVXPY, and the paper's
network against the Numba kernels of problems/mlp.py. Skipped without JAX (the [jax] extra).
"""

import gc
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import ssca_solver as ss  # noqa: E402
from conftest import quadratic_function, softmax_hessp_contract  # noqa: E402
from ssca_solver.model import autodiff  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# what docs/autodiff.md tells users to do first; from_jax would do it itself in a fresh process
jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="module", autouse=True)
def _stop_jax_threads_after_this_module():
    """Later test modules fork client processes: drop JAX's backend (and most of its threads)
    from this process when this module is done."""
    yield
    import jax.extend.backend

    jax.extend.backend.clear_backends()
    gc.collect()


def logistic(w, x, y):
    """Logistic loss of one sample with label y in {0, 1}."""
    z = x @ w
    return jnp.logaddexp(0.0, z) - y * z


def half_square(w, x, y):
    """0.5 |w - x|^2 (no target): conftest's quadratic_function."""
    return 0.5 * jnp.sum((w - x) ** 2)


def np_logistic(w, X, y):
    z = X @ w
    return np.logaddexp(0, z) - y * z, X.T @ (1 / (1 + np.exp(-z)) - y) / len(y)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return rng.normal(size=(37, 6)), rng.integers(0, 2, 37), rng.normal(size=6)


# -- values and gradients -------------------------------------------------------------------

def test_values_and_gradient_against_numpy_and_finite_differences(batch):
    X, y, w = batch
    f = ss.SampleFunction.from_jax(logistic)
    assert isinstance(f, ss.SampleFunction) and f.name == "logistic"
    v, g = f.value_and_grad(w, X, y)
    ref_v, ref_g = np_logistic(w, X, y)
    np.testing.assert_allclose(v, ref_v, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(g, ref_g, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(f.value(w, X, y), ref_v, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(f.grad(w, X, y), ref_g, rtol=1e-12, atol=1e-15)
    assert v.dtype == g.dtype == np.float64 and v.shape == (37,) and g.shape == (6,)
    assert ss.check_grad(f, w, X, y) < 1e-7
    # no targets (y=None), against conftest's hand-written quadratic
    q, ref = ss.from_jax(half_square), quadratic_function()
    Xq = X[:, :6]
    np.testing.assert_allclose(q.value(w, Xq, None), ref.value(w, Xq, None), rtol=1e-13)
    np.testing.assert_allclose(q.grad(w, Xq, None), ref.grad(w, Xq, None), rtol=1e-13)
    # a row of targets per sample (two columns: label and weight)
    Y = np.column_stack([y, np.linspace(0.5, 2, 37)])
    wl = ss.from_jax(lambda w, x, t: t[1] * logistic(w, x, t[0]))
    np.testing.assert_allclose(wl.value(w, X, Y), Y[:, 1] * ref_v, rtol=1e-13)
    assert wl.name == "f" and ss.check_grad(wl, w, X, Y) < 1e-7


def test_a_batched_loss_and_float32(batch):
    X, y, w = batch

    def batch_logistic(w, X, y):
        z = X @ w
        return jnp.logaddexp(0.0, z) - y * z

    f = ss.from_jax(batch_logistic, batched=True)
    ref_v, ref_g = np_logistic(w, X, y)
    v, g = f.value_and_grad(w, X, y)
    np.testing.assert_allclose(v, ref_v, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(g, ref_g, rtol=1e-12, atol=1e-15)
    f32 = ss.from_jax(logistic, dtype="float32")
    v32, g32 = f32.value_and_grad(w, X, y)
    assert v32.dtype == np.float64          # what the library reads is float64 ...
    np.testing.assert_allclose(v32, ref_v, rtol=1e-5, atol=1e-6)   # ... computed in float32
    np.testing.assert_allclose(g32, ref_g, rtol=1e-4, atol=1e-6)


def test_padding_is_exact_and_compiles_once_per_power_of_two(batch):
    """Batch sizes 1..40: the gradient of the mean over the n real rows (the padded rows are
    masked out), with one trace per power of two and program, counted by a Python side
    effect inside the traced loss."""
    X, y, w = batch
    traced = []

    def counted(w, x, y):
        traced.append(1)              # runs when JAX traces, never when a compiled call runs
        return logistic(w, x, y)

    f = ss.from_jax(counted)
    for n in range(1, 38):
        v, g = f.value_and_grad(w, X[:n], y[:n])
        ref_v, ref_g = np_logistic(w, X[:n], y[:n])
        np.testing.assert_allclose(v, ref_v, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(g, ref_g, rtol=1e-12, atol=1e-15)
    buckets = {autodiff.bucket_size(n) for n in range(1, 38)}
    assert buckets == {1, 2, 4, 8, 16, 32, 64}
    assert len(traced) == f.traces == len(buckets)
    for n in range(1, 38):                       # values: the other program, same buckets
        f.value(w, X[:n], y[:n])
    assert len(traced) == 2 * len(buckets)
    for n in (3, 17, 33, 37):                    # nothing new once every bucket is compiled
        f.value_and_grad(w + 1.0, X[:n], y[:n])
    assert len(traced) == 2 * len(buckets)
    exact = ss.from_jax(logistic, buckets="exact")
    for n in (3, 5, 6, 17):
        np.testing.assert_allclose(exact.grad(w, X[:n], y[:n]), f.grad(w, X[:n], y[:n]),
                                   rtol=1e-13, atol=1e-16)
    assert exact.traces == 4                     # one per distinct batch size


def test_auto_batch_sizes_do_not_recompile_every_round(cancer, cancer_data):
    """batch_size="grow" grows the clients' batches over the run (and the probe, the full-data
    evaluations and the full batches at the end are other sizes): at most one compilation per
    power of two and program, fewer than the rounds."""
    X, y = cancer
    f = ss.from_jax(logistic, name="loss")
    seen, inputs = set(), f._inputs

    def spy(w, X, y):
        seen.add(X.shape[0])
        return inputs(w, X, y)

    f._inputs = spy
    res = ss.Problem(f, dim=X.shape[1], data=cancer_data,
                     regularizer=lambda w: 1e-3 * __import__("cvxpy").sum_squares(w)).solve(
        seed=0, max_iter=300, batch_size="grow")
    assert len(seen) >= 4, seen                      # measured: 1, 16, 32, 113, 114 rows
    buckets = {autodiff.bucket_size(n) for n in seen}
    assert len(buckets) < len(seen)
    # traces bounded by the distinct shapes and the programs (values; values and gradient;
    # the Hessian of the Newton model's full batches), not by the rounds
    assert f.traces <= 3 * len(buckets), (f.traces, seen, res.nit)
    assert f.traces < res.nit, (f.traces, res.nit)


# -- a convex model with a constraint, against CVXPY -------------------------------------------

def class_loss(label, fraction):
    """The logistic loss of the rows of one class, weighted so that its sample average is the
    class mean (problems.logistic.logistic_loss(only_label=...), written in JAX)."""

    def loss(w, x, y):
        s = 2.0 * y - 1.0
        return jnp.where(y == label, jnp.logaddexp(0.0, -s * (x @ w)) / fraction, 0.0)

    return loss


def test_neyman_pearson_written_in_jax_reaches_the_cvxpy_optimum(cancer, cancer_data):
    """The docs' convex example: min class-1 loss + 1e-3 |w|^2 s.t. class-0 loss <= 0.2,
    default options, certified, at CVXPY's pooled optimum (as tests/test_convex.py asserts for
    the hand-written problems/neyman_pearson.py)."""
    import cvxpy as cp

    from problems.neyman_pearson import pooled_reference

    X, y = cancer
    pi1 = float(np.mean(y == 1))
    objective = ss.SampleFunction.from_jax(class_loss(1, pi1), name="loss[class 1]")
    constraint = ss.SampleFunction.from_jax(class_loss(0, 1 - pi1), name="loss[class 0]")
    prob = ss.Problem(objective, [constraint <= 0.2], dim=X.shape[1], data=cancer_data,
                      regularizer=lambda w: 1e-3 * cp.sum_squares(w))
    res = prob.solve(seed=0)
    _, ref_obj, _, ref_mu = pooled_reference(X, y, 0.2, lam=1e-3)
    assert res.status == "converged" and res.success
    assert abs(res.fun - ref_obj) / ref_obj <= 1e-3
    assert res.kkt.feasibility_rel[0] <= 1e-4
    assert res.kkt.multipliers[0] == pytest.approx(ref_mu, rel=1e-2)


# -- the paper's network: the same iterates as the Numba kernels -------------------------------

@pytest.mark.parametrize("kind", ["uncon", "con"])
@pytest.mark.parametrize("activation,bias", [("swish", False), ("relu", True)])
def test_the_network_in_jax_gives_the_iterates_of_the_numba_kernels(kind, activation, bias):
    from problems import mlp, mlp_jax
    from ssca_solver.datasets import digits

    (X, y), _ = digits()
    net = mlp.MLP(64, 8, 10, activation, bias)
    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    runs = []
    for module in (mlp, mlp_jax):
        prob = (module.classification_uncon(data, net, lam=1e-3) if kind == "uncon"
                else module.classification_con(data, net, U=1.0))
        xs = []
        res = prob.solve(method="ssca", max_iter=6, x0=net.init(0) + 0.01, seed=0,
                         batch_size=10, tau=0.1, eval_every=None,
                         callback=lambda it: xs.append(it.x.copy()))
        assert res.subproblem == "closed_form" and len(xs) == 6
        runs.append(np.array(xs))
    numba_x, jax_x = runs
    assert np.max(np.abs(numba_x[-1] - numba_x[0])) > 1e-3          # the iterates moved
    np.testing.assert_allclose(jax_x, numba_x, rtol=0, atol=1e-12 * np.abs(numba_x).max())
    w, Xs, ys = net.init(3), X[:50], y[:50]
    f_numba, f_jax = net.cross_entropy(), mlp_jax.cross_entropy(net)
    np.testing.assert_allclose(f_jax.value(w, Xs, ys), f_numba.value(w, Xs, ys), rtol=1e-12)
    np.testing.assert_allclose(f_jax.grad(w, Xs, ys), f_numba.grad(w, Xs, ys), rtol=1e-9,
                               atol=1e-14)


# -- pickling, processes, checkpoints, secure aggregation --------------------------------------

def test_pickling_keeps_the_loss_and_drops_the_compiled_programs(batch):
    X, y, w = batch
    f = ss.from_jax(logistic, name="loss", buckets="exact")
    g0 = f.grad(w, X, y)
    assert f.traces == 1
    state = f.__getstate__()
    assert state["loss"] is logistic and "_programs" not in state and "value" not in state
    back = pickle.loads(pickle.dumps(f))
    assert (back.name, back.buckets, back.dtype, back.traces) == ("loss", "exact", "float64", 0)
    np.testing.assert_array_equal(back.grad(w, X, y), g0)
    assert back.traces == 1                     # rebuilt, not carried over
    constraint = pickle.loads(pickle.dumps(back <= 0.3))
    assert constraint.bound == 0.3 and constraint.function.name == "loss"
    cloudpickle = pytest.importorskip("cloudpickle")       # Flower's way: closures too
    lam = cloudpickle.loads(cloudpickle.dumps(ss.from_jax(lambda w, x, y: jnp.sum(w * x))))
    np.testing.assert_allclose(lam.value(w, X, y), X @ w, rtol=1e-13)


PROCESS_SCRIPT = textwrap.dedent("""
    import json, sys, numpy as np, cvxpy as cp
    import jax.numpy as jnp
    import ssca_solver as ss
    from ssca_solver.datasets import breast_cancer
    from ssca_solver.model import autodiff

    def logistic(w, x, y):
        z = x @ w
        return jnp.logaddexp(0.0, z) - y * z

    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=3, seed=0)
    f = ss.SampleFunction.from_jax(logistic)
    import jax
    out = {"x64_turned_on": bool(jax.config.jax_enable_x64)}
    prob = ss.Problem(f, [f <= 0.3], dim=X.shape[1], data=data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    opts = dict(max_iter=15, seed=0, batch_size=20, tau=0.5, eval_every=5)
    a = prob.solve(transport="process", **opts)
    out["server_started_jax"] = autodiff._jax_started()
    b = prob.solve(transport="inprocess", **opts)      # starts JAX in this process
    out["max_diff"] = float(np.max(np.abs(a.x - b.x)))
    out["nit"] = [a.nit, b.nit]
    try:
        prob.solve(transport="process", **opts)
        out["error"] = None
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    print("RESULT " + json.dumps(out))
""")


def test_process_transport_rebuilds_the_function_in_each_client():
    """In a fresh interpreter (this one has started JAX, so its forks could not run JAX):
    transport="process" gives the in-process iterates; the server never starts JAX; from_jax
    turned x64 on by itself; and clients forked after the server started JAX raise a clear
    UserFunctionError instead of deadlocking. The interpreter's PID is the one stopped on a
    timeout (its clients exit when their pipe to it closes)."""
    proc = subprocess.Popen([sys.executable, "-c", PROCESS_SCRIPT], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, 9)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    line = [s for s in stdout.splitlines() if s.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    assert out["x64_turned_on"] and not out["server_started_jax"]
    assert out["nit"][0] == out["nit"][1] and out["max_diff"] <= 1e-12
    assert "UserFunctionError" in out["error"] and "forked" in out["error"]
    assert "transport='inprocess'" in out["error"]


def test_checkpoint_resume_gives_the_uninterrupted_iterates(cancer_data, tmp_path):
    f = ss.from_jax(logistic, name="loss")
    prob = ss.Problem(f, [f <= 0.3], dim=cancer_data.clients[0].X.shape[1],
                      data=cancer_data, regularizer=lambda w: 1e-2 * __import__(
                          "cvxpy").sum_squares(w))
    opts = dict(batch_size=10, tau=0.5, max_iter=12, seed=4, eval_every=None)
    full = prob.solve(**opts)
    first = prob.solve(checkpoint=tmp_path / "ck.npz", callback=lambda it: it.t == 5, **opts)
    assert first.status == "stopped" and first.nit == 5
    again = ss.from_jax(logistic, name="loss")       # a new process would rebuild it too
    prob2 = ss.Problem(again, [again <= 0.3], dim=prob.dim, data=cancer_data,
                       regularizer=lambda w: 1e-2 * __import__("cvxpy").sum_squares(w))
    resumed = prob2.solve(resume=tmp_path / "ck.npz", **opts)
    np.testing.assert_allclose(resumed.x, full.x, rtol=1e-12, atol=1e-14)


def test_secure_aggregation_matches_the_plain_run(cancer_data):
    pytest.importorskip("cryptography")
    f = ss.from_jax(logistic, name="loss")
    prob = ss.Problem(f, dim=cancer_data.clients[0].X.shape[1], data=cancer_data,
                      regularizer=lambda w: 1e-2 * __import__("cvxpy").sum_squares(w))
    opts = dict(batch_size=10, tau=0.5, max_iter=10, seed=3, eval_every=5)
    plain = prob.solve(**opts)
    secure = prob.solve(secure_aggregation=True, **opts)
    assert 0 < np.max(np.abs(secure.x - plain.x)) < 1e-8      # through the masks, same point


def test_shards_evaluate_pooled_batches_in_one_compiled_call(cancer_data):
    """A shard's clients' batches pooled into one call of the compiled loss (the batched
    evaluation the issue asks of JAX): the same iterates as client by client."""
    f = ss.from_jax(logistic, name="loss")
    prob = ss.Problem(f, dim=cancer_data.clients[0].X.shape[1], data=cancer_data,
                      regularizer=lambda w: 1e-2 * __import__("cvxpy").sum_squares(w))
    for opts in (dict(batch_size=10, tau=0.5, max_iter=10, seed=3),
                 dict(batch_size="full", max_iter=15, seed=3)):
        one = prob.solve(**opts)
        pooled = prob.solve(shards=2, **opts)
        assert (one.status, one.nit) == (pooled.status, pooled.nit)
        np.testing.assert_allclose(pooled.x, one.x, rtol=0, atol=1e-10)


# -- errors users will make --------------------------------------------------------------------

def test_a_loss_of_the_wrong_shape_or_dtype_is_named(batch):
    X, y, w = batch
    vec = ss.from_jax(lambda w, x, y: x * w, name="vec")
    with pytest.raises(ss.UserFunctionError, match=r"vec: the loss returned shape \(6,\) for "
                       r"one row x of shape \(6,\); it must return one scalar per sample"):
        vec.value(w, X, y)
    with pytest.raises(ss.UserFunctionError, match="batched=True"):
        vec.grad(w, X, y)
    short = ss.from_jax(lambda w, X, y: jnp.sum(X @ w), name="short", batched=True)
    with pytest.raises(ss.UserFunctionError, match=r"returned shape \(\) .* one value per row"):
        short.value(w, X, y)
    count = ss.from_jax(lambda w, x, y: jnp.sum(x > 0), name="count")
    with pytest.raises(ss.UserFunctionError, match="count: the loss returned dtype int.* a "
                       "real floating-point value"):
        count.grad(w, X, y)
    # through a solve: the library names the function and the client
    data = ss.FederatedData.split(X, y, num_clients=2, seed=0)
    with pytest.raises(ss.UserFunctionError, match="vec.value_and_grad raised on client 0.*"
                       "one scalar per sample"):
        ss.Problem(vec, dim=6, data=data).solve(max_iter=2)


@pytest.mark.parametrize("body,what", [
    (lambda w, x, y: float(x @ w), "float()"),
    (lambda w, x, y: np.exp(x @ w), "NumPy"),
    (lambda w, x, y: (x @ w) if x @ w > 0 else 0.0 * w[0], "if"),
])
def test_a_loss_jax_cannot_trace_says_what_to_fix(batch, body, what):
    X, y, w = batch
    f = ss.from_jax(body, name="bad")
    with pytest.raises(ss.UserFunctionError, match=r"bad: JAX cannot trace the loss") as err:
        f.value_and_grad(w, X, y)
    assert "use jnp.where or jax.lax.cond" in str(err.value) and "jax.numpy" in str(err.value)
    with pytest.raises(ss.UserFunctionError, match="cannot trace"):
        f.value(w, X, y)


def test_inputs_integer_w_and_x_are_converted_other_kinds_refused(batch):
    X, y, w = batch
    f = ss.from_jax(logistic)
    Xi, wi = np.round(3 * X).astype(np.int8), np.array([1, -2, 0, 3, 1, -1])
    ref_v, ref_g = np_logistic(wi.astype(float), Xi.astype(float), y)
    v, g = f.value_and_grad(wi, Xi, y)          # int8 X: no overflow, as FederatedData does
    np.testing.assert_allclose(g, ref_g, rtol=1e-12)
    np.testing.assert_allclose(v, ref_v, rtol=1e-13)
    with pytest.raises(TypeError, match="w must be a real array"):
        f.grad(w + 1j, X, y)
    with pytest.raises(TypeError, match="w must be a flat vector"):
        f.grad(w[None], X, y)
    with pytest.raises(TypeError, match=r"y must have one entry per row of X \(37\)"):
        f.grad(w, X, y[:5])
    with pytest.raises(TypeError, match="callable loss"):
        ss.from_jax("logistic")
    with pytest.raises(ValueError, match="buckets must be one of"):
        ss.from_jax(logistic, buckets="pow3")


def test_x64_off_is_refused_with_where_to_turn_it_on(batch):
    X, y, w = batch
    f = ss.from_jax(logistic, name="loss")
    f.grad(w, X, y)                              # JAX has started: x64 can't be turned on
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(ss.ModelError, match="jax_enable_x64.*top of your script.*"
                           "JAX_ENABLE_X64=1.*dtype='float32'"):
            ss.from_jax(logistic, name="loss")
        with pytest.raises(ss.UserFunctionError, match="loss: JAX's 64-bit mode .* was "
                           "turned off"):
            f.grad(w, X, y)
        single = ss.from_jax(logistic, dtype="float32")        # the way out
        np.testing.assert_allclose(single.grad(w, X, y), np_logistic(w, X, y)[1], rtol=1e-4,
                                   atol=1e-6)
    finally:
        jax.config.update("jax_enable_x64", True)
    np.testing.assert_allclose(f.grad(w, X, y), np_logistic(w, X, y)[1], rtol=1e-12)


def test_without_jax_the_message_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(ss.ModelError, match=r"pip install 'ssca-solver\[jax\]'"):
        ss.from_jax(logistic)


def test_negation_and_equality_work_on_a_jax_function(batch):
    X, y, w = batch
    f = ss.from_jax(logistic, name="loss")
    c = f >= 0.1                                  # -f <= -0.1
    np.testing.assert_allclose(c.function.grad(w, X, y), -f.grad(w, X, y))
    assert (f == 0.5).equality and math.isclose((f == 0.5).bound, 0.5)


@pytest.mark.slow                    # 27 s: Ray's start
def test_flower_simulation_ships_the_loss_and_compiles_it_on_the_nodes(cancer_data):
    """transport="flower" (Ray actors, fresh processes) pickles the function with cloudpickle:
    the nodes rebuild the programs and give the in-process iterates (to 1e-13)."""
    pytest.importorskip("flwr", reason="Flower is an optional extra")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

    def loss(w, x, y):               # defined here: cloudpickle ships it by value
        z = x @ w
        return jnp.logaddexp(0.0, z) - y * z

    f = ss.from_jax(loss, name="loss")
    prob = ss.Problem(f, [f <= 0.3], dim=cancer_data.clients[0].X.shape[1], data=cancer_data,
                      regularizer=lambda w: 1e-2 * __import__("cvxpy").sum_squares(w))
    opts = dict(batch_size=10, tau=0.5, max_iter=6, seed=2, eval_every=3)
    a = prob.solve(transport="inprocess", **opts)
    b = prob.solve(transport="flower", **opts)
    assert a.nit == b.nit == 6
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-13)


def test_from_jax_gives_the_hessian_and_the_newton_model():
    """``hess`` of a JAX function is jax.hessian of the batch mean (a padded bucket's dropped
    rows left out): it matches central differences of the gradient, survives a pickle, and
    with it hessian="auto" runs the Newton model."""
    f = ss.SampleFunction.from_jax(logistic)
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(37, 4)), rng.integers(0, 2, 37).astype(float)
    w = rng.normal(size=4)
    H = f.hess(w, X, y)
    h = 1e-6
    fd = np.array([(f.grad(w + h * e, X, y) - f.grad(w - h * e, X, y)) / (2 * h)
                   for e in np.eye(4)])
    np.testing.assert_allclose(H, fd, atol=1e-7)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(f)).hess(w, X, y), H)
    data = ss.FederatedData.split(X, y, num_clients=3, seed=0)
    prob = ss.Problem(f, dim=4, data=data,
                      regularizer=lambda v: 1e-2 * __import__("cvxpy").sum_squares(v))
    assert ss.SSCA.parse(prob, {}).hessian == "newton"
    res = prob.solve(seed=0)
    assert res.status == "converged" and res.communication.up_per_client_round >= 10


def cross_entropy_of_ten(w, x, t):
    """Softmax cross-entropy of one sample over 10 classes, w = vec(W) row-major."""
    z = w.reshape(10, -1) @ x
    return jax.nn.logsumexp(z) - z[t.astype(int)]


def test_from_jax_gives_hessian_vector_products_and_the_sketch_model():
    """``hessp`` of a JAX function (jvp of the gradient, vmapped over V's columns) keeps the
    contract of :func:`conftest.softmax_hessp_contract`: finite differences, ``hess @ V``,
    empty batch, wrong V, pickle, and the NumPy model's steps under hessian="sketch"."""
    softmax_hessp_contract(ss.SampleFunction.from_jax(cross_entropy_of_ten, name="ce"))
