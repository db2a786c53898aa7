"""A Result kept and looked at (issue 21): ``res.save(path)`` / ``ss.load_result(path)`` give
back every field, for runs of several kinds; the file is a plain .npz with JSON metadata that
is never unpickled, and malformed files are refused naming the file and the field;
``to_dict``/``to_json``/``history_columns`` give plain data without pandas; ``res.plot()``
(matplotlib, an optional extra) draws the run and says how to install it when it is missing."""

import dataclasses
import json
import os
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

import ssca_solver as ss
from conftest import quadratic_function
from problems.logistic import logistic_loss
from problems.neyman_pearson import neyman_pearson
from ssca_solver.diagnostics import result_io
from ssca_solver.federated import Dropout

ROOT = Path(__file__).resolve().parents[1]
MARK = 0.123456789


# -- runs of several kinds (tiny problems, few rounds) ------------------------------------------

def _unconstrained(cancer_data):
    """Algorithm 1: no constraints, adaptive batches."""
    return ss.Problem(logistic_loss(), dim=31, data=cancer_data).solve(
        batch_size=10, max_iter=5, seed=0, eval_every=2)


def _stages(cancer_data):
    """Algorithm 2 with two penalty stages and a fixed mini-batch."""
    return neyman_pearson(cancer_data, alpha=0.1).solve(
        batch_size=50, max_iter=12, penalty=[0.1, 1.0], seed=0, eval_every=5)


def _fedavg(cancer_data):
    return ss.Problem(logistic_loss(), dim=31, data=cancer_data).solve(
        method="fedavg", batch_size=20, max_iter=4, seed=0, eval_every=2)


def _primal_dual(cancer_data):
    """A Lagrangian baseline: its own multipliers (an array) in extras."""
    return neyman_pearson(cancer_data, alpha=0.1).solve(
        method="primal_dual", batch_size=20, max_iter=4, seed=0, eval_every=2)


def _domain(cancer_data):
    """The CVXPY path with a box: the KKT report's domain multipliers."""
    return neyman_pearson(cancer_data, alpha=0.2, box=1.0).solve(
        batch_size=50, max_iter=2, penalty=[10.0], seed=0, eval_every=None)


def _dropout(cancer_data):
    """Client 1 fails in round 2 (on_client_failure="drop")."""
    rng = np.random.default_rng(3)
    clients = [(rng.normal(size=(12, 3)), rng.normal(size=12)) for _ in range(3)]
    clients[1][0][:, 0] = MARK
    now = {"t": 1}

    def grad(w, X, y):
        if now["t"] == 2 and X[0, 0] == MARK:
            raise RuntimeError("this client's disk is gone")
        return X.T @ (X @ w - y) / len(y)

    def track(it):
        now["t"] = it.t + 1

    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2, grad, name="lsq")
    return ss.Problem(f, dim=3, data=ss.FederatedData(clients)).solve(
        batch_size=5, tau=0.1, seed=0, max_iter=4, eval_every=None,
        on_client_failure="drop", callback=track)


def _equality(cancer_data):
    """A linear equality constraint (F == b)."""
    rng = np.random.default_rng(0)
    data = ss.FederatedData([rng.normal(size=(15, 3)) + i for i in range(3)])
    mean = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(axis=0),
                             name="mean")
    return ss.Problem(quadratic_function(), [mean == 0.5], dim=3, data=data).solve(
        max_iter=6, seed=0, eval_every=2)


KINDS = {"unconstrained": _unconstrained, "stages": _stages, "fedavg": _fedavg,
         "primal_dual": _primal_dual, "domain": _domain, "dropout": _dropout,
         "equality": _equality}


@pytest.fixture(scope="module")
def runs(cancer_data):
    cache = {}

    def run(kind):
        if kind not in cache:
            cache[kind] = KINDS[kind](cancer_data)
        return cache[kind]

    return run


