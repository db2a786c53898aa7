"""The network of Section V: kernels, statistics, subproblem, and Algorithms 1 and 2 on digits."""

import gzip

import numpy as np
import pytest

import ssca_solver as ss
from problems.mlp import MLP, classification_con, classification_uncon
from ssca_solver.datasets import DatasetNotFound, digits, load_idx_dataset, read_idx
from conftest import round_request, ssca_clients
from ssca_solver.methods.ssca.step import combine
from ssca_solver.federated import InProcessTransport
from ssca_solver.subproblems import ClosedFormSubproblem, CvxpySubproblem


def numpy_reference(net, w, X, y):
    """Plain NumPy forward/backward of eqs. (Fcost)/(Ql): the reference for the kernel."""
    w1, w2, b1, b2 = net.unflatten(w)
    H = X @ w1.T + b1
    if net.activation == "swish":
        sig = 1 / (1 + np.exp(-H))
        S, Sp = H * sig, sig + H * sig * (1 - sig)
    else:
        S, Sp = np.maximum(H, 0), (H > 0).astype(float)
    Z = S @ w2.T + b2
    Q = np.exp(Z - Z.max(1, keepdims=True))
    Q /= Q.sum(1, keepdims=True)
    Y = np.eye(net.L)[y]
    losses = -np.sum(Y * np.log(Q), axis=1)
    D = (Q - Y) / len(y)
    dH = (D @ w2) * Sp
    g = [dH.T @ X, D.T @ S] + ([dH.sum(0), D.sum(0)] if net.bias else [])
    return losses, np.concatenate([x.ravel() for x in g])


