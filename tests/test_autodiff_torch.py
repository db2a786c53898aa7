"""ss.SampleFunction.from_torch (issue 22): per-sample functions by torch.func.vmap and
autograd.

PyTorch is never a dependency of the package (its wheels are hundreds of MB to GB): every
test here but one skips without it; CI installs the CPU build 2.13.0 only where its wheel
lies on the machine. Where torch is installed, the same contract as from_jax is checked:
values and gradients against NumPy and finite differences, float64 whatever torch's default
dtype, the paper's network against the Numba kernels of problems/mlp.py, a constrained
convex model against CVXPY, the Hessian and its products (the Newton and sketch models)
against finite differences and the NumPy losses' own, pickling, the process transport
(forked clients after the server used torch), Flower's simulation (slow), checkpoints,
secure aggregation, and the error messages.
"""

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ssca_solver as ss
from conftest import quadratic_function, softmax_hessp_contract

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not a dependency; tested where "
                               "it is installed")


def logistic(w, x, y):
    """Logistic loss of one sample with label y in {0, 1} (torch)."""
    import torch

    z = x @ w
    return torch.nn.functional.softplus(z) - y * z


def np_logistic(w, X, y):
    z = X @ w
    return np.logaddexp(0, z) - y * z, X.T @ (1 / (1 + np.exp(-z)) - y) / len(y)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return rng.normal(size=(37, 6)), rng.integers(0, 2, 37), rng.normal(size=6)


# -- values and gradients -------------------------------------------------------------------

