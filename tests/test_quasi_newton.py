"""The quasi-Newton model of the full-batch phase (issue 19): the compact L-BFGS matrix against
the BFGS recursion, Powell damping, the closed form with the model against CVXPY + Clarabel,
the option, checkpoints, and fewer rounds than the first-order surrogates on problems whose
optimum is known."""

import numpy as np
import pytest

from problems.classical import CLASSICAL, problem
from ssca_solver.methods.ssca.quasi_newton import DAMPING, MEMORY, LBFGSModel, add_pair
from ssca_solver.subproblems.closed_form import solve_closed_form_model


def _bfgs(pairs, delta, d):
    """The BFGS recursion from B_0 = delta I (the reference for the compact form)."""
    B = delta * np.eye(d)
    for s, y in pairs:
        Bs = B @ s
        B = B - np.outer(Bs, Bs) / (s @ Bs) + np.outer(y, y) / (s @ y)
    return B


def _pairs(rng, d, k, H):
    S, Y = np.zeros((0, d)), np.zeros((0, d))
    for j in range(k):
        s = rng.standard_normal(d)
        y = H @ s + (-2.0 * s if j % 3 == 2 else 0.0)      # some pairs of negative curvature
        S, Y = add_pair(S, Y, s, y)
    return S, Y


def test_compact_form_equals_the_bfgs_recursion():
    rng = np.random.default_rng(0)
    d = 12
    H = rng.standard_normal((d, d))
    H = H @ H.T / d + 0.1 * np.eye(d)
    S, Y = _pairs(rng, d, 5, H)
    model = LBFGSModel(S, Y)
    B = _bfgs(list(zip(S, Y)), model.delta, d)
    np.testing.assert_allclose(model.matmat(np.eye(d)), B, rtol=1e-9, atol=1e-9)
    v = rng.standard_normal(d)
    np.testing.assert_allclose(model.matvec(v), B @ v, rtol=1e-9, atol=1e-9)


def test_damping_keeps_the_model_positive_definite_and_memory_bounded():
    rng = np.random.default_rng(1)
    d = 8
    S, Y = np.zeros((0, d)), np.zeros((0, d))
    for _ in range(3 * MEMORY):
        s = rng.standard_normal(d)
        before = LBFGSModel(S, Y)
        Bs = before.matvec(s) if len(before) else (np.linalg.norm(-s) / np.linalg.norm(s)) * s
        S, Y = add_pair(S, Y, s, -s)               # negative curvature: always damped
        assert S[-1] @ Y[-1] >= DAMPING * (s @ Bs) * (1 - 1e-12)
        B = LBFGSModel(S, Y).matmat(np.eye(d))
        assert np.min(np.linalg.eigvalsh(0.5 * (B + B.T))) > 0
    assert S.shape == (MEMORY, d) and Y.shape == (MEMORY, d)
    # a pair without information is refused, not stored
    assert add_pair(S, Y, np.zeros(d), np.ones(d)) is None
    assert add_pair(S, Y, np.ones(d), np.full(d, np.nan)) is None


