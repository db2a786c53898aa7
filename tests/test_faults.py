"""Faults get clear errors, and nothing hangs.

Clients in their own processes (``transport="process"``) can stop answering (SIGSTOP, a user
function that sleeps), die (SIGKILL) or raise exceptions that cannot be pickled. Each must end
the solve with an error that names the client, the round and the cause, within about
``client_timeout``; the error carries the last good state (and the checkpoint, from which
``resume`` goes on); and no client process may be left behind, not after the error, not after
Ctrl-C, not at interpreter exit, not when the server itself is killed.

Every test records the PIDs of the client processes it makes. A watchdog SIGKILLs those (and
only those) still alive after a generous delay, so a regression fails a test instead of hanging
the suite, and a ``finally`` SIGKILLs any left at the end, so a failing test leaves nothing
behind.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.federated import ProcessTransport, Request, build_clients

from conftest import hooked_lsq_function, slack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads process states from /proc")

ROOT = Path(__file__).resolve().parents[1]
D = 4
ROWS = 30
MARK = 1.0        # client 0's rows have X[:, 0] == MARK: a user function can tell it is there


# -- processes ----------------------------------------------------------------------------------

def _state(pid: int):
    """The process's state letter from /proc (R, S, T, Z, ...), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1]
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def _alive(pid: int) -> bool:
    """Running, sleeping or stopped (a zombie is dead: it only waits to be reaped)."""
    return _state(pid) not in (None, "Z", "X")


