"""The diagonal-curvature closed form of Problem 5 against CVXPY + Clarabel."""

import cvxpy as cp
import numpy as np
import pytest

from ssca_solver.subproblems.closed_form import solve_closed_form, solve_closed_form_diag


def _instance(M, d, seed, spread=1.0):
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-spread, spread, size=d)
    a0 = rng.uniform(0.5, 2.0, size=d) * scales
    a = rng.uniform(0.0, 1.0, size=(M, d)) * scales
    b0 = rng.normal(size=d) * scales
    bs = [rng.normal(size=d) * scales for _ in range(M)]
    cs = rng.normal(size=M)
    U = rng.uniform(-1.0, 0.0, size=M)
    return a0, b0, 0.3, a, bs, cs, U


def _kkt_residual(sol, a0, b0, c0, a, bs, cs, U, c):
    """Largest violation of Problem 5's KKT conditions at the closed form's answer."""
    w, nu, s = sol.w, sol.multipliers, sol.slack
    A = a0 + nu @ a
    B = (0 if b0 is None else b0) + sum(n * b for n, b in zip(nu, bs))
    p = np.array([a[m] @ (w * w) + bs[m] @ w + cs[m] - U[m] for m in range(len(bs))])
    return max(np.max(np.abs(2 * A * w + B)) / max(1.0, np.max(np.abs(B))),   # stationarity
               np.max(np.maximum(p - s, 0), initial=0),                        # feasibility
               np.max(np.abs(nu * (p - s)), initial=0),                         # complementarity
               np.max(np.abs((c - nu) * s), initial=0))


def _cvxpy(a0, b0, c0, a, bs, cs, U, c):
    d, M = a0.size, len(bs)
    w, s = cp.Variable(d), cp.Variable(M, nonneg=True)
    obj = a0 @ cp.square(w) + (0 if b0 is None else b0 @ w) + c0 + c * cp.sum(s)
    cons = [a[m] @ cp.square(w) + bs[m] @ w + cs[m] - U[m] <= s[m] for m in range(M)]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    duals = np.array([float(k.dual_value) for k in cons])
    return w.value, s.value, duals, prob.value


@pytest.mark.parametrize("M", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("c", [1.0, 1e3])
def test_diagonal_closed_form_matches_cvxpy(M, seed, c):
    inst = _instance(M, 12, seed)
    w, s, duals, value = _cvxpy(*inst, c)
    sol = solve_closed_form_diag(*inst, c)
    # the exact KKT conditions, then agreement with Clarabel (whose answers at c = 1e3 are
    # accurate to ~1e-5 in w: the value, not w, is compared tightly)
    assert _kkt_residual(sol, *inst, c) <= 1e-9 * max(1.0, c)
    scale = max(1.0, np.max(np.abs(w)))
    np.testing.assert_allclose(sol.w, w, atol=1e-4 * scale)
    np.testing.assert_allclose(sol.multipliers, duals, atol=1e-4 * max(1.0, c))
    assert sol.value == pytest.approx(value, rel=1e-7, abs=1e-7)
    assert np.all(sol.multipliers >= 0) and np.all(sol.multipliers <= c)


def test_badly_scaled_curvatures_over_twelve_orders():
    """Curvatures from 1e-6 to 1e6: the scale the diagonal metric exists for."""
    inst = _instance(2, 15, 7, spread=6.0)
    w, s, duals, value = _cvxpy(*inst, 10.0)
    sol = solve_closed_form_diag(*inst, 10.0)
    assert _kkt_residual(sol, *inst, 10.0) <= 1e-9 * 10
    np.testing.assert_allclose(sol.multipliers, duals, rtol=1e-5, atol=1e-7)
    assert sol.value == pytest.approx(value, rel=1e-7)


@pytest.mark.parametrize("M", [1, 2])
def test_constant_vectors_reduce_to_the_scalar_closed_form(M):
    a0, b0, c0, a, bs, cs, U = _instance(M, 20, 3)
    a0s, As = 1.7, np.arange(1, M + 1) * 0.4
    ref = solve_closed_form(a0s, b0, c0, As, bs, cs, U, 50.0)
    sol = solve_closed_form_diag(np.full(20, a0s), b0, c0, np.outer(As, np.ones(20)), bs, cs,
                                 U, 50.0)
    np.testing.assert_allclose(sol.w, ref.w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol.multipliers, ref.multipliers, rtol=1e-9, atol=1e-12)


def test_deterministic_objective_and_bad_curvature():
    a0, b0, c0, a, bs, cs, U = _instance(1, 8, 4)
    w, s, duals, value = _cvxpy(a0, None, c0, a, bs, cs, U, 5.0)
    sol = solve_closed_form_diag(a0, None, c0, a, bs, cs, U, 5.0)
    np.testing.assert_allclose(sol.w, w, atol=1e-6)
    with pytest.raises(ValueError, match="a_0 > 0"):
        solve_closed_form_diag(np.zeros(8), b0, c0, a, bs, cs, U, 5.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_many_constraints_few_active_match_cvxpy(seed):
    """M = 120 constraints (w.q_m)^2 <= U_m around a far unconstrained minimiser, a few of
    them active at the optimum, most violated at nu = 0: the projected Newton method's free
    set starts large and shrinks (the regime of a round at n = m = 300)."""
    rng = np.random.default_rng(seed)
    d, M, c = 40, 120, 100.0
    a0 = rng.uniform(0.5, 2.0, size=d)
    b0 = -4.0 * a0 * rng.normal(size=d)                  # minimiser 2 N(0, 1) per coordinate
    Q = rng.normal(size=(M, d)) / np.sqrt(d)
    # a_m |w|^2-type curvature along q_m only would not be diagonal: take the diagonal
    # surrogate's form directly, a_m = q_m^2 and a linear term
    a = Q ** 2
    bs = [rng.normal(size=d) * 0.1 for _ in range(M)]
    cs = np.zeros(M)
    U = rng.uniform(0.5, 1.0, size=M)
    inst = (a0, b0, 0.3, a, bs, cs, U)
    w, s, duals, value = _cvxpy(*inst, c)
    sol = solve_closed_form_diag(*inst, c)
    assert _kkt_residual(sol, *inst, c) <= 1e-9 * c
    assert 1 <= np.sum(duals > 1e-6) < M // 4                # a few active
    assert sol.value == pytest.approx(value, rel=1e-7, abs=1e-7)
    np.testing.assert_allclose(sol.w, w, atol=1e-4 * max(1.0, np.max(np.abs(w))))