@pytest.mark.parametrize("equality", [False, True])
def test_closed_form_with_the_model_matches_clarabel(equality):
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(2)
    d, M = 25, 3
    H = rng.standard_normal((d, d))
    S, Y = _pairs(rng, d, 6, H @ H.T / d + 0.1 * np.eye(d))
    model = LBFGSModel(S, Y)
    B = model.matmat(np.eye(d))
    B = 0.5 * (B + B.T)
    x = rng.standard_normal(d)
    a0, b0, c0 = 0.3, rng.standard_normal(d), 1.0
    a = np.array([0.2, 0.0 if equality else 0.05, 0.1])
    bs = [rng.standard_normal(d) for _ in range(M)]
    cs, U = rng.standard_normal(M), np.array([-1.0, 0.5, -2.0])
    eq = np.array([False, equality, False])
    c = 10.0
    sol = solve_closed_form_model(a0, b0, c0, a, bs, cs, U, c, model, x, equality=eq)
    w, s = cp.Variable(d), cp.Variable(M)
    L = np.linalg.cholesky(B)
    obj = a0 * cp.sum_squares(w) + b0 @ w + c0 + 0.5 * cp.sum_squares(L.T @ (w - x)) + c * cp.sum(s)
    cons = [s >= 0]
    for j in range(M):
        p = a[j] * cp.sum_squares(w) + bs[j] @ w + cs[j] - U[j]
        cons += [cp.abs(p) <= s[j]] if eq[j] else [p <= s[j]]
    ref = cp.Problem(cp.Minimize(obj), cons)
    ref.solve(solver="CLARABEL")

    def primal(v):        # Problem 5's value at v with the least slack
        ex = np.array([a[j] * v @ v + bs[j] @ v + cs[j] - U[j] for j in range(M)])
        slack = np.where(eq, np.abs(ex), np.maximum(ex, 0.0))
        return a0 * v @ v + b0 @ v + c0 + 0.5 * (v - x) @ B @ (v - x) + c * slack.sum(), slack

    value, slack = primal(sol.w)
    assert abs(sol.value - value) <= 1e-10 * max(1.0, abs(value))
    np.testing.assert_allclose(sol.slack, slack, atol=1e-10)
    # no worse than the interior-point solve (which stops at its own tolerance, ~1e-9)
    assert value <= ref.value + 1e-8 * max(1.0, abs(ref.value))
    assert value >= ref.value - 1e-6 * max(1.0, abs(ref.value))
    # strong convexity (modulus 2 a0): |w - w*|^2 <= (value gap) / a0
    gap = max(primal(w.value)[0] - value, 0.0)
    assert np.linalg.norm(sol.w - w.value) <= np.sqrt(gap / a0) + 1e-6


def test_hessian_option_is_checked_and_recorded():
    c = CLASSICAL["rosenbrock"]
    with pytest.raises(ValueError, match="hessian"):
        problem(c).solve(x0=c.x0, hessian="bfgs")


@pytest.mark.parametrize("name, rounds", [("rosenbrock", 60), ("beale", 30), ("quartic", 40)])
def test_quasi_newton_certifies_in_tens_of_rounds(name, rounds):
    """The first-order surrogates need 700 (Beale), 180 (quartic) or more than 2000
    (Rosenbrock) rounds on these; the model: tens."""
    c = CLASSICAL[name]
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=2000)
    assert res.status == "converged", res.message
    assert res.nit <= rounds
    assert abs(res.fun - c.optimum) <= 1e-6 * max(1.0, abs(c.optimum))
    first = problem(c).solve(seed=0, x0=c.x0, max_iter=2000, hessian="none")
    assert first.nit > 2 * res.nit


def test_checkpoint_keeps_the_pairs(tmp_path):
    """A run stopped and resumed from its checkpoint continues with the same model: the same
    iterates as one run straight through."""
    c = CLASSICAL["rosenbrock"]
    path = tmp_path / "run.npz"
    straight = problem(c).solve(seed=0, x0=c.x0, max_iter=30, eval_every=0)
    problem(c).solve(seed=0, x0=c.x0, max_iter=15, eval_every=0, checkpoint=str(path),
                     checkpoint_every=5)
    with np.load(path) as z:
        assert any(k.endswith("qn_s") for k in z.files)
    resumed = problem(c).solve(seed=0, x0=c.x0, max_iter=30, eval_every=0,
                               checkpoint=str(path), resume=str(path))
    np.testing.assert_allclose(resumed.x, straight.x, rtol=0, atol=1e-12)


def test_the_model_is_not_used_on_sampled_rounds_or_with_a_fixed_tau():
    """hessian has no effect where it does not apply: a fixed tau or a fixed batch give the
    same iterates with "lbfgs" and "none"."""
    c = CLASSICAL["rosenbrock"]
    for opts in (dict(batch_size="full", tau=2000.0), dict(batch_size="auto", tau=2000.0)):
        a = problem(c).solve(seed=0, x0=c.x0, max_iter=40, **opts)
        b = problem(c).solve(seed=0, x0=c.x0, max_iter=40, hessian="none", **opts)
        np.testing.assert_array_equal(a.x, b.x)


