"""What a new user reads: the report states the relative residuals the certificate tests beside
their tolerances, long messages come in lines, a stage that kept c says so, every function has
a name from the user's code, each kind of warning is shown once, and ``res.time`` counts the
whole solve."""

from __future__ import annotations

import functools
import time
import warnings

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.engine.solve import once_per_kind


def _loss(w, X, y, shift=0.0):
    return 0.5 * (X @ w - y - shift) ** 2


def _grad(w, X, y, shift=0.0):
    return X.T @ (X @ w - y - shift) / len(X)


@pytest.fixture(scope="module")
def lsq():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=120)
    return ss.FederatedData.split(X, y, num_clients=3, seed=0)


def test_names_come_from_the_users_code(lsq):
    named = ss.SampleFunction(functools.partial(_loss, shift=1.0),
                              functools.partial(_grad, shift=1.0))
    assert named.name == "_loss"

    class Loss:
        def __call__(self, w, X, y):
            return _loss(w, X, y)

    assert ss.SampleFunction(Loss(), _grad).name == "Loss"
    assert ss.SampleFunction(lambda w, X, y: _loss(w, X, y), _grad).name == "f"
    assert ss.SampleFunction(_loss, _grad, name="mine").name == "mine"


def test_the_report_states_the_tested_residuals_beside_their_tolerances(lsq, tmp_path):
    f = ss.SampleFunction(_loss, _grad)
    norm = ss.SampleFunction(lambda w, X, y: np.full(len(X), w @ w), lambda w, X, y: 2 * w,
                             name="norm")
    res = ss.Problem(f, [norm <= 4.0], dim=4, data=lsq).solve(seed=0)
    assert res.success and res.tolerances == {"feas_tol": 1e-4, "kkt_tol": 1e-4}
    text = res.report()
    line = next(x for x in text.splitlines() if x.startswith("KKT"))
    assert "the certificate's test" in line
    rel = f"stationarity {res.kkt.stationarity_rel:.2g} <= 0.0001"
    assert rel in line, line
    assert f"feasibility {np.max(res.kkt.feasibility_rel):.2g} <= 0.0001" in line
    assert "absolute: stationarity" in text
    assert "   1 norm <= 4" in text                  # constraints are numbered
    # kept in a result file
    assert ss.load_result(res.save(str(tmp_path / "r.npz"))).tolerances == res.tolerances


def test_a_stage_that_kept_c_says_so(lsq):
    stage = ss.Stage(100.0, 10, 0.01)
    res = ss.Problem(ss.SampleFunction(_loss, _grad), dim=4, data=lsq).solve(max_iter=2)
    import dataclasses

    shown = dataclasses.replace(res, stages=(stage, ss.Stage(100.0, 5, 0.002),
                                             ss.Stage(1000.0, 5, 0.0)),
                                slack=np.zeros(1), constraints=np.zeros(1),
                                constraint_names=("g <= 0",),
                                kkt=dataclasses.replace(res.kkt, multipliers=np.zeros(1),
                                                        feasibility=np.zeros(1),
                                                        complementarity=np.zeros(1),
                                                        feasibility_rel=np.zeros(1),
                                                        complementarity_rel=np.zeros(1)))
    lines = [x for x in shown.report().splitlines() if x.startswith("  c = ")]
    assert len(lines) == 3 and "kept" not in lines[0] and "kept" not in lines[2]
    assert "c kept" in lines[1]


def test_a_long_message_comes_in_lines_and_the_report_indents_them(lsq):
    res = ss.Problem(ss.SampleFunction(_loss, _grad), dim=4, data=lsq).solve(
        batch_size=5, tau=1.0, max_iter=3, seed=0)
    assert res.status == "max_iter"
    first, *rest = res.message.split("\n")
    assert "did not pass" in first and rest and rest[-1].startswith("try ")
    status = res.report().split("\n")[:1 + len(rest)]
    assert status[0].startswith("status        max_iter: ")
    assert all(line.startswith(" " * 14) for line in status[1:])


def test_each_kind_of_warning_is_shown_once_with_its_count():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with once_per_kind():
            for k in range(5):
                warnings.warn(f"round {k}: something inexact", RuntimeWarning)
            warnings.warn("another kind", UserWarning)
    texts = [str(w.message) for w in caught]
    assert texts == ["round 0: something inexact (5 times in this solve)", "another kind"]


def test_a_warning_the_caller_makes_an_error_raises_at_the_end():
    done = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeWarning, match="inexact"):
            with once_per_kind():
                warnings.warn("inexact", RuntimeWarning)
                done.append(True)
    assert done == [True]                     # the run went on to its end


def test_the_time_counts_the_whole_solve(lsq, monkeypatch):
    from ssca_solver.engine import session as session_module

    real = session_module.Session.__init__

    def slow_start(self, *args, **kwargs):
        time.sleep(0.3)                        # an engine that takes a while to start
        real(self, *args, **kwargs)

    monkeypatch.setattr(session_module.Session, "__init__", slow_start)
    res = ss.Problem(ss.SampleFunction(_loss, _grad), dim=4, data=lsq).solve(max_iter=2)
    assert res.time >= 0.3


def test_a_dead_default_start_is_refused_and_a_problems_own_start_is_used(lsq):
    """f(w) = (w_0 w_1 - y)^2 has a vanishing gradient at w = 0 for every row (a network
    with all weights 0 is such a point): a solve without x0 refuses the default zeros and
    says to pass x0; given one, by the solve or by the problem, it runs from there."""
    def value(w, X, y):
        return (w[0] * w[1] * X[:, 0] - y) ** 2

    def grad(w, X, y):
        r = 2 * (w[0] * w[1] * X[:, 0] - y) * X[:, 0]
        return np.array([np.mean(r) * w[1], np.mean(r) * w[0]])

    f = ss.SampleFunction(value, grad, name="product")
    with pytest.raises(ss.ModelError, match="x0 defaulted to zeros.*Pass x0="):
        ss.Problem(f, dim=2, data=lsq).solve(max_iter=5, seed=0)
    start = np.array([0.5, 0.5])
    given = ss.Problem(f, dim=2, data=lsq).solve(max_iter=5, seed=0, x0=start)
    own = ss.Problem(f, dim=2, data=lsq, x0=start).solve(max_iter=5, seed=0)
    np.testing.assert_array_equal(given.x, own.x)
    assert np.linalg.norm(own.x - start) > 0
    with pytest.raises(ss.ModelError, match="x0 must be a finite array of shape"):
        ss.Problem(f, dim=2, data=lsq, x0=np.zeros(3))
