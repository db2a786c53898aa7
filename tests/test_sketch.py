"""The sketch of the Lagrangian's Hessian (hessian="sketch", methods/ssca/newton.py): the
clients' Hessian products with k directions give a randomized Nystrom model; against the
matrices it approximates, the closed form against CVXPY + Clarabel, the pooled optimum, finite
differences for every ``hessp``, secure aggregation, client processes and a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.errors import UserFunctionError
from ssca_solver.methods.ssca import SSCA
from ssca_solver.methods.ssca.newton import SketchModel, sketch_directions, sketch_model
from ssca_solver.methods.ssca.options import sketch_rank
from ssca_solver.model.functions import checked_hessp
from conftest import model_subproblem
from problems import least_squares, suite
from problems.logistic import logistic_loss


@pytest.fixture(scope="module")
def spiked():
    prob, X, y, target, r = least_squares.spiked()
    return prob, least_squares.ill_conditioned_reference(X, y, target, r)


def test_the_rank_follows_the_floats_budget():
    """k d stays within the Newton model's floats at d = 256 (32,896), k in [8, 64], k < d."""
    assert sketch_rank(650) == 50 and sketch_rank(1000) == 32 and sketch_rank(5000) == 8
    assert sketch_rank(300) == 64 and sketch_rank(10) == 9 and sketch_rank(2) == 1
    for d in (300, 650, 1000, 4112):
        assert sketch_rank(d) * d <= 256 * 257 // 2


def test_nystrom_is_exact_on_a_low_rank_psd_matrix_and_ritz_on_an_indefinite_one():
    rng = np.random.default_rng(0)
    d, k, r = 40, 10, 6
    A = rng.standard_normal((d, r))
    L = A @ A.T                                           # rank 6 < k: Nystrom is exact
    omega = sketch_directions(k, 1, np.zeros(d), np.zeros(0), np.zeros((0, d)))
    np.testing.assert_allclose(omega @ omega.T, np.eye(k), atol=1e-12)
    U, eig = sketch_model(omega, omega @ L)
    lam, rho = eig[:-1], eig[-1]
    np.testing.assert_allclose(U @ U.T, np.eye(k), atol=1e-10)
    assert np.all(np.diff(lam) <= 0) and rho == lam[-1]
    np.testing.assert_allclose((U.T * lam) @ U, L, atol=1e-8 * np.abs(L).max())
    np.testing.assert_allclose(lam[:r], np.linalg.eigvalsh(L)[::-1][:r], rtol=1e-8)
    # rho is floored at 1e-12 of the largest (L's other eigenvalues are 0)
    assert rho == pytest.approx(1e-12 * lam[0])
    # indefinite: Rayleigh-Ritz on the directions, eigenvalues by their absolute values
    B = rng.standard_normal((d, d))
    S = B + B.T
    U2, eig2 = sketch_model(omega, omega @ S)
    ritz = np.linalg.eigvalsh(omega @ S @ omega.T)
    np.testing.assert_allclose(np.sort(eig2[:-1]), np.sort(np.abs(ritz)), rtol=1e-10)
    np.testing.assert_allclose(U2 @ S @ U2.T, np.diag(ritz[np.argsort(-np.abs(ritz))]),
                               atol=1e-10 * np.abs(ritz).max())


def test_the_directions_carry_the_last_models_and_the_step():
    rng = np.random.default_rng(1)
    d, k = 30, 8
    rows, _ = np.linalg.qr(rng.standard_normal((d, 8)))
    w, prev = rng.standard_normal(d), rng.standard_normal(d)
    omega = sketch_directions(k, 5, w, prev, rows.T)
    again = sketch_directions(k, 5, w, prev, rows.T)
    np.testing.assert_array_equal(omega, again)        # the request's = the step's
    P = omega.T @ omega                                 # projector onto their span
    for v in list(rows.T[:k - 3]) + [w - prev]:
        np.testing.assert_allclose(P @ v, v, atol=1e-10 * np.linalg.norm(v))