def test_checkpoint_layout_admits_the_pairs(tmp_path):
    """The pairs (twice the memory: SMALL_MEMORY at small d) fit the checkpoint's layout: a
    run of a small problem with 64 pairs resumes from its checkpoint."""
    from ssca_solver.engine.checkpoint import STATE_ROWS
    from ssca_solver.methods.ssca import quasi_newton as qn

    assert 2 * MEMORY <= STATE_ROWS and qn.memory_for(10) == qn.SMALL_MEMORY
    assert qn.memory_for(qn.SMALL_DIM + 1) == MEMORY
    c = CLASSICAL["sixth_power_equality"]              # certified at round 31 with 64 pairs
    path = tmp_path / "run.npz"
    first = problem(c).solve(seed=0, x0=c.x0, max_iter=200, checkpoint=path,
                             callback=lambda it: it.t >= 25)          # stopped at round 25
    resumed = problem(c).solve(seed=0, resume=path, max_iter=200)
    whole = problem(c).solve(seed=0, x0=c.x0, max_iter=200)
    assert first.status == "stopped" and resumed.status == whole.status == "converged"
    np.testing.assert_array_equal(resumed.x, whole.x)


def test_cvxpy_path_with_the_model_matches_the_closed_form():
    """The same Problem 5 with the model through CVXPY (the factor term, DPP) and through the
    closed form: the same w and multipliers to the interior point's accuracy, and the
    parametrised problem is compiled once for both rounds."""
    from ssca_solver.model.surrogates import ProximalLinear
    from ssca_solver.subproblems.closed_form import ClosedFormSubproblem
    from ssca_solver.subproblems.cvxpy_backend import CvxpySubproblem
    from ssca_solver.model.deterministic import DeterministicPart

    rng = np.random.default_rng(3)
    d = 10
    H = rng.standard_normal((d, d))
    S, Y = _pairs(rng, d, 5, H @ H.T / d + 0.1 * np.eye(d))
    model = LBFGSModel(S, Y)
    builders = [ProximalLinear(), ProximalLinear()]
    closed = ClosedFormSubproblem(d, builders, True, [0.3], 0.0)
    cvx = CvxpySubproblem(d, builders, True, [0.3], DeterministicPart((), (), d))
    assert cvx.parametrize
    for _ in range(2):
        x = rng.standard_normal(d)
        stats = tuple({"quad": np.asarray(0.05), "lin": rng.standard_normal(d),
                       "const": np.asarray(float(rng.standard_normal()))} for _ in builders)
        a = closed.with_model(model, x).solve(stats, 10.0, round=1)
        b = cvx.with_model(model, x).solve(stats, 10.0, round=1)
        # values to the interior point's tolerance (~1e-9 relative gap); w to what strong
        # convexity (modulus >= 2 quad = 0.1) makes of that: |dw|^2 <= 2 dvalue / 0.1
        tol = 1e-7 * max(1.0, abs(a.value))
        assert abs(a.value - b.value) <= tol
        assert np.linalg.norm(b.w - a.w) <= np.sqrt(2.0 * tol / 0.1)
        np.testing.assert_allclose(b.multipliers, a.multipliers, atol=1e-4)
    assert cvx._model_main().problem.is_dpp()


def test_the_max_iter_message_names_the_steps_that_ran():
    """A run stopped by max_iter on full batches says its steps were quasi-Newton ones with
    the model, first-order SCA's without it (issue 21: advice that applies)."""
    c = CLASSICAL["rosenbrock"]
    # (without hessian="lbfgs" the clients difference the gradients: the Newton model)
    second = problem(c).solve(seed=0, x0=c.x0, max_iter=15, hessian="lbfgs")
    first = problem(c).solve(seed=0, x0=c.x0, max_iter=15, hessian="none")
    assert second.status == first.status == "max_iter"
    assert "quasi-Newton" in second.message and "first order" not in second.message
    assert "first order" in first.message and "quasi-Newton" not in first.message


