"""Evaluations cost what they must (issue 19): a full-batch round's own statistics are the
full-data evaluation at the point it accepted (the KKT test runs on them without a second pass
over the data), and on sampled rounds the scheduled evaluations keep to ``eval_budget`` of the
clients' work when asked (``eval_budget``; the default None
evaluates every ``eval_every`` rounds)."""

import numpy as np
import pytest

import ssca_solver as ss
from problems.classical import CLASSICAL, problem
from problems.neyman_pearson import neyman_pearson


def test_full_batch_rounds_are_their_own_evaluations():
    c = CLASSICAL["rosenbrock"]
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=2000)
    assert res.status == "converged"
    one = 2 * c.dim + 2            # floats up of one evaluation (values and gradients) ...
    # ... of which there are two: the scale at the start and the returned point
    assert res.communication.eval_up_total <= 2 * (one + 8)
    # the test ran between multiples of eval_every, on the rounds' own evaluations
    assert res.nit % 10 != 0 or np.any(res.history.eval_t % 10 != 0)
    assert len(res.history.eval_t) > res.nit // 10
    # the returned point is the one the passing test evaluated: its full-data report agrees
    assert res.kkt.passed(1e-4, 1e-4)


def test_the_first_order_path_has_them_too():
    """hessian="none" keeps the first-order surrogates; its full-batch rounds still serve as
    evaluations (the same iterates as before, a test at every round)."""
    c = CLASSICAL["quartic"]
    res = problem(c).solve(seed=0, x0=c.x0, max_iter=2000, hessian="none")
    assert res.status == "converged"
    assert len(res.history.eval_t) > res.nit // 10


@pytest.fixture(scope="module")
def cancer_data():
    from ssca_solver.datasets import breast_cancer

    X, y = breast_cancer()
    return ss.FederatedData.split(X, y, num_clients=5, seed=0)


def test_sampled_rounds_keep_the_evaluations_within_budget(cancer_data):
    """B = 10 on 5 clients reads 50 rows a round; an evaluation reads all 569 (with
    gradients). With eval_budget 0.15 one runs once the rounds since the last read
    569 (0.85 / 0.15) = 3224 rows, i.e. every 70 rounds at eval_every = 10; None: every 10."""
    prob = neyman_pearson(cancer_data, 0.2)
    budget = prob.solve(seed=0, batch_size=10, tau=0.5, max_iter=200, eval_budget=0.15)
    every = prob.solve(seed=0, batch_size=10, tau=0.5, max_iter=200)
    np.testing.assert_array_equal(budget.history.eval_t, [70, 140])
    np.testing.assert_array_equal(every.history.eval_t, np.arange(10, 201, 10))
    np.testing.assert_array_equal(budget.x, every.x)       # evaluations do not move iterates
    rows = 569 * (len(budget.history.eval_t) + 2)
    assert budget.communication.eval_up_total < every.communication.eval_up_total
    assert rows <= 0.2 * (200 * 50 + rows)


def test_eval_budget_is_checked():
    c = CLASSICAL["quartic"]
    for bad in (0.0, 1.5, "a lot"):
        with pytest.raises(ValueError, match="eval_budget"):
            problem(c).solve(x0=c.x0, eval_budget=bad)