@pytest.mark.parametrize("activation", ["swish", "relu"])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_against_finite_differences_and_numpy(activation, bias):
    rng = np.random.default_rng(0)
    net = MLP(6, 5, 4, activation, bias)
    X, y = rng.normal(size=(30, 6)), rng.integers(0, 4, 30)
    w = net.init(1) + 0.05
    f = net.cross_entropy()
    assert ss.check_grad(f, w, X, y) < 1e-6
    losses, g = f.value_and_grad(w, X, y)
    ref_losses, ref_g = numpy_reference(net, w, X, y)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-12)
    np.testing.assert_allclose(g, ref_g, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(f.value(w, X, y), ref_losses, rtol=1e-12)


def test_paper_dimension_and_layout():
    net = MLP(784, 128, 10)
    assert net.dim == 784 * 128 + 128 * 10 == 101_632
    w = np.arange(net.dim, dtype=float)
    w1, w2, b1, b2 = net.unflatten(w)
    assert w1.shape == (128, 784) and w2.shape == (10, 128) and w1[0, 1] == 1.0
    assert MLP(784, 128, 10, bias=True).dim == 101_632 + 138


def test_statistics_carry_the_corrected_sign_of_A():
    """PAPER_NOTES item 3: the constant is F(w_t) - grad F(w_t).w_t + tau |w_t|^2 with F the
    cross-entropy (>= 0), so the surrogate equals F at w_t (the paper's A-bar has +log Q)."""
    rng = np.random.default_rng(1)
    net = MLP(6, 5, 3)
    X, y = rng.normal(size=(12, 6)), rng.integers(0, 3, 12)
    w, tau = net.init(2), 0.1
    f = net.cross_entropy()
    q = ss.ProximalLinear().statistics(f, w, X, y, tau, "test")
    F, g = f.value(w, X, y).sum(), 12 * f.grad(w, X, y)
    assert F > 0
    assert np.isclose(q["const"], F - g @ w + 12 * tau * w @ w, rtol=1e-12)
    assert np.isclose(ss.ProximalLinear().evaluate(q, w), F, rtol=1e-12)


@pytest.mark.parametrize("kind", ["uncon", "con"])
def test_one_step_closed_form_equals_cvxpy_on_the_network(kind):
    (X, y), _ = digits()
    net = MLP(64, 8, 10)
    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    prob = (classification_uncon(data, net, lam=1e-3) if kind == "uncon"
            else classification_con(data, net, U=1.0))
    w = net.init(0)
    msgs = InProcessTransport(ssca_clients(prob, 0)).exchange(round_request(1, w, 10))
    stats = combine(msgs, data.num_samples)
    lam = prob.deterministic.norm2_coefficient()
    cf = ClosedFormSubproblem(net.dim, prob.builders, prob.objective is not None, prob.bounds,
                              lam).solve(stats, 1e5, round=1)
    cv = CvxpySubproblem(net.dim, prob.builders, prob.objective is not None, prob.bounds,
                         prob.deterministic, solver_options=dict(
                             tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)).solve(
        stats, 1e5, round=1)
    scale = max(1.0, np.linalg.norm(cv.w))
    assert np.linalg.norm(cf.w - cv.w) <= (1e-8 if kind == "uncon" else 1e-5) * scale
    np.testing.assert_allclose(cf.multipliers, cv.multipliers, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def digits_clients():
    (X, y), test = digits()
    return ss.FederatedData.split(X, y, num_clients=10, seed=0), (X, y), test


PAPER_B10 = dict(batch_size=10, tau=0.1, rho=ss.PowerStep(0.6, 0.3),
                 gamma=ss.PowerStep(0.9, 0.35))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_algorithm1_on_digits_reaches_92_percent(digits_clients, seed):
    """10 clients, B = 10, T = 100, the paper's B = 10 settings: measured 94-97 % test accuracy
    (seeds 0-2) for a 64-32-10 network; we require 92 %."""
    data, _, (Xt, yt) = digits_clients
    net = MLP(64, 32, 10)
    with pytest.warns(ss.ScheduleWarning, match="sum gamma_t"):
        res = classification_uncon(data, net, lam=1e-5).solve(
            max_iter=99, x0=net.init(seed), seed=seed, eval_every=None, **PAPER_B10)
    assert res.subproblem == "closed_form"
    assert net.evaluate(res.x, Xt, yt)[1] >= 0.92


def test_algorithm2_on_digits_meets_the_cost_bound(digits_clients):
    """min |w|^2 s.t. F <= U = 0.3: slack zero; the full-data cost ends within 0.04 of U
    (measured +0.018 and +0.029 for seeds 0-1 at T = 100: the recursive surrogate lags the
    moving iterate, so the bound is slightly overshot; it shrinks with T, see the slow test)."""
    data, (X, y), _ = digits_clients
    net = MLP(64, 32, 10)
    with pytest.warns(ss.ScheduleWarning):
        res = classification_con(data, net, U=0.3).solve(
            max_iter=100, x0=net.init(0), seed=0, eval_every=None, penalty=[1e5], **PAPER_B10)
    # the paper's settings, no evaluation: no stopping test ran, so no success is claimed
    assert res.status == "max_iter" and res.stages[-1].slack_norm <= 1e-9
    cost, _ = net.evaluate(res.x, X, y)
    assert abs(cost - 0.3) <= 0.04
    assert res.constraints[0] == pytest.approx(cost - 0.3, abs=1e-10)


@pytest.mark.slow
def test_algorithm2_overshoot_shrinks_with_more_rounds(digits_clients):
    data, (X, y), _ = digits_clients
    net = MLP(64, 32, 10)
    res = classification_con(data, net, U=0.3).solve(
        max_iter=1000, x0=net.init(0), seed=0, eval_every=None, penalty=[1e5], batch_size=10)
    assert abs(net.evaluate(res.x, X, y)[0] - 0.3) <= 0.015


def test_linearised_and_exact_lambda_are_both_available(digits_clients):
    data, _, _ = digits_clients
    net = MLP(64, 8, 10)
    exact = classification_uncon(data, net, lam=1e-2)
    lin = classification_uncon(data, net, lam=1e-2, lam_mode="linearised")
    assert exact.deterministic.norm2_coefficient() == pytest.approx(1e-2)
    assert lin.deterministic.norm2_coefficient() == 0.0
    w = net.init(0)
    Xc, yc = data.clients[0].X, data.clients[0].y
    assert lin.objective.value(w, Xc, yc).mean() == pytest.approx(
        exact.objective.value(w, Xc, yc).mean() + 1e-2 * w @ w)


def test_idx_reader_round_trip(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    labels = np.array([7, 0, 9], dtype=np.uint8)
    head = bytes([0, 0, 8, 3]) + b"".join(int(n).to_bytes(4, "big") for n in images.shape)
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as fh:
        fh.write(head + images.tobytes())
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + (3).to_bytes(
        4, "big") + labels.tobytes())
    np.testing.assert_array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), images)
    X, y = load_idx_dataset(tmp_path, "train")
    assert X.shape == (3, 784) and X.max() <= 1.0
    np.testing.assert_allclose(X[1], images[1].ravel() / 255.0)
    np.testing.assert_array_equal(y, labels)
    with pytest.raises(DatasetNotFound, match="dataset-fashion-mnist"):
        load_idx_dataset(tmp_path, "test", "Fashion-MNIST")
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")


def test_a_penalty_stage_never_starts_at_a_rejected_trial_step():
    """Bug found in stop 33 (fixed): with penalty=(1, 10, ..., 1e5) the digits network goes to
    w = 0 at c = 1 and 10 (F = log 10 there) while tau falls to 1e-26, every trial step from
    there at the later c is rejected, and each new stage started at the previous stage's
    pending trial (adopted unjudged; a step of length 76): the run returned |w|^2 = 18,032 and
    F - U = 66, far worse than any point it had accepted. Now a long trial computed after a
    rejection is neither a stage's start nor the returned point: the last accepted point is."""
    (X, y), _ = digits()
    net = MLP(64, 32, 10, bias=True)
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    x0 = net.init(0)
    res = classification_con(data, net, U=0.25).solve(
        seed=0, x0=x0, max_iter=1000, penalty=(1.0, 10.0, 100.0, 1e3, 1e4, 1e5))
    F = net.evaluate(res.x, X, y)[0]
    # no worse than the start in |w|^2, and no worse than w = 0 (F = log 10) in the violation
    assert float(res.x @ res.x) <= float(x0 @ x0)
    assert F <= np.log(10.0) + 1e-3
    assert res.status != "converged"
    # the last stage settled with most of max_iter left: the message says so and does not ask
    # for more rounds (it did, stop 34)
    assert res.nit < 1000 and f"{1000 - res.nit} of max_iter's rounds left" in res.message
    assert "more rounds" not in res.message