@pytest.mark.parametrize("seed", range(4))
def test_pairs_of_rounding_curvature_leave_the_model_a_symmetric_positive_definite_matrix(seed):
    """S2MPJ's MAKELA1 (d = 3, a linear objective): the first pairs come from a Lagrangian
    that is linear to rounding (y about 1e-16 s), the later ones from curvatures near 1, and
    the steps lie in a plane (w1 = w2). N is then singular to rounding: its inverse made B
    asymmetric (0.65) and indefinite (an eigenvalue of -4.7), the closed form solved another
    problem (objective -1.30 where Clarabel finds -1.414 for the same subproblem) and every
    step raised the objective. The oldest pairs are dropped until the compact form is a
    positive definite matrix again (every seed failed before)."""
    rng = np.random.default_rng(seed)
    d = 3
    S, Y = np.zeros((0, d)), np.zeros((0, d))
    for j in range(12):
        p, q, r = rng.uniform(0.1, 2.0, 3)
        H = np.array([[p, q, 0.3], [q, p, 0.3], [0.3, 0.3, r]])      # symmetric in w1, w2
        a, b = rng.standard_normal(2) * 0.6 ** j
        s = np.array([a, a, b])
        out = add_pair(S, Y, s, (1e-16 if j < 2 else 1.0) * (H @ s), memory=64)
        if out is not None:
            S, Y = out
        model = LBFGSModel(S, Y)
        B = model.matmat(np.eye(d))
        x = rng.standard_normal(d)
        tol = 1e-8 * np.abs(B).max()
        assert np.allclose(B, B.T, rtol=1e-8, atol=tol)
        assert np.allclose(model.matvec(x), B @ x, rtol=1e-8, atol=tol)
        assert np.linalg.eigvalsh(0.5 * (B + B.T))[0] > 0.0
        assert len(model) == len(S)          # the state keeps the pairs the model uses


def test_the_merit_weight_lets_full_steps_along_a_curved_active_constraint_through():
    """Stop 29: logistic regression on breast cancer (standardised, intercept, 5 clients)
    s.t. mean (x.w)^2 <= 4, active with multiplier 0.026. The merit test weighed the
    violation by max(2 |nu|, c / 100) = 1 at c = 100, 40 times the multiplier: every full
    quasi-Newton step along the curved constraint raised it (the Maratos effect) and 87 of
    197 rounds were second-order corrections. With the floor c / 10^4 the weight is 2 |nu|
    (still above the multiplier: an exact penalty): 110 rounds, 5 rejected. Checked against
    CVXPY + Clarabel on the pooled rows."""
    import cvxpy as cp
    import ssca_solver as ss
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    X = np.hstack([X, np.ones((len(X), 1))])
    y = 2.0 * y - 1.0
    n, d = X.shape
    loss = ss.SampleFunction(lambda w, X, y: np.logaddexp(0.0, -y * (X @ w)),
                             lambda w, X, y: X.T @ (-y * 0.5 * (1 - np.tanh(0.5 * y * (X @ w))))
                             / len(y), name="logistic")
    energy = ss.SampleFunction(lambda w, X, y: (X @ w) ** 2,
                               lambda w, X, y: 2 * X.T @ (X @ w) / len(y), name="energy")
    data = ss.FederatedData.split(X, y, num_clients=5, seed=1)
    res = ss.Problem(loss, [energy <= 4.0], dim=d, data=data).solve(seed=0)
    w = cp.Variable(d)
    ref = cp.Problem(cp.Minimize(cp.sum(cp.logistic(-cp.multiply(y, X @ w))) / n),
                     [cp.sum_squares(X @ w) / n <= 4.0])
    ref.solve(solver="CLARABEL")
    assert res.status == "converged"
    assert abs(res.fun - ref.value) <= 1e-6 * abs(ref.value)
    np.testing.assert_allclose(res.kkt.multipliers, np.ravel(ref.constraints[0].dual_value),
                               rtol=1e-3)
    rejected = int(np.sum(res.history.as_dict()["rejected"]))
    assert res.nit <= 140 and rejected <= 15, (res.nit, rejected)