def test_the_model_is_its_eigen_decomposition_and_positive_definite():
    rng = np.random.default_rng(2)
    d, k = 25, 6
    U, _ = np.linalg.qr(rng.standard_normal((d, k)))
    model = SketchModel(U.T, np.array([9.0, 5.0, 3.0, 2.0, 1.5, 1.0, 1.0]))
    B = model.matmat(np.eye(d))
    np.testing.assert_allclose(B, B.T, atol=1e-13)
    lam, V = model.eigen()
    np.testing.assert_allclose((V * lam) @ V.T, B, atol=1e-12)
    np.testing.assert_allclose(V.T @ V, np.eye(d), atol=1e-12)
    assert np.linalg.eigvalsh(B)[0] == pytest.approx(1.0) and model.delta == 1.0
    v = rng.standard_normal(d)
    np.testing.assert_allclose(model.matvec(v), B @ v, atol=1e-12)


def test_the_sketch_model_in_the_closed_form_matches_cvxpy():
    """Problem 5 with (w - x)' B (w - x) / 2 of a SketchModel: the closed form (in the span
    of its directions and the linear terms) equals CVXPY + Clarabel's problem written out."""
    from ssca_solver.subproblems import ClosedFormSubproblem

    rng = np.random.default_rng(3)
    d, M, c, k = 40, 2, 50.0, 5
    U, _ = np.linalg.qr(rng.standard_normal((d, k)))
    model = SketchModel(U.T, np.array([30.0, 10.0, 4.0, 2.0, 0.5, 0.5]))
    stats, x, U0, w_ref, value_ref = model_subproblem(rng, d, M, model.matmat(np.eye(d)), c,
                                                      tol=1e-10)
    builders = [ss.ProximalLinear()] * (1 + M)
    sol = ClosedFormSubproblem(d, builders, True, U0, 0.0).with_model(model, x).solve(
        stats, c, 1)
    np.testing.assert_allclose(sol.w, w_ref, atol=1e-7)
    assert sol.value == pytest.approx(value_ref, rel=1e-9)


def test_every_hessp_matches_finite_differences_of_its_gradient():
    """The products the clients send: the built-in softmax, logistic and squared losses' and
    the sketch family's ``hessp`` against central differences of ``grad`` (and against
    ``hess @ V`` where there is a ``hess``); -f's against f's negated."""
    rng = np.random.default_rng(4)
    X, y = suite._digits()
    X, y = X[:300], y[:300]
    K = 10
    funcs = [(suite.softmax_loss(K), X, y), (suite.softmax_loss(K, 3, 0.1), X, y)]
    prob, Xs, ys, *_ = least_squares.spiked(d=30, n=200, clients=2)
    funcs += [(fn, Xs[:50], ys[:50]) for fn in prob.functions]
    funcs += [(-suite.softmax_loss(K, 3, 0.1), X, y)]
    Xl, yl = X[:, :20] / 16.0, (y > 4).astype(float)
    funcs += [(logistic_loss(), Xl, yl), (logistic_loss(1, 0.5), Xl, yl),
              (least_squares.squared_loss(), Xl, yl)]
    for fn, A, b in funcs:
        d = K * A.shape[1] if fn.name.lstrip("-").startswith("cross") else A.shape[1]
        w = 0.05 * rng.standard_normal(d)
        V = rng.standard_normal((d, 3))
        got = checked_hessp(fn, w, A, b, V, "a test")
        eps = 1e-5
        fd = np.column_stack([(fn.grad(w + eps * v, A, b) - fn.grad(w - eps * v, A, b))
                              / (2 * eps) for v in V.T])
        np.testing.assert_allclose(got, fd, atol=1e-7 * max(1.0, np.abs(fd).max()),
                                   err_msg=fn.name)
        if fn.hess is not None:
            np.testing.assert_allclose(got, fn.hess(w, A, b) @ V, rtol=1e-10, atol=1e-12,
                                       err_msg=fn.name)


def test_a_wrong_hessp_is_named():
    fn = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), name="bad",
                           hessp=lambda w, X, y, V: V[:, :1])
    X = np.ones((4, 3))
    with pytest.raises(UserFunctionError, match=r"bad.hessp.*shape \(3, 2\)"):
        checked_hessp(fn, np.zeros(3), X, None, np.ones((3, 2)), "client 0, round 1")
    with pytest.raises(TypeError, match="hessp must be callable"):
        ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), hessp=3)


