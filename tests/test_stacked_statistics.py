"""A run of STACK_RUN or more functions with the same statistics travels as one array per
statistic (rows: the functions): the same iterates as one array per function, on every path
a reply takes (in process, client processes, secure aggregation), and a malformed stacked
reply named as a per-function one is."""

import dataclasses
import itertools

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.errors import ReplyError
from ssca_solver.federated import InProcessTransport, register_transport
from ssca_solver.methods.ssca import step as ssca_step

D, M = 5, 12


def _problem(diagonal_at=None):
    """Least squares with M constraints (x_j.w - c_m)^2 <= U_m (a few active at the
    optimum); constraint ``diagonal_at`` (if given) with a DiagonalCurvature surrogate, which
    splits the run of proximal-linear ones in two."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((90, D)) / 2
    y = X @ rng.standard_normal(D) + 0.1 * rng.standard_normal(90)
    data = ss.FederatedData.split(X, y, num_clients=3, seed=0)
    A = rng.standard_normal((M, D)) / np.sqrt(D)
    U = rng.uniform(0.2, 1.0, size=M)
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / len(X), name="lsq",
                          convexity="convex")
    cons = []
    for m in range(M):
        a = A[m]
        surrogate = (ss.DiagonalCurvature(lambda w, X, y, a=a: 2.0 * a * a)
                     if m == diagonal_at else None)
        g = ss.SampleFunction(lambda w, X, y, a=a: np.full(len(X), (a @ w) ** 2),
                              lambda w, X, y, a=a: 2.0 * (a @ w) * a, name=f"c{m}",
                              convexity="convex", surrogate=surrogate)
        cons.append(g <= U[m])
    return ss.Problem(f, cons, dim=D, data=data)


def _solve(prob, monkeypatch, stacked, **opts):
    monkeypatch.setattr(ssca_step, "STACK_RUN", 8 if stacked else 10 ** 9)
    return prob.solve(seed=0, max_iter=40, **opts)


def _same(a, b):
    assert a.nit == b.nit and a.status == b.status
    assert np.array_equal(a.x, b.x)
    assert np.array_equal(a.history.multipliers, b.history.multipliers)


def test_a_reply_carries_a_run_of_functions_as_one_array_per_statistic():
    prob = _problem()
    stats = [b.initial_statistics(D, 1.0, "tau") for b in prob.builders]
    packed = ssca_step.pack_statistics(stats)
    # the objective and the 12 constraints share the proximal-linear layout: one run
    assert sorted(packed) == ["0..12:const", "0..12:lin", "0..12:quad"]
    assert packed["0..12:lin"].shape == (M + 1, D) and packed["0..12:quad"].shape == (M + 1,)
    back = ssca_step.unpack_statistics(packed, stats)
    for st, got in zip(stats, back):
        assert set(st) == set(got)
        for k in st:
            assert np.shape(got[k]) == np.shape(st[k]) and np.array_equal(got[k], st[k])
            assert isinstance(got[k], np.ndarray)          # 0-d arrays, as a function's own


def test_runs_split_where_the_layout_changes_and_short_runs_travel_per_function():
    prob = _problem(diagonal_at=3)        # the functions: 0-3 proximal, 4 diagonal, 5-12 proximal
    stats = [b.initial_statistics(D, 1.0, "tau") for b in prob.builders]
    runs = ssca_step.stat_runs(stats)
    assert [(a, b) for a, b, _ in runs] == [(0, 4), (4, 5), (5, 13)]
    keys = ssca_step.stat_keys(stats)
    assert "0:lin" in keys and "3:quad" in keys and "4:quad" in keys     # runs below 8
    assert "5..12:lin" in keys and "5:lin" not in keys
    assert list(ssca_step.pack_statistics(stats)) == keys
    assert ssca_step.pack_statistics(stats)["4:quad"].shape == (D,)


@pytest.mark.parametrize("diagonal_at", [None, 3])
def test_stacked_replies_give_the_iterates_of_per_function_ones(monkeypatch, diagonal_at):
    prob = _problem(diagonal_at)
    a = _solve(prob, monkeypatch, True)
    b = _solve(prob, monkeypatch, False)
    _same(a, b)
    assert a.kkt.multipliers.size == M and np.any(a.kkt.multipliers > 0)


def test_stacked_replies_through_client_processes(monkeypatch):
    prob = _problem()
    _same(_solve(prob, monkeypatch, True, transport="process"),
          _solve(prob, monkeypatch, False))


def test_stacked_replies_under_secure_aggregation(monkeypatch):
    pytest.importorskip("cryptography")
    prob = _problem()
    _same(_solve(prob, monkeypatch, True, secure_aggregation=True),
          _solve(prob, monkeypatch, False, secure_aggregation=True))


_names = itertools.count()


class _Dropping(InProcessTransport):
    """Client 1's reply to round 3 without one array."""

    def __init__(self, clients, name):
        super().__init__(clients)
        self.name = name

    def stream(self, request, participants=None, tolerate_failures=False):
        for r in super().stream(request, participants, tolerate_failures):
            if r.client == 1 and r.round == 3 and r.task == "ssca.round":
                r = dataclasses.replace(r, arrays={k: v for k, v in r.arrays.items()
                                                   if k != self.name})
            yield r


