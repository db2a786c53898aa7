import numpy as np
import pytest

import ssca_solver as ss


def test_explicit_clients_of_any_size():
    rng = np.random.default_rng(0)
    parts = [(rng.normal(size=(n, 3)), rng.integers(0, 2, n)) for n in (1, 4, 9)]
    data = ss.FederatedData(parts)
    assert data.client_sizes == (1, 4, 9) and data.num_samples == 14
    X, y = data.pooled()
    np.testing.assert_array_equal(X, np.vstack([p[0] for p in parts]))
    np.testing.assert_array_equal(y, np.concatenate([p[1] for p in parts]))


def test_clients_without_targets():
    data = ss.FederatedData([np.ones((2, 2)), np.zeros((3, 2))])
    assert data.clients[0].y is None and data.num_samples == 5


def test_split_is_an_equal_iid_partition():
    X = np.arange(103 * 2, dtype=float).reshape(103, 2)
    y = np.arange(103)
    data = ss.FederatedData.split(X, y, num_clients=10, seed=1)
    assert sorted(data.client_sizes) == [10] * 7 + [11] * 3
    Xp, yp = data.pooled()
    assert sorted(yp.tolist()) == list(range(103))  # every row exactly once
    for c in data.clients:
        np.testing.assert_array_equal(c.X[:, 0], 2 * c.y)  # rows stay with their targets
    again = ss.FederatedData.split(X, y, num_clients=10, seed=1)
    np.testing.assert_array_equal(again.clients[3].y, data.clients[3].y)


def test_dirichlet_split_skews_labels(cancer):
    X, y = cancer
    skewed = ss.FederatedData.dirichlet(X, y, num_clients=5, alpha=0.1, seed=0)
    iid = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    assert skewed.num_samples == len(y)
    assert sorted(np.concatenate([c.y for c in skewed.clients]).tolist()) == sorted(y.tolist())

    def spread(d):  # how far client class-1 fractions are from the global one
        return np.std([c.y.mean() for c in d.clients])

    assert spread(skewed) > 3 * spread(iid)


@pytest.mark.parametrize("clients, match", [
    ([(np.ones((0, 2)), np.ones(0))], "no rows"),
    ([(np.ones((3, 2)), np.ones(2))], "same length"),
    ([(np.ones((3, 2)), np.ones(3)), (np.ones((3, 4)), np.ones(3))], "shape"),
    ([(np.ones((3, 2)), np.ones(3)), np.ones((3, 2))], "targets"),
    ([], "at least one client"),
])
def test_bad_clients_raise(clients, match):
    with pytest.raises(ss.DataError, match=match):
        ss.FederatedData(clients)


def test_split_errors():
    with pytest.raises(ss.DataError, match="no rows"):
        ss.FederatedData.split(np.ones((3, 2)), num_clients=4)
    with pytest.raises(ss.DataError, match="rows"):
        ss.FederatedData.split(np.ones((3, 2)), np.ones(4), num_clients=2)
    with pytest.raises(ss.DataError, match="alpha"):
        ss.FederatedData.dirichlet(np.ones((4, 2)), np.array([0, 1, 0, 1]), 2, alpha=0)


def test_integer_features_are_computed_in_floating_point():
    """int8 features of 100: X * X wrapped to 16 in int8, so a diagonal curvature from
    squared features was 33 % off (issue 20); X is converted to float64, y keeps its dtype."""
    rng = np.random.default_rng(0)
    X = rng.integers(-100, 101, size=(40, 3)).astype(np.int8)
    y = rng.integers(0, 2, size=40).astype(np.int8)
    data = ss.FederatedData([(X[:20], y[:20]), (X[20:], y[20:])])
    for c in data.clients:
        assert c.X.dtype == np.float64 and c.y.dtype == np.int8
    sq = np.concatenate([c.X for c in data.clients]) ** 2
    np.testing.assert_array_equal(sq, X.astype(float) ** 2)
    assert sq.max() > 127            # would have wrapped in int8
