"""Every bad input of the core issue's item 9 raises a documented, specific error."""

import cvxpy as cp
import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss


def solve(prob, **kw):
    return prob.solve(**{"batch_size": 5, "max_iter": 3, "eval_every": None, **kw})


def test_gradient_of_wrong_shape(cancer_data):
    good = logistic_loss()
    bad = ss.SampleFunction(good.value, lambda w, X, y: good.grad(w, X, y)[:-1], name="short")
    with pytest.raises(ss.UserFunctionError, match=r"short.grad .*shape \(31,\).*\(30,\) "
                                                   r"on client 0, before round 1"):
        solve(ss.Problem(bad, dim=31, data=cancer_data))


def test_values_of_wrong_shape(cancer_data):
    good = logistic_loss()
    bad = ss.SampleFunction(lambda w, X, y: good.value(w, X, y).mean(), good.grad, name="mean")
    with pytest.raises(ss.UserFunctionError, match=r"per-sample values of shape \(5,\)"):
        solve(ss.Problem(bad, dim=31, data=cancer_data))


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_nan_from_a_user_function_names_client_and_round(cancer):
    X, y = cancer
    X = X.copy()
    data = ss.FederatedData.split(X, y, num_clients=3, seed=0)
    data.clients[2].X[:, 0] = np.nan  # client 2 holds corrupt rows

    with pytest.raises(ss.UserFunctionError, match="non-finite .* client 2, before round 1"):
        solve(ss.Problem(logistic_loss(), dim=31, data=data))
    # without the probe the first round finds it
    with pytest.raises(ss.UserFunctionError, match="non-finite .* client 2, round 1"):
        solve(ss.Problem(logistic_loss(), dim=31, data=data), tau=0.1, check_gradients=False)


def test_inf_in_gradient_is_caught(cancer_data):
    good = logistic_loss()

    def grad(w, X, y):
        g = good.grad(w, X, y)
        g[3] = np.inf
        return g

    with pytest.raises(ss.UserFunctionError, match="grad returned a non-finite entry on "
                                                   "client 0, before round 1"):
        solve(ss.Problem(ss.SampleFunction(good.value, grad), dim=31, data=cancer_data))


def test_batch_larger_than_a_client(cancer):
    X, y = cancer
    data = ss.FederatedData([(X[:4], y[:4]), (X[4:], y[4:])])
    with pytest.raises(ss.DataError, match="batch_size=5 is larger than client 0's 4 rows"):
        solve(ss.Problem(logistic_loss(), dim=31, data=data))


def test_client_without_rows_and_ragged_arrays(cancer):
    X, y = cancer
    with pytest.raises(ss.DataError, match="client 1 has no rows"):
        ss.FederatedData([(X[:4], y[:4]), (X[:0], y[:0])])
    with pytest.raises(ss.DataError, match="client 0: X has 4 rows but y has 3"):
        ss.FederatedData([(X[:4], y[:3])])


@pytest.mark.parametrize("kw, exc, match", [
    ({"rho": ss.PowerStep(2.0, 0.5)}, ss.ScheduleError, r"rho_t must lie in \(0, 1\]"),
    ({"gamma": 1.5}, ss.ScheduleError, "constant step"),
    ({"gamma": "fast"}, ss.ScheduleError, "PowerStep"),
    ({"penalty": [10.0, 1.0]}, ValueError, "strictly increasing"),
    ({"penalty": [-1.0]}, ValueError, "> 0"),
    ({"tau": 0.0}, ValueError, "tau"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"max_iter": 0}, ValueError, "max_iter"),
    ({"x0": np.zeros(3)}, ValueError, r"shape \(31,\)"),
    ({"subproblem": "magic"}, ValueError, "subproblem"),
    ({"surrogate_init": "one"}, ValueError, "surrogate_init"),
    ({"transport": "carrier pigeon"}, ValueError, "transport"),
])
def test_invalid_options(cancer_data, kw, exc, match):
    prob = ss.Problem(logistic_loss(), [logistic_loss(name="c") <= 1.0], dim=31, data=cancer_data)
    with pytest.raises(exc, match=match):
        solve(prob, **kw)


def test_powerstep_with_invalid_parameters():
    with pytest.raises(ss.ScheduleError):
        ss.PowerStep(0.5, -1)


def test_unknown_solve_option_is_an_error_with_a_suggestion(cancer_data):
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)
    with pytest.raises(TypeError, match="unknown solve option 'bacth_size'.*'batch_size'"):
        prob.solve(bacth_size=10)
    with pytest.raises(ValueError, match="unknown method 'sgd'"):
        prob.solve(method="sgd")


def test_penalty_without_constraints_warns(cancer_data):
    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)
    with pytest.warns(UserWarning, match="penalty has no effect"):
        solve(prob, penalty=[10.0])


def test_non_convex_deterministic_terms_are_named(cancer_data):
    f = logistic_loss()
    with pytest.raises(ss.ModelError, match=r"regularizer #1 is not convex"):
        ss.Problem(f, dim=31, data=cancer_data,
                   regularizer=[lambda w: cp.sum_squares(w), lambda w: -cp.norm(w, 2)])
    with pytest.raises(ss.ModelError, match="objective is not convex"):
        ss.Problem(lambda w: cp.sqrt(cp.sum(w)), [f <= 1.0], dim=31, data=cancer_data)
    with pytest.raises(ss.ModelError, match=r"domain #0: constraint 0 .* not convex"):
        ss.Problem(f, dim=31, data=cancer_data, domain=lambda w: [cp.norm(w, 2) >= 1])
    with pytest.raises(ss.ModelError, match="regularizer #0 must be a scalar"):
        ss.Problem(f, dim=31, data=cancer_data, regularizer=lambda w: cp.square(w))


