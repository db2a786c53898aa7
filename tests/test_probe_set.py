"""The fast cases of issue 20's probe set that no other test file covered (the others are in
test_checkpoint_faults.py, test_replies.py, test_timeouts.py, test_faults.py,
test_option_meaning.py and test_data.py). Each asserts the exception's type and that its
message names the file, field, client or array at fault.

* A client reply that lacks one of the arrays the other clients send, or carries one more,
  under plain aggregation: ReplyError naming the client, the round and the array (it was a
  bare ValueError from the server's fold that named the client but not the round, and with
  on_client_failure="drop" it ended the run instead of being a dropout); the one reply of a
  request (one client, or one participant) is compared with the earlier requests' arrays.
* A reply of finite but absurd numbers (1e300 times too large): the DivergenceError that
  follows names the client instead of blaming the solver's steps.
* The probe's own NaN ("no finite difference along the gradient at x0") is not a malformed
  reply: the server warns as it means to, and the run's error names the user's function (the
  reply check had refused it as client 0's non-finite reply).
* x0 given again on resume: the run continues from the checkpoint's point, so an x0 other
  than the first run's is refused naming the file and the field (it was silently ignored).
* 20 one-row clients with batch_size=1 and a fixed tau: the max_iter message speaks of full
  batches, not of a mini-batch's noise floor (issue 20, item 5).
* int8 data end to end: the same iterates as the same numbers in float64.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import warnings

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.errors import ReplyError
from ssca_solver.federated import InProcessTransport, Reply, register_transport

from conftest import quadratic_function

_names = itertools.count()


class _Corrupting(InProcessTransport):
    """In-process clients, with ``fault(reply)`` applied to the replies ``which(reply)``."""

    def __init__(self, clients, which, fault):
        super().__init__(clients)
        self.which, self.fault = which, fault

    def stream(self, request, participants=None, tolerate_failures=False):
        for r in super().stream(request, participants, tolerate_failures):
            yield self.fault(r) if isinstance(r, Reply) and self.which(r) else r


def _transport(which, fault) -> str:
    name = f"probe_set_{next(_names)}"
    register_transport(name, lambda clients, timeout: _Corrupting(clients, which, fault))
    return name


def _at(client, round, task="ssca.round"):
    return lambda r: r.client == client and r.round == round and r.task == task


def _without(reply, name):
    return dataclasses.replace(reply, arrays={k: v for k, v in reply.arrays.items()
                                              if k != name})


def _quadratic(num_clients=3):
    rng = np.random.default_rng(0)
    data = ss.FederatedData([rng.standard_normal((20, 4)) + i for i in range(num_clients)])
    return ss.Problem(quadratic_function(), dim=4, data=data)


ROUND_OPTS = dict(max_iter=6, seed=0, eval_every=2, batch_size=5, tau=1.0)


# -- replies: a missing or an unexpected array ---------------------------------------------------

def test_a_reply_missing_an_array_names_the_client_the_round_and_the_array():
    """Before: ValueError("client 1: statistics [...], the server expects [...]") from the
    server's fold, with no round and not a ClientError."""
    with pytest.raises(ReplyError) as info:
        _quadratic().solve(transport=_transport(_at(1, 3), lambda r: _without(r, "0:lin")),
                           **ROUND_OPTS)
    err = info.value
    assert isinstance(err, ss.ClientError)
    assert (err.client, err.round, err.kind, err.array) == (1, 3, "layout", "0:lin")
    assert str(err).startswith("client 1, round 3: its reply to task 'ssca.round' carries the "
                               "arrays ['0:const', '0:quad'] (missing ['0:lin']), but the "
                               "replies of clients [0, 2] to the same request carry "
                               "['0:const', '0:lin', '0:quad'] (the most common set of "
                               "arrays)"), str(err)
    assert err.state is not None and err.state.t == 2         # the last good round


@pytest.mark.parametrize("clients, opts", [(1, {}), (3, {"clients_per_round": 1})],
                         ids=["one client", "one participant"])
