"""The constrained baselines (method "primal_dual" and "augmented_lagrangian", issue 12) through
the same runner and client layer as SSCA, against a pooled CVXPY + Clarabel reference."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.suite import solve_pooled

D, N, U = 5, 240, 1.0


@pytest.fixture(scope="module")
def ls_ball():
    """Least squares F_0 = mean (a.w - y)^2 / 2 subject to the stochastic quadratic constraint
    F_1 = mean |w - z_n|^2 / 2 <= 1 (active), 4 clients; and its pooled CVXPY optimum."""
    rng = np.random.default_rng(0)
    A = rng.normal(size=(N, D))
    y = A @ (2 * rng.normal(size=D)) + 0.3 * rng.normal(size=N)
    Z = rng.normal(scale=0.5, size=(N, D))
    data = ss.FederatedData.split(np.hstack([A, Z]), y, num_clients=4, seed=0)
    f0 = ss.SampleFunction(lambda w, R, y: 0.5 * (R[:, :D] @ w - y) ** 2,
                           lambda w, R, y: R[:, :D].T @ (R[:, :D] @ w - y) / len(y), name="ls")
    f1 = ss.SampleFunction(lambda w, R, y: 0.5 * np.sum((w - R[:, D:]) ** 2, axis=1),
                           lambda w, R, y: w - R[:, D:].mean(0), name="ball")

    def reference(box=None):
        w = cp.Variable(D)
        zbar = Z.mean(0)
        const = 0.5 * np.mean(np.sum(Z ** 2, 1)) - 0.5 * zbar @ zbar
        con = 0.5 * cp.sum_squares(w - zbar) + const <= U
        dom = [cp.norm(w, "inf") <= box] if box is not None else []
        p = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(A @ w - y) / N), [con] + dom)
        solve_pooled(p)
        return w.value, p.value, float(np.ravel(con.dual_value)[0])

    return f0, f1, data, reference


def problem(ls_ball, box=None):
    f0, f1, data, _ = ls_ball
    dom = (lambda w: [cp.norm(w, "inf") <= box]) if box is not None else None
    return ss.Problem(f0, [f1 <= U], dim=D, data=data, domain=dom)


def rel(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("method,options", [
    ("primal_dual", dict(lr=0.2, dual_lr=0.5)),
    ("augmented_lagrangian", dict(lr=0.2, rho=1.0)),
    ("augmented_lagrangian", dict(lr=0.2, rho=2.0, dual_every=5))])
def test_full_batch_e1_reaches_the_cvxpy_optimum(ls_ball, method, options):
    """E = 1, full batches: the KKT test passes (status "converged") at the pooled optimum."""
    _, fref, lref = ls_ball[3]()
    res = problem(ls_ball).solve(method=method, batch_size="full", local_steps=1,
                                 max_iter=2000, eval_every=10, **options)
    assert res.status == "converged" and res.success, res.message
    assert res.method == method and res.nit < 2000
    assert rel(res.fun, fref) <= 1e-3
    assert res.constraints[0] <= 1e-4 * U
    assert rel(res.extras["multipliers"][0], lref) <= 1e-2      # the method's own lambda
    assert rel(res.kkt.multipliers[0], lref) <= 1e-2            # the KKT report's
    np.testing.assert_array_equal(res.history.multipliers[-1], res.extras["multipliers"])


@pytest.mark.parametrize("method,options", [("primal_dual", dict(dual_lr=0.5)),
                                            ("augmented_lagrangian", dict(rho=1.0))])
def test_full_batch_local_steps_reach_the_cvxpy_optimum(ls_ball, method, options):
    """E = 3 local steps: within the client drift of a constant lr (documented), the optimum
    and its multiplier are reached; the KKT test at 1e-4 is not passed, and the status says
    so."""
    _, fref, lref = ls_ball[3]()
    res = problem(ls_ball).solve(method=method, batch_size="full", local_steps=3, lr=0.05,
                                 max_iter=1500, eval_every=100, **options)
    assert rel(res.fun, fref) <= 1e-3
    assert res.constraints[0] <= 1e-3 * U
    assert rel(res.extras["multipliers"][0], lref) <= 1e-2
    assert rel(res.kkt.multipliers[0], lref) <= 1e-2
    assert res.status == "max_iter" and not res.success
    assert "KKT test did not pass" in res.message


def test_box_domain_goes_through_the_server_prox(ls_ball):
    """A domain: the server projects the averaged model (CVXPY); E = 1 full batches is then
    projected gradient descent-ascent and reaches the pooled optimum with the box active."""
    wref, fref, lref = ls_ball[3](box=0.45)
    assert np.max(np.abs(wref)) > 0.45 - 1e-6                  # the box is active
    res = problem(ls_ball, box=0.45).solve(method="primal_dual", batch_size="full", lr=0.2,
                                          dual_lr=0.5, max_iter=2000, eval_every=10)
    assert res.extras["server_prox"]
    assert rel(res.fun, fref) <= 1e-3
    assert rel(res.extras["multipliers"][0], lref) <= 1e-2
    assert np.max(np.abs(res.x)) <= 0.45 + 1e-8
    np.testing.assert_allclose(res.x, wref, atol=1e-3)


@pytest.mark.parametrize("method", ["primal_dual", "augmented_lagrangian"])
def test_full_batch_iterates_are_the_documented_equations(ls_ball, method):
    """Five rounds by hand on the pooled data (E = 1, full batches): w_{t+1} = w_t - r (grad F_0
    + mu_t grad F_1) with mu_t = lambda_t (primal-dual) or max(0, lambda_t + rho e_{t-1})
    (augmented Lagrangian, e the previous round's F_1 - U), and the projected dual steps."""
    f0, f1, data, _ = ls_ball
    R = np.vstack([c.X for c in data.clients])
    Y = np.concatenate([c.y for c in data.clients])
    ws, lams = [], []
    problem(ls_ball).solve(method=method, batch_size="full", lr=0.1, max_iter=5,
                           eval_every=None, x0=np.full(D, 0.3),
                           **({"dual_lr": 0.7} if method == "primal_dual" else {"rho": 2.0}),
                           callback=lambda it: (ws.append(it.x.copy()),
                                                lams.append(it.state.multipliers.copy())))
    w, lam, e = np.full(D, 0.3), 0.0, 0.0
    for t in range(5):
        mu = lam if method == "primal_dual" else max(0.0, lam + 2.0 * e)
        F1 = f1.value(w, R, Y).mean()
        w = w - 0.1 * (f0.grad(w, R, Y) + mu * f1.grad(w, R, Y))
        e = F1 - U
        lam = max(0.0, lam + (0.7 if method == "primal_dual" else 2.0) * e)
        np.testing.assert_allclose(ws[t], w, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(lams[t], [lam], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("method", ["primal_dual", "augmented_lagrangian"])
def test_resume_from_a_checkpoint_gives_the_same_iterates(ls_ball, tmp_path, method):
    prob = problem(ls_ball)
    opts = dict(method=method, batch_size=7, local_steps=2, lr=ss.PowerStep(0.2, 0.5),
                seed=3, eval_every=5)
    full = prob.solve(max_iter=30, **opts)
    path = tmp_path / "ck.npz"
    prob.solve(max_iter=12, checkpoint=path, **opts)
    resumed = prob.solve(max_iter=30, resume=path, **{k: v for k, v in opts.items()
                                                      if k != "seed"})
    np.testing.assert_array_equal(resumed.x, full.x)
    np.testing.assert_array_equal(resumed.history.multipliers, full.history.multipliers)
    np.testing.assert_array_equal(resumed.history.objective, full.history.objective)
    assert resumed.communication.up_total == full.communication.up_total
    with pytest.raises(ValueError, match="resume"):
        prob.solve(max_iter=30, resume=path, **{**opts, "local_steps": 3})


def test_mini_batches_on_the_process_transport_give_the_same_iterates(ls_ball):
    """Stateless clients: the forked-process transport draws the same batches."""
    prob = problem(ls_ball)
    opts = dict(method="augmented_lagrangian", batch_size=5, local_steps=2, max_iter=6,
                seed=1, eval_every=3)
    a = prob.solve(**opts)
    b = prob.solve(transport="process", **opts)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.history.multipliers, b.history.multipliers)
    # d + M floats each way per client and round (the model and the constraint estimates up,
    # the model and the weights mu down)
    assert a.communication.up_per_client_round == D + 1
    assert a.communication.down_per_client_round == D + 1
    assert a.communication.up_total == a.communication.down_total == 6 * 4 * (D + 1)


def test_mini_batch_status_is_honest(ls_ball):
    res = problem(ls_ball).solve(method="primal_dual", batch_size=5, max_iter=40, seed=0,
                                 eval_every=10)
    assert res.status == "max_iter" and not res.success
    assert "KKT test did not pass" in res.message and "batch_size" in res.message
    assert res.history.multipliers.shape == (40, 1)
    assert res.history.constraint_estimate.shape == (40, 1)
    # the start point's evaluation (round 0) and four scheduled ones
    assert res.history.eval_t[0] == 0 and len(res.history.eval_t) == 5


def test_bad_options_raise(ls_ball):
    prob = problem(ls_ball)
    with pytest.raises(TypeError, match="unknown solve option 'dual_lr' for method "
                                        "'augmented_lagrangian'"):
        prob.solve(method="augmented_lagrangian", dual_lr=0.1)
    with pytest.raises(TypeError, match="unknown solve option 'rho' for method 'primal_dual'"):
        prob.solve(method="primal_dual", rho=1.0)
    with pytest.raises(TypeError, match="did you mean 'local_steps'"):
        prob.solve(method="primal_dual", local_step=2)
    with pytest.raises(ValueError, match="rho must be"):
        prob.solve(method="augmented_lagrangian", rho=0.0)
    with pytest.raises(ValueError, match="dual_every"):
        prob.solve(method="augmented_lagrangian", dual_every=0)
    with pytest.raises(ValueError, match="lr must be"):
        prob.solve(method="primal_dual", lr=-0.1)
    with pytest.raises(ValueError, match="dual_lr must be"):
        prob.solve(method="primal_dual", dual_lr="big")
    with pytest.raises(ValueError, match="multipliers0 must be 1 finite numbers >= 0"):
        prob.solve(method="primal_dual", multipliers0=[-1.0])
    with pytest.raises(ValueError, match="multipliers0"):
        prob.solve(method="primal_dual", multipliers0=[1.0, 2.0])
    with pytest.raises(ValueError, match="local_steps"):
        prob.solve(method="primal_dual", local_steps=0)
    with pytest.raises(ss.DataError, match="batch_size"):
        prob.solve(method="primal_dual", batch_size=10_000)
    with pytest.raises(ss.ScheduleError, match="lr_t"):
        prob.solve(method="primal_dual", lr=lambda t: -1.0, max_iter=2)


@pytest.mark.parametrize("method", ["primal_dual", "augmented_lagrangian"])
def test_secure_aggregation_and_partial_participation_apply(ls_ball, method):
    """The server reads the replies only as sum_i weight_i N_i/N x_i: under secure aggregation
    (one masked sum per round) the iterates stay within the quantisation error of the plain
    run; with clients_per_round=2 of 4 only the sampled clients send."""
    pytest.importorskip("cryptography")
    prob = problem(ls_ball)
    opts = dict(method=method, batch_size=5, local_steps=2, max_iter=8, seed=2,
                eval_every=None, lr=0.1,
                **({"dual_lr": 0.3} if method == "primal_dual" else {"rho": 0.3}))
    plain = prob.solve(**opts)
    secure = prob.solve(secure_aggregation=True, **opts)
    assert np.max(np.abs(plain.x - secure.x)) < 1e-8
    np.testing.assert_allclose(secure.history.multipliers, plain.history.multipliers,
                               atol=1e-8)
    part = prob.solve(clients_per_round=2, **opts)
    assert part.communication.clients_per_round == 2
    assert part.communication.up_total == 8 * 2 * (D + 1)
    assert not np.allclose(part.x, plain.x)