def test_a_stacked_array_missing_from_a_reply_is_named():
    name = f"stacked_drop_{next(_names)}"
    register_transport(name, lambda clients, timeout: _Dropping(clients, "0..12:lin"))
    with pytest.raises(ReplyError) as info:
        _problem().solve(seed=0, max_iter=6, transport=name, batch_size=10)
    err = info.value
    assert (err.client, err.round, err.kind, err.array) == (1, 3, "layout", "0..12:lin")


def test_rescaling_every_functions_tau_at_once_is_rescaling_each():
    """A retry's tau factor over hundreds of functions (``rescale_all``, |w|^2 once) gives
    each function exactly what ``rescale_tau`` gives it: the same floats, scalar curvatures
    and a diagonal one (a vector quad) alike; the value and gradient at w are kept."""
    from ssca_solver.methods.ssca import adaptive as ad

    rng = np.random.default_rng(3)
    w = rng.normal(size=5)
    stats = [{"quad": np.asarray(rng.uniform(0.1, 2.0)), "lin": rng.normal(size=5),
              "const": np.asarray(rng.normal())} for _ in range(40)]
    stats.append({"quad": rng.uniform(0.1, 2.0, size=5), "lin": rng.normal(size=5),
                  "const": np.asarray(1.5)})
    for k in (0.25, 2.0, 37.0):
        together = ad.rescale_all(tuple(stats), w, k)
        assert len(together) == len(stats)
        for st, got in zip(stats, together):
            one = ad.rescale_tau(st, w, k)
            assert sorted(got) == sorted(one)
            for name in one:
                np.testing.assert_array_equal(got[name], one[name])
            q = np.asarray(got["quad"])
            value = float(np.sum(q * w * w) + got["lin"] @ w + got["const"])
            before = float(np.sum(np.asarray(st["quad"]) * w * w) + st["lin"] @ w
                           + st["const"])
            assert value == pytest.approx(before, rel=1e-12)
            np.testing.assert_allclose(2.0 * q * w + got["lin"],
                                       2.0 * np.asarray(st["quad"]) * w + st["lin"],
                                       rtol=1e-12, atol=1e-12)