def test_the_only_reply_of_a_request_missing_an_array_names_the_client_and_the_round(clients,
                                                                                      opts):
    """A request answered by one client has no other reply to compare with; it is compared
    with the arrays of the earlier requests of its task. Before: ValueError("client 0:
    statistics ['0:const', '0:quad'], the server expects [...]") from the server's fold."""
    with pytest.raises(ReplyError) as info:
        _quadratic(clients).solve(transport=_transport(
            lambda r: r.round == 3 and r.task == "ssca.round", lambda r: _without(r, "0:lin")),
            **ROUND_OPTS, **opts)
    err = info.value
    assert (err.round, err.kind, err.array) == (3, "layout", "0:lin")
    assert str(err).startswith(f"client {err.client}, round 3: its reply to task 'ssca.round' "
                               "carries the arrays ['0:const', '0:quad'] (missing ['0:lin']), "
                               "but the replies to the earlier requests of task 'ssca.round' "
                               "carried ['0:const', '0:lin', '0:quad'] (the only reply to "
                               "this request"), str(err)
    assert err.state is not None and err.state.t == 2         # the last good round
    # with drop, it is a dropout (and, as no client is left, the round fails naming it)
    with pytest.raises(ss.RoundFailedError, match=r"client \d: ReplyError: its reply to task "
                       r"'ssca.round' carries the arrays \['0:const', '0:quad'\]"):
        _quadratic(clients).solve(transport=_transport(
            lambda r: r.round == 3 and r.task == "ssca.round", lambda r: _without(r, "0:lin")),
            on_client_failure="drop", **ROUND_OPTS, **opts)


def test_the_only_reply_is_compared_with_requests_of_the_same_kind():
    """Straight through a Gatherer with one client: evaluations with and without gradients
    carry other arrays, and are compared each with its own kind (the request's switches)."""
    from ssca_solver.federated import Client, Request
    from ssca_solver.federated.gather import Gatherer
    from ssca_solver.model.data import ClientData

    def evaluate(client, request):
        arrays = {"values": np.zeros(2)}
        if request.config["with_grad"]:
            arrays["grads"] = np.zeros((2, 3))
        if request.round == 9:                            # the faulty reply
            del arrays["values"]
        return client.reply(request, arrays)

    g = Gatherer(InProcessTransport([Client(0, ClientData(np.ones((4, 3))), 0,
                                            {"evaluate": evaluate})]), [4])
    for t, with_grad in enumerate([True, False, True, False, False]):
        assert len(list(g.collect(Request("evaluate", t, np.zeros(3),
                                          {"with_grad": with_grad}), kind="eval"))) == 1
    with pytest.raises(ReplyError, match=r"^client 0, full-data evaluation: .*\['grads'\] "
                       r"\(missing \['values'\]\), but the replies to the earlier requests of "
                       r"task 'evaluate' carried \['grads', 'values'\]"):
        list(g.collect(Request("evaluate", 9, np.zeros(3), {"with_grad": True}), kind="eval"))


def test_the_first_client_is_named_when_it_is_the_one_at_fault():
    """Client 0's reply arrives first; the two others agree with each other: client 0 is
    named, for the array it carries too many."""
    extra = lambda r: dataclasses.replace(r, arrays={**r.arrays, "bogus": np.zeros(2)})
    with pytest.raises(ReplyError, match=r"^client 0, round 1: .*\(unexpected \['bogus'\]\), "
                       r"but the replies of clients \[1, 2\]") as info:
        _quadratic().solve(transport=_transport(_at(0, 1), extra), **ROUND_OPTS)
    assert info.value.array == "bogus"


def test_with_drop_a_reply_missing_an_array_is_a_dropout_and_the_run_goes_on():
    """Before: the ValueError ended the run although on_client_failure="drop"."""
    res = _quadratic().solve(transport=_transport(_at(2, 4), lambda r: _without(r, "0:quad")),
                             on_client_failure="drop", **ROUND_OPTS)
    assert res.nit == 6
    assert [(d.client, d.round) for d in res.dropouts] == [(2, 4)]
    assert res.dropouts[0].error.startswith("ReplyError: its reply to task 'ssca.round' "
                                            "carries the arrays ['0:const', '0:lin']")


def test_the_replies_of_an_evaluation_are_compared_too():
    drop_grads = lambda r: _without(r, "grads")
    with pytest.raises(ReplyError, match=r"^client 1, full-data evaluation: its reply to task "
                       r"'evaluate' carries the arrays \['values'\] \(missing \['grads'\]\)"):
        _quadratic().solve(transport=_transport(_at(1, 2, "evaluate"), drop_grads),
                           **ROUND_OPTS)


