"""VectorSampleFunction: K constraints of Problem 3 from one call per client, batch and point,
with the same iterates as K separate SampleFunctions."""

import numpy as np
import pytest

import ssca_solver as ss

C = np.array([0.5, 1.0, -0.3])
U = np.array([0.6, 1.2, 0.8])


def _data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 4)) / 2
    y = X @ np.array([1.0, -0.5, 0.3, 0.2]) + 0.1 * rng.standard_normal(60)
    return ss.FederatedData.split(X, y, num_clients=3, seed=0)


def _objective():
    return ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                             lambda w, X, y: X.T @ (X @ w - y) / len(X), name="lsq",
                             convexity="convex")


def _vector(calls=None, **kw):
    """f_k(w, x) = (x.w - c_k)^2, k = 0, 1, 2, from one call."""
    def value(w, X, y):
        if calls is not None:
            calls.append("value")
        return (X @ w)[:, None] ** 2 - 2 * (X @ w)[:, None] * C + C ** 2

    def jac(w, X, y):
        if calls is not None:
            calls.append("jac")
        r = (X @ w)[:, None] - C
        return 2.0 * (r.T @ X) / len(X)

    return ss.VectorSampleFunction(value, jac, 3, name="dev", convexity="convex", **kw)


def _separate(calls=None):
    out = []
    for k, c in enumerate(C):
        def value(w, X, y, c=c):
            if calls is not None:
                calls.append("value")
            return (X @ w) ** 2 - 2 * (X @ w) * c + c ** 2

        def grad(w, X, y, c=c):
            if calls is not None:
                calls.append("grad")
            return 2.0 * ((X @ w - c) @ X) / len(X)

        out.append(ss.SampleFunction(value, grad, name=f"dev[{k}]", convexity="convex"))
    return out


def test_the_components_take_the_iterates_of_separate_functions_from_one_call_each_round():
    data = _data()
    calls_v, calls_s = [], []

    def mark(calls):           # the calls of the rounds and evaluations after round 1 (the
        return lambda it: calls.append(f"round {it.t}")   # probe before it differs)

    F = _vector(calls_v)
    # the quasi-Newton model: its rounds call each function once (under "auto" the clients
    # difference the gradients here, 2 d more calls at other points, shared the same way)
    a = ss.Problem(_objective(), F <= U, dim=4, data=data).solve(
        seed=0, max_iter=40, callback=mark(calls_v), hessian="lbfgs")
    b = ss.Problem(_objective(), [f <= u for f, u in zip(_separate(calls_s), U)], dim=4,
                   data=data).solve(seed=0, max_iter=40, callback=mark(calls_s),
                                    hessian="lbfgs")
    assert a.status == b.status == "converged" and a.nit == b.nit
    np.testing.assert_allclose(a.x, b.x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.kkt.multipliers, b.kkt.multipliers, rtol=1e-8, atol=1e-10)
    assert np.any(a.kkt.multipliers > 1e-3)                # a constraint is active
    # from round 2 on: one value and one Jacobian call per client task where the separate
    # functions make K of each
    after_v, after_s = calls_v[calls_v.index("round 1"):], calls_s[calls_s.index("round 1"):]
    assert after_v.count("value") >= 3 * a.nit - 3
    assert after_s.count("value") == 3 * after_v.count("value")
    assert after_s.count("grad") == 3 * after_v.count("jac")
    # against CVXPY + Clarabel on the pooled rows
    import cvxpy as cp
    X = np.vstack([c.X for c in data.clients])
    y = np.concatenate([c.y for c in data.clients])
    w = cp.Variable(4)
    cons = [cp.sum_squares(X @ w - c) / len(X) <= u for c, u in zip(C, U)]
    ref = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - y) / len(X)), cons)
    ref.solve(solver="CLARABEL")
    assert a.fun == pytest.approx(ref.value, rel=1e-5, abs=1e-8)


def test_bounds_mixed_relations_and_components_as_functions():
    F = _vector()
    assert len(F) == 3 and F[1].name == "dev[1]" and list(F)[2] is F[2]
    le = F <= 1.0
    assert [c.bound for c in le] == [1.0, 1.0, 1.0] and not any(c.equality for c in le)
    ge = F >= [0.1, 0.2, 0.3]
    assert [c.bound for c in ge] == [-0.1, -0.2, -0.3]
    eq = F == np.array([1.0, 2.0, 3.0])
    assert all(c.equality for c in eq)
    prob = ss.Problem(_objective(), [F <= U, F[0] >= 0.01], dim=4, data=_data())
    assert prob.num_constraints == 4 and prob.constraints_convex is False   # -F[0] is concave
    # a component is a SampleFunction: its gradient checks out
    rng = np.random.default_rng(0)
    X = rng.standard_normal((7, 4))
    for f in F:
        assert ss.check_grad(f, rng.standard_normal(4), X) < 1e-6