def test_a_linear_objective_and_a_flat_lagrangian_are_certified_at_the_optimum():
    """Mifflin's minimax problem (S2MPJ's MIFFLIN1): min u s.t. -u - x1 + x1^2 + x2^2 <= 1,
    -u - x1 <= 0, from (0.8, 0.6, 0). The objective is linear and the Lagrangian nearly flat
    at the first pair, so the model's scale delta is tiny; a tau cut to 1 % of it made round
    2's trial step 2.2e14 long (a DivergenceError). The run is certified at the optimum -1 at
    (1, 0)."""
    import ssca_solver as ss

    data = ss.FederatedData([np.zeros((1, 1))])
    obj = ss.SampleFunction(lambda w, X, y: np.full(len(X), w[2]),
                            lambda w, X, y: np.array([0.0, 0.0, 1.0]), name="u")
    f1 = ss.SampleFunction(lambda w, X, y: np.full(len(X), -w[2] - w[0] + w[0] ** 2 + w[1] ** 2),
                           lambda w, X, y: np.array([-1 + 2 * w[0], 2 * w[1], -1.0]), name="F1")
    f2 = ss.SampleFunction(lambda w, X, y: np.full(len(X), -w[2] - w[0]),
                           lambda w, X, y: np.array([-1.0, 0.0, -1.0]), name="F2")
    res = ss.Problem(obj, [f1 <= 1.0, f2 <= 0.0], dim=3, data=data).solve(
        seed=0, x0=np.array([0.8, 0.6, 0.0]))
    assert res.status == "converged", res.message
    assert res.fun == pytest.approx(-1.0, abs=1e-6)
    np.testing.assert_allclose(res.x[:2], [1.0, 0.0], atol=1e-5)


@pytest.mark.parametrize("d, k", [(12, 3), (12, 8), (40, 5), (6, 0)])
def test_the_models_eigenvectors_diagonalise_it(d, k):
    """LBFGSModel.eigen: from a QR of its 2k directions when 2k < d (the complement has
    eigenvalue delta), from B itself otherwise; no pair: B = 0."""
    rng = np.random.default_rng(d + k)
    H = rng.standard_normal((d, d))
    S, Y = _pairs(rng, d, k, H @ H.T / d + 0.1 * np.eye(d))
    model = LBFGSModel(S, Y)
    lam, V = model.eigen()
    B = model.matmat(np.eye(d))
    np.testing.assert_allclose(V.T @ V, np.eye(d), atol=1e-12)
    np.testing.assert_allclose((V * lam) @ V.T, 0.5 * (B + B.T),
                               atol=1e-10 * max(1.0, np.max(np.abs(B))))


class _WithoutEigen:
    """The same model without ``eigen`` (the closed form then decomposes B itself)."""

    def __init__(self, model):
        self.model, self.delta = model, model.delta

    def matvec(self, v):
        return self.model.matvec(v)

    def matmat(self, V):
        return self.model.matmat(V)

    def directions(self):
        return self.model.directions()