def test_legitimate_differences_between_replies_are_not_refused():
    """The noise numbers of adaptive sampling come only from clients with a mini-batch (a
    client of 3 rows sends its full batch), and a client whose functions are not finite at a
    trial point answers with the one array "nonfinite": both runs go on."""
    rng = np.random.default_rng(1)
    data = ss.FederatedData([rng.standard_normal((n, 4)) for n in (3, 40, 40)])
    res = ss.Problem(quadratic_function(), dim=4, data=data).solve(max_iter=8, seed=0,
                                                                   batch_size="grow")
    assert res.nit == 8

    from ssca_solver.methods.ssca.client import NONFINITE

    def nonfinite(r):               # what a client answers at a trial point it cannot evaluate
        return dataclasses.replace(r, arrays={NONFINITE: np.ones(1)})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = _quadratic().solve(transport=_transport(_at(1, 3), nonfinite),
                                 batch_size="full", max_iter=6, seed=0)
    assert res.nit >= 3 and not res.dropouts


def test_a_reply_of_absurd_but_finite_numbers_is_named_when_the_iterates_diverge():
    """A reply whose numbers are 1e300 times too large is no malformed reply (finite, real,
    of the right shape) and passes; the iterates then diverge, and the DivergenceError said
    "This is the solver's failure ..." under raise and under drop. It now names the client
    and the round, and how far its numbers were from the others'."""
    def huge(r):                    # the linear term of the surrogate, 1e300 times too large
        return dataclasses.replace(r, arrays={**r.arrays, "0:lin": r.arrays["0:lin"] * 1e300})

    for mode in ("raise", "drop"):
        with pytest.raises(ss.DivergenceError) as info:
            _quadratic().solve(transport=_transport(_at(1, 3), huge), on_client_failure=mode,
                               **ROUND_OPTS)
        text = str(info.value)
        assert text.startswith("the iterates diverged at round 3: "), text
        assert "client 1's reply to round 3 held a number of magnitude" in text, text
        assert "solver's failure" not in text
        assert info.value.state.t == 2


def test_a_divergence_of_the_steps_names_no_client():
    """tau=1e-3 fixed on sampled rounds (B = 5, curvature ~1): the steps diverge on every
    client alike; no client is accused."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3))
    y = X @ np.array([1.0, -2.0, 0.5])
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / X.shape[0], name="ls")
    prob = ss.Problem(f, dim=3, data=ss.FederatedData([(X[:10], y[:10]), (X[10:], y[10:])]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ss.DivergenceError) as info:
            prob.solve(batch_size=5, tau=1e-3, seed=0)
    # the cause it names is the fixed tau below round 1's stability bound (issue 20 item 5)
    assert "client" not in str(info.value) and "the fixed tau=0.001" in str(info.value)


# -- the probe's NaN ------------------------------------------------------------------------------

def test_the_probes_nan_mark_is_not_taken_for_a_malformed_reply():
    """A function finite at x0 only: the probe finds no finite difference along the gradient
    and sends NaN in its place, on purpose (the server then warns instead of checking). The
    reply check refused it as "client 0, round 0: ... 1 non-finite value(s) ... a reply's
    numbers must be finite"; now the warning comes, and the run ends on the function's
    non-finite value, naming the function."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3))
    y = X @ np.ones(3)

    def value(w, X, y):
        r = 0.5 * (X @ w - y) ** 2
        return r if np.all(w == 0) else np.full_like(r, np.nan)

    f = ss.SampleFunction(value, lambda w, X, y: X.T @ (X @ w - y) / len(y), name="edge")
    prob = ss.Problem(f, dim=3, data=ss.FederatedData.split(X, y, 2, seed=0))
    with pytest.warns(RuntimeWarning, match=r"edge: its gradient was not checked on client "
                      r"\d: its values are not finite on either side of x0"):
        with pytest.raises(ss.UserFunctionError, match=r"edge\.value returned a non-finite "
                           r"value") as info:
            prob.solve(max_iter=3, seed=0)
    assert not isinstance(info.value, ReplyError)