def test_statistics_read_from_replies_keep_their_layout_and_rescale_a_run_at_once():
    """The server's statistics (read from the replies' stacked arrays) carry their runs and
    those arrays: packing them again gives the same arrays, and a retry's tau factor scales a
    stacked run as one array with exactly what ``rescale_tau`` gives each function (a run of
    13 proximal-linear functions, a diagonal one, a short run of 3), keeping the layout for
    the next round."""
    from ssca_solver.federated import Reply
    from ssca_solver.methods.ssca import adaptive as ad

    rng = np.random.default_rng(5)
    w = rng.normal(size=D)

    def draw(m):
        quad = rng.uniform(0.1, 2.0, size=D) if m == 13 else np.asarray(rng.uniform(0.1, 2.0))
        return {"quad": quad, "lin": rng.normal(size=D), "const": np.asarray(rng.normal())}

    plain = tuple(draw(m) for m in range(17))
    runs = ssca_step.stat_runs(plain)
    assert [(a, b) for a, b, _ in runs] == [(0, 13), (13, 14), (14, 17)]
    replies = [Reply(client, "ssca.round", 1, 10, 10, ssca_step.pack_statistics(
        tuple(draw(m) for m in range(17)))) for client in (0, 1)]
    got = ssca_step.average_with_messages(plain, replies, 20, 0.5)
    assert isinstance(got, ssca_step.Statistics) and got.runs == runs
    fresh = ssca_step.pack_statistics(tuple(dict(st) for st in got))
    again = ssca_step.pack_statistics(got)
    assert list(again) == list(fresh)
    for key in fresh:
        np.testing.assert_array_equal(again[key], fresh[key])
    # a statistic over every function, rows the functions; none where the shapes differ
    lin = got.stacked("lin")
    assert lin.shape == (17, D)
    for m, st in enumerate(got):
        np.testing.assert_array_equal(lin[m], st["lin"])
    assert got.stacked("quad") is None and got.stacked("const").shape == (17,)
    for k in (0.25, 2.0, 37.0):
        together = ad.rescale_all(got, w, k)
        assert isinstance(together, ssca_step.Statistics) and together.runs == runs
        for st, row in zip(got, together):
            one = ad.rescale_tau(st, w, k)
            assert sorted(row) == sorted(one)
            for name in one:
                assert np.shape(row[name]) == np.shape(one[name])
                np.testing.assert_array_equal(row[name], one[name])
        # the plain tuple of the same dicts: the same numbers, function by function
        for a, b in zip(together, ad.rescale_all(tuple(got), w, k)):
            for name in a:
                np.testing.assert_array_equal(a[name], b[name])

    # the merit's stacked surrogates a_m |w|^2 + b_m.w + c_m read from the stacked arrays:
    # those of the plain tuple (scalar curvatures only: the diagonal one left out)
    from types import SimpleNamespace

    from ssca_solver.methods.ssca import merit as mt

    scalar = tuple(st for m, st in enumerate(plain) if m != 13)
    replies = [Reply(client, "ssca.round", 1, 10, 10, ssca_step.pack_statistics(
        tuple(draw(m) for m in range(17) if m != 13))) for client in (0, 1)]
    got = ssca_step.average_with_messages(scalar, replies, 20, 0.5)
    cfg = SimpleNamespace(builders=[ss.ProximalLinear()] * len(scalar))
    assert mt._packed_forms(got) is not None and mt._packed_forms(tuple(got)) is None
    for a, b in zip(mt.stacked_quadratics(cfg, got), mt.stacked_quadratics(cfg, tuple(got))):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows", [11, 100])
