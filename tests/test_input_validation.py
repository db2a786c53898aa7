"""Bad input is refused with a clear error (issue 9, item 8): data, constraint bounds, labels."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ssca_solver as ss
from problems.mlp import MLP, classification_con, classification_uncon

ROOT = Path(__file__).resolve().parents[1]


# -- FederatedData: dtypes and non-finite values ---------------------------------------------------

def _clients(n_clients=3, rows=20, cols=4, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(rows, cols)), rng.integers(0, 3, rows)) for _ in range(n_clients)]


@pytest.mark.parametrize("bad, shown", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_non_finite_features_name_client_and_first_bad_row(bad, shown):
    clients = _clients()
    clients[2][0][17, 2] = bad
    clients[2][0][18, 1] = bad  # only the first bad row is reported
    with pytest.raises(ss.DataError, match=rf"client 2, row 17: X has a non-finite value "
                                           rf"\({shown}\)"):
        ss.FederatedData(clients)


@pytest.mark.parametrize("bad, shown", [(np.nan, "nan"), (np.inf, "inf")])
def test_non_finite_targets_name_client_and_row(bad, shown):
    clients = [(X, y.astype(float)) for X, y in _clients()]
    clients[1][1][5] = bad
    with pytest.raises(ss.DataError, match=rf"client 1, row 5: y has a non-finite value "
                                           rf"\({shown}\)"):
        ss.FederatedData(clients)


def test_non_finite_in_one_hot_targets_and_image_rows():
    """Rows of any shape: a (n, L) one-hot y and (n, 2, 3) image X name the row too."""
    X, Y = np.ones((5, 2, 3)), np.eye(3)[[0, 1, 2, 0, 1]]
    Y[3, 2] = np.nan
    with pytest.raises(ss.DataError, match=r"client 1, row 3: y has a non-finite value \(nan\)"):
        ss.FederatedData([(X[:2], Y[:2]), (X, Y)])
    Y[3, 2] = 0.0
    X[2, 1, 2] = np.inf
    with pytest.raises(ss.DataError, match=r"client 0, row 2: X has a non-finite value \(inf\)"):
        ss.FederatedData([(X, Y), (X[:1], Y[:1])])


@pytest.mark.parametrize("make, match", [
    (lambda X: X.astype(object), "X must be numeric.*object"),
    (lambda X: X.astype(str), "X must be numeric.*<U"),
    (lambda X: X.astype(complex), "X has complex dtype complex128"),
    (lambda X: X.astype(np.complex64), "X has complex dtype complex64"),
    (lambda X: X > 0, "X must be numeric.*bool"),
])
def test_non_numeric_and_complex_features_are_refused(make, match):
    clients = _clients()
    clients[1] = (make(clients[1][0]), clients[1][1])
    with pytest.raises(ss.DataError, match="client 1: " + match):
        ss.FederatedData(clients)


@pytest.mark.parametrize("make, match", [
    (lambda y: y.astype(object), "y must be numeric.*object"),
    (lambda y: np.array(["cat", "dog"])[y % 2], "y must be numeric.*<U"),
    (lambda y: y + 0j, "y has complex dtype"),
])
def test_non_numeric_and_complex_targets_are_refused(make, match):
    clients = _clients()
    clients[2] = (clients[2][0], make(clients[2][1]))
    with pytest.raises(ss.DataError, match="client 2: " + match):
        ss.FederatedData(clients)


def test_object_array_with_none_and_ragged_rows_are_refused():
    with pytest.raises(ss.DataError, match="client 0: X must be numeric.*object"):
        ss.FederatedData([np.array([[1.0, None], [2.0, 3.0]])])
    with pytest.raises(ss.DataError, match="client 0: X is not a rectangular array"):
        ss.FederatedData([[[[1.0, 2.0], [3.0]]]])


def test_valid_data_is_accepted_without_copies():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 4))
    for y in (rng.integers(0, 3, 50), rng.normal(size=50), np.eye(3)[rng.integers(0, 3, 50)],
              rng.integers(0, 2, 50).astype(bool), rng.integers(0, 9, 50).astype(np.uint8)):
        data = ss.FederatedData([(X, y), (X[:7], y[:7])])
        assert data.clients[0].X is X and data.clients[0].y is y
    Xi = rng.integers(0, 255, size=(10, 3))  # integer features, e.g. pixel values: computed
    Xc = ss.FederatedData([Xi]).clients[0].X  # in float64 (one copy; int8 X * X wraps)
    assert Xc.dtype == np.float64 and np.array_equal(Xc, Xi)
    X16 = np.full((3, 2), 6e4, dtype=np.float16)  # finite, but its sum overflows float16
    assert ss.FederatedData([X16]).clients[0].X is X16


def test_split_and_dirichlet_name_the_row_of_the_unsplit_data():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(100, 3)), rng.integers(0, 2, 100)
    Xbad = X.copy()
    Xbad[63, 2] = np.nan
    ybad = y.astype(float)
    ybad[41] = np.inf
    for build in (ss.FederatedData.split, ss.FederatedData.dirichlet):
        with pytest.raises(ss.DataError, match=r"row 63: X has a non-finite value \(nan\)"):
            build(Xbad, y, num_clients=4, seed=0)
        with pytest.raises(ss.DataError, match=r"row 41: y has a non-finite value \(inf\)"):
            build(X, ybad, num_clients=4, seed=0)
        with pytest.raises(ss.DataError, match="complex"):
            build(X + 1j, y, num_clients=4, seed=0)
        with pytest.raises(ss.DataError, match="y must be numeric"):
            build(X, y.astype(object), num_clients=4, seed=0)


def test_clients_built_by_split_are_checked_by_the_constructor():
    """split/dirichlet end in FederatedData(...): the per-client check also runs there."""
    data = ss.FederatedData.split(np.ones((8, 2)), np.arange(8), num_clients=2, seed=0)
    X0 = data.clients[0].X.copy()
    X0[1, 0] = np.nan
    with pytest.raises(ss.DataError, match="client 0, row 1"):
        ss.FederatedData([(X0, data.clients[0].y), data.clients[1]])


# -- stochastic constraint bounds ------------------------------------------------------------------

def quadratic_function():
    """f(w, x) = 0.5 |w - x|^2; any SampleFunction would do for building constraints."""
    return ss.SampleFunction(lambda w, X, y: 0.5 * np.sum((w - X) ** 2, axis=1),
                             lambda w, X, y: w - X.mean(axis=0), name="quad")


@pytest.mark.parametrize("bound", ["0.5", True, False, np.bool_(True), None, [1.0],
                                   np.array([0.1, 0.2]), np.array(True), 1 + 2j,
                                   np.complex128(1.0)],
                         ids=lambda b: f"{type(b).__name__}-{b!r}")
def test_bounds_that_are_not_real_numbers_raise_type_error(bound):
    f = quadratic_function()
    with pytest.raises(TypeError, match="bound must be a real number"):
        f <= bound
    with pytest.raises(TypeError, match="bound must be a real number"):
        f >= bound


@pytest.mark.parametrize("bound, expected", [
    (np.float32(0.25), 0.25), (np.float16(0.5), 0.5), (np.int64(1), 1.0), (np.uint8(3), 3.0),
    (np.array(0.75), 0.75), (np.array(2), 2.0), (2, 2.0), (0.1, 0.1), (np.longdouble(0.5), 0.5),
], ids=lambda b: f"{type(b).__name__}")
def test_real_scalar_bounds_are_stored_as_python_floats(bound, expected):
    f = quadratic_function()
    upper, lower = f <= bound, f >= bound
    assert type(upper.bound) is float and upper.bound == expected
    assert type(lower.bound) is float and lower.bound == -expected


@pytest.mark.parametrize("bound", [np.nan, np.inf, -np.inf, np.float32("nan"), np.array(np.inf)])
def test_non_finite_bounds_raise_value_error(bound):
    f = quadratic_function()
    with pytest.raises(ValueError, match="must be finite"):
        f <= bound
    with pytest.raises(ValueError, match="must be finite"):
        f >= bound


# -- network labels --------------------------------------------------------------------------------

NET = MLP(4, 3, 5)


def _batch(y):
    return NET.init(0), np.ones((len(y), 4)), np.asarray(y)


BAD_LABELS = [(-1, "-1"), (5, "5"), (2.7, "2.7"), (np.nan, "nan"), (np.inf, "inf"),
              (10**9, "1000000000")]


@pytest.mark.parametrize("label, shown", BAD_LABELS)
def test_bad_labels_are_refused_before_the_kernel(label, shown):
    w, X, y = _batch([1, 2, label, 0])
    f = NET.cross_entropy()
    for call in (f.value, f.grad, f.value_and_grad):
        with pytest.raises(ss.DataError, match=rf"row 2: label {shown} is not a class index: "
                                               r"labels must be integers 0\.\.4"):
            call(w, X, y)
    with pytest.raises(ss.DataError, match=rf"evaluate, row 2: label {shown}"):
        NET.evaluate(w, X, y)


def test_label_shape_and_dtype_are_checked():
    w, X, _ = _batch([0, 1, 2])
    f = NET.cross_entropy()
    with pytest.raises(ss.DataError, match="one-hot rows pass y.argmax"):
        f.value(w, X, np.eye(5)[[0, 1, 2]])
    with pytest.raises(ss.DataError, match="3 class indices"):
        f.value(w, X, np.array([0, 1]))
    with pytest.raises(ss.DataError, match="must be integers 0..4, got dtype"):
        f.value(w, X, np.array(["0", "1", "2"]))


def test_integer_valued_labels_of_any_dtype_are_accepted():
    w, X, y = _batch([0, 3, 4, 1])
    ref = NET.cross_entropy().value(w, X, y)
    for yy in (y.astype(float), y.astype(np.float32), y.astype(np.uint8), y.astype(np.int32)):
        np.testing.assert_array_equal(NET.cross_entropy().value(w, X, yy), ref)
    assert NET.evaluate(w, X, y.astype(float)) == NET.evaluate(w, X, y)


def test_a_huge_label_no_longer_crashes_the_process():
    """A label of 10**9 used to index out of bounds inside the Numba kernel (a segfault):
    run it in a child process so a regression fails this test instead of killing pytest."""
    code = textwrap.dedent("""
        import numpy as np, ssca_solver as ss
        from problems.mlp import MLP
        net = MLP(4, 3, 5)
        try:
            net.cross_entropy().value(net.init(0), np.ones((2, 4)), np.array([1, 10**9]))
        except ss.DataError as exc:
            print("refused:", exc)
    """)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, f"child exited with {run.returncode}: {run.stderr[-2000:]}"
    assert "refused: batch, row 1: label 1000000000 is not a class index" in run.stdout


@pytest.mark.parametrize("build", [classification_uncon, classification_con])
@pytest.mark.parametrize("label", [-1, 5, 2.7, np.nan, 10**9])
def test_problem_builders_check_every_clients_labels(build, label):
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(6, 4)), rng.integers(0, 5, 6).astype(float)) for _ in range(3)]
    clients[1][1][4] = label
    if not np.isfinite(label):
        with pytest.raises(ss.DataError, match="client 1, row 4: y has a non-finite value"):
            ss.FederatedData(clients)  # caught earlier, by FederatedData itself
        return
    data = ss.FederatedData(clients)
    with pytest.raises(ss.DataError, match=r"client 1, row 4: label .* is not a class index"):
        build(data, NET)


def test_problem_builders_check_features_and_that_labels_exist():
    rng = np.random.default_rng(0)
    data = ss.FederatedData([(rng.normal(size=(6, 4)), rng.integers(0, 5, 6))])
    with pytest.raises(ss.DataError, match=r"client 0: rows of X have shape \(4,\), the network "
                                           r"expects \(7,\)"):
        classification_uncon(data, MLP(7, 3, 5))
    with pytest.raises(ss.DataError, match="needs labels"):
        classification_con(ss.FederatedData([rng.normal(size=(6, 4))]), NET)
    assert classification_uncon(data, NET).dim == NET.dim  # valid data still builds


@pytest.mark.parametrize("op,bound", [(op, b) for op in ("<=", ">=", "==")
                                      for b in (float("nan"), float("inf"), "0.5")
                                      if not (op == "==" and b == "0.5")])
def test_a_bad_constraint_bound_names_the_function(op, bound):
    """``energy <= nan`` raised a ValueError that did not name the function (issue 20): the
    message now starts with the constraint as written. (``f == "0.5"`` is no constraint:
    a SampleFunction compared with anything but a number is equal only to itself.)"""
    f = ss.SampleFunction(lambda w, X, y: (X @ w) ** 2,
                          lambda w, X, y: 2 * X.T @ (X @ w) / len(X), name="energy")
    with pytest.raises((ValueError, TypeError), match=rf"^energy {op} "):
        {"<=": f.__le__, ">=": f.__ge__, "==": f.__eq__}[op](bound)
