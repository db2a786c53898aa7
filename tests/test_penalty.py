"""Algorithm 2's penalty continuation (Theorem 2 and the paragraph after it)."""

import numpy as np

from problems.neyman_pearson import neyman_pearson


def test_continuation_drives_the_slack_to_zero(cancer_data):
    # mu* = 0.74 at alpha = 0.1: c = 0.1 and 0.3 are below it, so the penalised problem prefers
    # to violate the constraint; c = 10 is exact and the slack vanishes.
    res = neyman_pearson(cancer_data, alpha=0.1).solve(
        batch_size=50, max_iter=300, penalty=[0.1, 0.3, 10.0], seed=0, eval_every=None)
    norms = [s.slack_norm for s in res.stages]
    assert [s.penalty for s in res.stages] == [0.1, 0.3, 10.0]
    assert norms[0] > 1e-2 and norms[1] > 1e-3 and norms[0] > norms[1]
    assert norms[2] <= 1e-3
    assert res.status == "converged" and res.penalty == 10.0
    assert res.constraints[0] < 5e-3
    assert np.all(np.diff(res.history.penalty) >= 0)  # c only increases, stage after stage
    assert res.nit == 900


def test_stops_at_the_first_penalty_with_zero_slack(cancer_data):
    res = neyman_pearson(cancer_data, alpha=0.2).solve(
        batch_size=50, max_iter=200, penalty=[10.0, 100.0, 1000.0], seed=0, eval_every=None)
    assert res.status == "converged" and len(res.stages) == 1 and res.nit == 200


def test_infeasible_problem_is_reported(cancer_data):
    # the logistic loss is positive, so mean loss <= -0.05 cannot hold
    res = neyman_pearson(cancer_data, alpha=-0.05).solve(
        batch_size=50, max_iter=100, penalty=[1.0, 10.0], seed=0, eval_every=None)
    assert res.status == "infeasible"
    assert "slack stayed positive" in res.message and "c = 10" in res.message
    assert len(res.stages) == 2 and res.stages[-1].slack_norm > 0.04
    assert res.constraints[0] > 0.04 and res.kkt.feasibility[0] > 0.04
