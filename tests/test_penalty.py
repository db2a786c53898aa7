"""Algorithm 2's penalty continuation (Theorem 2 and the paragraph after it), and statuses."""

import numpy as np

from problems.neyman_pearson import neyman_pearson


def test_continuation_drives_the_slack_to_zero(cancer_data):
    # mu* = 0.74 at alpha = 0.1: c = 0.1 and 0.3 are below it, so the penalised problem prefers
    # to violate the constraint; c = 10 is exact and the slack vanishes.
    res = neyman_pearson(cancer_data, alpha=0.1).solve(
        batch_size=50, tau=0.1, max_iter=300, penalty=[0.1, 0.3, 10.0], seed=0,
        eval_every=None)
    norms = [s.slack_norm for s in res.stages]
    assert [s.penalty for s in res.stages] == [0.1, 0.3, 10.0]
    assert norms[0] > 1e-2 and norms[1] > 1e-3 and norms[0] > norms[1]
    assert norms[2] <= 1e-3
    # no evaluation, so no stopping test: whatever the slack, no success is claimed
    assert res.status == "max_iter" and not res.success and res.penalty == 10.0
    assert res.constraints[0] < 5e-3
    assert np.all(np.diff(res.history.penalty) >= 0)  # c only increases, stage after stage
    assert res.nit == 900


def test_a_penalty_large_enough_is_kept_and_the_kkt_test_stops_the_run(cancer_data):
    res = neyman_pearson(cancer_data, alpha=0.1).solve(penalty=[0.1, 10.0, 1000.0],
                                                       max_iter=300, seed=0)
    assert res.status == "converged" and res.penalty == 10.0
    assert [s.penalty for s in res.stages] == [0.1, 10.0]
    assert res.nit < 600 and res.kkt.passed(1e-4, 1e-4)


def test_a_small_slack_keeps_c_for_the_next_stage(cancer_data):
    """Once a stage's slack is small, c is exact: the remaining stages keep it."""
    res = neyman_pearson(cancer_data, alpha=0.2).solve(
        batch_size=50, tau=0.1, max_iter=100, penalty=[10.0, 100.0, 1000.0], seed=0,
        eval_every=None)
    assert [s.penalty for s in res.stages] == [10.0, 10.0, 10.0]


def test_an_infimum_at_infinity_is_not_called_infeasible_while_the_violation_falls(
        cancer_data):
    """The logistic loss is positive, so mean loss <= -0.05 cannot hold; but its infimum 0 is
    approached only as |w| -> infinity, the violation keeps falling, and that is no evidence
    of infeasibility yet (the suite's infeasible problem, whose violation settles, is reported
    "infeasible": tests/test_suite.py)."""
    res = neyman_pearson(cancer_data, alpha=-0.05).solve(max_iter=100, penalty=[1.0, 10.0],
                                                         seed=0)
    assert res.status == "max_iter" and not res.success
    assert "no feasible point was found" in res.message
    assert "still decreasing" in res.message and "no evidence of infeasibility" in res.message
    assert res.constraints[0] > 0.04 and res.kkt.feasibility[0] > 0.04


def test_a_feasible_problem_stopped_early_is_not_called_infeasible(cancer, cancer_data):
    """Started at a feasible point with far too small a c, the run ends violating the
    constraint; an evaluated iterate was feasible, so the status is max_iter, not infeasible."""
    from problems.neyman_pearson import pooled_reference

    X, y = cancer
    w, *_ = pooled_reference(X, y, 0.15, lam=1e-3)          # feasible for U = 0.2
    res = neyman_pearson(cancer_data, 0.2).solve(x0=w, penalty=[1e-4], max_iter=40,
                                                 eval_every=5, seed=0)
    assert res.history.constraints[0, 0] < 0 < res.constraints[0]
    assert res.status == "max_iter" and "did not pass" in res.message