def test_a_run_of_plain_functions_gives_each_its_own_statistics_bit_for_bit(rows):
    """A client's run of plain functions with the proximal-linear builder (scalar_blocks;
    a DiagonalCurvature splits it) gives every function exactly the floats
    ProximalLinear.statistics gives it on its own (eq. (fsmbar)), with a builder's own tau;
    with few rows (their values summed as one array's rows) and with many."""
    from ssca_solver.methods.ssca.client import (SUM_ROWS_TOGETHER, scalar_blocks,
                                                 scalar_statistics)

    prob = _problem(diagonal_at=3)
    fns = [prob.objective] + [c.function for c in prob.constraints]
    builders = list(prob.builders)
    builders[6] = ss.ProximalLinear(2.5)
    blocks = scalar_blocks(fns, builders)
    assert blocks == [[0, 1, 2, 3], list(range(5, M + 1))]
    assert (rows <= SUM_ROWS_TOGETHER) == (rows == 11)
    rng = np.random.default_rng(7)
    X, y = rng.standard_normal((rows, D)), rng.standard_normal(rows)
    w = rng.standard_normal(D)
    got = scalar_statistics(blocks, fns, builders, w, X, y, 0.7)
    assert sorted(got) == [0, 1, 2, 3] + list(range(5, M + 1))
    for m, st in got.items():
        t = builders[m].tau if builders[m].tau is not None else 0.7
        ref = builders[m].statistics(fns[m], w, X, y, t, "here")
        assert set(st) == set(ref)
        for k in ref:
            assert np.shape(st[k]) == np.shape(ref[k]) and np.array_equal(st[k], ref[k]), (m, k)


@pytest.mark.parametrize("fault", ["nan", "shape", "raises"])
def test_a_run_with_a_faulty_function_goes_one_by_one_and_names_it(fault):
    """A function of a run that is not finite, answers with the wrong shape or raises leaves
    the run out of the joint path; one by one, the error names that function."""
    from ssca_solver.methods.ssca.client import scalar_blocks, scalar_statistics

    def value(w, X, y):
        if fault == "raises":
            raise ZeroDivisionError("boom")
        return np.full(len(X) + (fault == "shape"), np.nan if fault == "nan" else 1.0)

    good = ss.SampleFunction(lambda w, X, y: np.ones(len(X)), lambda w, X, y: np.ones(D),
                             name="good")
    bad = ss.SampleFunction(value, lambda w, X, y: np.ones(D), name="bad")
    fns, builders = [good, bad, good], [ss.ProximalLinear()] * 3
    X = np.ones((4, D))
    assert scalar_statistics(scalar_blocks(fns, builders), fns, builders, np.zeros(D), X,
                             None, 1.0) == {}
    prob = ss.Problem(good, [bad <= 1.0, good <= 2.0], dim=D,
                      data=ss.FederatedData([X, X]))
    with pytest.raises(ss.UserFunctionError, match=r"bad\.value"):
        prob.solve(seed=0, max_iter=3)


def test_runs_of_plain_functions_give_the_iterates_of_one_by_one(monkeypatch):
    """Solving with the clients' joint path for runs of plain functions gives the iterates,
    multipliers and status of every function evaluated on its own path."""
    from ssca_solver.methods.ssca import client

    prob = _problem(diagonal_at=3)
    a = prob.solve(seed=0, max_iter=40)
    monkeypatch.setattr(client, "scalar_blocks", lambda functions, builders: [])
    b = prob.solve(seed=0, max_iter=40)
    _same(a, b)