def assert_same(a, b, where="result"):
    """Equal values of equal types: arrays of the same dtype and shape (NaN equal to NaN),
    dataclasses field by field, History column by column in the same order."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape,
                                                           b.shape)
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, ss.History):
        assert isinstance(b, ss.History) and a.names == b.names, where
        for name in a.names:
            assert_same(getattr(a, name), getattr(b, name), f"{where}.{name}")
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, float):
        assert isinstance(b, float), where
        assert a == b or (np.isnan(a) and np.isnan(b)), (where, a, b)
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


# -- save and load -------------------------------------------------------------------------------

def test_the_file_holds_every_field_of_a_result():
    """A new Result field must be added to the file's layout, not silently lost."""
    assert {f.name for f in dataclasses.fields(ss.Result)} == set(result_io.SAVED_FIELDS)


@pytest.mark.parametrize("kind", list(KINDS))
def test_save_and_load_give_back_every_field(runs, kind, tmp_path):
    res = runs(kind)
    if kind == "stages":
        assert len(res.stages) >= 2 and res.slack.size == 1
    if kind == "dropout":
        assert res.dropouts and res.dropouts[0].client == 1
    if kind == "equality":
        assert "==" in res.constraint_names[0]
    if kind == "domain":
        assert res.kkt.domain_multipliers
    if kind == "primal_dual":
        assert isinstance(res.extras["multipliers"], np.ndarray)
    path = tmp_path / "run.npz"
    assert res.save(path) == str(path)
    back = ss.load_result(path)
    assert_same(res, back)
    assert back.report() == res.report() and repr(back) == repr(res)
    assert back.success == res.success
    # saved again, the file holds the same
    again = back.save(tmp_path / "again.npz")
    assert_same(back, ss.load_result(again))


def test_the_file_is_plain_numpy_and_json_with_the_versions(runs, tmp_path):
    res = runs("stages")
    path = res.save(tmp_path / "run.npz")
    with np.load(path, allow_pickle=False) as f:
        names = set(f.files)
        meta = json.loads(str(f["__meta__"]), parse_constant=lambda c: 1 / 0)
        np.testing.assert_array_equal(f["x"], res.x)
        np.testing.assert_array_equal(f["history/slack"], res.history.slack)
    assert {"x", "constraints", "slack", "kkt/multipliers", "kkt/feasibility",
            "history/t", "history/objective"} <= names
    assert meta["format"] == "ssca-solver-result" and meta["version"] == 1
    v = meta["versions"]
    assert v["numpy"] == np.__version__ and v["ssca-solver"] == ss.__version__
    assert v["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert meta["status"] == res.status and meta["nit"] == res.nit
    assert [s["penalty"] for s in meta["stages"]] == [s.penalty for s in res.stages]
    assert meta["communication"]["up_total"] == res.communication.up_total
    assert meta["kkt"]["stationarity_rel"] == res.kkt.stationarity_rel
    assert result_io.metadata(path)["versions"] == v


def test_non_finite_numbers_and_other_values_survive(runs, tmp_path):
    """NaN and infinities (a failed KKT report), tuples, lists, nested dicts and arrays in
    extras come back exactly; an exception comes back as its text, another object as its
    repr with a warning."""
    res = runs("stages")
    failed = ss.KKTReport.failed_at("SolverError: no", 1)
    odd = dataclasses.replace(
        res, fun=float("nan"), penalty=float("inf"), kkt=failed,
        extras={"a": (1, 2.5, [None, True, "s"]), "b": {"x": np.arange(3), 4: -np.inf},
                "error": ss.SubproblemError("round 3: no solver could solve it")},
        solver_info={"inaccurate_rounds": (3, 4), "solver": "CLARABEL"})
    back = ss.load_result(odd.save(tmp_path / "odd.npz"))
    expected = {**odd.extras, "error": "SubproblemError: round 3: no solver could solve it"}
    assert_same(dataclasses.replace(odd, extras=expected), back)
    assert back.kkt.failed

    with pytest.warns(RuntimeWarning, match=r"extras\['f'\] \(a builtin_function_or_method\) "
                                            r"is saved as its repr") as warned:
        path = dataclasses.replace(res, extras={"f": len}).save(tmp_path / "f.npz")
    assert warned[0].filename == __file__                    # the caller's line
    assert ss.load_result(path).extras == {"f": repr(len)}


def test_save_replaces_a_file_whole(runs, tmp_path):
    path = tmp_path / "run.npz"
    path.write_bytes(b"old")
    runs("fedavg").save(path)
    assert ss.load_result(path).method == "fedavg"
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]    # no temporary left


