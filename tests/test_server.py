"""The server's per-round arithmetic: the fused kernels, the bounded-memory averaging of the
clients' messages and the transports' message streams."""

import numpy as np
import pytest

from ssca_solver.errors import ReplyError
from problems.neyman_pearson import neyman_pearson
from ssca_solver.methods.ssca import step as driver
from ssca_solver._kernels import FOLD_WIDTH, convex_step, fold
from conftest import round_request, ssca_clients
from ssca_solver.methods.ssca.step import combine
from ssca_solver.federated import InProcessTransport, ProcessTransport


@pytest.mark.parametrize("count", [0, 1, FOLD_WIDTH - 1, FOLD_WIDTH, FOLD_WIDTH + 1, 11])
@pytest.mark.parametrize("shape", [(), (3,), (1000,), (40, 30)])
def test_fold_is_the_linear_combination(count, shape):
    rng = np.random.default_rng(count)
    y = rng.normal(size=shape)
    xs = [rng.normal(size=shape) for _ in range(count)]
    wts = list(rng.normal(size=count))
    expect = 0.7 * y + sum((wj * x for wj, x in zip(wts, xs)), np.zeros(shape))
    out = fold(0.7, y, wts, xs, np.empty(shape))
    np.testing.assert_allclose(out, expect, rtol=1e-13, atol=1e-13)
    fold(0.7, y, wts, xs, y)                                     # in place
    np.testing.assert_allclose(y, expect, rtol=1e-13, atol=1e-13)


def test_fold_refuses_mismatched_input():
    with pytest.raises(ValueError, match="2 weights for 1 arrays"):
        fold(1.0, np.zeros(100), [1.0, 2.0], [np.zeros(100)], np.zeros(100))
    with pytest.raises(ValueError, match=r"shape \(99,\)"):
        fold(1.0, np.zeros(100), [1.0], [np.zeros(99)], np.zeros(100))
    x = np.zeros(100)
    with pytest.raises(ValueError, match="overlaps an input"):
        fold(1.0, np.zeros(100), [1.0], [x], x)
    with pytest.raises(ValueError, match="overlaps an input"):
        fold(1.0, x[::-1], [], [], x)
    with pytest.raises(ValueError, match="C-contiguous float64"):
        fold(1.0, np.zeros(100), [], [], np.zeros(200)[::2])


@pytest.mark.parametrize("d", [1, 10, 100_003])
def test_convex_step_and_its_distance(d):
    rng = np.random.default_rng(d)
    w, target = rng.normal(size=d), rng.normal(size=d)
    new, dist = convex_step(w, 0.3, target)
    np.testing.assert_allclose(new, 0.7 * w + 0.3 * target, rtol=1e-14, atol=1e-15)
    assert dist == pytest.approx(np.linalg.norm(target - w), rel=1e-12)


@pytest.mark.parametrize("buffer_bytes", [1, 2000, 64 * 2 ** 20])
def test_streamed_average_equals_combine_then_average(cancer_data, monkeypatch, buffer_bytes):
    """Whatever the buffer (one message per flush, a few, all), the streamed fold is eqs.
    (Fs0bar)/(Fsmbar) on the combined statistics."""
    monkeypatch.setattr(driver, "FOLD_BUFFER_BYTES", buffer_bytes)
    prob = neyman_pearson(cancer_data, alpha=0.2)
    transport = InProcessTransport(ssca_clients(prob, 0))
    req = round_request(1, np.full(prob.dim, 0.1), 7)
    msgs = transport.exchange(req)
    prev = driver.init(np.ones(prob.dim), prob.builders, 0.1, "tau").stats
    ref = driver.average_statistics(prev, combine(msgs, cancer_data.num_samples), 0.3)
    streamed = driver.average_with_messages(prev, iter(msgs), cancer_data.num_samples, 0.3)
    for x, z in zip(streamed, ref):
        assert set(x) == set(z)
        for k in x:
            np.testing.assert_allclose(x[k], z[k], rtol=1e-13, atol=1e-14)


def test_average_refuses_no_messages_and_foreign_statistics(cancer_data):
    from dataclasses import replace

    prob = neyman_pearson(cancer_data, alpha=0.2)
    prev = driver.init(np.zeros(prob.dim), prob.builders, 0.1, "tau").stats
    with pytest.raises(ValueError, match="no client messages"):
        driver.average_with_messages(prev, [], cancer_data.num_samples, 0.5)
    msg = InProcessTransport(ssca_clients(prob, 0)).exchange(
        round_request(1, np.zeros(prob.dim), 7))[0]
    bad = replace(msg, arrays={k: v for k, v in msg.arrays.items() if k.startswith("0:")})
    with pytest.raises(ReplyError, match=r"client 0, round 1: its statistics are .*"
                                            r"missing \['1:const', '1:lin', '1:quad'\]") as info:
        driver.average_with_messages(prev, [msg, bad], cancer_data.num_samples, 0.5)
    assert (info.value.kind, info.value.array) == ("layout", "1:const")