def test_the_option_and_its_rules(spiked):
    prob, _ = spiked
    assert SSCA.parse(prob, {}).hessian == "lbfgs"          # "auto" does not pick it
    assert SSCA.parse(prob, {"hessian": "sketch"}).hessian == "sketch"
    # a function with neither hess nor hessp: the clients difference its gradient along the
    # directions (tests/test_newton.py checks the products)
    plain = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), name="plain")
    without = ss.Problem(plain, dim=prob.dim, data=prob.data)
    assert SSCA.parse(without, {"hessian": "sketch"}).hessian == "sketch"
    assert SSCA.parse(without, {}).hessian == "lbfgs"       # d = 600 > 256


def test_a_spiked_spectrum_in_few_rounds_at_the_pooled_optimum(spiked):
    """Six directions of variance up to 1e3 over a flat bulk, d = 600 (k = 54): the sketch
    certifies the pooled optimum's neighbourhood in a few dozen rounds where the quasi-Newton
    model takes several times as many; a client with only ``hess`` (multiplied by the
    directions on the client) takes the same steps to rounding."""
    prob, x_ref = spiked
    res = prob.solve(seed=0, batch_size="full", hessian="sketch")
    assert res.status == "converged" and res.nit <= 40, (res.nit, res.message)
    assert np.linalg.norm(res.x - x_ref) <= 1e-3 * np.linalg.norm(x_ref)
    quasi = prob.solve(seed=0, batch_size="full", hessian="lbfgs")
    assert quasi.nit > 3 * res.nit, (quasi.nit, res.nit)
    # the curvature's floats: k d per function per client per round, counted
    k, d = sketch_rank(prob.dim), prob.dim
    assert res.communication.up_per_client_round >= 3 * k * d
    whole, *_ = least_squares.spiked(products=False)
    same = whole.solve(seed=0, batch_size="full", hessian="sketch")
    assert same.nit == res.nit and same.status == res.status
    np.testing.assert_allclose(same.x, res.x, atol=1e-8 * np.linalg.norm(res.x))


@pytest.fixture(scope="module")
def small_spiked():
    prob, X, y, target, r = least_squares.spiked(d=300, n=900, clients=3)
    return prob, least_squares.ill_conditioned_reference(X, y, target, r)


def test_under_secure_aggregation_the_sketch_works_as_in_the_clear(small_spiked):
    prob, x_ref = small_spiked
    plain = prob.solve(seed=0, batch_size="full", hessian="sketch")
    secure = prob.solve(seed=0, batch_size="full", hessian="sketch", secure_aggregation=True)
    assert plain.status == secure.status == "converged"
    assert secure.nit <= plain.nit + 5, (secure.nit, plain.nit)
    assert secure.fun == pytest.approx(plain.fun, rel=1e-6)
    assert np.linalg.norm(secure.x - x_ref) <= 1e-3 * np.linalg.norm(x_ref)


def test_through_client_processes_the_same_steps(small_spiked):
    prob, _ = small_spiked
    inproc = prob.solve(seed=0, batch_size="full", hessian="sketch")
    procs = prob.solve(seed=0, batch_size="full", hessian="sketch", transport="process")
    assert procs.nit == inproc.nit and procs.status == inproc.status
    np.testing.assert_allclose(procs.x, inproc.x, atol=1e-10 * np.linalg.norm(inproc.x))


def test_a_resumed_run_takes_the_uninterrupted_runs_steps(small_spiked, tmp_path):
    prob, _ = small_spiked
    whole = prob.solve(seed=0, batch_size="full", hessian="sketch")
    assert whole.nit > 5
    path = str(tmp_path / "run.npz")
    first = prob.solve(seed=0, batch_size="full", hessian="sketch", checkpoint=path,
                       callback=lambda it: it.t == 4)
    assert first.status == "stopped"
    rest = prob.solve(seed=0, batch_size="full", hessian="sketch", resume=path)
    assert rest.nit == whole.nit and rest.status == whole.status
    np.testing.assert_array_equal(rest.x, whole.x)
