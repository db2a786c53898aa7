"""Default options on the problem suite (problems/suite.py) against independent references.

Each problem is solved with the DEFAULT options (only max_iter set, per penalty stage) on seed
0 and compared with a reference that never calls the solver: CVXPY + Clarabel on the pooled
data for convex problems, multi-start SciPy SLSQP for nonconvex ones. The targets are those of
issue 10 item 7 (problems.suite.TARGETS): convex: status "converged", relative objective gap
<= 1e-3, multipliers within 1e-2 relative, relative violation <= 1e-4; nonconvex: "converged"
with KKT residuals <= 1e-4 relative at a point within 1e-3 (inf-norm) of an SLSQP KKT point;
the infeasible problem: status "infeasible". A problem on which the defaults miss a target is
an xfail(strict=True) test whose reason gives the measured numbers
(benchmarks/defaults.py measures seeds 0-2 and a hand-tuned baseline).
"""

import numpy as np
import pytest

from problems import suite

MAX_ITER = 2000

def _solve(name):
    prob, ref = suite.build(name)
    res = prob.solve(seed=0, max_iter=MAX_ITER)
    return prob, ref, res, suite.measure(prob, ref, res)


def _assert_targets(name):
    prob, ref, res, m = _solve(name)
    T = suite.TARGETS
    info = (f"{name}: {res.status} in {res.nit} rounds; gap {m['gap']}, violation "
            f"{m['violation']}, multiplier error {m['multiplier_error']}, x error "
            f"{m['x_error']}, KKT {m['stationarity_rel']:.2g}/{m['complementarity_rel']:.2g}; "
            f"{res.message}")
    assert res.status == "converged" and res.success, info
    assert m["violation"] <= T["violation"], info
    if ref["kind"] == "convex":
        assert abs(m["gap"]) <= T["gap"], info
        if prob.num_constraints:
            np.testing.assert_allclose(res.kkt.multipliers, ref["multipliers"],
                                       rtol=T["multipliers"],
                                       atol=T["multipliers"] * np.max(ref["multipliers"]),
                                       err_msg=info)
    else:
        assert max(m["stationarity_rel"], m["complementarity_rel"]) <= T["kkt"], info
        assert m["x_error"] <= T["x"], info
    assert suite.meets_targets(ref["kind"], m) == [], info


@pytest.mark.parametrize("name", [
    "neyman_pearson", "fairness", "qcqp3", "box_domain", "l1_ball_logcosh",
    "dirichlet_noniid", "sigmoid_miss_rate", "np_times_1e3", "np_times_1e-3", "two_active",
    "unconstrained",
    pytest.param("softmax_digits", marks=pytest.mark.slow),   # its CVXPY reference: ~40 s
    "badly_scaled",   # was a strict xfail (max_iter at gap +0.117); the diagonal metric
])
def test_default_options_meet_the_targets(name):
    _assert_targets(name)


L1_BALL_SEED_1 = (
    "measured at 84de206: default options raise SubproblemError on l1_ball_logcosh with "
    "seed 1 (seeds 0 and 2 converge in 220 rounds): full batches from round 201, every step "
    "rejected from round 210 on (the full-data evaluation at round 210: objective 1.4941896 "
    "vs the reference 1.4941889, constraint -2.6e-8), tau doubled 29 times from 1.1 to 5.9e8 "
    "while the step grew from 1.5e-6 to 6.3e-3 and the slack to 9e-3, then Clarabel "
    "returned 'unbounded' on Problem 5 at round 239 (3 attempts)")


def test_l1_ball_with_seed_1():
    """Was L1_BALL_SEED_1; fixed by accepting merit increases within the CVXPY solver's
    accuracy and settling after 8 rejected steps in a row."""
    prob, ref = suite.build("l1_ball_logcosh")
    res = prob.solve(seed=1, max_iter=MAX_ITER)
    m = suite.measure(prob, ref, res)
    assert suite.meets_targets(ref["kind"], m) == [], m


def test_infeasible_problem_is_reported_infeasible():
    prob, ref = suite.build("infeasible")
    assert ref["min_violation"] > 0.1           # CVXPY: the constraint cannot be met
    res = prob.solve(seed=0, max_iter=MAX_ITER)
    assert res.status == "infeasible" and not res.success
    # the returned point is the least-violating one the penalty reaches: within 1e-6 of the
    # pooled minimum of the constraint
    assert res.constraints[0] == pytest.approx(ref["min_violation"], rel=1e-6)


@pytest.mark.parametrize("name", [n for n in suite.PROBLEMS
                                  if n not in ("softmax_digits", "infeasible")])
def test_references_are_kkt_points_with_the_stated_active_constraints(name):
    """The references are what the suite says: feasible on the pooled data, complementary,
    and with the constraints the docstrings call active having positive multipliers."""
    prob, ref = suite.build(name)
    cons = suite.pooled_constraints(prob, ref["x"])
    mu = np.asarray(ref["multipliers"])
    assert np.all(cons <= 1e-7 * np.maximum(1.0, np.abs(prob.bounds)))
    assert np.all(np.abs(mu * cons) <= 1e-6 * np.maximum(1.0, np.abs(prob.bounds)))
    active = {"fairness": [0], "qcqp3": [1, 2], "two_active": [0, 1],
              "unconstrained": []}.get(name, [0])
    assert sorted(np.flatnonzero(mu > 1e-3).tolist()) == active