def _recording_clients(prob, record):
    """The problem's clients, each calling record(client, request) before it answers."""
    clients = ssca_clients(prob, 0)
    for c in clients:
        original = c.handle
        c.handle = (lambda req, c=c, original=original: record(c, req) or original(req))
    return clients


def test_in_process_stream_runs_each_client_when_asked(cancer_data):
    prob = neyman_pearson(cancer_data, alpha=0.2)
    calls = []
    clients = _recording_clients(prob, lambda c, req: calls.append(c.index))
    stream = InProcessTransport(clients).stream(round_request(1, np.zeros(prob.dim), 7))
    assert calls == []
    assert next(stream).client == 0 and calls == [0]
    assert [m.client for m in stream] == [1, 2, 3, 4] and calls == [0, 1, 2, 3, 4]


def test_process_stream_left_early_does_not_leak_replies(cancer_data):
    """A stream abandoned after one message must not leave the other replies in the pipes,
    where they would be read as the answers to the next request."""
    prob = neyman_pearson(cancer_data, alpha=0.2)
    with ProcessTransport(ssca_clients(prob, 0)) as transport:
        stream = transport.stream(round_request(1, np.zeros(prob.dim), 7))
        assert next(stream).round == 1
        stream.close()
        msgs = transport.exchange(round_request(2, np.zeros(prob.dim), 7))
        assert [m.round for m in msgs] == [2] * cancer_data.num_clients
        assert [m.client for m in msgs] == list(range(cancer_data.num_clients))


def _writes_into_w():
    import ssca_solver as ss

    def value(w, X, y):
        return np.sum(X * w, axis=1)

    def grad(w, X, y):
        w[0] = 0.0                                # a user function changing its input
        return X.mean(axis=0)

    return ss.SampleFunction(value, grad, name="mutating")


@pytest.mark.parametrize("transport", ["inprocess", "process"])
def test_clients_get_a_read_only_w(cancer_data, transport):
    """One copy of w per request, shared by the clients: it must not be writable, or one
    client could change what the next receives (and, without the copy, the server's state)."""
    import ssca_solver as ss

    prob = ss.Problem(_writes_into_w(), dim=cancer_data.clients[0].X.shape[1], data=cancer_data)
    with pytest.raises(ss.UserFunctionError, match="read-only: copy it"):
        prob.solve(batch_size=5, max_iter=2, eval_every=None, transport=transport)


def test_in_process_clients_share_one_copy_not_the_servers_array(cancer_data):
    prob = neyman_pearson(cancer_data, alpha=0.2)
    seen = []
    clients = _recording_clients(prob, lambda c, req: seen.append(req.w))
    w = np.full(prob.dim, 0.1)
    InProcessTransport(clients).exchange(round_request(1, w, 7))
    assert all(v is seen[0] for v in seen)        # one copy per request, not one per client
    assert not np.shares_memory(seen[0], w) and not seen[0].flags.writeable
    np.testing.assert_array_equal(seen[0], w)



@pytest.mark.parametrize("count", [1, 2, FOLD_WIDTH])
def test_convex_step_from_terms(count):
    rng = np.random.default_rng(count)
    w = rng.normal(size=5000)
    terms = [(float(rng.normal()), rng.normal(size=5000)) for _ in range(count)]
    target = sum(c * v for c, v in terms)
    new, dist = convex_step(w, 0.3, terms)
    np.testing.assert_allclose(new, 0.7 * w + 0.3 * target, rtol=1e-12, atol=1e-12)
    assert dist == pytest.approx(np.linalg.norm(target - w), rel=1e-12)