def test_a_reply_packed_from_its_pieces_is_the_reply_packed_function_by_function():
    """pack_pieces (a run's rows sliced from the statistics computed at once, no dict per
    function) gives the arrays pack_statistics gives from each function's own statistics
    (ProximalLinear.statistics one by one): the same names in the same order, shapes, dtypes
    and floats; with a DiagonalCurvature splitting the layout, a piece inside a run too short
    to be stacked, and a function outside any piece inside a stacked run."""
    from ssca_solver.methods.ssca.client import pack_pieces, scalar_blocks, scalar_statistics

    prob = _problem(diagonal_at=3)
    fns = [prob.objective] + [c.function for c in prob.constraints]
    builders = list(prob.builders)
    builders[6] = ss.ProximalLinear(2.5)
    rng = np.random.default_rng(8)
    X, y, w = rng.standard_normal((11, D)), rng.standard_normal(11), rng.standard_normal(D)
    own = [b.statistics(fn, w, X, y, b.tau if b.tau is not None else 0.7, "here")
           for fn, b in zip(fns, builders)]
    blocks = [[m for m in ms if m != 9] for ms in scalar_blocks(fns, builders)]
    assert blocks == [[0, 1, 2, 3], [5, 6, 7, 8, 10, 11, 12]]
    pieces = []
    read = scalar_statistics(blocks, fns, builders, w, X, y, 0.7, pieces)
    assert sorted(read) == blocks[0] + blocks[1] and all(v is None for v in read.values())
    stats = [None if m in read else own[m] for m in range(len(fns))]
    runs = ssca_step.stat_runs(own)
    assert [r[:2] for r in runs] == [(0, 4), (4, 5), (5, 13)]
    assert ssca_step.stacked_run(runs[2]) and not ssca_step.stacked_run(runs[0])
    ref = ssca_step.pack_statistics(own, runs)
    got = pack_pieces(stats, runs, pieces)
    assert list(got) == list(ref)
    for k in ref:
        a, b = np.asarray(got[k]), np.asarray(ref[k])
        assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), k


def test_the_initial_statistics_are_each_builders_own_in_the_stacked_layout():
    """init computes Fbar^(0) once per (builder type, tau): every function's statistics equal
    its builder's initial_statistics, none shares an array with another, and a stacked run
    carries its packed arrays (eq. (Fs0bar), the "tau" start)."""
    prob = _problem(diagonal_at=3)
    builders = list(prob.builders)
    builders[6] = ss.ProximalLinear(2.5)
    state = ssca_step.init(np.ones(D), builders, 0.7, "tau", M, 1.0)
    assert state.stats.packed is not None and len(state.stats) == M + 1
    for b, st in zip(builders, state.stats):
        ref = b.initial_statistics(D, b.tau if b.tau is not None else 0.7, "tau")
        assert set(st) == set(ref)
        for k in ref:
            assert np.shape(st[k]) == np.shape(ref[k]) and np.array_equal(st[k], ref[k])
    arrays = [(m, np.asarray(v)) for m, st in enumerate(state.stats) for v in st.values()]
    for (m, a), (k, b) in itertools.combinations(arrays, 2):
        assert m == k or not np.shares_memory(a, b), (m, k)


def test_statistics_read_from_packed_arrays_make_a_dict_only_when_read():
    """unpack_statistics makes no per-function dict: a function's is made when first read
    (views of a stacked run's rows, a short run's own arrays), the same as the dict it was
    packed from; negative indices, slices, iteration and pickling behave as a tuple's; a
    missing array is a KeyError naming it."""
    import pickle

    prob = _problem(diagonal_at=3)
    rng = np.random.default_rng(9)
    stats = [{k: rng.standard_normal(np.shape(v)) for k, v in
              b.initial_statistics(D, 1.0, "tau").items()} for b in prob.builders]
    packed = ssca_step.pack_statistics(stats)
    got = ssca_step.unpack_statistics(packed, stats)
    assert got._items == [None] * len(stats)          # nothing made yet
    st = got[7]                                        # in the stacked run 5..12
    assert sum(x is not None for x in got._items) == 1 and got[7] is st
    run = ssca_step.run_key(5, 12, "lin")
    assert np.shares_memory(st["lin"], packed[run])
    for m, (a, b) in enumerate(zip(got, stats)):
        assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in b), m
    assert got[-1] is got[len(stats) - 1] and got[1:3] == (got[1], got[2])
    with pytest.raises(IndexError):
        got[len(stats)]
    back = pickle.loads(pickle.dumps(got))
    assert isinstance(back, ssca_step.Statistics) and back.runs == got.runs
    assert all(np.array_equal(back[m][k], got[m][k]) for m in range(len(stats))
               for k in got[m])
    del packed[run]
    with pytest.raises(KeyError, match=r"5\.\.12:lin"):
        ssca_step.unpack_statistics(packed, stats)
