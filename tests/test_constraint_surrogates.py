"""The constraints' surrogates under the quasi-Newton model (acceptance.constraint_surrogates):
an inequality keeps CONSTRAINT_TAU_SHARE of tau as its proximal weight, its curvature being
the model's (SQP's linearised constraints), with the same value and gradient at the round's
point."""

import numpy as np
import pytest
from scipy.optimize import minimize

import ssca_solver as ss
from ssca_solver.methods.ssca import adaptive as ad
from ssca_solver.methods.ssca.acceptance import constraint_surrogates

# Charalambous and Bandler's minimax problem (S2MPJ's CB2) written as a user would: the
# largest of three smooth functions of x as a variable z, min z s.t. g_i(x) - z <= 0
G = [lambda x: x[0] ** 2 + x[1] ** 4,
     lambda x: (2 - x[0]) ** 2 + (2 - x[1]) ** 2,
     lambda x: 2 * np.exp(x[1] - x[0])]
DG = [lambda x: np.array([2 * x[0], 4 * x[1] ** 3]),
      lambda x: np.array([-2 * (2 - x[0]), -2 * (2 - x[1])]),
      lambda x: 2 * np.exp(x[1] - x[0]) * np.array([-1.0, 1.0])]
X0 = np.array([2.0, 2.0, 1.0])


def _minimax():
    data = ss.FederatedData([np.zeros((1, 1))])
    cons = []
    for i, (g, dg) in enumerate(zip(G, DG)):
        f = ss.SampleFunction(lambda w, X, y, g=g: np.full(len(X), g(w[:2]) - w[2]),
                              lambda w, X, y, dg=dg: np.append(dg(w[:2]), -1.0), name=f"g{i}")
        cons.append(f <= 0.0)
    return ss.Problem(lambda w: w[2], cons, dim=3, data=data)


def _slsqp():
    return minimize(lambda w: w[2], X0, jac=lambda w: np.array([0.0, 0.0, 1.0]),
                    method="SLSQP", tol=1e-12,
                    constraints=[{"type": "ineq", "fun": lambda w, g=g: w[2] - g(w[:2])}
                                 for g in G])


def test_a_minimax_problem_reaches_slsqps_point_in_a_few_more_rounds_than_its_iterations():
    """With the objective's tau in every constraint's surrogate, a step of length r lowered a
    constraint by at most |grad g| r - tau r^2: from (2, 2, 1) (tau 48 at round 1) the
    linearised constraints were out of reach, the subproblem kept slack at multiplier c = 100
    for 7 rounds, and the pairs built with those multipliers gave a model 100 times too
    stiff (scale 4,700 against 4 at the solution): 18 rounds. With 1e-3 tau: 12 (SLSQP: 9
    iterations)."""
    res = _minimax().solve(x0=X0, seed=0)
    ref = _slsqp()
    assert ref.success
    assert res.status == "converged", res.message
    np.testing.assert_allclose(res.x, ref.x, atol=1e-5)
    assert res.nit <= 13, res.nit


def test_the_constraints_proximal_weight_is_a_share_of_tau_with_value_and_gradient_kept(
        monkeypatch):
    """Every subproblem of a run under ``hessian="lbfgs"`` sees each inequality's statistics
    with quad' = 1e-3 quad and the value and gradient at the round's point unchanged, the
    objective's untouched; under ``hessian="none"`` the statistics as they are."""
    from ssca_solver.methods.ssca import acceptance

    seen = []

    def spy(cfg, state, stats, center):
        out = constraint_surrogates(cfg, state, stats, center)
        seen.append((cfg.first, stats, out, np.array(center)))
        return out

    monkeypatch.setattr(acceptance, "constraint_surrogates", spy)

    def value(s, w):
        return float(s["quad"]) * (w @ w) + s["lin"] @ w + float(s["const"])

    def grad(s, w):
        return 2 * float(s["quad"]) * w + s["lin"]

    for hessian, share in (("lbfgs", ad.CONSTRAINT_TAU_SHARE), ("none", 1.0)):
        seen.clear()
        _minimax().solve(x0=X0, seed=0, hessian=hessian, max_iter=6)
        assert len(seen) >= 5
        for first, given, out, w in seen:
            assert out[:first] == given[:first]
            for a, b in zip(given[first:], out[first:]):
                assert float(b["quad"]) == pytest.approx(share * float(a["quad"]), rel=1e-12)
                assert value(b, w) == pytest.approx(value(a, w), rel=1e-12, abs=1e-12)
                np.testing.assert_allclose(grad(b, w), grad(a, w), rtol=1e-12, atol=1e-12)