def test_the_closed_form_over_the_whole_space_takes_the_models_eigenvectors():
    """Directions spanning R^d (2 memory >= d): the rotated problem in the model's own
    eigenvectors gives the w-bar and multipliers of the eigendecomposition of B (d = 12,
    6 pairs, M = 5)."""
    rng = np.random.default_rng(5)
    d, M = 12, 5
    H = rng.standard_normal((d, d))
    S, Y = _pairs(rng, d, 6, H @ H.T / d + 0.1 * np.eye(d))
    model = LBFGSModel(S, Y)
    x, b0 = rng.standard_normal(d), rng.standard_normal(d)
    a, bs = rng.uniform(0.05, 0.3, M), [rng.standard_normal(d) for _ in range(M)]
    cs, U = rng.standard_normal(M), rng.uniform(-1.0, 0.5, M)
    sol = solve_closed_form_model(0.3, b0, 1.0, a, bs, cs, U, 10.0, model, x)
    ref = solve_closed_form_model(0.3, b0, 1.0, a, bs, cs, U, 10.0, _WithoutEigen(model), x)
    assert model.directions().shape[0] >= d
    np.testing.assert_allclose(sol.w, ref.w, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(sol.multipliers, ref.multipliers, atol=1e-9)
    assert np.any(sol.multipliers > 0)


class _AllDirections(_WithoutEigen):
    """The same model declaring all of R^d its directions, with its own ``eigen``: the
    closed form then solves in the model's d eigenvectors (the reference for the split)."""

    def eigen(self):
        return self.model.eigen()

    def directions(self):
        return np.eye(self.model.directions().shape[1])


def _sketch(rng, d, k):
    from ssca_solver.methods.ssca.newton import SketchModel

    U, _ = np.linalg.qr(rng.standard_normal((d, k)))
    return SketchModel(U.T, np.concatenate([np.sort(rng.uniform(1.0, 5.0, k))[::-1], [0.7]]))


@pytest.mark.parametrize("kind, M, equality", [("lbfgs", 3, False), ("lbfgs", 40, False),
                                               ("lbfgs", 40, True), ("sketch", 40, False),
                                               ("none", 40, False)])
def test_the_split_closed_form_equals_the_one_in_the_models_eigenvectors(kind, M, equality):
    """Directions spanning less than R^d: the dual split into the span's coordinates and the
    complement's Gram matrix (M = 40 runs the working set) gives the w-bar, slacks, value and
    multipliers of the diagonal closed form in all d of the model's eigenvectors. With no
    pair (B = 0) it is the plain scalar closed form."""
    from ssca_solver.subproblems.closed_form import solve_closed_form

    rng = np.random.default_rng(M + len(kind))
    d = 60
    H = rng.standard_normal((d, d))
    if kind == "sketch":
        model = _sketch(rng, d, 7)
    else:
        S, Y = _pairs(rng, d, 5 if kind == "lbfgs" else 0, H @ H.T / d + 0.1 * np.eye(d))
        model = LBFGSModel(S, Y)
    assert model.directions().shape[0] < d
    x, b0 = rng.standard_normal(d), rng.standard_normal(d)
    eq = np.zeros(M, dtype=bool)
    if equality:
        eq[[3, 17]] = True
    a = np.where(eq, 0.0, rng.uniform(0.0, 0.3, M))
    bs = [rng.standard_normal(d) for _ in range(M)]
    cs, U = rng.standard_normal(M), rng.uniform(-1.0, 0.5, M)
    sol = solve_closed_form_model(0.3, b0, 1.0, a, bs, cs, U, 10.0, model, x, equality=eq)
    if kind == "none":
        ref = solve_closed_form(0.3, b0, 1.0, a, bs, cs, U, 10.0, equality=eq)
    else:
        ref = solve_closed_form_model(0.3, b0, 1.0, a, bs, cs, U, 10.0, _AllDirections(model),
                                      x, equality=eq)
    scale = max(1.0, float(np.max(np.abs(ref.w))))
    np.testing.assert_allclose(sol.w, ref.w, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(sol.multipliers, ref.multipliers, rtol=0, atol=1e-8)
    np.testing.assert_allclose(sol.slack, ref.slack, rtol=0, atol=1e-9 * scale)
    assert abs(sol.value - ref.value) <= 1e-10 * max(1.0, abs(ref.value))
    assert sol.residual <= 1e-13 * 11.0 and np.any(sol.multipliers > 0)
    assert np.sum((sol.multipliers > 0) & (sol.multipliers < 10.0)) >= 2


def _cb2(objective: str, equality: bool = False):
    """S2MPJ's CB2 (Charalambous and Bandler's minimax problem): min u s.t.
    g_i(x) - u <= 0, g = (x1^2 + x2^4, (2 - x1)^2 + (2 - x2)^2, 2 exp(x2 - x1)), from
    (2, 2, 1); ``objective``: u as a SampleFunction ("stochastic"), as the deterministic
    w[2] ("deterministic"), or none ("none": a feasibility problem); ``equality``: also
    x1 + x2 == 2.0386 (close to the optimum's)."""
    import ssca_solver as ss

    gs = [lambda x: x[0] ** 2 + x[1] ** 4, lambda x: (2 - x[0]) ** 2 + (2 - x[1]) ** 2,
          lambda x: 2 * np.exp(x[1] - x[0])]
    dg = [lambda x: np.array([2 * x[0], 4 * x[1] ** 3]),
          lambda x: np.array([-2 * (2 - x[0]), -2 * (2 - x[1])]),
          lambda x: 2 * np.exp(x[1] - x[0]) * np.array([-1.0, 1.0])]
    data = ss.FederatedData([np.zeros((1, 1))])
    cons = [ss.SampleFunction((lambda g: lambda w, X, y: np.full(len(X), g(w[:2]) - w[2]))(g),
                              (lambda d: lambda w, X, y: np.append(d(w[:2]), -1.0))(d),
                              name=f"g{i}") <= 0.0 for i, (g, d) in enumerate(zip(gs, dg))]
    if equality:
        cons.append(ss.SampleFunction(lambda w, X, y: np.full(len(X), w[0] + w[1]),
                                      lambda w, X, y: np.array([1.0, 1.0, 0.0]),
                                      name="sum") == 2.0386)
    obj = {"stochastic": ss.SampleFunction(lambda w, X, y: np.full(len(X), w[2]),
                                           lambda w, X, y: np.array([0.0, 0.0, 1.0]),
                                           name="u"),
           "deterministic": lambda w: w[2], "none": lambda w: 0}[objective]
    return ss.Problem(obj, cons, dim=3, data=data), gs


@pytest.mark.parametrize("objective", ["stochastic", "deterministic"])
def test_round_one_tau_is_the_objectives_with_inequalities_only(objective):
    """With inequality constraints only, round 1's tau is set by the objective as in SQP's
    first step: u's own curvature along its gradient (0: the fallback 0.1), at least the
    first trust radius |grad u| / (2 max(1, |x0|)) = 1/6 -- not the constraints' largest
    curvature (47.6 at x0), which every inequality's surrogate carries as its proximal weight
    and which put round 1's linearised constraints out of reach (18 rounds, 7 of them with
    every multiplier at c). Certified at SLSQP's point in at most as many rounds as SLSQP's
    10 iterations, with u written either way. With an equality, or without an objective, the
    constraints' curvature stays in round 1's tau."""
    from scipy.optimize import minimize

    x0 = np.array([2.0, 2.0, 1.0])
    prob, gs = _cb2(objective)
    # the quasi-Newton model's rule (the default above d = 256 or where the clients cannot
    # difference the gradients cheaply; here "auto" would difference them)
    res = prob.solve(seed=0, x0=x0, hessian="lbfgs")
    ref = minimize(lambda w: w[2], x0, jac=lambda w: np.array([0.0, 0.0, 1.0]), method="SLSQP",
                   tol=1e-12, constraints=[{"type": "ineq", "fun": (lambda g: lambda w: w[2]
                                                                     - g(w[:2]))(g)}
                                           for g in gs])
    assert ref.success
    assert res.status == "converged", res.message
    # the history's tau is the one the round left for the next (round 1's accepted step
    # lowered it)
    assert res.history.as_dict()["tau"][0] <= 1.0 / 6.0
    assert res.nit <= 10, res.nit
    np.testing.assert_allclose(res.x, ref.x, atol=1e-5)
    for other, equality in ((objective, True), ("none", False)):
        again, _ = _cb2(other, equality)
        first = again.solve(seed=0, x0=x0, max_iter=1,
                            hessian="lbfgs").history.as_dict()["tau"][0]
        assert first > 40.0, (other, equality, first)


def _quadratic_problem(H, g, constraint=None):
    import ssca_solver as ss

    data = ss.FederatedData([np.zeros((1, 1))])
    f = ss.SampleFunction(lambda w, X, y: np.full(len(X), 0.5 * w @ H @ w + g @ w),
                          lambda w, X, y: H @ w + g, name="f")
    return ss.Problem(f, [] if constraint is None else [constraint], dim=g.size, data=data)


def test_the_agreement_is_the_merits_fall_over_the_models_predicted_fall():
    """acceptance.agreement on a quadratic f = w'Hw/2 + g.w, from x with the statistics of
    tau and an L-BFGS model B of pairs from another matrix: r = (f(x) - f(w)) /
    -(grad f(x).s + tau |s|^2 + s'Bs/2) for any trial step s (the model's and a random one),
    computed here from f and the model's own class; with a constraint the penalty's part
    enters both. NaN where the model predicts no fall."""
    import ssca_solver as ss
    from ssca_solver.methods.ssca import SSCA, acceptance
    from ssca_solver.methods.ssca.state import SSCAState

    rng = np.random.default_rng(11)
    d = 6
    A = rng.standard_normal((d, d))
    H = A @ A.T / d + 0.5 * np.eye(d)
    g = rng.standard_normal(d)
    S, Y = _pairs(rng, d, 3, H + 0.3 * np.eye(d))
    B = LBFGSModel(S, Y)
    X, tau = np.zeros((1, 1)), 0.7
    for constrained in (False, True):
        a = rng.standard_normal(d)
        con = (ss.SampleFunction(lambda w, X, y: np.full(len(X), a @ w), lambda w, X, y: a,
                                 name="a") <= -0.2) if constrained else None
        prob = _quadratic_problem(H, g, con)
        options = {"seed": 0, "batch_size": "full"}
        method = SSCA.build(prob, SSCA.parse(prob, options), options)
        cfg, c = method.config, 10.0

        def stats_at(w):
            return tuple(b.statistics(fn, w, X, None, tau if b.tau is None else b.tau, "test")
                         for b, fn in zip(method.builders, prob.functions))

        def merit(w):
            f = 0.5 * w @ H @ w + g @ w
            return f + (c * max(a @ w + 0.2, 0.0) if constrained else 0.0)

        x = rng.standard_normal(d)
        base = stats_at(x)
        assert float(base[0]["quad"]) == pytest.approx(tau)
        steps = (-np.linalg.solve(H + 2 * tau * np.eye(d), H @ x + g),
                 0.3 * rng.standard_normal(d))
        for s in steps:
            w = x + s
            state = SSCAState(t=2, w=w, stats=stats_at(w), penalty=c, tau=tau, prev_w=x,
                              prev_stats=base, merit=merit(x), qn_s=S, qn_y=Y)
            lin = (H @ x + g) @ s + tau * s @ s + 0.5 * s @ B.matvec(s)
            model = merit(x) + lin
            if constrained:
                model += c * max(a @ w + 0.2, 0.0) - c * max(a @ x + 0.2, 0.0)
            want = ((merit(x) - merit(w)) / (merit(x) - model) if merit(x) > model
                    else np.nan)
            got = acceptance.agreement(cfg, state, merit(x), merit(w), c)
            if np.isnan(want):
                assert np.isnan(got)
            else:
                assert got == pytest.approx(want, rel=1e-9)
    # a step the model says raises the merit: no agreement
    up = state._replace(w=x + 10.0 * steps[0] * -1.0)
    assert np.isnan(acceptance.agreement(cfg, up, merit(x), merit(up.w), c))


def test_tau_falls_by_the_agreement_of_each_accepted_quasi_newton_step():
    """With the quasi-Newton model, tau's factor after an accepted step is TAU_DOWN_AGREE
    where the step's agreement is at least AGREE_HIGH, 1 below AGREE_LOW, TAU_DOWN_MODEL in
    between (read from the run: each accepted round's agreement as acceptance.agreement gives
    it, against the tau the next round used). On an ill-conditioned quadratic whose probe
    tau is far above its curvature along the path, the fast fall is taken and the run is
    certified at the optimum."""
    from ssca_solver.methods.ssca import acceptance, adaptive as ad

    d = 8
    H = np.diag(np.logspace(0, 4, d))
    g = -H @ np.linspace(1.0, 2.0, d)
    prob = _quadratic_problem(H, g)
    seen = []
    real = acceptance.agreement

    def spy(cfg, state, reference, value, c_merit):
        r = real(cfg, state, reference, value, c_merit)
        seen.append((state.t, r))
        return r

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(acceptance, "agreement", spy)
        res = prob.solve(seed=0, x0=np.zeros(d), batch_size="full", hessian="lbfgs")
    assert res.status == "converged", res.message
    np.testing.assert_allclose(res.x, np.linspace(1.0, 2.0, d), rtol=1e-4)
    h = res.history.as_dict()
    tau = np.asarray(h["tau"])
    checked = 0
    for t, r in seen:
        # the step of round t (state.t) accepted: round t + 1 (row t) runs at the tau it left
        # (row t - 1 is round t's). Below 1e-5 tau may sit at its floor MODEL_TAU_FLOOR delta
        # (delta, y'y / s'y, is at most H's largest eigenvalue 1e4 here), which overrides
        # the factor
        if t >= tau.size or not np.isfinite(r) or tau[t] <= 1e-5:
            continue
        k = tau[t] / tau[t - 1]
        want = (ad.TAU_DOWN_AGREE if r >= ad.AGREE_HIGH else 1.0 if r < ad.AGREE_LOW
                else ad.TAU_DOWN_MODEL)
        assert k == pytest.approx(want, rel=1e-9), (t, r, k)
        checked += 1
    assert checked >= 3
    assert any(r >= ad.AGREE_HIGH for _, r in seen)
    assert ad.TAU_DOWN_AGREE < ad.TAU_DOWN_MODEL < 1.0
