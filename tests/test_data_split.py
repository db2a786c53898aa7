"""FederatedData.dirichlet reports clients smaller than ``min_rows`` (issue 21): a warning by
default (the split as drawn, unchanged for a seed), a DataError on request, or draws repeated
until every client has its minimum."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.model.data import MIN_CLIENT_ROWS, SmallClientWarning


def _labels(n=60, classes=3):
    X = np.arange(2.0 * n).reshape(n, 2)
    return X, np.arange(n) % classes


def test_default_warns_and_names_the_small_clients(cancer):
    X, y = cancer
    with pytest.warns(SmallClientWarning) as caught:
        data = ss.FederatedData.dirichlet(X, y, num_clients=10, alpha=0.3, seed=0)
    small = [(i, k) for i, k in enumerate(data.client_sizes) if k < MIN_CLIENT_ROWS]
    assert small and MIN_CLIENT_ROWS == 10
    text = str(caught[0].message)
    for i, k in small:
        assert f"client {i}: {k}" in text
    assert "min_rows=10" in text and "on_small_client='redraw'" in text
    assert caught[0].filename == __file__           # points at the caller's line


def test_the_check_does_not_change_the_split(cancer):
    """The same seed gives the same clients whatever min_rows says (warn and min_rows=1)."""
    X, y = cancer
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # min_rows=1: nothing to report
        quiet = ss.FederatedData.dirichlet(X, y, num_clients=10, alpha=0.3, seed=0, min_rows=1)
    with pytest.warns(SmallClientWarning):
        loud = ss.FederatedData.dirichlet(X, y, num_clients=10, alpha=0.3, seed=0)
    assert quiet.client_sizes == loud.client_sizes
    for a, b in zip(quiet.clients, loud.clients):
        np.testing.assert_array_equal(a.X, b.X)
        np.testing.assert_array_equal(a.y, b.y)


def test_no_report_when_every_client_is_large_enough(cancer):
    X, y = cancer
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = ss.FederatedData.dirichlet(X, y, num_clients=3, alpha=5.0, seed=0)
    assert min(data.client_sizes) >= MIN_CLIENT_ROWS


def test_raise_refuses_the_split(cancer):
    X, y = cancer
    with pytest.raises(ss.DataError, match=r"fewer than min_rows=10 rows \(client"):
        ss.FederatedData.dirichlet(X, y, num_clients=10, alpha=0.3, seed=0,
                                   on_small_client="raise")


def test_redraw_gives_every_client_its_minimum(cancer):
    X, y = cancer
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = ss.FederatedData.dirichlet(X, y, num_clients=10, alpha=0.3, seed=0,
                                          on_small_client="redraw")
    assert min(data.client_sizes) >= 10 and data.num_samples == len(y)
    assert sorted(np.concatenate([c.y for c in data.clients]).tolist()) == sorted(y.tolist())
    again = ss.FederatedData.dirichlet(X, y, num_clients=10, alpha=0.3, seed=0,
                                       on_small_client="redraw")
    assert again.client_sizes == data.client_sizes                # still seeded


def test_impossible_minimum_is_refused_before_drawing():
    X, y = _labels(20)
    for mode in ("raise", "redraw"):
        with pytest.raises(ss.DataError, match="cannot give each of 5 clients min_rows=5"):
            ss.FederatedData.dirichlet(X, y, num_clients=5, seed=0, min_rows=5,
                                       on_small_client=mode)
    with pytest.warns(SmallClientWarning):          # "warn" still returns the split
        data = ss.FederatedData.dirichlet(X, y, num_clients=5, seed=0, min_rows=5)
    assert data.num_samples == 20


def test_redraw_that_never_succeeds_says_so(monkeypatch):
    """Tiny alpha over many classes: a draw rarely gives every client its minimum."""
    import ssca_solver.model.data as data_module

    monkeypatch.setattr(data_module, "DIRICHLET_DRAWS", 3)
    X, y = _labels(40, classes=2)
    with pytest.raises(ss.DataError, match=r"clients 8 rows in 3 draws.*smaller min_rows"):
        ss.FederatedData.dirichlet(X, y, num_clients=5, alpha=0.01, seed=0, min_rows=8,
                                   on_small_client="redraw")


@pytest.mark.parametrize("kwargs, match", [
    (dict(min_rows=0), "min_rows must be a positive integer"),
    (dict(min_rows=2.5), "min_rows must be a positive integer"),
    (dict(min_rows=True), "min_rows must be a positive integer"),
    (dict(on_small_client="ignore"), "on_small_client must be one of"),
])
def test_bad_arguments(kwargs, match):
    X, y = _labels()
    with pytest.raises(ss.DataError, match=match):
        ss.FederatedData.dirichlet(X, y, num_clients=3, seed=0, **kwargs)


def test_split_is_left_as_asked():
    """split() gives sizes N / I exactly as asked (one-row clients are a deliberate test
    setting elsewhere): no report."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = ss.FederatedData.split(np.ones((20, 2)), num_clients=20, seed=0)
    assert data.client_sizes == (1,) * 20