# -- x0 on resume ---------------------------------------------------------------------------------

def _lsq_problem():
    rng = np.random.default_rng(2)
    parts = [(rng.normal(size=(n, 2)), rng.normal(size=n)) for n in (12, 9, 10)]
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / len(y), name="lsq")
    return ss.Problem(f, dim=2, data=ss.FederatedData(parts))


CK_OPTS = dict(batch_size=4, max_iter=6, eval_every=None)


def test_another_x0_on_resume_is_refused_naming_the_file_and_the_field(tmp_path):
    """The run goes on from the checkpoint's point: an x0 other than the first run's was
    silently ignored. The same x0, or none, resumes."""
    prob, path = _lsq_problem(), tmp_path / "run.npz"
    prob.solve(checkpoint=path, x0=[0.5, -1.0], seed=0, **{**CK_OPTS, "max_iter": 3})
    with pytest.raises(ss.CheckpointError) as info:
        prob.solve(resume=path, x0=[0.0, 0.0], **CK_OPTS)
    err = info.value
    assert err.field == "x0" and str(path) in str(err)
    assert "started from another x0; omit x0=" in str(err)
    full = prob.solve(x0=[0.5, -1.0], seed=0, **CK_OPTS)
    for again in ({"x0": np.array([0.5, -1.0])}, {}):
        res = prob.solve(resume=path, **again, **CK_OPTS)
        assert res.nit == 6 and np.array_equal(res.x, full.x)

    # a checkpoint written by the resumed run keeps the first run's x0
    second = tmp_path / "second.npz"
    prob.solve(resume=path, checkpoint=second, **{**CK_OPTS, "max_iter": 4})
    with pytest.raises(ss.CheckpointError, match="another x0"):
        prob.solve(resume=second, x0=[1.0, 1.0], **CK_OPTS)
    # a run from the default x0 (zeros) is compared with zeros
    default = tmp_path / "default.npz"
    prob.solve(checkpoint=default, seed=0, **{**CK_OPTS, "max_iter": 3})
    assert prob.solve(resume=default, x0=np.zeros(2), **CK_OPTS).nit == 6
    with pytest.raises(ss.CheckpointError, match="another x0"):
        prob.solve(resume=default, x0=[1e-12, 0.0], **CK_OPTS)


def test_a_tampered_x0_record_is_refused_naming_the_field(tmp_path):
    prob, good = _lsq_problem(), tmp_path / "run.npz"
    prob.solve(checkpoint=good, seed=0, **{**CK_OPTS, "max_iter": 3})
    with np.load(good, allow_pickle=False) as f:
        payload = {k: f[k] for k in f.files}
    meta = json.loads(str(payload["__meta__"]))
    payload["__meta__"] = np.array(json.dumps({**meta, "x0": [0.0, 0.0]}))
    bad = tmp_path / "bad.npz"
    with open(bad, "wb") as out:
        np.savez(out, **payload)
    with pytest.raises(ss.CheckpointError) as info:
        prob.solve(resume=bad, **CK_OPTS)
    assert info.value.field == "x0" and str(bad) in str(info.value)
    assert "is not the start point's hash" in str(info.value)


# -- item 5: one-row clients, a fixed tau ---------------------------------------------------------

