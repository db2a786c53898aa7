"""FedAvg / FedSGD baselines (Section VI's comparisons) through the same federated layer."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson

LAM = 1e-2


def ridge_logistic(data):
    return ss.Problem(logistic_loss(), dim=31, data=data,
                      regularizer=lambda w: LAM * cp.sum_squares(w))


def full_gradient(w, X, y):
    return logistic_loss().grad(w, X, y) + 2 * LAM * w


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_full_batch_fedsgd_is_gradient_descent(cancer, cancer_data, momentum):
    X, y = cancer
    ws = []
    ridge_logistic(cancer_data).solve(
        method="fedavg", batch_size="full", local_steps=1, lr=0.3, momentum=momentum,
        max_iter=5, eval_every=None, callback=lambda it: ws.append(it.x.copy()))
    w, v = np.zeros(31), np.zeros(31)
    for t in range(5):
        v = momentum * v + 0.3 * full_gradient(w, X, y)
        w = w - v
        np.testing.assert_allclose(ws[t], w, rtol=1e-12, atol=1e-14)


def test_fedavg_with_local_steps_averages_local_models(cancer_data):
    """E = 2 full-batch local steps: the server model is the N_i/N average of each client's
    two gradient steps on its own rows."""
    ws = []
    ridge_logistic(cancer_data).solve(method="fedavg", batch_size="full", local_steps=2, lr=0.3,
                                      max_iter=1, eval_every=None,
                                      callback=lambda it: ws.append(it.x.copy()))
    expected = np.zeros(31)
    for c in cancer_data.clients:
        w = np.zeros(31)
        for _ in range(2):
            w = w - 0.3 * full_gradient(w, c.X, c.y)
        expected += c.num_rows / cancer_data.num_samples * w
    np.testing.assert_allclose(ws[0], expected, rtol=1e-12, atol=1e-14)


def test_fedavg_reaches_the_pooled_optimum(cancer, cancer_data):
    X, y = cancer
    v = cp.Variable(31)
    ref = cp.Problem(cp.Minimize(cp.sum(cp.logistic(-cp.multiply(2 * y - 1, X @ v))) / len(y)
                                 + LAM * cp.sum_squares(v)))
    ref.solve(solver="CLARABEL")
    res = ridge_logistic(cancer_data).solve(method="fedavg", batch_size=20, lr=ss.PowerStep(
        1.0, 0.3), max_iter=300, seed=0, eval_every=50)
    assert res.method == "fedavg" and res.subproblem is None
    assert res.status == "max_iter" and not res.success
    assert (res.fun - ref.value) / ref.value <= 1e-2
    assert res.communication.up_per_client_round == 31
    assert res.communication.up_total == 300 * 5 * 31
    assert len(res.history.objective) == 6


def test_fedavg_refuses_what_it_cannot_do(cancer_data):
    with pytest.raises(ss.ModelError, match="cannot handle stochastic constraints"):
        neyman_pearson(cancer_data, 0.2).solve(method="fedavg")
    with pytest.raises(ss.ModelError, match="lambda \\|w\\|\\^2"):
        ss.Problem(logistic_loss(), dim=31, data=cancer_data,
                   regularizer=lambda w: cp.norm1(w)).solve(method="fedavg")
    with pytest.raises(TypeError, match="unknown solve option 'tau' for method 'fedavg'"):
        ridge_logistic(cancer_data).solve(method="fedavg", tau=0.1)
    with pytest.raises(ValueError, match="momentum"):
        ridge_logistic(cancer_data).solve(method="fedavg", momentum=1.0)
    with pytest.raises(ss.ScheduleError, match="lr_t"):
        ridge_logistic(cancer_data).solve(method="fedavg", lr=lambda t: -1.0, max_iter=2)


def test_ssca_with_rho_one_is_fedsgd(cancer_data):
    """With rho_t = 1 the proximal-linear surrogate's minimiser is w_t - grad / (2 tau), so SSCA
    with step gamma equals FedSGD with lr = gamma / (2 tau) on the same batches (clients draw
    them from the same seeded streams). A consistency check of both paths."""
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)
    wa, wb = [], []
    with pytest.warns(ss.ScheduleWarning, match="constant"):
        prob.solve(method="ssca", batch_size=15, tau=0.5, rho=1.0, gamma=0.2, max_iter=8,
                   seed=4, eval_every=None, callback=lambda it: wa.append(it.x.copy()))
    prob.solve(method="fedavg", batch_size=15, lr=0.2 / (2 * 0.5), max_iter=8, seed=4,
               eval_every=None, callback=lambda it: wb.append(it.x.copy()))
    np.testing.assert_allclose(np.array(wa), np.array(wb), rtol=1e-12, atol=1e-14)
