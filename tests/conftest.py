import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.datasets import breast_cancer


@pytest.fixture(scope="session")
def cancer():
    return breast_cancer()


@pytest.fixture(scope="session")
def cancer_data(cancer):
    X, y = cancer
    return ss.FederatedData.split(X, y, num_clients=5, seed=0)


def quadratic_function(name="quad"):
    """f(w, x) = 0.5 |w - x|^2: F(w) = 0.5 mean |w - x_n|^2, a simple exact reference."""

    def value(w, X, y):
        return 0.5 * np.sum((w - X) ** 2, axis=1)

    def grad(w, X, y):
        return w - X.mean(axis=0)

    return ss.SampleFunction(value, grad, name=name)