def test_one_row_clients_with_a_fixed_tau_are_told_about_full_batches():
    """Every batch of batch_size=1 is a one-row client's whole data: a run that has not
    passed the test in 20 rounds is advised as a full-batch run (tau='auto' adapts tau there),
    not told that a mini-batch ends at its noise floor."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3))
    y = X @ np.array([1.0, -2.0, 0.5])
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / X.shape[0], name="ls")
    prob = ss.Problem(f, dim=3, data=ss.FederatedData([(X[i:i + 1], y[i:i + 1])
                                                       for i in range(20)]))
    res = prob.solve(batch_size=1, tau=0.1, max_iter=20, seed=0)
    assert res.status == "max_iter"
    assert "full batches" in res.message and "tau='auto'" in res.message
    assert "noise floor" not in res.message and "mini-batch" not in res.message


# -- int8 data end to end -------------------------------------------------------------------------

def test_int8_features_give_the_iterates_of_the_same_numbers_in_float64():
    """X * X of int8 features of 100 wrapped (16 for 100 * 100): the diagonal curvature of
    DiagonalCurvature was 33 % off. The same rows in float64 now give the same run."""
    rng = np.random.default_rng(0)
    X8 = rng.integers(-100, 101, size=(60, 3)).astype(np.int8)
    y = X8.astype(float) @ np.array([0.01, -0.02, 0.005]) + 0.1 * rng.standard_normal(60)
    f = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                          lambda w, X, y: X.T @ (X @ w - y) / X.shape[0], name="ls",
                          surrogate=ss.DiagonalCurvature(lambda w, X, y: np.mean(X * X,
                                                                                 axis=0)))

    def run(X):
        data = ss.FederatedData([(X[:30], y[:30]), (X[30:], y[30:])])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ss.Problem(f, dim=3, data=data).solve(seed=0, max_iter=30)

    a, b = run(X8), run(X8.astype(np.float64))
    np.testing.assert_array_equal(a.x, b.x)
    ref = np.linalg.lstsq(X8.astype(float), y, rcond=None)[0]
    assert np.abs(b.x - ref).max() < 1e-3 * np.abs(ref).max()


def test_the_first_request_answered_by_one_client_without_an_array_is_a_reply_error():
    """The first request of a task answered by a single client has no earlier reply to
    compare its layout with: the method's fold names the client, the round and the array
    (before: ValueError("client 0: statistics [...], the server expects [...]"), no round)."""
    with pytest.raises(ReplyError) as info:
        _quadratic(1).solve(transport=_transport(
            lambda r: r.round == 1 and r.task == "ssca.round", lambda r: _without(r, "0:lin")),
            **ROUND_OPTS)
    err = info.value
    assert (err.client, err.round, err.kind, err.array) == (0, 1, "layout", "0:lin")
    assert "has no array '0:lin'" in str(err), str(err)


# -- option values no other test tried (tests/fault_probe.py, category "options") ----------------

@pytest.mark.parametrize("opts, match", [
    ({"feas_tol": -1.0}, "feas_tol"),
    ({"kkt_tol": float("nan")}, "kkt_tol"),
    ({"subproblem": "cvxpy", "solver_options": [1]}, "solver_options"),
    ({"transport": "process", "client_timeout": float("nan")}, "client_timeout"),
    ({"transport": "process", "client_timeout": -1}, "client_timeout"),
    ({"x0": np.full(4, np.nan)}, "x0"),
    ({"x0": np.zeros((4, 1))}, "x0"),
    ({"clients_per_round": 4}, "clients_per_round"),
    ({"on_client_failure": "ignore"}, "on_client_failure"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_option_values_the_probe_tried_are_refused_naming_the_option(opts, match):
    """Each is refused before round 1 (a ValueError or TypeError naming the option), never
    run with a meaning of its own: no round runs."""
    rounds = []
    with pytest.raises((ValueError, TypeError), match=match):
        _quadratic().solve(max_iter=3, seed=0, callback=lambda it: rounds.append(it.t), **opts)
    assert rounds == []


@pytest.mark.slow
def test_the_probe_program_classifies_and_writes_its_results(tmp_path):
    """tests/fault_probe.py end to end on three cases (a refusal, a correct run, one
    whose error must arrive within client_timeout; the latter's secure variant comes along):
    each in its own process group, the JSON and the PNG written to --results-dir. About 15 s
    (one process imports the library)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, os.path.join(root, "tests", "fault_probe.py"), "--results-dir",
         str(tmp_path), "--only",
         "ckpt_path_missing_directory,resume_same_everything,client_process_sleeps_past_timeout"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads((tmp_path / "fault_probe_only.json").read_text())
    got = {r["name"]: (r["outcome"], r["met"]) for r in doc["cases"]}
    got.pop("client_process_sleeps_past_timeout_secure", None)    # its name contains ours
    assert got == {"ckpt_path_missing_directory": ("clear_error", True),
                   "resume_same_everything": ("correct", True),
                   "client_process_sleeps_past_timeout": ("clear_error", True)}, doc["cases"]
    assert doc["counts"]["hang"] == 0 and (tmp_path / "fault_probe_only.png").stat().st_size
