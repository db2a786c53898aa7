"""Classical smooth programs with known optima (``problems/classical.py``: equalities,
degenerate optima, bounds far from 1, a start at 5e7, an equality written as two
inequalities, a solution that is no KKT point), solved with default options: a "converged"
status is never wrong (objective within 1e-4 of the optimum, feasible to feas_tol, the KKT
residual its report states), and the problems a first-order method certifies today are
certified."""

import numpy as np
import pytest

from problems.classical import CLASSICAL, problem

#: certified with default options (max_iter=2000): all of them since the quasi-Newton model
#: of the full-batch phase (issue 19); with hessian="none" (first order) Rosenbrock's valley
#: and its disc-constrained variant are still being followed after 2000 rounds
CERTIFIED = {"rosenbrock_circle", "linear_on_circle", "maratos", "halfplane", "quartic",
             "far_bounds", "far_start", "beale", "box_quadratic", "two_equalities",
             "equality_as_two_inequalities", "product_on_sphere", "no_kkt_point",
             "rosenbrock", "rosenbrock_disc", "sine_on_line", "sixth_power_equality"}
FIRST_ORDER_UNCERTIFIED = {"rosenbrock", "rosenbrock_disc"}


@pytest.mark.parametrize("name", sorted(CLASSICAL))
def test_a_certificate_on_a_classical_program_is_never_wrong(name):
    c = CLASSICAL[name]
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=2000)
    gap = (res.fun - c.optimum) / max(1.0, abs(c.optimum))
    if res.status == "converged":
        assert res.kkt.passed(1e-4, 1e-4)
        assert np.max(res.kkt.feasibility_rel, initial=0.0) <= 1e-4
        # what the certified violation is worth in the objective (first-order sensitivity:
        # sum_m |mu_m| violation_m; the KKT test runs at every full-batch round and stops at
        # the first point within feas_tol), the domain's constraints included: the
        # interior-point solver leaves bounds violated by ~1e-9, worth 6e-6 of an objective
        # of 1.4e7 against duals of 5e3 (far_bounds)
        allowed = 0.0
        if c.certifiable:
            allowed = float(np.sum(np.abs(res.kkt.multipliers) * res.kkt.feasibility))
            allowed += sum(float(np.sum(np.abs(d))) for d in res.kkt.domain_multipliers) \
                * float(res.kkt.domain_violation)
        # within 1e-4 of the optimum plus what the violation is worth (maratos: |w|^2 - 1 =
        # 7.3e-5 against mu = -1.5 puts f 1.09e-4 above f*), below it only by the latter
        assert gap <= 1e-4 + allowed / max(1.0, abs(c.optimum)), (name, gap)
        if c.certifiable:
            assert gap >= -(2.0 * allowed + 1e-8) / max(1.0, abs(c.optimum)), (name, gap)
        if c.solution is not None and name not in ("quartic", "no_kkt_point"):
            assert np.max(np.abs(res.x - c.solution)) <= 1e-3 * max(1.0, np.max(
                np.abs(c.solution))), (name, res.x)
    else:
        assert res.status == "max_iter" and "did not pass" in res.message, res.message
    assert (res.status == "converged") == (name in CERTIFIED), (name, res.status, res.message)


@pytest.mark.parametrize("name", sorted(FIRST_ORDER_UNCERTIFIED))
def test_first_order_surrogates_stay_honest_where_they_do_not_certify(name):
    """hessian="none" (the paper's first-order surrogates in every round): Rosenbrock's
    valley is not followed to a certificate in 2000 rounds, and the status says so."""
    c = CLASSICAL[name]
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=2000, hessian="none")
    assert res.status == "max_iter" and "did not pass" in res.message, res.message


def test_far_start_is_certified_only_near_the_minimum():
    """From w = 5e7 the floor 1 % of the start gradient (2e6) alone let |g| = 11 pass, a
    point 5.3 from the minimum (gap 57); the floor is now capped by the secant curvature
    times max(1, |w|), so the certificate comes at 1e-6 from it."""
    c = CLASSICAL["far_start"]
    res = problem(c).solve(seed=0, x0=c.x0)
    assert res.status == "converged"
    # relative stationarity 1e-4 against the secant scale L max(1, |w|) certifies a distance
    # of about 1e-4 max(1, |w*|) (|w*| = 2.2) from the minimum
    assert np.max(np.abs(res.x - c.solution)) < 1e-4 * np.linalg.norm(c.solution)
    assert res.kkt.scale < 100          # not 1 % of the start gradient (about 1.4e6)


def test_a_point_that_is_no_kkt_point_is_certified_only_within_the_tolerances():
    """min w s.t. w^2 <= 0 has its solution at w = 0, where no multiplier exists (grad g = 0).
    What can be certified is the tolerance-relaxed problem: w^2 <= feas_tol at w = -0.005,
    with the huge multiplier (100) that signals the degeneracy; the report says both."""
    c = CLASSICAL["no_kkt_point"]
    res = problem(c).solve(seed=0, x0=c.x0)
    assert res.status == "converged"
    assert res.kkt.feasibility[0] <= 1e-4 and res.kkt.multipliers[0] > 50


def test_the_first_step_is_bounded_where_the_start_has_no_curvature():
    """sine_on_line starts at sin's inflection with a linear constraint: the probe measures a
    curvature of ~1e-9 along the gradient. The starting tau is at least |grad F_0| / (2
    max(1, |x0|)), so the first step is at most max(1, |x0|) (an SQP code's identity Hessian);
    with the probe's tau alone the first step went ~1e9 away and the run ended max_iter at
    f = 4.7e4 (measured)."""
    c = CLASSICAL["sine_on_line"]
    # the quasi-Newton model's first step (under "auto" the clients difference the
    # gradients here, and the Newton model's first step is Newton's, regularised by tau)
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=1, hessian="lbfgs")
    assert np.linalg.norm(res.x - c.x0) <= 1.0 + 1e-9
    # the default run still ends at the solution
    full = problem(c).solve(seed=0, x0=c.x0)
    assert full.status == "converged", full.message


def test_no_diagonal_metric_from_gradients_that_do_not_vary():
    """One row per client (a deterministic function): the squared per-sample gradients are
    the squared gradient, which spans 1e12 at sixth_power_equality's start. They are not a
    curvature and no diagonal metric is set (with it the run ended max_iter at f = 734 after
    800 rounds; without it, certified)."""
    c = CLASSICAL["sixth_power_equality"]
    res = problem(c).solve(seed=0, x0=c.x0)
    assert "diagonal_metric" not in res.extras
    assert res.status == "converged"