def test_modelling_mistakes(cancer_data):
    f = logistic_loss()
    with pytest.raises(ss.ModelError, match="dim must be a positive integer"):
        ss.Problem(f, dim=0, data=cancer_data)
    with pytest.raises(ss.ModelError, match="deterministic constraints go in domain"):
        ss.Problem(f, [cp.Variable(31) <= 1], dim=31, data=cancer_data)
    with pytest.raises(ss.ModelError, match="stochastic constraint"):
        ss.Problem(f, [f], dim=31, data=cancer_data)
    with pytest.raises(ss.ModelError, match="needs data=FederatedData"):
        ss.Problem(f, dim=31, data=cancer_data.pooled())
    with pytest.raises(ss.ModelError, match="objective must be"):
        ss.Problem(3.0, dim=31, data=cancer_data)


@pytest.mark.parametrize("kw, match", [
    ({"tau": True}, "tau must be a number"),
    ({"tau": "0.1"}, "tau must be a number"),
    ({"max_iter": True}, "max_iter must be an integer"),
    ({"max_iter": 3.0}, "max_iter must be an integer"),
    ({"batch_size": True}, "batch_size"),
    ({"slack_tol": "tight"}, "slack_tol must be a number"),
    ({"penalty": [True, 10.0]}, "penalty"),
    ({"penalty": "10"}, "penalty"),
    ({"eval_every": True}, "eval_every"),
    ({"eval_every": -2}, "eval_every"),
    ({"client_timeout": "5"}, "client_timeout"),
    ({"client_timeout": 0}, "client_timeout"),
    ({"checkpoint_every": 0}, "checkpoint_every"),
    ({"progress": "yes"}, "progress"),
    ({"x0": ["a"] * 31}, "x0"),
])
def test_bools_and_strings_are_refused_where_numbers_go(cancer_data, kw, match):
    prob = ss.Problem(logistic_loss(), [logistic_loss(name="c") <= 1.0], dim=31, data=cancer_data)
    with pytest.raises(ValueError, match=match):
        solve(prob, **kw)


def test_numpy_scalars_of_any_float_type_are_accepted(cancer_data):
    prob = ss.Problem(logistic_loss(), [logistic_loss(name="c") <= 1.0], dim=31, data=cancer_data)
    base = solve(prob, tau=0.25, slack_tol=1e-3, penalty=[10.0, 100.0], batch_size=5,
                 max_iter=3, client_timeout=30.0, seed=0)
    for ftype in (np.float32, np.float64, np.longdouble):
        res = solve(prob, tau=ftype(0.25), slack_tol=ftype(1e-3),
                    penalty=[ftype(10.0), ftype(100.0)], batch_size=np.int64(5),
                    max_iter=np.int32(3), client_timeout=ftype(30.0), seed=np.int64(0))
        np.testing.assert_array_equal(res.x, base.x)
    with pytest.raises(ValueError, match="local_steps"):
        ss.Problem(logistic_loss(), dim=31, data=cancer_data).solve(method="fedavg",
                                                                    local_steps=True)
    with pytest.raises(ValueError, match="lr"):
        ss.Problem(logistic_loss(), dim=31, data=cancer_data).solve(method="fedavg", lr="fast")


@pytest.mark.parametrize("mistake, match", [
    (lambda g, n: -g, r"sign error"),
    (lambda g, n: n * g, r"sum instead of a mean over the \d+ rows"),
])
def test_a_wrong_gradient_is_caught_before_round_1(cancer_data, mistake, match):
    good = logistic_loss()
    bad = ss.SampleFunction(good.value, lambda w, X, y: mistake(good.grad(w, X, y), len(X)),
                            name="mine")
    prob = ss.Problem(good, [bad <= 0.5], dim=31, data=cancer_data)
    with pytest.raises(ss.UserFunctionError, match=r"mine: its gradient does not match its "
                                                   r"values on client 0's batch.*" + match):
        prob.solve(max_iter=3)
    # the check can be skipped (then nothing catches the mistake here)
    res = prob.solve(max_iter=3, penalty=[10.0], check_gradients=False, eval_every=None, seed=0)
    assert res.nit == 3


def test_divergence_is_the_solvers_failure_not_the_users(cancer):
    """Least squares on features scaled by 1e3 with a fixed tiny tau on
    sampled rounds (B = 10; full batches are guarded, tests/test_full_batch_guard.py): the
    iterates explode; the error says so and points at the settings, not at the function."""
    X, y = cancer
    X = X * 1e3
    data = ss.FederatedData.split(X, y, num_clients=3, seed=0)

    def value(w, X, y):
        return 0.5 * (X @ w - y) ** 2

    def grad(w, X, y):
        return X.T @ (X @ w - y) / len(y)

    prob = ss.Problem(ss.SampleFunction(value, grad, name="ls"), dim=31, data=data)
    with pytest.raises(ss.DivergenceError, match="the iterates diverged at round .*tau") as info:
        with np.errstate(over="ignore", invalid="ignore"):
            prob.solve(batch_size=10, tau=1e-3, max_iter=200,
                       eval_every=None)
    assert info.value.state is not None and isinstance(info.value.__cause__,
                                                       (ss.UserFunctionError, type(None)))