def _kill_alive(pids) -> None:
    for pid in list(pids):
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait_gone(pids, within: float = 10.0) -> list[int]:
    """The PIDs still alive after waiting up to ``within`` seconds for them to go."""
    end = time.monotonic() + slack(within)
    while True:
        left = [p for p in pids if _alive(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


@contextlib.contextmanager
def _guard(pids: list, after: float = 30.0):
    """SIGKILL the recorded PIDs still alive ``after`` seconds from now (a regression then fails
    its test instead of hanging it), and any left alive at the end."""
    timer = threading.Timer(slack(after), _kill_alive, (pids,))
    timer.daemon = True
    timer.start()
    try:
        yield pids
    finally:
        timer.cancel()
        _kill_alive(pids)
        mp.active_children()          # reap what this process forked


def _client_pids() -> dict[int, int]:
    """Client index -> PID of the live client processes forked by this process."""
    return {int(p.name.rsplit("-", 1)[1]): p.pid for p in mp.active_children()
            if p.name.startswith("ssca-client-")}


def _no_children_among(pids) -> bool:
    """None of ``pids`` is a live child of this process (multiprocessing joined them all)."""
    return not {p.pid for p in mp.active_children()} & set(pids)


# -- a small least-squares problem --------------------------------------------------------------

def _data(num_clients: int = 3) -> ss.FederatedData:
    rng = np.random.default_rng(1)
    clients = []
    for i in range(num_clients):
        X = 0.5 * rng.normal(size=(ROWS, D))
        y = X @ np.arange(1.0, D + 1) + 0.1 * rng.normal(size=ROWS)
        if i == 0:
            X[:, 0] = MARK
        clients.append((X, y))
    return ss.FederatedData(clients)


def _problem(hook=None, name="lsq", record=None) -> ss.Problem:
    return ss.Problem(hooked_lsq_function(hook, name, record), dim=D, data=_data())


def _recorded(record) -> list[int]:
    return sorted(int(f.name[4:]) for f in record.glob("pid-*"))


RUN = dict(method="ssca", batch_size=5, seed=0, eval_every=None)

# The client_timeout of the tests that wait for one: rounds before the fault must stay within it
# on a busy machine, so it grows with the suite's time scale.
TIMEOUT = max(2, round(slack(1)))


def _solve(prob, *, transport="process", **options):
    return prob.solve(**{**RUN, "transport": transport, **options})


def _on_round(t, action, pids):
    """A callback that records the client PIDs and runs ``action(client_pids)`` after round t
    (never when ``action`` is None)."""

    def callback(it):
        now = _client_pids()
        pids.extend(p for p in now.values() if p not in pids)
        if it.t == t and action is not None:
            action(now)

    return callback


# -- 1-3: a stopped, a killed and a sleeping client ---------------------------------------------

def test_a_stopped_client_times_out_with_a_clear_error_and_is_removed():
    pids = []
    stopped = {}

    def stop(now):
        stopped["pid"] = now[1]
        stopped["at"] = time.monotonic()
        os.kill(now[1], signal.SIGSTOP)

    with _guard(pids):
        with pytest.raises(ss.ClientError) as info:
            _solve(_problem(), max_iter=6, client_timeout=TIMEOUT,
                   callback=_on_round(2, stop, pids))
        took = time.monotonic() - stopped["at"]
        err = info.value
        assert f"client 1, round 3: no answer within client_timeout={TIMEOUT} s" in str(err)
        assert (err.client, err.round) == (1, 3)
        assert TIMEOUT - 0.1 < took < TIMEOUT + slack(2.0), took   # the timeout, then cleanup
        assert err.state.t == 2 and err.checkpoint is None
        assert len(pids) == 3 and stopped["pid"] in pids
        assert _wait_gone(pids, within=0) == [] and _no_children_among(pids)


def test_a_killed_client_is_reported_at_once_naming_the_signal():
    pids = []
    killed = {}

    def kill(now):
        killed["at"] = time.monotonic()
        os.kill(now[2], signal.SIGKILL)

    with _guard(pids):
        with pytest.raises(ss.ClientError) as info:
            _solve(_problem(), max_iter=6, client_timeout=60, callback=_on_round(2, kill, pids))
        took = time.monotonic() - killed["at"]
        err = info.value
        assert (err.client, err.round) == (2, 3)
        assert str(err).startswith("client 2, round 3: ")
        assert "killed by SIGKILL" in str(err)
        assert took < min(slack(10), 50), took      # not the 60 s timeout
        assert err.state.t == 2
        assert _wait_gone(pids, within=0) == [] and _no_children_among(pids)


def test_a_user_function_that_sleeps_times_out_and_its_process_is_removed(tmp_path):
    flag = tmp_path / "sleep-now"

    def hook(X):                     # only client 0 holds MARK rows; sleeps once flag exists
        if X[0, 0] == MARK and flag.exists():
            time.sleep(TIMEOUT + 60)

    pids = []
    start = {}

    def arm(now):
        start["at"] = time.monotonic()
        flag.touch()

    with _guard(pids, after=20):
        with pytest.raises(ss.ClientError) as info:
            _solve(_problem(hook), max_iter=5, client_timeout=TIMEOUT,
                   callback=_on_round(1, arm, pids))
        took = time.monotonic() - start["at"]
        err = info.value
        assert f"client 0, round 2: no answer within client_timeout={TIMEOUT} s" in str(err)
        assert "is alive" in str(err)
        assert TIMEOUT - 0.1 < took < TIMEOUT + slack(3.0), took
        assert err.state.t == 1
        assert len(pids) == 3
        assert _wait_gone(pids, within=0) == [] and _no_children_among(pids)


# -- 4-5: exceptions raised in a client ----------------------------------------------------------

def test_an_unpicklable_user_exception_reaches_the_user_with_its_type_and_traceback(tmp_path):
    """The library wraps a user function's exception in UserFunctionError (picklable); the
    original, of a class defined here (which pickle cannot find), reaches the user through the
    message (its repr) and the chained remote traceback (its type, the line that raised)."""

    class LocalBoom(Exception):
        pass

    def exploding_hook(X):
        if X[0, 0] == MARK:
            raise LocalBoom("the user's own failure")

    pids = []
    with _guard(pids):
        with pytest.raises(ss.UserFunctionError) as info:
            _solve(_problem(exploding_hook, name="boomer", record=tmp_path), max_iter=3)
        pids.extend(_recorded(tmp_path))       # it failed in round 1: no callback ran
        assert len(pids) == 3
        assert _wait_gone(pids, within=5) == [] and _no_children_among(pids)
        err = info.value
        assert "LocalBoom" in str(err) and "the user's own failure" in str(err)
        # the probe before round 1 (gradient check) is the first to call the function
        assert "client 0, before round 1" in str(err) and "boomer" in str(err)
        shown = "".join(traceback.format_exception(err))      # what an uncaught error prints
        assert "raised in client 0, round 0" in shown
        assert "LocalBoom: the user's own failure" in shown
        assert "in exploding_hook" in shown and 'raise LocalBoom("the user' in shown
        assert err.state.t == 0


class LockedError(Exception):
    """A module-level exception class whose instances carry a lock: they cannot be pickled."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def _ones(c, r):
    return c.reply(r, {"a": np.ones(1) * c.index})


def _transport(handler, num_clients=3, timeout=10.0) -> ProcessTransport:
    data = ss.FederatedData([(np.full((4, 3), float(i)), np.ones(4)) for i in range(num_clients)])
    return ProcessTransport(build_clients(data, 1, {"t": handler}), timeout=timeout)


def _request(t, d=3):
    return Request("t", t, np.zeros(d), {})


@pytest.mark.parametrize("kind", ["LocalError", "LockedError"])
def test_an_unpicklable_exception_in_a_task_handler_becomes_a_client_error(kind):
    class LocalError(Exception):        # a local class: pickle cannot find it by name
        pass

    def raising_handler(c, r):
        if c.index == 1:
            raise (LocalError("not sendable") if kind == "LocalError"
                   else LockedError("has a lock"))
        return _ones(c, r)

    transport = _transport(raising_handler)
    pids = list(transport.pids)
    with _guard(pids), transport:
        with pytest.raises(ss.ClientError) as info:
            transport.exchange(_request(1))
        err = info.value
        assert (err.client, err.round) == (1, 1)
        assert str(err).startswith("client 1, round 1: raised ")
        assert f"{kind}: " in str(err) and "could not be sent back as itself" in str(err)
        assert "in raising_handler" in err.remote_traceback
        assert "in raising_handler" in str(err)           # the message shows it too
        assert _wait_gone(pids, within=0) == [] and _no_children_among(pids)
        with pytest.raises(RuntimeError, match="closed after a client failure"):
            transport.exchange(_request(2))


def test_a_picklable_exception_keeps_its_type_and_the_transport_goes_on():
    def picky_handler(c, r):
        if c.index == 1 and r.round == 1:
            raise KeyError("no such row")
        return _ones(c, r)

    transport = _transport(picky_handler)
    pids = list(transport.pids)
    with _guard(pids), transport:
        with pytest.raises(KeyError) as info:
            transport.exchange(_request(1))
        cause = info.value.__cause__
        assert "raised in client 1, round 1" in str(cause) and "in picky_handler" in str(cause)
        # the other replies of round 1 were drained: round 2 gets its own answers
        replies = transport.exchange(_request(2))
        assert [(m.client, m.round) for m in replies] == [(0, 2), (1, 2), (2, 2)]
    assert _wait_gone(pids, within=5) == []


def test_a_user_function_error_in_a_process_client_keeps_its_type_and_state(tmp_path):
    flag = tmp_path / "nan-now"

    def value(w, X, y):
        v = 0.5 * (X @ w - y) ** 2
        if X[0, 0] == MARK and flag.exists():
            v[0] = np.nan
        return v

    fn = ss.SampleFunction(value, lambda w, X, y: X.T @ (X @ w - y) / len(y), name="nanny")
    prob = ss.Problem(fn, dim=D, data=_data())
    pids = []
    with _guard(pids):
        with pytest.raises(ss.UserFunctionError, match="nanny") as info:
            _solve(prob, max_iter=6, callback=_on_round(2, lambda now: flag.touch(), pids))
        err = info.value
        assert type(err) is ss.UserFunctionError
        assert "non-finite" in str(err) and "client 0, round 3" in str(err)
        assert err.state.t == 2
        assert "raised in client 0, round 3" in str(err.__cause__)
        assert _wait_gone(pids, within=5) == [] and _no_children_among(pids)


# -- 6: the last good state and the checkpoint ---------------------------------------------------

@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_client_failure_leaves_a_checkpoint_that_resume_continues(tmp_path, fault):
    ck = tmp_path / "ck.npz"
    pids = []

    def hurt(now):
        os.kill(now[1], signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

    with _guard(pids):
        with pytest.raises(ss.ClientError) as info:
            _solve(_problem(), max_iter=7, client_timeout=TIMEOUT, checkpoint=ck,
                   callback=_on_round(3, hurt, pids))
        err = info.value
        assert err.round == 4
        assert err.state.t == 3
        assert err.checkpoint == str(ck) and os.path.exists(err.checkpoint)
        assert _wait_gone(pids, within=0) == []

    resumed = _solve(_problem(), transport="inprocess", max_iter=7, resume=err.checkpoint)
    whole = _solve(_problem(), transport="inprocess", max_iter=7)
    assert resumed.nit == whole.nit == 7
    np.testing.assert_allclose(resumed.x, whole.x, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(resumed.history.t, whole.history.t)
    np.testing.assert_allclose(resumed.history.step_norm, whole.history.step_norm, atol=1e-12)


def _fail_in_an_evaluation(tmp_path) -> ss.ClientError:
    """Client 0 dies in the full-data evaluation after round 4 (eval_every=1)."""
    flag, ck = tmp_path / "die-now", tmp_path / "ck.npz"

    def hook(X):                     # all of client 0's rows: an evaluation, not a batch of 5
        if X[0, 0] == MARK and X.shape[0] == ROWS and flag.exists():
            os.kill(os.getpid(), signal.SIGKILL)

    pids = []
    with _guard(pids):
        with pytest.raises(ss.ClientError) as info:
            _solve(_problem(hook), max_iter=7, eval_every=1, checkpoint=ck,
                   callback=_on_round(3, lambda now: flag.touch(), pids))
        assert _wait_gone(pids, within=0) == []
    return info.value


def test_a_failure_in_an_evaluation_is_reported_with_the_last_good_state(tmp_path):
    err = _fail_in_an_evaluation(tmp_path)
    assert (err.client, err.round) == (0, "evaluation")
    assert str(err).startswith("client 0, full-data evaluation: the client process died: ")
    assert "killed by SIGKILL" in str(err)
    assert err.state.t == 3 and err.checkpoint == str(tmp_path / "ck.npz")
    assert os.path.exists(err.checkpoint)


def test_a_failure_in_an_evaluation_leaves_a_checkpoint_that_resume_continues(tmp_path):
    err = _fail_in_an_evaluation(tmp_path)
    resumed = _solve(_problem(), transport="inprocess", max_iter=7, eval_every=1,
                     resume=err.checkpoint)
    whole = _solve(_problem(), transport="inprocess", max_iter=7, eval_every=1)
    assert resumed.nit == whole.nit == 7
    np.testing.assert_allclose(resumed.x, whole.x, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(resumed.history.t, whole.history.t)


def test_a_failure_in_a_constrained_solve_resumes_to_the_same_point(cancer_data, tmp_path):
    from problems.neyman_pearson import neyman_pearson

    ck = tmp_path / "np.npz"
    opts = dict(method="ssca", batch_size=10, seed=0, eval_every=None, max_iter=6,
                penalty=(1e2, 1e3))
    pids = []
    with _guard(pids):
        with pytest.raises(ss.ClientError, match="client 1, round 4") as info:
            neyman_pearson(cancer_data, 0.2).solve(
                transport="process", client_timeout=30, checkpoint=ck,
                callback=_on_round(3, lambda now: os.kill(now[1], signal.SIGKILL), pids), **opts)
        assert _wait_gone(pids, within=0) == []
    assert info.value.state.t == 3 and info.value.checkpoint == str(ck)
    resumed = neyman_pearson(cancer_data, 0.2).solve(resume=info.value.checkpoint, **opts)
    whole = neyman_pearson(cancer_data, 0.2).solve(**opts)
    assert resumed.nit == whole.nit and resumed.status == whole.status
    np.testing.assert_allclose(resumed.x, whole.x, rtol=0, atol=1e-12)


# -- 7: nothing left behind at interpreter exit ---------------------------------------------------

_SCRIPT = """
import os, signal, sys, time
import numpy as np
import ssca_solver as ss
from ssca_solver.federated import ProcessTransport, Request, build_clients

pidfile = sys.argv[1]
data = ss.FederatedData([(np.full((4, 3), float(i)), np.ones(4)) for i in range(3)])
def handler(c, r):
    return c.reply(r, {"a": np.zeros(1)})
t = ProcessTransport(build_clients(data, 1, {"t": handler}), timeout=60)
assert [m.round for m in t.exchange(Request("t", 1, np.zeros(3), {}))] == [1, 1, 1]
with open(pidfile, "w") as f:
    f.write(" ".join(map(str, t.pids)))

def stop(pid):                    # SIGSTOP, and wait until the process is stopped
    os.kill(pid, signal.SIGSTOP)
    while "State:\tT" not in open(f"/proc/{pid}/status").read():
        time.sleep(0.01)
"""

_ENDINGS = {
    "exit with a stopped client": "stop(t.pids[0])\n",
    "uncaught KeyboardInterrupt with a stopped client":
        "stop(t.pids[1])\nraise KeyboardInterrupt\n",
    "sys.exit while a client is busy":
        "s = t.stream(Request('t', 2, np.zeros(3), {}))\nnext(s)\nsys.exit(3)\n",
    "the server is killed": "os.kill(os.getpid(), signal.SIGKILL)\n",
}


def _run_script(code: str, tmp_path, timeout=30.0, **kwargs):
    """Run ``code`` in a fresh interpreter; return (its returncode, or None when it did not exit
    within ``timeout``; stdout; stderr; seconds taken; the client PIDs it wrote to its PID file).

    Output goes to files, not pipes: a client that outlived the interpreter would hold a pipe
    open and make the wait for its end a wait for the client.
    """
    pidfile, out, err = tmp_path / "pids", tmp_path / "stdout", tmp_path / "stderr"
    start = time.monotonic()
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, "-c", code, str(pidfile)], stdout=fo,
                                stderr=fe, text=True, cwd=ROOT, **kwargs)
        try:
            code = proc.wait(timeout=slack(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    took = time.monotonic() - start
    pids = [int(p) for p in pidfile.read_text().split()] if pidfile.exists() else []
    return code, out.read_text(), err.read_text(), took, pids


@pytest.mark.parametrize("ending", list(_ENDINGS))
def test_no_client_outlives_the_interpreter(tmp_path, ending):
    if ending == "sys.exit while a client is busy":
        code = _SCRIPT.replace("    return c.reply",
                               "    time.sleep(30 if c.index == 2 and r.round == 2 else 0)\n"
                               "    return c.reply")
    else:
        code = _SCRIPT
    pids = []
    try:
        rc, out, err, took, found = _run_script(code + _ENDINGS[ending], tmp_path)
        pids.extend(found)
        assert rc is not None, f"the interpreter did not exit within 30 s ({ending})"
        assert len(pids) == 3, err
        if ending == "the server is killed":
            assert rc == -signal.SIGKILL
        else:
            assert took < slack(15), took
            assert rc == {"sys.exit while a client is busy": 3,
                          "uncaught KeyboardInterrupt with a stopped client": -signal.SIGINT,
                          }.get(ending, 0)
            # the main program's own KeyboardInterrupt, and nothing from the clients
            assert err.count("Traceback") == ("KeyboardInterrupt" in ending), err
        left = _wait_gone(pids, within=10)
        assert left == [], f"client processes {left} outlived the interpreter ({ending}): " + \
            ", ".join(f"{p}: state {_state(p)}" for p in left)
    finally:
        _kill_alive(pids)


def test_a_transport_dropped_without_close_stops_its_clients():
    transport = _transport(_ones)
    pids = list(transport.pids)
    with _guard(pids):
        assert len(transport.exchange(_request(1))) == 3
        del transport
        gc.collect()
        assert _wait_gone(pids, within=5) == [] and _no_children_among(pids)


# -- 8: Ctrl-C ----------------------------------------------------------------------------------

_SOLVE_SCRIPT = """
import multiprocessing as mp, os, signal, sys, threading, time
import numpy as np
import ssca_solver as ss

# Ctrl-C as in a terminal: a shell that starts a job in the background hands it SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler
signal.signal(signal.SIGINT, signal.default_int_handler)
pidfile = sys.argv[1]
rng = np.random.default_rng(1)
data = ss.FederatedData([(X, X @ np.arange(1.0, 5) ) for X in rng.normal(size=(3, 30, 4))])
fn = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                       lambda w, X, y: X.T @ (X @ w - y) / len(y), name="lsq")
prob = ss.Problem(fn, dim=4, data=data)
marks = {}

def callback(it):
    pids = {int(p.name.rsplit("-", 1)[1]): p.pid for p in mp.active_children()
            if p.name.startswith("ssca-client-")}
    if it.t == 2:
        with open(pidfile, "w") as f:
            f.write(" ".join(str(pids[i]) for i in sorted(pids)))
        marks["at"] = time.monotonic()
        ACTION
try:
    prob.solve(method="ssca", transport="process", client_timeout=60, batch_size=5,
               max_iter=50, seed=0, eval_every=None, callback=callback)
except KeyboardInterrupt as exc:
    print("KeyboardInterrupt after", time.monotonic() - marks["at"], "s; state t =",
          getattr(getattr(exc, "state", None), "t", None))
print("children:", [p.name for p in mp.active_children()], flush=True)
"""

_CTRL_C = {
    # Ctrl-C reaches the whole foreground process group: the server and its clients
    "in the callback": "os.killpg(os.getpgrp(), signal.SIGINT)",
    # ... while the server waits for a client that will never answer
    "while waiting for a stopped client": (
        "os.kill(pids[1], signal.SIGSTOP); "
        "threading.Timer(0.5, os.killpg, (os.getpgrp(), signal.SIGINT)).start()"),
}


@pytest.mark.parametrize("when", list(_CTRL_C))
def test_ctrl_c_stops_the_solve_promptly_and_leaves_no_client(tmp_path, when):
    code = _SOLVE_SCRIPT.replace("ACTION", _CTRL_C[when])
    pids = []
    try:
        # its own session and process group: the SIGINT cannot reach pytest
        rc, out, err, took, found = _run_script(code, tmp_path, start_new_session=True)
        pids.extend(found)
        assert rc is not None, "the interrupted solve did not exit within 30 s"
        assert rc == 0, err
        assert len(pids) == 3
        line = out.splitlines()[0]
        assert line.startswith("KeyboardInterrupt after"), out + err
        assert float(line.split()[2]) < 5.0, line
        if when != "in the callback":      # interrupted inside round 3: the last good state
            assert line.endswith("state t = 2"), line
        assert "children: []" in out
        assert "Traceback" not in err, err      # the clients ignored SIGINT
        assert _wait_gone(pids, within=5) == []
    finally:
        _kill_alive(pids)


# -- the transport's own bounds: no read or write may block past client_timeout ---------------

def test_a_large_request_to_a_stopped_client_times_out_instead_of_blocking():
    """A request larger than the pipe's buffer cannot be written whole to a client that does
    not read: sending must be bounded by client_timeout as well."""
    transport = _transport(_ones, timeout=1.0)
    pids = list(transport.pids)
    with _guard(pids, after=15), transport:
        assert len(transport.exchange(_request(1, d=2_000_000))) == 3
        os.kill(pids[0], signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(ss.ClientError) as info:
            transport.exchange(_request(2, d=2_000_000))
        took = time.monotonic() - start
        assert (info.value.client, info.value.round) == (0, 2)
        assert "within client_timeout=1 s" in str(info.value)
        assert took < slack(5), took
        assert _wait_gone(pids, within=0) == []


def test_a_reply_cut_short_by_a_stopped_client_times_out_instead_of_blocking():
    """Client 1 writes a large reply while the server still waits for client 0, and is stopped
    half-way: the server must not block forever on the partial reply."""

    def handler(c, r):
        if c.index == 0:
            time.sleep(1.0)
        n = 4_000_000 if c.index == 1 else 1
        return c.reply(r, {"a": np.ones(n)})

    transport = _transport(handler, timeout=2.0)
    pids = list(transport.pids)
    with _guard(pids, after=15), transport:
        threading.Timer(0.5, os.kill, (pids[1], signal.SIGSTOP)).start()
        start = time.monotonic()
        with pytest.raises(ss.ClientError) as info:
            transport.exchange(_request(1))
        took = time.monotonic() - start
        assert (info.value.client, info.value.round) == (1, 1)
        assert "within client_timeout=2 s" in str(info.value)
        assert took < slack(6), took
        assert _wait_gone(pids, within=0) == []


def test_a_stream_left_early_with_a_late_client_never_hands_out_a_stale_reply():
    """Leaving a stream early drains the other replies; a client too late for that must not
    have its old reply read as the answer to the next request."""

    def handler(c, r):
        if c.index == 2 and r.round == 1:
            time.sleep(1.5)
        return _ones(c, r)

    transport = _transport(handler, timeout=0.5)
    pids = list(transport.pids)
    with _guard(pids), transport:
        stream = transport.stream(_request(1))
        assert next(stream).round == 1
        stream.close()                       # client 2 does not answer within 0.5 s
        time.sleep(1.5)                      # ... but its round-1 reply is in its pipe now
        try:
            replies = transport.exchange(_request(2))
        except RuntimeError as exc:          # closed, and said so
            assert "closed after a client failure: client 2, round 1: no answer" in str(exc)
        else:
            assert [m.round for m in replies] == [2, 2, 2]


def test_an_interrupt_while_waiting_never_hands_out_a_stale_reply():
    """KeyboardInterrupt while the server waits for reply i: reply i, when it comes, must not be
    read as the answer to the next request (and waiting must not resume for long)."""

    def handler(c, r):
        if c.index == 0 and r.round == 1:
            time.sleep(1.0)
        return _ones(c, r)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    transport = _transport(handler, timeout=30)
    pids = list(transport.pids)
    old = signal.signal(signal.SIGALRM, interrupt)
    with _guard(pids), transport:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                transport.exchange(_request(1))
            assert time.monotonic() - start < 5
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        time.sleep(1.0)                      # client 0's round-1 reply is now in its pipe
        try:
            replies = transport.exchange(_request(2))
        except RuntimeError as exc:
            assert str(exc) == ("this transport was closed when a stream ended on "
                                "KeyboardInterrupt with client 0's answer to round 1 unread")
        else:
            assert [m.round for m in replies] == [2, 2, 2]