def test_values_and_gradient_against_numpy_and_finite_differences(torch, batch):
    X, y, w = batch
    f = ss.SampleFunction.from_torch(logistic)
    assert isinstance(f, ss.TorchSampleFunction) and f.name == "logistic"
    v, g = f.value_and_grad(w, X, y)
    ref_v, ref_g = np_logistic(w, X, y)
    np.testing.assert_allclose(v, ref_v, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(g, ref_g, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(f.value(w, X, y), ref_v, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(f.grad(w, X, y), ref_g, rtol=1e-12, atol=1e-15)
    assert v.dtype == g.dtype == np.float64 and v.shape == (37,) and g.shape == (6,)
    assert ss.check_grad(f, w, X, y) < 1e-7
    # every batch size (nothing is compiled, nothing padded)
    for n in (1, 2, 5, 36):
        np.testing.assert_allclose(f.grad(w, X[:n], y[:n]), np_logistic(w, X[:n], y[:n])[1],
                                   rtol=1e-12, atol=1e-15)
    # no targets (y=None), against conftest's hand-written quadratic
    q = ss.from_torch(lambda w, x, y: 0.5 * ((w - x) ** 2).sum(), name="quad")
    ref = quadratic_function()
    np.testing.assert_allclose(q.value(w, X, None), ref.value(w, X, None), rtol=1e-13)
    np.testing.assert_allclose(q.grad(w, X, None), ref.grad(w, X, None), rtol=1e-13)
    # a row of targets per sample (label and weight)
    Y = np.column_stack([y, np.linspace(0.5, 2, 37)])
    wl = ss.from_torch(lambda w, x, t: t[1] * logistic(w, x, t[0]))
    np.testing.assert_allclose(wl.value(w, X, Y), Y[:, 1] * ref_v, rtol=1e-13)
    assert wl.name == "f" and ss.check_grad(wl, w, X, Y) < 1e-7
    # a loss that does not depend on w: values, and a zero gradient (no autograd error)
    const = ss.from_torch(lambda w, x, y: x.sum() * 1.0, name="const")
    v, g = const.value_and_grad(w, X, y)
    np.testing.assert_allclose(v, X.sum(axis=1), rtol=1e-13)
    assert g.shape == (6,) and not g.any()


def test_float64_whatever_the_default_dtype_a_batched_loss_and_float32(torch, batch):
    X, y, w = batch
    ref_v, ref_g = np_logistic(w, X, y)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)            # torch's own default: not ours
    try:
        def scaled(w, x, y):                           # creates a tensor like w: float64
            return logistic(w, x, y) * torch.ones((), dtype=w.dtype)

        v, g = ss.from_torch(scaled).value_and_grad(w, X, y)
        np.testing.assert_allclose(g, ref_g, rtol=1e-12, atol=1e-15)
    finally:
        torch.set_default_dtype(old)

    def batch_logistic(w, X, y):
        z = X @ w
        return torch.nn.functional.softplus(z) - y * z

    f = ss.from_torch(batch_logistic, batched=True)
    v, g = f.value_and_grad(w, X, y)
    np.testing.assert_allclose(v, ref_v, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(g, ref_g, rtol=1e-12, atol=1e-15)
    f32 = ss.from_torch(logistic, dtype="float32")
    v32, g32 = f32.value_and_grad(w, X, y)
    assert v32.dtype == np.float64                     # what the library reads is float64 ...
    np.testing.assert_allclose(v32, ref_v, rtol=1e-5, atol=1e-6)   # ... computed in float32
    np.testing.assert_allclose(g32, ref_g, rtol=1e-4, atol=1e-6)
    assert np.max(np.abs(g32 - ref_g)) > 1e-12         # and it is single precision


# -- models ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["uncon", "con"])
@pytest.mark.parametrize("activation,bias", [("swish", False), ("relu", True)])
def test_the_network_in_torch_gives_the_iterates_of_the_numba_kernels(torch, kind,
                                                                      activation, bias):
    from problems import mlp, mlp_torch
    from ssca_solver.datasets import digits

    (X, y), _ = digits()
    net = mlp.MLP(64, 8, 10, activation, bias)
    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    runs = []
    for module in (mlp, mlp_torch):
        prob = (module.classification_uncon(data, net, lam=1e-3) if kind == "uncon"
                else module.classification_con(data, net, U=1.0))
        xs = []
        res = prob.solve(method="ssca", max_iter=6, x0=net.init(0) + 0.01, seed=0,
                         batch_size=10, tau=0.1, eval_every=None,
                         callback=lambda it: xs.append(it.x.copy()))
        assert res.subproblem == "closed_form" and len(xs) == 6
        runs.append(np.array(xs))
    numba_x, torch_x = runs
    assert np.max(np.abs(numba_x[-1] - numba_x[0])) > 1e-3          # the iterates moved
    np.testing.assert_allclose(torch_x, numba_x, rtol=0, atol=1e-12 * np.abs(numba_x).max())
    w, Xs, ys = net.init(3), X[:50], y[:50]
    f_numba, f_torch = net.cross_entropy(), mlp_torch.cross_entropy(net)
    np.testing.assert_allclose(f_torch.value(w, Xs, ys), f_numba.value(w, Xs, ys), rtol=1e-12)
    np.testing.assert_allclose(f_torch.grad(w, Xs, ys), f_numba.grad(w, Xs, ys), rtol=1e-9,
                               atol=1e-14)


def class_loss(label, fraction):
    """The logistic loss of the rows of one class, weighted so that its sample average is the
    class mean (tests/test_autodiff.py's JAX loss, in torch)."""

    def loss(w, x, y):
        import torch

        s = 2.0 * y - 1.0
        return torch.where(y == label, torch.nn.functional.softplus(-s * (x @ w)) / fraction,
                           torch.zeros((), dtype=w.dtype))

    return loss


def test_neyman_pearson_written_in_torch_reaches_the_cvxpy_optimum(torch, cancer, cancer_data):
    """min class-1 loss + 1e-3 |w|^2 s.t. class-0 loss <= 0.2, default options, certified, at
    CVXPY's pooled optimum (as tests/test_autodiff.py asserts for the JAX version)."""
    import cvxpy as cp

    from problems.neyman_pearson import pooled_reference

    X, y = cancer
    pi1 = float(np.mean(y == 1))
    objective = ss.SampleFunction.from_torch(class_loss(1, pi1), name="loss[class 1]")
    constraint = ss.SampleFunction.from_torch(class_loss(0, 1 - pi1), name="loss[class 0]")
    prob = ss.Problem(objective, [constraint <= 0.2], dim=X.shape[1], data=cancer_data,
                      regularizer=lambda w: 1e-3 * cp.sum_squares(w))
    res = prob.solve(seed=0)
    _, ref_obj, _, ref_mu = pooled_reference(X, y, 0.2, lam=1e-3)
    assert res.status == "converged" and res.success, res.message
    assert abs(res.fun - ref_obj) / ref_obj <= 1e-3
    assert res.kkt.feasibility_rel[0] <= 1e-4
    assert res.kkt.multipliers[0] == pytest.approx(ref_mu, rel=1e-2)


# -- curvature: hess and hessp (the Newton and sketch models) ----------------------------------

def test_hess_matches_finite_differences_and_runs_the_newton_model(torch, batch):
    """``hess`` of a torch function is torch.func.hessian of the batch mean: it matches central
    differences of the gradient (and the NumPy logistic loss's exact Hessian), is NaN on an
    empty batch, survives a pickle, and with it hessian="auto" runs the Newton model, taking
    the steps of the same model written in NumPy with its own exact ``hess``."""
    import cvxpy as cp
    from problems.logistic import logistic_loss

    X, y, w = batch
    y = y.astype(float)
    f = ss.SampleFunction.from_torch(logistic)
    H = f.hess(w, X, y)
    h = 1e-6
    fd = np.array([(f.grad(w + h * e, X, y) - f.grad(w - h * e, X, y)) / (2 * h)
                   for e in np.eye(w.size)])
    np.testing.assert_allclose(H, fd, atol=1e-7)
    np.testing.assert_allclose(H, logistic_loss().hess(w, X, y), rtol=0, atol=1e-14)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(f)).hess(w, X, y), H)
    assert np.isnan(f.hess(w, X[:0], y[:0])).all()
    rng = np.random.default_rng(5)
    Xb, yb = rng.normal(size=(400, 6)), rng.integers(0, 2, 400).astype(float)
    data = ss.FederatedData.split(Xb, yb, num_clients=3, seed=0)
    runs = []
    for g in (f, logistic_loss(name="logistic")):
        prob = ss.Problem(g, [g <= 0.7], dim=6, data=data,
                          regularizer=lambda v: 1e-2 * cp.sum_squares(v))
        assert ss.SSCA.parse(prob, {}).hessian == "newton"
        runs.append(prob.solve(seed=0, batch_size="full"))
    assert runs[0].status == runs[1].status == "converged"
    assert runs[0].nit == runs[1].nit
    np.testing.assert_allclose(runs[0].x, runs[1].x, rtol=0, atol=1e-10)


def cross_entropy_of_ten(w, x, t):
    """Softmax cross-entropy of one sample over 10 classes, w = vec(W) row-major (torch)."""
    import torch

    z = w.reshape(10, -1) @ x
    return torch.logsumexp(z, 0) - z[t.long()]


def test_hessp_matches_finite_differences_and_runs_the_sketch_model(torch):
    """``hessp`` (jvp of the gradient, vmapped over V's columns) keeps the contract of
    :func:`conftest.softmax_hessp_contract`: finite differences, ``hess @ V``, empty batch,
    wrong V, pickle, and the NumPy model's steps under hessian="sketch"."""
    softmax_hessp_contract(ss.SampleFunction.from_torch(cross_entropy_of_ten, name="ce"))


# -- pickling, processes, checkpoints ---------------------------------------------------------

def test_pickling_keeps_the_loss_and_options(torch, batch):
    X, y, w = batch
    f = ss.from_torch(logistic, name="loss", dtype="float32")
    g0 = f.grad(w, X, y)
    state = f.__getstate__()
    assert state["loss"] is logistic and "value" not in state and "grad" not in state
    back = pickle.loads(pickle.dumps(f))
    assert (back.name, back.dtype, back.batched) == ("loss", "float32", False)
    np.testing.assert_array_equal(back.grad(w, X, y), g0)
    constraint = pickle.loads(pickle.dumps(back <= 0.3))
    assert constraint.bound == 0.3 and constraint.function.name == "loss"
    cloudpickle = pytest.importorskip("cloudpickle")        # Flower's way: closures too
    lam = cloudpickle.loads(cloudpickle.dumps(ss.from_torch(lambda w, x, y: (w * x).sum())))
    np.testing.assert_allclose(lam.value(w, X, y), X @ w, rtol=1e-13)


PROCESS_SCRIPT = textwrap.dedent("""
    import json, numpy as np, cvxpy as cp, torch
    import ssca_solver as ss
    from ssca_solver.datasets import breast_cancer

    def logistic(w, x, y):
        z = x @ w
        return torch.nn.functional.softplus(z) - y * z

    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=3, seed=0)
    f = ss.SampleFunction.from_torch(logistic)
    # the server uses torch (and its OpenMP threads) before the clients are forked
    big = torch.randn(4000, 400, dtype=torch.float64)
    for _ in range(10):
        big @ torch.ones(400, dtype=torch.float64)
    out = {"check_grad": ss.check_grad(f, np.full(X.shape[1], 0.1), X, y),
           "server_threads": torch.get_num_threads()}
    prob = ss.Problem(f, [f <= 0.3], dim=X.shape[1], data=data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    opts = dict(max_iter=15, seed=0, batch_size=20, tau=0.5, eval_every=5)
    a = prob.solve(transport="process", client_threads=None, **opts)
    b = prob.solve(transport="inprocess", **opts)
    out["max_diff"] = float(np.max(np.abs(a.x - b.x)))
    out["nit"] = [a.nit, b.nit]
    print("RESULT " + json.dumps(out))
""")


def test_process_transport_after_the_server_used_torch(torch):
    """transport="process" forks the clients from a server that has run torch's OpenMP
    threads (which do not survive a fork: a parallel kernel in the child waited forever
    before from_torch ran torch on one thread there); client_threads=None so that no other
    limit hides it. The same iterates as in process. In a fresh interpreter with a timeout
    (a hang fails the test instead of stopping the suite)."""
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
    assert out["check_grad"] < 1e-7
    assert out["nit"][0] == out["nit"][1] == 15 and out["max_diff"] <= 1e-12


def test_checkpoint_resume_gives_the_uninterrupted_iterates(torch, cancer_data, tmp_path):
    import cvxpy as cp

    f = ss.from_torch(logistic, name="loss")
    dim = cancer_data.clients[0].X.shape[1]
    reg = lambda w: 1e-2 * cp.sum_squares(w)  # noqa: E731
    prob = ss.Problem(f, [f <= 0.3], dim=dim, data=cancer_data, regularizer=reg)
    opts = dict(batch_size=10, tau=0.5, max_iter=12, seed=4, eval_every=None)
    full = prob.solve(**opts)
    first = prob.solve(checkpoint=tmp_path / "ck.npz", callback=lambda it: it.t == 5, **opts)
    assert first.status == "stopped" and first.nit == 5
    again = ss.from_torch(logistic, name="loss")
    prob2 = ss.Problem(again, [again <= 0.3], dim=dim, data=cancer_data, regularizer=reg)
    resumed = prob2.solve(resume=tmp_path / "ck.npz", **opts)
    np.testing.assert_allclose(resumed.x, full.x, rtol=1e-12, atol=1e-14)


def test_secure_aggregation_matches_the_plain_run(torch, cancer_data):
    pytest.importorskip("cryptography")
    import cvxpy as cp

    f = ss.from_torch(logistic, name="loss")
    prob = ss.Problem(f, dim=cancer_data.clients[0].X.shape[1], data=cancer_data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    opts = dict(batch_size=10, tau=0.5, max_iter=10, seed=3, eval_every=5)
    plain = prob.solve(**opts)
    secure = prob.solve(secure_aggregation=True, **opts)
    assert 0 < np.max(np.abs(secure.x - plain.x)) < 1e-8      # through the masks, same point


# -- errors users will make --------------------------------------------------------------------

def test_a_loss_of_the_wrong_shape_dtype_or_precision_is_named(torch, batch):
    X, y, w = batch
    vec = ss.from_torch(lambda w, x, y: x * w, name="vec")
    with pytest.raises(ss.UserFunctionError, match=r"vec: the loss returned shape \(6,\) for "
                       r"one row x of shape \(6,\); it must return one scalar per sample"):
        vec.value(w, X, y)
    with pytest.raises(ss.UserFunctionError, match="batched=True"):
        vec.grad(w, X, y)
    short = ss.from_torch(lambda w, X, y: (X @ w).sum(), name="short", batched=True)
    with pytest.raises(ss.UserFunctionError, match=r"returned shape \(\) .* one value per row"):
        short.value(w, X, y)
    count = ss.from_torch(lambda w, x, y: (x > 0).sum(), name="count")
    with pytest.raises(ss.UserFunctionError, match="count: the loss returned dtype torch.int64"
                       ".* a real floating-point value"):
        count.grad(w, X, y)
    single = ss.from_torch(lambda w, x, y: (x @ w).float(), name="single")
    with pytest.raises(ss.UserFunctionError, match=r"single: the loss returned dtype "
                       r"torch.float32 .* inputs are torch.float64.*dtype=w.dtype"):
        single.grad(w, X, y)
    notensor = ss.from_torch(lambda w, x, y: 1.0, name="const")
    with pytest.raises(ss.UserFunctionError, match="must return a torch tensor, got float"):
        notensor.value(w, X, y)
    data = ss.FederatedData.split(X, y, num_clients=2, seed=0)
    with pytest.raises(ss.UserFunctionError, match="vec.value_and_grad raised on client 0.*"
                       "one scalar per sample"):
        ss.Problem(vec, dim=6, data=data).solve(max_iter=2)


@pytest.mark.parametrize("body,what", [
    (lambda w, x, y: float(x @ w) * w[0], ".item()"),
    (lambda w, x, y: np.exp(x @ w), "storage"),
    (lambda w, x, y: (x @ w) if x @ w > 0 else 0.0 * w[0], "data-dependent control flow"),
])
def test_a_loss_torch_func_cannot_transform_says_what_to_fix(torch, batch, body, what):
    X, y, w = batch
    f = ss.from_torch(body, name="bad")
    with pytest.raises(ss.UserFunctionError, match=r"bad: the loss failed under torch.func") \
            as err:
        f.value_and_grad(w, X, y)
    assert what in str(err.value)                              # torch's own reason, kept
    assert "use torch.where" in str(err.value) and "no .item()" in str(err.value)
    with pytest.raises(ss.UserFunctionError, match="failed under torch.func"):
        f.value(w, X, y)


def test_inputs_integer_w_and_x_are_converted_other_kinds_refused(torch, batch):
    X, y, w = batch
    f = ss.from_torch(logistic)
    Xi, wi = np.round(3 * X).astype(np.int8), np.array([1, -2, 0, 3, 1, -1])
    ref_v, ref_g = np_logistic(wi.astype(float), Xi.astype(float), y)
    v, g = f.value_and_grad(wi, Xi, y)           # int8 X: no overflow, as FederatedData does
    np.testing.assert_allclose(g, ref_g, rtol=1e-12)
    np.testing.assert_allclose(v, ref_v, rtol=1e-13)
    ro = X.copy()
    ro.setflags(write=False)                     # the library's arrays are read-only
    np.testing.assert_allclose(f.grad(w, ro, y), np_logistic(w, X, y)[1], rtol=1e-12)
    with pytest.raises(TypeError, match="w must be a real array"):
        f.grad(w + 1j, X, y)
    with pytest.raises(TypeError, match="w must be a flat vector"):
        f.grad(w[None], X, y)
    with pytest.raises(TypeError, match=r"y must have one entry per row of X \(37\)"):
        f.grad(w, X, y[:5])
    with pytest.raises(TypeError, match="callable loss"):
        ss.from_torch("logistic")
    with pytest.raises(ValueError, match="dtype must be one of"):
        ss.from_torch(logistic, dtype="float16")


def test_without_torch_the_message_says_how_to_get_it(monkeypatch):
    """Runs everywhere (torch or not): from_torch names what to install, and that it is not
    a dependency."""
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ss.ModelError, match=r"needs PyTorch, which is not installed: install "
                       r"PyTorch .*not a dependency of ssca-solver"):
        ss.SampleFunction.from_torch(logistic)


def test_from_torch_sits_beside_from_jax_and_importing_the_library_imports_neither():
    """Runs everywhere: both builders are classmethods of SampleFunction (functions.py) that
    delegate to their own module; importing the library imports neither JAX nor torch (each
    is imported when a function is built)."""
    code = textwrap.dedent("""
        import sys
        import cvxpy                   # its solver probe may import JAX (MPAX) by itself
        before = {m for m in ("jax", "torch") if m in sys.modules}
        import ssca_solver as ss
        assert {m for m in ("jax", "torch") if m in sys.modules} == before
        from ssca_solver.model import autodiff, autodiff_jax, autodiff_torch
        for name, module in (("from_jax", autodiff_jax), ("from_torch", autodiff_torch)):
            method = ss.SampleFunction.__dict__[name]
            assert isinstance(method, classmethod), name
            assert method.__func__.__module__ == "ssca_solver.model.functions", name
            assert getattr(ss, name) is getattr(autodiff, name) is getattr(module, name)
        assert issubclass(ss.TorchSampleFunction, autodiff.AutodiffSampleFunction)
        assert issubclass(ss.JaxSampleFunction, autodiff.AutodiffSampleFunction)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.slow                    # Ray's start: about 30 s
def test_flower_simulation_ships_the_loss(torch, cancer_data):
    """transport="flower" (Ray actors, fresh processes) pickles the function with cloudpickle:
    the nodes import torch and give the in-process iterates (to 1e-13)."""
    pytest.importorskip("flwr", reason="Flower is an optional extra")
    import cvxpy as cp

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

    def loss(w, x, y):               # defined here: cloudpickle ships it by value
        import torch

        z = x @ w
        return torch.nn.functional.softplus(z) - y * z

    f = ss.from_torch(loss, name="loss")
    prob = ss.Problem(f, [f <= 0.3], dim=cancer_data.clients[0].X.shape[1], data=cancer_data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    opts = dict(batch_size=10, tau=0.5, max_iter=6, seed=2, eval_every=3)
    a = prob.solve(transport="inprocess", **opts)
    b = prob.solve(transport="flower", **opts)
    assert a.nit == b.nit == 6
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-13)