def test_bad_input_is_refused_with_the_function_named():
    with pytest.raises(ValueError, match="2 bounds for 3 components"):
        _vector() <= [1.0, 2.0]
    with pytest.raises(ValueError, match="finite"):
        _vector() <= [1.0, np.inf, 2.0]
    with pytest.raises(ValueError, match="positive integer"):
        ss.VectorSampleFunction(lambda w, X, y: 0, lambda w, X, y: 0, 0)
    with pytest.raises(ValueError, match="one per component"):
        ss.VectorSampleFunction(lambda w, X, y: 0, lambda w, X, y: 0, 3,
                                convexity=["convex"] * 2)
    bad = ss.VectorSampleFunction(lambda w, X, y: np.zeros((len(X), 2)),
                                  lambda w, X, y: np.zeros((3, 4)), 3, name="wrong")
    with pytest.raises(ss.UserFunctionError, match=r"wrong\[0\]\.value_and_grad raised on client 0.*wrong.value must return .* shape \(20, 3\)"):
        ss.Problem(_objective(), bad <= 1.0, dim=4, data=_data()).solve(seed=0, max_iter=3)
    nan = ss.VectorSampleFunction(
        lambda w, X, y: np.column_stack([np.zeros(len(X)), np.full(len(X), np.nan)]),
        lambda w, X, y: np.zeros((2, 4)), 2, name="nan")
    with pytest.raises(ss.UserFunctionError, match=r"nan\[1\].value returned a non-finite"):
        ss.Problem(_objective(), nan <= 1.0, dim=4, data=_data()).solve(seed=0, max_iter=3)


def test_hessians_and_value_and_jac_in_one_pass():
    """With ``hess`` (K, d, d) every component carries its Hessian (the Newton model runs),
    and ``value_and_jac`` replaces the two calls."""
    calls = []

    def value_and_jac(w, X, y):
        calls.append("both")
        r = (X @ w)[:, None] - C
        return r ** 2, 2.0 * (r.T @ X) / len(X)

    def hess(w, X, y):
        calls.append("hess")
        return np.broadcast_to(2.0 * X.T @ X / len(X), (3, 4, 4)).copy()

    F = ss.VectorSampleFunction(lambda w, X, y: 1 / 0, lambda w, X, y: 1 / 0, 3, name="dev",
                                value_and_jac=value_and_jac, hess=hess, convexity="convex")
    obj = ss.SampleFunction(_objective().value, _objective().grad, name="lsq",
                            hess=lambda w, X, y: X.T @ X / len(X), convexity="convex")
    from ssca_solver import SSCA

    prob = ss.Problem(obj, F <= U, dim=4, data=_data())
    assert SSCA.parse(prob, {}).hessian == "newton"
    res = prob.solve(seed=0)
    assert res.status == "converged", res.message
    assert calls.count("hess") > 0 and "value" not in calls


def test_threads_answer_their_clients_from_their_own_evaluation():
    """Threads of one process answer different clients at the same time (a transport of
    docs/architecture.md's kind): each keeps its own evaluation, so the iterates equal the
    in-process run's; forked client processes likewise."""
    from conftest import register_thread_pool_transport

    threads = register_thread_pool_transport("vector_threads")
    data = _data()
    a = ss.Problem(_objective(), _vector() <= U, dim=4, data=data).solve(seed=0, max_iter=30)
    for transport in (threads, "process"):
        b = ss.Problem(_objective(), _vector() <= U, dim=4, data=data).solve(
            seed=0, max_iter=30, transport=transport)
        np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-12, err_msg=transport)


def test_components_travel_by_pickle_without_the_evaluations():
    """Flower's simulation ships the functions to its nodes with cloudpickle: a component
    arrives with its vector function, which arrives without the evaluations held here."""
    cloudpickle = pytest.importorskip("cloudpickle", reason="shipped with the Flower extra")
    F = _vector()
    rng = np.random.default_rng(0)
    X, w = rng.standard_normal((5, 4)), rng.standard_normal(4)
    here = F[1].value(w, X, None)
    assert F._cache                                         # this thread's evaluation
    G1 = cloudpickle.loads(cloudpickle.dumps(F[1]))
    assert G1.value.func.__self__._cache == {}
    np.testing.assert_array_equal(G1.value(w, X, None), here)
    np.testing.assert_array_equal(G1.grad(w, X, None), F[1].grad(w, X, None))
    assert G1.name == "dev[1]"


def test_a_client_reads_consecutive_components_at_once_as_one_by_one():
    """component_blocks finds the runs of components with the proximal-linear builder (an
    equality's Linearization included, F >= L's negated components not); block_statistics
    gives each component the statistics ProximalLinear.statistics gives it (eq. (fsmbar))."""
    from ssca_solver.methods.ssca.client import block_statistics, component_blocks
    from ssca_solver.model.surrogates import Linearization, ProximalLinear

    F, G = _vector(), _vector()
    fns = [_objective(), F[0], F[1], F[2], G[0], G[1]]
    builders = [ProximalLinear(), ProximalLinear(), Linearization(), ProximalLinear(2.0),
                ProximalLinear(), ProximalLinear()]
    blocks = component_blocks(fns, builders)
    assert [(vec is F, ms, ks) for vec, ms, ks in blocks] == [(True, [1, 2, 3], [0, 1, 2]),
                                                              (False, [4, 5], [0, 1])]
    negated = [c.function for c in (F >= 0.1)]
    assert component_blocks([negated[0], negated[1]], [ProximalLinear()] * 2) == []
    rng = np.random.default_rng(0)
    X, y, w = rng.standard_normal((9, 4)), rng.standard_normal(9), rng.standard_normal(4)
    got = block_statistics(blocks, fns, builders, w, X, y, 0.7)
    assert sorted(got) == [1, 2, 3, 4, 5]
    for m in got:
        t = builders[m].tau if builders[m].tau is not None else 0.7
        ref = builders[m].statistics(fns[m], w, X, y, t, "here")
        for k in ref:
            np.testing.assert_allclose(got[m][k], ref[k], rtol=1e-13, atol=1e-13)
            assert np.shape(got[m][k]) == np.shape(ref[k])