@pytest.mark.parametrize("d", [4, 7, 64, 1001])
def test_convex_step_gives_the_same_floats_for_the_same_numbers(d):
    """The step and its distance (which decides when the iterates stopped moving) are a
    function of the numbers alone: the same floats whether the padding terms (zero weights,
    see convex_step) repeat the first array or are copies of it elsewhere in memory, and
    convex_step's own (test_identical_solves_in_one_process_give_the_same_floats)."""
    from ssca_solver._kernels import _convex_step5

    rng = np.random.default_rng(d)
    for _ in range(50):
        w = 1.0 + 1e-3 * rng.normal(size=d)
        v = w + 1e-4 * rng.normal(size=d)
        gamma, c0 = (1.0, 1.0) if rng.random() < 0.5 else (rng.random(), rng.normal())
        results = set()
        for copies in (False, True):
            pads = [v.copy() if copies else v for _ in range(FOLD_WIDTH - 1)]
            out = np.empty(d)
            dist2 = _convex_step5(w.copy() if copies else w, gamma, c0, v, 0.0, pads[0], 0.0,
                                  pads[1], 0.0, pads[2], 0.0, pads[3], out)
            results.add((out.tobytes(), dist2))
        assert len(results) == 1
        new, dist = convex_step(w, gamma, [(c0, v)])
        (out_bytes, dist2), = results
        assert new.tobytes() == out_bytes and dist == np.sqrt(dist2)


def test_identical_solves_in_one_process_give_the_same_floats():
    """Ten identical solves, one after another in this process (each allocating afresh):
    every step norm, iterate and multiplier the same, to the last bit. The step's kernel once
    summed the squared distance in a loop compiled with reassociation, and about every other
    process saw one of its solves differ from the others in the last bit of a step norm."""
    from problems.classical import CLASSICAL, problem

    c = CLASSICAL["sixth_power_equality"]
    prob = problem(c)
    first = prob.solve(seed=0, x0=c.x0, max_iter=300)
    for _ in range(9):
        res = prob.solve(seed=0, x0=c.x0, max_iter=300)
        assert res.nit == first.nit and res.status == first.status
        np.testing.assert_array_equal(res.history.step_norm, first.history.step_norm)
        np.testing.assert_array_equal(res.x, first.x)
        np.testing.assert_array_equal(res.kkt.multipliers, first.kkt.multipliers)


def test_convex_step_refuses_bad_terms():
    with pytest.raises(ValueError, match="1 to 5 terms"):
        convex_step(np.zeros(10), 0.5, [(1.0, np.zeros(10))] * (FOLD_WIDTH + 1))
    with pytest.raises(ValueError, match="shapes"):
        convex_step(np.zeros(10), 0.5, [(1.0, np.zeros(9))])


def test_solution_from_terms_forms_w_once_when_read():
    from ssca_solver.subproblems.base import SubproblemSolution

    v = [np.arange(100.0), np.ones(100)]
    sol = SubproblemSolution(None, np.zeros(1), np.zeros(1), 0.0, terms=[(2.0, v[0]), (-1.0, v[1])])
    assert sol.terms[1][1] is v[1]
    w = sol.w
    np.testing.assert_array_equal(w, 2.0 * v[0] - v[1])
    assert sol.w is w
    direct = SubproblemSolution(w, np.zeros(1), np.zeros(1), 0.0)
    assert direct.terms == ((1.0, w),)
    with pytest.raises(ValueError, match="exactly one of w and terms"):
        SubproblemSolution(w, np.zeros(1), np.zeros(1), 0.0, terms=[(1.0, w)])


def test_step_with_more_terms_than_one_pass_takes(cancer_data):
    """A solution with more than FOLD_WIDTH terms (e.g. M = 5 with a stochastic objective) is
    formed first; the step is eq. (updatew) either way."""
    import ssca_solver as ss
    from problems.logistic import logistic_loss
    from ssca_solver.subproblems.base import SubproblemSolution

    prob = ss.Problem(logistic_loss(), dim=31, data=cancer_data)
    rng = np.random.default_rng(0)
    terms = [(float(rng.normal()), rng.normal(size=prob.dim)) for _ in range(FOLD_WIDTH + 2)]

    class Fixed:
        name = "fixed"

        def solve(self, stats, penalty, round, nu0=None, center=None):
            return SubproblemSolution(None, np.zeros(0), np.zeros(0), 0.0, terms=terms)

    w0 = rng.normal(size=prob.dim)
    state = driver.init(w0, prob.builders, 0.1, "tau")
    msgs = InProcessTransport(ssca_clients(prob, 0)).stream(round_request(1, w0, 7))
    new, info = driver.step(state, msgs, cancer_data.num_samples, 0.5, 0.25, Fixed())
    target = sum(c * v for c, v in terms)
    np.testing.assert_allclose(new.w, 0.75 * w0 + 0.25 * target, rtol=1e-12, atol=1e-12)
    assert info.step_norm == pytest.approx(np.linalg.norm(target - w0), rel=1e-12)
