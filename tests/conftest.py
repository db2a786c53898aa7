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


def ssca_clients(prob, seed=0):
    """The clients a solve of ``prob`` by method "ssca" would build (round and evaluation
    tasks), for tests that drive rounds by hand."""
    from ssca_solver.algorithms.ssca import SSCARoundTask
    from ssca_solver.diagnostics import Evaluator
    from ssca_solver.federated import build_clients
    from ssca_solver.options import seed_entropy

    tasks = {"ssca.round": SSCARoundTask(prob.functions, prob.builders), **Evaluator(prob).tasks}
    return build_clients(prob.data, seed_entropy(seed), tasks)


def round_request(t, w, batch_size, tau=0.1):
    """The request of SSCA's round t at w (batch_size None: full batch)."""
    from ssca_solver.federated import Request

    return Request("ssca.round", t, w, {"batch_size": batch_size, "tau": tau})