# -- malformed files -----------------------------------------------------------------------------

def _rewrite(path, out, change):
    """Copy the saved Result at ``path`` to ``out`` with ``change(arrays, meta)`` applied."""
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    change(arrays, meta)
    arrays["__meta__"] = np.array(json.dumps(meta))
    with open(out, "wb") as fh:
        np.savez(fh, **arrays)
    return out


def _set(key, value):
    def change(arrays, meta):
        meta[key] = value
    return change


def _drop(key):
    def change(arrays, meta):
        del meta[key]
    return change


def _array(name, value):
    def change(arrays, meta):
        arrays[name] = value
    return change


def _del_array(name):
    def change(arrays, meta):
        del arrays[name]
    return change


def _stage_rounds(arrays, meta):
    meta["stages"][1]["rounds"] = -1


MALFORMED = [
    (_set("format", "ssca-solver-checkpoint/1"), "format", "a checkpoint"),
    (_set("format", "something else"), "format", "not a saved Result"),
    (_set("version", 2), "version", "written by a newer ssca-solver"),
    (_drop("nit"), "nit", "is missing"),
    (_set("nit", "4"), "nit", "is not a non-negative integer"),
    (_set("status", "fine"), "status", "is not one of converged"),
    (_set("fun", "a lot"), "fun", "is not a number"),
    (_stage_rounds, "stages[1].rounds", "is not a non-negative integer"),
    (_set("history", ["t", "stage", "eval_t", "objective"]), "history",
     "has no column 'constraints'"),
    (_array("history/rho", np.zeros(3)), "history/rho", "one row per round"),
    (_array("kkt/multipliers", np.zeros(2)), "kkt/multipliers", "has shape (2,), not (1,)"),
    (_array("x", np.array(["a", "b"])), "x", "not of numbers"),
    (_del_array("history/t"), "history/t", "is missing"),
    (_array("stray", np.zeros(1)), "stray", "no field of the metadata refers to"),
    (_set("extras", {"dict": [["m", {"array": "extras/9"}]]}), "extras/9", "is missing"),
    (_set("extras", {"pickle": "x"}), "extras", "unknown tag 'pickle'"),
]


@pytest.mark.parametrize("change, field, words", MALFORMED,
                         ids=[f"{m[1]}-{m[2][:20]}" for m in MALFORMED])
def test_a_malformed_file_is_refused_naming_the_file_and_the_field(runs, tmp_path, change,
                                                                   field, words):
    good = runs("stages").save(tmp_path / "good.npz")
    bad = _rewrite(good, tmp_path / "bad.npz", change)
    with pytest.raises(result_io.ResultFileError) as err:
        ss.load_result(bad)
    assert err.value.path == str(bad) and err.value.field == field
    assert str(bad) in str(err.value) and field in str(err.value) and words in str(err.value)


