import numpy as np
import pytest

import ssca_solver as ss
from problems.logistic import logistic_loss


def test_check_grad_accepts_a_right_gradient(cancer):
    X, y = cancer
    w = np.random.default_rng(0).normal(size=X.shape[1]) * 0.3
    assert ss.check_grad(logistic_loss(), w, X, y) < 1e-6
    fn = logistic_loss(only_label=0, class_fraction=np.mean(y == 0))
    assert ss.check_grad(fn, w, X, y, directions=5) < 1e-6


def test_check_grad_catches_a_wrong_gradient(cancer):
    X, y = cancer
    good = logistic_loss()
    bad = ss.SampleFunction(good.value, lambda w, X, y: 2 * good.grad(w, X, y))
    w = np.full(X.shape[1], 0.1)
    assert ss.check_grad(bad, w, X, y) > 0.5


def test_logistic_hessian_diagonal_matches_finite_differences(cancer):
    X, y = cancer
    fn = logistic_loss()
    w = np.random.default_rng(1).normal(size=X.shape[1]) * 0.2
    eps = 1e-5
    fd = np.array([(fn.grad(w + eps * e, X, y) - fn.grad(w - eps * e, X, y))[k] / (2 * eps)
                   for k, e in enumerate(np.eye(X.shape[1]))])
    np.testing.assert_allclose(fn.hess_diag(w, X, y), fd, rtol=1e-5, atol=1e-9)


def test_constraint_operators():
    f = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(axis=0), name="lin")
    c = f <= 0.5
    assert c.bound == 0.5 and c.function is f and c.name == "lin <= 0.5"
    g = f >= 0.5   # -f <= -0.5
    X = np.array([[1.0, 2.0], [3.0, 4.0]])
    w = np.array([0.5, -1.0])
    np.testing.assert_allclose(g.function.value(w, X, None), -(X @ w))
    np.testing.assert_allclose(g.function.grad(w, X, None), -X.mean(axis=0))
    assert g.bound == -0.5
    with pytest.raises(TypeError):
        f <= "a"


def test_ge_refuses_a_custom_surrogate():
    f = logistic_loss(curvature=True)
    with pytest.raises(ss.ModelError, match="custom surrogate"):
        f >= 0.1


@pytest.mark.parametrize("only_label", [None, 0, 1])
def test_the_logistic_loss_value_and_grad_equals_its_two_calls(only_label, cancer):
    """problems.logistic's value_and_grad (one X @ w, one X' c) gives the same numbers as
    value and grad called apart, and its gradient agrees with finite differences."""
    from problems.logistic import logistic_loss

    X, y = cancer
    fn = logistic_loss(only_label=only_label, class_fraction=0.4 if only_label is not None
                       else 1.0)
    w = np.random.default_rng(0).normal(size=X.shape[1]) * 0.3
    v, g = fn.value_and_grad(w, X, y)
    np.testing.assert_allclose(v, fn.value(w, X, y), rtol=1e-15, atol=0)
    np.testing.assert_allclose(g, fn.grad(w, X, y), rtol=1e-13, atol=1e-16)
    assert ss.check_grad(fn, w, X, y) < 1e-6