def test_a_block_that_is_not_finite_goes_one_by_one_and_names_its_component():
    from ssca_solver.methods.ssca.client import block_statistics, component_blocks
    from ssca_solver.model.surrogates import ProximalLinear

    F = ss.VectorSampleFunction(lambda w, X, y: np.full((len(X), 2), np.nan),
                                lambda w, X, y: np.zeros((2, X.shape[1])), 2, name="bad")
    blocks = component_blocks(list(F), [ProximalLinear()] * 2)
    X = np.ones((3, 2))
    assert len(blocks) == 1 and block_statistics(blocks, list(F), [ProximalLinear()] * 2,
                                                 np.zeros(2), X, None, 1.0) == {}


@pytest.mark.parametrize("with_grad", [True, False])
def test_a_full_data_evaluation_reads_the_components_at_once_as_one_by_one(with_grad):
    """The full-data evaluation (eq. (Fs0) and the F_m of Problem 3) reads a vector
    function's components from one evaluation of it: the same floats as component by
    component, beside a plain function; a component that is not finite is named."""
    from ssca_solver.diagnostics.evaluation import EvaluateTask
    from ssca_solver.federated import Request
    from ssca_solver.model.functions import checked_value_and_grad

    F = _vector()
    fns = [_objective(), F[0], F[1], F[2]]
    rng = np.random.default_rng(1)
    X, y, w = rng.standard_normal((300, 4)), rng.standard_normal(300), rng.standard_normal(4)
    got = EvaluateTask(fns)._arrays(Request("evaluate", 0, w, {"with_grad": with_grad}),
                                    X, y, "here")
    both = [checked_value_and_grad(f, w, X, y, "here") for f in fns]
    assert got["values"].tolist() == [v.sum() for v, _ in both]
    assert ("grads" in got) == with_grad
    if with_grad:
        assert got["grads"].tolist() == [(300 * g).tolist() for _, g in both]
    bad = ss.VectorSampleFunction(lambda w, X, y: np.where(np.arange(2) == 1, np.nan, 1.0)
                                  * np.ones((len(X), 2)),
                                  lambda w, X, y: np.zeros((2, X.shape[1])), 2, name="bad")
    with pytest.raises(ss.UserFunctionError, match=r"bad\[1\]"):
        EvaluateTask(list(bad))._arrays(Request("evaluate", 0, w, {"with_grad": with_grad}),
                                        X, y, "here")


def test_values_and_jacobian_alone_call_only_their_part_and_share_the_cache():
    """A difference of values (the probe's gradient check) calls ``value`` alone, one of
    gradients (differenced Hessians) ``jac`` alone; the other part at the same point and rows
    is computed once when asked for, and both agree with :meth:`evaluate`."""
    calls = []
    F = _vector(calls)
    rng = np.random.default_rng(2)
    X, w = rng.standard_normal((5, 4)), rng.standard_normal(4)
    v = F.values(w, X, None)
    assert calls == ["value"]
    J = F.jacobian(w, X, None)
    assert calls == ["value", "jac"]
    v2, J2 = F.evaluate(w, X, None)                   # both cached now
    assert calls == ["value", "jac"] and v2 is v and J2 is J
    F.jacobian(w + 1.0, X, None)
    assert calls[-1] == "jac" and calls.count("value") == 1
    ref = _vector()
    np.testing.assert_array_equal(F.evaluate(w + 1.0, X, None)[1], ref.evaluate(w + 1.0, X)[1])
    np.testing.assert_array_equal(F.values(w + 1.0, X, None), ref.values(w + 1.0, X))
    # with value_and_jac, one call gives both parts
    both = []
    G = ss.VectorSampleFunction(lambda w, X, y: both.append("value"),
                                lambda w, X, y: both.append("jac"), 3, name="g",
                                value_and_jac=lambda w, X, y: (
                                    both.append("both") or (np.zeros((len(X), 3)),
                                                            np.zeros((3, 4)))))
    G.values(w, X, None)
    G.jacobian(w, X, None)
    assert both == ["both"]
    bad = ss.VectorSampleFunction(lambda w, X, y: np.zeros((len(X), 2)),
                                  lambda w, X, y: np.zeros((3, 4)), 3, name="bad")
    with pytest.raises(ss.UserFunctionError, match="per-sample values of shape"):
        bad.values(w, X, None)