def test_a_pickle_in_the_file_is_never_loaded(runs, tmp_path):
    """An object array (a pickle that would create a file when unpickled) is refused before
    its data is read."""
    marker = tmp_path / "unpickled"

    class Trap:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    good = runs("stages").save(tmp_path / "good.npz")
    with np.load(good, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["x"] = np.array([Trap()], dtype=object)
    bad = tmp_path / "bad.npz"
    with open(bad, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(result_io.ResultFileError, match="holds Python objects") as err:
        ss.load_result(bad)
    assert err.value.field == "x" and not marker.exists()


def test_files_that_are_no_saved_result(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved Result"):
        ss.load_result(tmp_path / "none.npz")
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(result_io.ResultFileError, match="is empty"):
        ss.load_result(empty)
    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(result_io.ResultFileError, match="not a Result saved by this library"):
        ss.load_result(text)
    good = runs("stages").save(tmp_path / "good.npz")
    data = Path(good).read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(result_io.ResultFileError, match="truncated or corrupted"):
        ss.load_result(cut)
    # one flipped byte in the history's data: the CRC check refuses it
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("history/rho.npy")
    flipped = bytearray(data)
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 200
    flipped[at] ^= 0xFF
    flip = tmp_path / "flip.npz"
    flip.write_bytes(bytes(flipped))
    with pytest.raises(result_io.ResultFileError, match="history/rho"):
        ss.load_result(flip)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(result_io.ResultFileError, match="is a special file"):
        ss.load_result(tmp_path / "fifo")                    # refused without opening it
    with pytest.raises(result_io.ResultFileError, match="is a directory"):
        ss.load_result(tmp_path)
    no_meta = tmp_path / "no_meta.npz"
    np.savez(no_meta, x=np.zeros(3))
    with pytest.raises(result_io.ResultFileError, match="'__meta__' is missing"):
        ss.load_result(no_meta)


# -- plain data ----------------------------------------------------------------------------------

def _only_plain(value, where="to_dict()"):
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), where
            _only_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _only_plain(v, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (bool, int, float, str, np.ndarray), \
            (where, type(value))


@pytest.mark.parametrize("kind", ["stages", "dropout", "primal_dual", "domain"])
def test_to_dict_is_plain_data_and_to_json_is_standard_json(runs, kind, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)          # pandas is not needed
    res = runs(kind)
    d = res.to_dict()
    _only_plain(d)
    assert set(d) == {f.name for f in dataclasses.fields(ss.Result)} | {"success"}
    assert d["status"] == res.status and d["kkt"]["stationarity"] == res.kkt.stationarity
    np.testing.assert_array_equal(d["history"]["t"], res.history.t)
    assert [s["penalty"] for s in d["stages"]] == [s.penalty for s in res.stages]
    d["x"][0] += 1.0                                          # a copy
    assert d["x"][0] != res.x[0]
    back = json.loads(res.to_json(), parse_constant=lambda c: 1 / 0)
    assert back["x"] == res.x.tolist() and back["nit"] == res.nit
    assert back["dropouts"] == [dataclasses.asdict(x) for x in res.dropouts]
    assert back["history"]["t"] == res.history.t.tolist()
    nan = dataclasses.replace(res, fun=float("nan"))
    assert json.loads(nan.to_json())["fun"] is None
    assert "\n  " in res.to_json(indent=2)


def test_history_columns_are_one_row_per_round(runs, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    res = runs("stages")
    cols = res.history_columns()
    lengths = {name: np.shape(c) for name, c in cols.items()}
    # a row per round, and one before them for the start point's evaluation (round 0)
    assert res.history.eval_t[0] == 0
    assert set(lengths.values()) == {(res.nit + 1,)}, lengths
    assert list(cols)[:2] == ["t", "stage"]
    np.testing.assert_array_equal(cols["t"], np.r_[0, res.history.t])
    np.testing.assert_array_equal(cols["slack[0]"][1:], res.history.slack[:, 0])
    evaluated = np.isin(cols["t"], res.history.eval_t)
    np.testing.assert_array_equal(cols["evaluated"], evaluated)
    np.testing.assert_array_equal(cols["objective"][evaluated], res.history.objective)
    assert np.all(np.isnan(cols["objective"][~evaluated]))
    np.testing.assert_array_equal(cols["constraints[0]"][evaluated],
                                  res.history.constraints[:, 0])
    # without constraints there are no constraint columns; a run without evaluations has
    # none evaluated
    plain = runs("dropout").history_columns()
    assert "constraints[0]" not in plain and not plain["evaluated"].any()


def test_an_evaluation_without_a_round_gets_a_row_of_its_own(runs):
    """An evaluation at round 0 (the start point's: no round row): a row with NaN in the
    round columns; one at a round that has no row either (a history cut short) too."""
    res = runs("stages")
    cols = res.history_columns()
    assert {np.shape(c) for c in cols.values()} == {(res.nit + 1,)}
    assert cols["t"][0] == 0 and np.isnan(cols["stage"][0]) and np.isnan(cols["rho"][0])
    assert cols["evaluated"][0] and cols["objective"][0] == res.history.objective[0]
    assert cols["constraints[0]"][0] == res.history.constraints[0, 0]
    np.testing.assert_array_equal(cols["stage"][1:], res.history.stage)
    h = res.history.as_dict()
    h["eval_t"] = np.r_[h["eval_t"], res.nit + 5]
    h["objective"] = np.r_[h["objective"], 7.0]
    h["constraints"] = np.vstack([h["constraints"], [[-1.0]]])
    cols = dataclasses.replace(res, history=ss.History(h)).history_columns()
    assert {np.shape(c) for c in cols.values()} == {(res.nit + 2,)}
    assert cols["t"][-1] == res.nit + 5 and np.isnan(cols["rho"][-1])
    assert cols["objective"][-1] == 7.0 and cols["constraints[0]"][-1] == -1.0


def test_history_columns_make_a_dataframe(runs):
    pd = pytest.importorskip("pandas")
    res = runs("stages")
    frame = pd.DataFrame(res.history_columns())
    assert len(frame) == res.nit and frame["penalty"].tolist() == res.history.penalty.tolist()


# -- plot ----------------------------------------------------------------------------------------

@pytest.fixture
def pyplot(monkeypatch):
    matplotlib = pytest.importorskip("matplotlib",
                                     reason="plot is an optional extra: pip install "
                                            "'ssca-solver[plot]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def no_show(*args, **kwargs):
        raise AssertionError("Result.plot called plt.show()")

    monkeypatch.setattr(plt, "show", no_show)
    yield plt
    plt.close("all")


def _labels(fig):
    return [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]


def test_plot_draws_the_runs_quantities_against_rounds_and_floats(runs, pyplot, tmp_path):
    from matplotlib.figure import Figure

    res = runs("stages")
    fig = res.plot()
    assert isinstance(fig, Figure)
    assert _labels(fig) == ["objective", "largest\nviolation", "stationarity", "penalty c",
                            "batch size"]
    assert fig.axes[-1].get_xlabel() == "round"
    tops = [child for ax in fig.axes for child in ax.child_axes]
    assert [ax.get_xlabel().split(" (")[0] for ax in tops] == ["floats sent"]
    # the penalty panel draws the stages' penalties; the objective panel every evaluation and
    # the returned point
    penalty = fig.axes[3].lines[0].get_ydata()
    assert set(np.asarray(penalty, dtype=float)) == {s.penalty for s in res.stages}
    x, y = fig.axes[0].lines[0].get_data()
    assert list(x) == [*res.history.eval_t.tolist(), res.nit][-len(x):]
    assert y[-1] == res.fun
    fig.savefig(tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0

    fed = runs("fedavg").plot(figsize=(6, 4), title="FedAvg")
    assert _labels(fed) == ["objective", "stationarity"]
    assert fed.get_size_inches().tolist() == [6, 4] and fed._suptitle.get_text() == "FedAvg"
    assert _labels(runs("unconstrained").plot()) == ["objective", "stationarity",
                                                      "batch size"]


def test_plot_draws_a_recorded_stationarity_column(runs, pyplot):
    res = runs("stages")
    h = res.history.as_dict()
    h["stationarity_rel"] = np.linspace(1.0, 0.1, len(h["eval_t"]))
    fig = dataclasses.replace(res, history=ss.History(h)).plot()
    labels = [line.get_label() for line in fig.axes[2].lines]
    assert "relative stationarity" in labels


def test_plot_without_matplotlib_says_how_to_install_it(runs, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install 'ssca-solver\[plot\]'"):
        runs("fedavg").plot()


def test_matplotlib_is_the_optional_plot_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("matplotlib") for d in project["dependencies"])
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["plot"])


def test_dropouts_come_back_as_dropouts(runs, tmp_path):
    res = runs("dropout")
    back = ss.load_result(res.save(tmp_path / "d.npz"))
    assert all(isinstance(d, Dropout) for d in back.dropouts)
    assert back.dropouts == res.dropouts
