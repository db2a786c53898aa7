"""Issue 20's probe set: faults and bad inputs tried against the public API as a new user would.

Each case runs in a fresh Python process (its own session and process group, killed whole
when it outlives its wall-clock limit), uses ``import ssca_solver as ss`` with the default
options except the one under test, and states the outcome that is right for it. The child
classifies what it saw; the parent adds what only it can see (a hang, processes left behind,
an interpreter that outlives the solve). Outcomes:

* ``clear_error``: an exception of the library's types, or a ValueError / TypeError, whose
  message names what the case requires (the file, the field, the client, the array, the
  option at fault), carrying ``exc.state`` where the issue requires it;
* ``correct``: a Result whose status and numbers are right (checked against an independent
  reference: the least-squares solution, CVXPY, or the same solve never interrupted);
* ``silent_wrong``: a Result that claims more than is true, a refusal that should have been
  one but was accepted, or an option silently ignored;
* ``crash``: a raw exception (NumPy, zipfile, json, OS), an error that does not name the thing
  at fault, work lost (no ``exc.state``), or stray files;
* ``hang``: the wall-clock limit, a client timeout not held, or processes / an interpreter that
  outlive the solve.

A case also says which outcomes are acceptable (``accept``): ``met`` in the JSON says whether
the outcome was one of them (e.g. an honest "max_iter" where the case expects convergence is
``correct`` but not met).

    python tests/fault_probe.py                      # the whole set (about 10 minutes)
    python tests/fault_probe.py --quick              # one case in four, no slow ones
    python tests/fault_probe.py --only checkpoint    # the cases whose name has it

Writes ``fault_probe.json`` and ``fault_probe.png`` to ``--results-dir`` (default
benchmarks/results) and prints a table of outcomes per category. Nothing binds other than
127.0.0.1 (only the Flower simulation opens sockets, Ray's, on the local host).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUTCOMES = ("clear_error", "correct", "silent_wrong", "crash", "hang")


@dataclasses.dataclass
class Case:
    name: str
    category: str
    expected: str                   # "clear_error" or "correct"
    fn: Callable
    names: tuple = ()               # what the error's message must contain
    state: bool = False             # the error must carry exc.state
    accept: tuple = ()              # outcomes that meet the case (default: (expected,))
    timeout: float = 60.0
    slow: bool = False              # left out of --quick
    needs: Optional[str] = None     # a module the case needs (skipped without it)
    grace: float = 10.0             # seconds the interpreter may live on after the case


CASES: dict[str, Case] = {}


def add(name, category, expected, fn, names=(), state=False, accept=(), timeout=60.0,
        slow=False, needs=None, grace=10.0):
    """Register the case ``name``; ``names``: strings the error's message must contain (a
    tuple among them: any one of its strings)."""
    CASES[name] = Case(name, category, expected, fn, tuple(names), state,
                       tuple(accept) or (expected,), timeout, slow, needs, grace)


def case(category, expected, **kw):
    def register(fn):
        add(fn.__name__, category, expected, fn, **kw)
        return fn
    return register


class Verdict(Exception):
    """Raised (or returned) by a case: its outcome decided by the case itself."""

    def __init__(self, outcome, note=""):
        super().__init__(note)
        self.outcome, self.note = outcome, note


# =================================================================================================
# Child side: problems, references and helpers (ssca_solver is imported only in the child)
# =================================================================================================

ss = None          # set by child_main


def synth(n=240, d=6, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * scale
    w = rng.standard_normal(d)
    return X, X @ w / scale + 0.1 * rng.standard_normal(n)


def ls_function(name="ls", hess=False):
    def value(w, X, y):
        return 0.5 * (X @ w - y) ** 2

    def grad(w, X, y):
        return X.T @ (X @ w - y) / X.shape[0]

    if not hess:
        return ss.SampleFunction(value, grad, name=name)
    return ss.SampleFunction(value, grad, name=name, surrogate=ss.DiagonalCurvature(
        lambda w, X, y: (X * X).mean(0)))


def ls_problem(X=None, y=None, clients=4, fn=None, **kw):
    if X is None:
        X, y = synth()
    data = ss.FederatedData.split(X, y, num_clients=clients, seed=0)
    return ss.Problem(fn or ls_function(), dim=np.shape(X)[1], data=data, **kw)


def lstsq(X, y):
    return np.linalg.lstsq(np.asarray(X, float), np.asarray(y, float), rcond=None)[0]


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - b) / max(1.0, np.linalg.norm(b)))


def check_ls(res, X, y, tol=1e-3, want_converged=True):
    """A Result of a least-squares solve against np.linalg.lstsq."""
    err = rel(res.x, lstsq(X, y))
    note = f"status {res.status}, nit {res.nit}, relative error {err:.2e}"
    if res.success != (res.status == "converged"):
        raise Verdict("silent_wrong", f"success {res.success} but status {res.status}")
    if res.success and err > 10 * tol:
        raise Verdict("silent_wrong", "claims convergence: " + note)
    if not res.success and want_converged:
        raise Verdict("correct", "honest, but expected to converge: " + note)
    return Verdict("correct", note)


def constrained(X=None, y=None, share=0.25):
    """Least squares subject to 0.5 mean((x.w)^2) <= U, U a share of its value at the
    unconstrained solution (so the constraint is active)."""
    if X is None:
        X, y = synth()
    energy = energy_function()
    U = share * 0.5 * float(np.mean((X @ lstsq(X, y)) ** 2))
    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    return ss.Problem(ls_function(), constraints=[energy <= U], dim=X.shape[1], data=data), U


def cvx_constrained(X, y, U):
    import cvxpy as cp
    w = cp.Variable(X.shape[1])
    p = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(X @ w - y) / len(y)),
                   [0.5 * cp.sum_squares(X @ w) / len(y) <= U])
    p.solve(solver="CLARABEL")
    return w.value, p.value


def check_constrained(res, X, y, U, feas_tol=1e-4, kkt_tol=1e-4, want_converged=True):
    x_ref, f_ref = cvx_constrained(X, y, U)
    viol = max(0.5 * float(np.mean((X @ res.x) ** 2)) - U, 0.0)
    f = 0.5 * float(np.mean((X @ res.x - y) ** 2))
    gap = (f - f_ref) / max(1.0, abs(f_ref))
    note = (f"status {res.status}, nit {res.nit}, violation {viol:.2e}, objective gap "
            f"{gap:.2e}, distance to CVXPY {rel(res.x, x_ref):.2e}")
    if res.success:
        if viol > feas_tol * max(1.0, abs(U)) * 1.0001:
            raise Verdict("silent_wrong", f"claims convergence at feas_tol {feas_tol:g}: " + note)
        k = res.kkt
        worst = max(float(np.max(k.stationarity_rel, initial=0)),
                    float(np.max(k.complementarity_rel, initial=0)))
        if worst > kkt_tol * 1.0001:
            raise Verdict("silent_wrong", f"claims convergence at kkt_tol {kkt_tol:g} with a "
                          f"relative residual {worst:.2e}: " + note)
        if kkt_tol <= 1e-4 and abs(gap) > 1e-2 and rel(res.x, x_ref) > 1e-2:
            raise Verdict("silent_wrong", "claims convergence: " + note)
    elif want_converged:
        raise Verdict("correct", "honest, but expected to converge: " + note)
    return Verdict("correct", note)


class Ctx:
    def __init__(self, tmp):
        self.tmp = Path(tmp)

    def path(self, name):
        return str(self.tmp / name)


# -- checkpoints -----------------------------------------------------------------------------------

RESUME_OPTS = dict(max_iter=60, seed=0)


def written(ctx, name="run.npz", stop_at=10, **opts):
    """A least-squares solve stopped at round ``stop_at`` with a checkpoint."""
    X, y = synth()
    prob = ls_problem(X, y)
    path = ctx.path(name)
    o = {**RESUME_OPTS, **opts}
    prob.solve(**o, checkpoint=path, callback=lambda it: it.t >= stop_at)
    return prob, path, o, X, y


def npy_bytes(a):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(a), allow_pickle=True)
    return buf.getvalue()


def rewrite(src, dst, meta=None, members=None, drop=(), extra=None):
    """Copy the checkpoint ``src`` to ``dst`` with its metadata edited by ``meta(dict) ->
    dict | str``, members replaced ({name: array}), dropped or added."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            name = info.filename[:-4]
            if name in drop:
                continue
            data = zin.read(info)
            if name == "__meta__" and meta is not None:
                m = meta(json.loads(str(np.load(io.BytesIO(data)))))
                data = npy_bytes(np.array(m if isinstance(m, str) else json.dumps(m)))
            if members and name in members:
                data = npy_bytes(members[name])
            zout.writestr(info.filename, data)
        for name, a in (extra or {}).items():
            zout.writestr(name + ".npy", npy_bytes(a))
    return dst


def resume_check(ctx, prob, path, o, X, y):
    """Resume from ``path``: 'correct' when the result equals the uninterrupted solve."""
    res = prob.solve(**o, resume=path)
    full = prob.solve(**o)
    if not np.array_equal(res.x, full.x):
        v = check_ls(res, X, y, want_converged=False)
        raise Verdict("silent_wrong" if res.success and v.outcome != "correct" else "correct",
                      "resumed, not the uninterrupted iterates: " + v.note)
    return Verdict("correct", f"the uninterrupted iterates ({res.status}, nit {res.nit})")


def refused(ctx, edit_meta=None, members=None, drop=(), extra=None, **resume_opts):
    """Write a checkpoint, edit it, resume: a Result here means the edit was accepted."""
    prob, path, o, X, y = written(ctx)
    bad = rewrite(path, ctx.path("edited.npz"), edit_meta, members, drop, extra)
    res = prob.solve(**{**o, **resume_opts}, resume=bad)
    full = prob.solve(**o)
    same = np.array_equal(res.x, full.x)
    raise Verdict("silent_wrong", f"accepted ({res.status}, nit {res.nit}, the uninterrupted "
                  f"iterates: {same})")


def state_of(path, name):
    with np.load(path) as z:
        return z[name]


def meta_edit(**changes):
    def edit(m):
        for k, v in changes.items():
            if v is DELETE:
                m.pop(k, None)
            else:
                m[k] = v
        return m
    return edit


DELETE = object()


# -- replies ---------------------------------------------------------------------------------------

_transport_names = iter(range(10 ** 6))


def corrupting(fault, client=1, round=3, task="ssca.round"):
    """A registered transport: in-process clients whose reply to ``task`` at ``round`` from
    ``client`` goes through ``fault(reply)``."""
    from ssca_solver.federated import InProcessTransport, Reply, register_transport

    class Corrupting(InProcessTransport):
        def stream(self, request, participants=None, tolerate_failures=False):
            for r in super().stream(request, participants, tolerate_failures):
                hit = (isinstance(r, Reply) and r.client == client and r.round == round
                       and r.task == task)
                yield fault(r) if hit else r

    name = f"probe_{next(_transport_names)}"
    register_transport(name, lambda clients, timeout: Corrupting(clients))
    return name


def with_arrays(reply, fn):
    return dataclasses.replace(reply, arrays=fn(dict(reply.arrays)))


def first_vector(arrays):
    return next(k for k, v in sorted(arrays.items()) if np.ndim(v) == 1 and np.size(v) > 1)


def reply_case(fault, secure=False, **opts):
    X, y = synth()
    o = dict(max_iter=8, seed=0, batch_size=10, tau=1.0, eval_every=2)
    if secure:
        o["secure_aggregation"] = True
    res = ls_problem(X, y).solve(transport=corrupting(fault), **{**o, **opts})
    raise Verdict("silent_wrong", f"the faulty reply was accepted ({res.status}, nit {res.nit})")


# -- client faults: a trigger file set by the callback, read in the clients -----------------------

def faulty(ctx, action, at=3):
    """A least-squares problem whose gradient does ``action()`` on client 0 once the callback
    has created the trigger file (after round ``at``)."""
    trigger = ctx.path("trigger")
    X, y = synth()
    base = ls_function()

    def grad(w, X_, y_):
        if os.path.exists(trigger) and len(y_) and float(y_[0]) in mine:
            out = action()
            if out is not NotImplemented:
                return out
        return base.grad(w, X_, y_)

    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    mine = set(data.clients[0].y.tolist())         # client 0's targets identify its rows
    prob = ss.Problem(ss.SampleFunction(base.value, grad, name="ls"), dim=X.shape[1],
                      data=data)

    def callback(it):
        if it.t == at:
            Path(trigger).touch()
            callback.fired = time.monotonic()
    callback.fired = None
    return prob, callback, X, y


def timed_error(ctx, action, limit, **opts):
    """Solve with a fault from round 3; the error must come within ``limit`` s of it."""
    prob, cb, X, y = faulty(ctx, action)
    try:
        res = prob.solve(batch_size="full", tau=1.0, max_iter=30, seed=0, callback=cb, **opts)
    except BaseException as exc:
        waited = time.monotonic() - cb.fired if cb.fired else float("nan")
        if waited > limit:
            raise Verdict("hang", f"{type(exc).__name__} only {waited:.1f} s after the fault "
                          f"(limit {limit} s): {exc}") from None
        exc.probe_note = f"{waited:.1f} s after the fault"
        raise
    raise Verdict("silent_wrong", f"no error: {res.status}, nit {res.nit}")


def sleep_forever():
    time.sleep(10 ** 6)


def drop_case(ctx, transport, limit, **opts):
    prob, cb, X, y = faulty(ctx, sleep_forever)
    t0 = time.monotonic()
    res = prob.solve(batch_size="full", tau=1.0, max_iter=20, seed=0, callback=cb,
                     on_client_failure="drop", client_timeout=3, transport=transport, **opts)
    took = time.monotonic() - t0
    if took > limit:
        raise Verdict("hang", f"the solve took {took:.0f} s (limit {limit} s)")
    # a client left out cannot be part of a full-data claim
    return check_ls(res, X, y, want_converged=False)


# =================================================================================================
# The cases
# =================================================================================================

# -- checkpoint paths (checked before round 1; write failures later) ------------------------------

def _never_run(ctx, path, names=()):
    rounds = []
    X, y = synth()
    res = ls_problem(X, y).solve(max_iter=5, seed=0, checkpoint=path,
                                 callback=lambda it: rounds.append(it.t))
    raise Verdict("silent_wrong", f"accepted: {res.status} after {len(rounds)} rounds")


@case("checkpoint_path", "clear_error", names=("does not exist", "checkpoint="))
def ckpt_path_missing_directory(ctx):
    _never_run(ctx, ctx.path("no/such/dir/run.npz"))


@case("checkpoint_path", "clear_error", names=("is a file", "checkpoint="))
def ckpt_path_file_as_directory(ctx):
    Path(ctx.path("plain")).write_text("x")
    _never_run(ctx, ctx.path("plain/run.npz"))


@case("checkpoint_path", "clear_error", names=("is a directory", "checkpoint="))
def ckpt_path_is_a_directory(ctx):
    os.mkdir(ctx.path("d.npz"))
    _never_run(ctx, ctx.path("d.npz"))


@case("checkpoint_path", "clear_error", names=("is a directory",))
def ckpt_path_trailing_slash(ctx):
    os.mkdir(ctx.path("d2"))
    _never_run(ctx, ctx.path("d2") + "/")


@case("checkpoint_path", "clear_error", names=("cannot create a file", "/sys"))
def ckpt_path_read_only_directory(ctx):
    # the probe runs as root, which a chmod-ed directory does not stop: sysfs refuses anyone
    _never_run(ctx, "/sys/probe_run.npz")


@case("checkpoint_path", "clear_error", names=("not a regular file",))
def ckpt_path_special_file(ctx):
    _never_run(ctx, "/dev/null")


@case("checkpoint_path", "clear_error", names=("bytes free",))
def ckpt_path_no_space_before_round_1(ctx):
    import shutil as sh
    real = sh.disk_usage
    sh.disk_usage = lambda p: real(p)._replace(free=100)
    _never_run(ctx, ctx.path("run.npz"))


@case("checkpoint_path", "clear_error", names=("checkpoint",))
def ckpt_path_not_a_path(ctx):
    _never_run(ctx, 12345)


@case("checkpoint_path", "clear_error", names=("checkpoint_every",))
def ckpt_every_zero(ctx):
    X, y = synth()
    res = ls_problem(X, y).solve(max_iter=5, seed=0, checkpoint=ctx.path("r.npz"),
                                 checkpoint_every=0)
    raise Verdict("silent_wrong", f"accepted ({res.status})")


def _enospc_after(n_ok):
    """np.savez in the library's writer: the first ``n_ok`` calls work, the others write a
    little and raise OSError(ENOSPC), as a full disk would."""
    from ssca_solver import npzfile
    real = npzfile.np.savez
    calls = [0]

    def savez(f, **payload):
        calls[0] += 1
        if calls[0] <= n_ok:
            return real(f, **payload)
        f.write(b"PK\x03\x04partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    npzfile.np.savez = savez


def _stray(ctx):
    return sorted(p.name for p in ctx.tmp.iterdir() if p.name.startswith(".") or
                  p.name.endswith(".tmp"))


@case("checkpoint_path", "correct")
def ckpt_full_disk_every_write_run_goes_on(ctx):
    _enospc_after(0)
    X, y = synth()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = ls_problem(X, y).solve(max_iter=60, seed=0, checkpoint=ctx.path("run.npz"),
                                     checkpoint_every=5)
    if _stray(ctx):
        raise Verdict("crash", f"stray files {_stray(ctx)}")
    if not any("could not write" in str(x.message) for x in w):
        raise Verdict("silent_wrong", "the failed writes were not reported")
    return check_ls(res, X, y, want_converged=False)


@case("checkpoint_path", "clear_error", names=("no such",), state=True)
def ckpt_full_disk_then_user_function_fails(ctx):
    """The disk fills after the first checkpoint; then the user's function raises: the
    error carries the state and names the last good checkpoint, and nothing stray is left."""
    _enospc_after(1)

    def action():
        raise RuntimeError("no such sensor")
    prob, cb, X, y = faulty(ctx, action, at=12)
    path = ctx.path("run.npz")
    try:
        # the growing batches: a run long enough for the fault at round 12
        prob.solve(max_iter=60, seed=0, checkpoint=path, checkpoint_every=5, callback=cb,
                   batch_size="grow")
    except ss.SSCAError as exc:
        if _stray(ctx):
            raise Verdict("crash", f"stray files {_stray(ctx)}") from None
        if exc.checkpoint != path or int(state_of(path, "state/t")) != 5:
            raise Verdict("crash", f"exc.checkpoint {exc.checkpoint!r} is not the last good "
                          "checkpoint of round 5") from None
        raise
    raise Verdict("silent_wrong", "no error")


@case("checkpoint_path", "correct")
def ckpt_directory_removed_mid_run(ctx):
    X, y = synth()
    sub = ctx.tmp / "sub"
    sub.mkdir()

    def cb(it):
        if it.t == 7:
            shutil.rmtree(sub)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = ls_problem(X, y).solve(max_iter=60, seed=0, checkpoint=str(sub / "run.npz"),
                                     checkpoint_every=5, callback=cb)
    if not any("could not write" in str(x.message) for x in w):
        raise Verdict("silent_wrong", "the failed writes were not reported")
    return check_ls(res, X, y, want_converged=False)


@case("checkpoint_path", "correct")
def ckpt_directory_put_in_place_mid_run(ctx):
    X, y = synth()
    path = ctx.path("run.npz")

    def cb(it):
        if it.t == 7:
            os.unlink(path)
            os.mkdir(path)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = ls_problem(X, y).solve(max_iter=60, seed=0, checkpoint=path, checkpoint_every=5,
                                     callback=cb)
    if not any("could not write" in str(x.message) for x in w):
        raise Verdict("silent_wrong", "the failed writes were not reported")
    if _stray(ctx):
        raise Verdict("crash", f"stray files {_stray(ctx)}")
    return check_ls(res, X, y, want_converged=False)


@case("checkpoint_path", "correct")
def ckpt_resume_and_checkpoint_the_same_file(ctx):
    prob, path, o, X, y = written(ctx)
    res = prob.solve(**o, resume=path, checkpoint=path)
    full = prob.solve(**o)
    if not np.array_equal(res.x, full.x) or int(state_of(path, "state/t")) != res.nit:
        raise Verdict("silent_wrong", "not the uninterrupted iterates, or the file not updated")
    return Verdict("correct", f"{res.status}, nit {res.nit}")


@case("checkpoint_path", "correct")
def ckpt_written_when_a_round_fails(ctx):
    def action():
        raise RuntimeError("sensor offline")
    prob, cb, X, y = faulty(ctx, action, at=12)
    path = ctx.path("run.npz")
    o = dict(max_iter=60, seed=0, batch_size="grow")    # long enough for the fault at round 12
    try:
        prob.solve(**o, checkpoint=path, callback=cb)
    except ss.UserFunctionError as exc:
        if exc.state is None or exc.checkpoint != path or exc.state.t != 12:
            raise Verdict("crash", f"state {exc.state}, checkpoint {exc.checkpoint}") from None
    os.unlink(ctx.path("trigger"))
    res = prob.solve(**o, resume=path)
    full = prob.solve(**o)
    if not np.array_equal(res.x, full.x):
        raise Verdict("silent_wrong", "the resumed run is not the uninterrupted one")
    return Verdict("correct", f"resumed from round 12 to the uninterrupted {res.status}")


# -- resume with other data, problems or options ---------------------------------------------------

@case("resume_mismatch", "correct")
def resume_same_everything(ctx):
    return resume_check(ctx, *written(ctx))


@case("resume_mismatch", "correct")
def resume_longer_max_iter(ctx):
    prob, path, o, X, y = written(ctx, max_iter=20, stop_at=20)
    res = prob.solve(**{**o, "max_iter": 60}, resume=path)
    full = prob.solve(**{**o, "max_iter": 60})
    if not np.array_equal(res.x, full.x):
        raise Verdict("silent_wrong", "the continued run is not the uninterrupted one")
    return Verdict("correct", f"{res.status}, nit {res.nit}")


@case("resume_mismatch", "clear_error", names=("fingerprint.data[0]", "run.npz"))
def resume_other_data_same_shape(ctx):
    prob, path, o, X, y = written(ctx)
    X2, y2 = synth(seed=1)
    ls_problem(X2, y2).solve(**o, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("fingerprint.data[", "run.npz"))
def resume_one_row_changed(ctx):
    prob, path, o, X, y = written(ctx)
    X2 = X.copy()
    X2[-1, 0] += 1e-9
    ls_problem(X2, y).solve(**o, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("seed",))
def resume_other_seed(ctx):
    prob, path, o, X, y = written(ctx)
    prob.solve(**{**o, "seed": 1}, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("batch_size", "run.npz"))
def resume_other_batch_size(ctx):
    prob, path, o, X, y = written(ctx)
    prob.solve(**{**o, "batch_size": 7}, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("tau", "run.npz"))
def resume_other_tau(ctx):
    prob, path, o, X, y = written(ctx, tau=1.0, batch_size=10)
    prob.solve(**{**o, "tau": 2.0}, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("rho", "run.npz"))
def resume_other_rho(ctx):
    prob, path, o, X, y = written(ctx, tau=1.0, batch_size=10)
    prob.solve(**{**o, "rho": ss.PowerStep(0.5, 0.3)}, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("client_sizes", "run.npz"))
def resume_other_client_split(ctx):
    prob, path, o, X, y = written(ctx)
    ls_problem(X, y, clients=3).solve(**o, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("dim", "run.npz"))
def resume_other_dimension(ctx):
    prob, path, o, X, y = written(ctx)
    ls_problem(np.c_[X, X[:, :1]], y).solve(**o, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("method", "run.npz"))
def resume_other_method(ctx):
    prob, path, o, X, y = written(ctx)
    prob.solve(method="fedavg", **o, resume=path)
    raise Verdict("silent_wrong", "accepted")


def _constrained_written(ctx):
    """A constrained solve stopped at round 10 with a checkpoint: (X, y, problem, path, opts)."""
    X, y = synth()
    prob, U = constrained(X, y)
    path = ctx.path("run.npz")
    o = dict(max_iter=200, seed=0)
    prob.solve(**o, checkpoint=path, callback=lambda it: it.t >= 10)
    return X, y, prob, path, o


@case("resume_mismatch", "clear_error", names=(("bounds", "constraints"), "run.npz"))
def resume_other_bound(ctx):
    X, y, prob, path, o = _constrained_written(ctx)
    constrained(X, y, share=0.3)[0].solve(**o, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("penalty", "run.npz"))
def resume_other_penalty(ctx):
    X, y, prob, path, o = _constrained_written(ctx)
    prob.solve(**o, penalty=[10.0, 1e3], resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("x0", "run.npz"))
def resume_other_x0(ctx):
    prob, path, o, X, y = written(ctx)
    prob.solve(**o, x0=np.ones(X.shape[1]), resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("run.npz",))
def resume_missing_file(ctx):
    X, y = synth()
    try:
        ls_problem(X, y).solve(max_iter=5, seed=0, resume=ctx.path("run.npz"))
    except FileNotFoundError as exc:
        if not isinstance(exc, ss.SSCAError):
            raise Verdict("crash", f"raw FileNotFoundError: {exc}") from None
        raise
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("res.npz",))
def resume_from_a_saved_result(ctx):
    X, y = synth()
    prob = ls_problem(X, y)
    res = prob.solve(max_iter=5, seed=0)
    res.save(ctx.path("res.npz"))
    prob.solve(max_iter=5, seed=0, resume=ctx.path("res.npz"))
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("rdir",))
def resume_from_a_directory(ctx):
    os.mkdir(ctx.path("rdir"))
    X, y = synth()
    ls_problem(X, y).solve(max_iter=5, seed=0, resume=ctx.path("rdir"))
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "correct")
def resume_edited_function_warns(ctx):
    prob, path, o, X, y = written(ctx)
    base = ls_function()
    f2 = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                           lambda w, X, y: X.T @ (X @ w - y) / len(y) * 1.0, name="ls")
    p2 = ss.Problem(f2, dim=X.shape[1], data=ss.FederatedData.split(X, y, num_clients=4, seed=0))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = p2.solve(**o, resume=path)
    if not any(issubclass(x.category, RuntimeWarning) and "ls" in str(x.message) for x in w):
        raise Verdict("silent_wrong", "another function's code resumed without a word")
    del base
    return check_ls(res, X, y, want_converged=False)


@case("resume_mismatch", "clear_error", names=("eval_every",), accept=("clear_error", "correct"))
def resume_other_eval_every(ctx):
    # eval_every changes only what is recorded, not the iterates: either is fine, silently
    # mixing is not (the check: same iterates as the uninterrupted run)
    prob, path, o, X, y = written(ctx)
    res = prob.solve(**o, eval_every=3, resume=path)
    full = prob.solve(**o)
    if not np.array_equal(res.x, full.x):
        raise Verdict("silent_wrong", "other iterates after a resume with another eval_every")
    return Verdict("correct", "the same iterates")


# -- hand-edited metadata --------------------------------------------------------------------------

def _meta_case(**changes):
    def fn(ctx):
        refused(ctx, meta_edit(**changes))
    return fn


META_CASES = {
    "stage_99": (dict(stage=99), ("stage",)),
    "stage_negative": (dict(stage=-1), ("stage",)),
    "stage_string": (dict(stage="0"), ("stage",)),
    "stage_float": (dict(stage=0.5), ("stage",)),
    "round_huge": (dict(round=10 ** 9), ("round",)),
    "round_negative": (dict(round=-3), ("round",)),
    "round_other": (dict(round=7), ("round",)),
    "seed_missing": (dict(seed=DELETE), ("seed",)),
    "seed_other": (dict(seed="12345"), ("seed",)),
    "seed_not_a_number": (dict(seed="abc"), ("seed",)),
    "fingerprint_missing": (dict(fingerprint=DELETE), ("fingerprint",)),
    "fingerprint_a_list": (dict(fingerprint=[1, 2]), ("fingerprint",)),
    "method_other": (dict(method="fedavg"), ("method",)),
    "format_newer": (dict(format="ssca-solver-checkpoint/9"), ("format",)),
    "elapsed_negative": (dict(elapsed=-5.0), ("elapsed",)),
    "elapsed_string": (dict(elapsed="soon"), ("elapsed",)),
    "x0_hash_missing": (dict(x0=DELETE), ("x0",)),
    "grad_scale_nan": (dict(grad_scale=float("nan")), ("grad_scale",)),
    "grad_scale_negative": (dict(grad_scale=-1.0), ("grad_scale",)),
    "grad_scale_string": (dict(grad_scale="big"), ("grad_scale",)),
    "curvature_negative": (dict(curvature=-4.0), ("curvature",)),
    "curvature_string": (dict(curvature=[1, 2]), ("curvature",)),
    "value_start_nan": (dict(value_start=float("nan")), ("value_start",)),
    "constraint_scale_negative": (dict(constraint_scale=-1.0), ("constraint_scale",)),
}

for _key, (_changes, _names) in META_CASES.items():
    add(f"meta_{_key}", "checkpoint_metadata", "clear_error", _meta_case(**_changes),
        names=_names + ("edited.npz",))


@case("checkpoint_metadata", "clear_error", names=("edited.npz",))
def meta_not_json(ctx):
    refused(ctx, lambda m: "{not json")


@case("checkpoint_metadata", "clear_error", names=("edited.npz",))
def meta_a_json_list(ctx):
    refused(ctx, lambda m: "[1, 2, 3]")


@case("checkpoint_metadata", "clear_error", names=("edited.npz", "__meta__"))
def meta_member_missing(ctx):
    refused(ctx, drop=("__meta__",))


@case("checkpoint_metadata", "clear_error", names=("dim", "edited.npz"))
def meta_fingerprint_dim_edited(ctx):
    def edit(m):
        m["fingerprint"]["dim"] = 11
        return m
    refused(ctx, edit)


@case("checkpoint_metadata", "clear_error", names=("edited.npz",),
      accept=("clear_error", "correct"))
def meta_unknown_key_added(ctx):
    prob, path, o, X, y = written(ctx)
    bad = rewrite(path, ctx.path("edited.npz"), meta_edit(comment="hand-made"))
    return resume_check(ctx, prob, bad, o, X, y)


# -- damaged checkpoint files ----------------------------------------------------------------------

def _damaged(ctx, damage):
    prob, path, o, X, y = written(ctx)
    raw = Path(path).read_bytes()
    bad = ctx.path("edited.npz")
    Path(bad).write_bytes(damage(raw))
    res = prob.solve(**o, resume=bad)
    raise Verdict("silent_wrong", f"accepted ({res.status})")


def _flip(raw, at):
    b = bytearray(raw)
    b[at] ^= 0x10
    return bytes(b)


def _offset_of(raw, member, skip=200):
    """An offset inside ``member``'s data (past its .npy header)."""
    i = raw.index(member.encode())
    return i + len(member) + skip


for _key, _damage in {
    "empty": lambda raw: b"",
    "truncated_half": lambda raw: raw[: len(raw) // 2],
    "truncated_100_bytes": lambda raw: raw[:100],
    "truncated_end_record": lambda raw: raw[:-10],
    "not_a_zip": lambda raw: b"checkpoint\n" * 100,
    "random_bytes": lambda raw: np.random.default_rng(0).bytes(len(raw)),
    "bit_flip_state_w": lambda raw: _flip(raw, _offset_of(raw, "state/w.npy", 140)),
    "bit_flip_meta": lambda raw: _flip(raw, _offset_of(raw, "__meta__.npy", 600)),
    "bit_flip_directory": lambda raw: _flip(raw, len(raw) - 300),
}.items():
    add(f"file_{_key}", "checkpoint_file", "clear_error",
        (lambda d: lambda ctx: _damaged(ctx, d))(_damage), names=("edited.npz",))


@case("checkpoint_file", "clear_error", names=("edited.npz",))
def file_empty_zip(ctx):
    prob, path, o, X, y = written(ctx)
    with zipfile.ZipFile(ctx.path("edited.npz"), "w"):
        pass
    prob.solve(**o, resume=ctx.path("edited.npz"))
    raise Verdict("silent_wrong", "accepted")


@case("checkpoint_file", "clear_error", names=("state/w", "edited.npz"), timeout=120)
def file_decompression_bomb(ctx):
    """state/w declared as 400 MB of zeros, deflated to a few hundred kB: refused before it
    is inflated (peak memory must not grow by the member's size)."""
    import resource
    prob, path, o, X, y = written(ctx)
    bad = ctx.path("edited.npz")
    n = 50_000_000
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            if info.filename != "state/w.npy":
                zout.writestr(info, zin.read(info))
        zi = zipfile.ZipInfo("state/w.npy")
        zi.compress_type = zipfile.ZIP_DEFLATED
        with zout.open(zi, "w", force_zip64=True) as f:
            buf = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                buf, {"descr": "<f8", "fortran_order": False, "shape": (n,)})
            f.write(buf.getvalue())
            chunk = bytes(1 << 20)
            for _ in range(n * 8 >> 20):
                f.write(chunk)
    size = os.path.getsize(bad)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        prob.solve(**o, resume=bad)
    except ss.SSCAError:
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        if grew > 100:
            raise Verdict("crash", f"refused, but peak memory grew {grew:.0f} MB on a "
                          f"{size / 1e3:.0f} kB file") from None
        raise
    raise Verdict("silent_wrong", "accepted")


for _key, (_kw, _names) in {
    "state_w_wrong_length": (lambda p: dict(members={"state/w": np.zeros(5)}), ("state/w",)),
    "state_w_nan": (lambda p: dict(members={"state/w": np.full(6, np.nan)}), ("state/w",)),
    "state_w_inf": (lambda p: dict(members={"state/w": np.r_[np.inf, np.zeros(5)]}),
                    ("state/w",)),
    "state_w_complex": (lambda p: dict(members={"state/w": np.zeros(6, complex)}), ("state/w",)),
    "state_w_int": (lambda p: dict(members={"state/w": np.zeros(6, np.int64)}), ("state/w",)),
    "state_w_2d": (lambda p: dict(members={"state/w": np.zeros((6, 1))}), ("state/w",)),
    "state_w_pickled_object": (lambda p: dict(members={"state/w": np.array([object()] * 6)}),
                               ("state/w",)),
    "state_w_missing": (lambda p: dict(drop=("state/w",)), ("state/w",)),
    "state_tau_negative": (lambda p: dict(members={"state/tau": np.array(-1.0)}), ("state/tau",)),
    "state_tau_nan": (lambda p: dict(members={"state/tau": np.array(np.nan)}), ("state/tau",)),
    "state_batch_zero": (lambda p: dict(members={"state/batch": np.array(0)}), ("state/batch",)),
    "state_t_mismatch": (lambda p: dict(members={"state/t": np.array(3)}), ("state/t",)),
    "stats_lin_nan": (lambda p: dict(members={"state/stats/0/lin": np.full(6, np.nan)}),
                      ("state/stats/0/lin",)),
    "stats_quad_negative": (lambda p: dict(members={"state/stats/0/quad": np.array(-5.0)}),
                            ("state/stats/0/quad",)),
    "history_column_short": (lambda p: dict(members={"history/rho": np.zeros(3)}),
                             ("history/rho",)),
    "tally_negative": (lambda p: dict(members={"tally/up": np.array(-7.0)}), ("tally/up",)),
}.items():
    add(f"file_{_key}", "checkpoint_file", "clear_error",
        (lambda k: lambda ctx: refused(ctx, **k(None)))(_kw), names=_names + ("edited.npz",))


@case("checkpoint_file", "clear_error", names=("edited.npz",), accept=("clear_error", "correct"))
def file_extra_member(ctx):
    prob, path, o, X, y = written(ctx)
    bad = rewrite(path, ctx.path("edited.npz"), extra={"state/bonus": np.ones(3)})
    return resume_check(ctx, prob, bad, o, X, y)


# -- malformed client replies (plain and secure aggregation) --------------------------------------

def _reply_faults():
    def arr(fn):
        return lambda r: with_arrays(r, fn)

    def vec(change):
        def fn(a):
            k = first_vector(a)
            a[k] = change(np.asarray(a[k]))
            return a
        return arr(fn)

    def drop_one(a):
        a.pop(first_vector(a))
        return a

    return {
        "wrong_shape": (vec(lambda v: v[:-1]), ("client 1",)),
        "wrong_shape_2d": (vec(lambda v: v[:, None]), ("client 1",)),
        "nan": (vec(lambda v: np.full_like(v, np.nan)), ("client 1",)),
        "inf": (vec(lambda v: np.r_[np.inf, v[1:]]), ("client 1",)),
        "bool": (vec(lambda v: v > 0), ("client 1",)),
        "complex": (vec(lambda v: v.astype(complex)), ("client 1",)),
        "object": (vec(lambda v: v.astype(object)), ("client 1",)),
        "list": (vec(lambda v: v.tolist()), ("client 1",)),
        "missing_array": (arr(drop_one), ("client 1",)),
        "extra_array": (arr(lambda a: {**a, "bonus": np.ones(3)}), ("client 1",)),
        "none": (lambda r: None, ("client",)),
        "other_client_id": (lambda r: dataclasses.replace(r, client=0), ("client",)),
        "other_round": (lambda r: dataclasses.replace(r, round=99), ("client 1",)),
        "absurd_1e300": (vec(lambda v: v * 1e300 + 1e300), ("client 1",)),
    }


def _secure_faults():
    def masked(change):
        return lambda r: with_arrays(r, lambda a: {**a, "masked": change(np.asarray(a["masked"]))}
                                     if "masked" in a else a)
    return {
        "secure_wrong_length": (masked(lambda v: v[:-1]), ("client 1",)),
        "secure_float": (masked(lambda v: v.astype(float) + 0.5), ("client 1",)),
        "secure_bool": (masked(lambda v: v > 0), ("client 1",)),
        "secure_2d": (masked(lambda v: v[:, None]), ("client 1",)),
        "secure_missing": (lambda r: with_arrays(r, lambda a: {k: v for k, v in a.items()
                                                               if k != "masked"}), ("client 1",)),
        "secure_extra": (lambda r: with_arrays(r, lambda a: {**a, "bonus": np.ones(3)}),
                         ("client 1",)),
        "secure_none": (lambda r: None, ("client",)),
        "secure_random": (masked(lambda v: np.random.default_rng(1).integers(
            0, 2 ** 62, size=v.shape, dtype=v.dtype) if v.dtype.kind in "iu" else v * 3),
            ("corrupted",)),                            # secure aggregation cannot say whose
    }


def _reply_fn(fault, secure):
    return lambda ctx: reply_case(fault, secure=secure)


for _key, (_fault, _names) in _reply_faults().items():
    add(f"reply_{_key}", "reply", "clear_error", _reply_fn(_fault, False),
        names=_names + ("round 3",))
for _key, (_fault, _names) in _secure_faults().items():
    add(f"reply_{_key}", "reply_secure", "clear_error", _reply_fn(_fault, True), names=_names,
        needs="cryptography")


@case("reply", "correct")
def reply_integer_arrays(ctx):
    """Integer arrays combine as the floats they equal (an integral reply is fine)."""
    def fault(r):
        return with_arrays(r, lambda a: {k: (np.round(v).astype(np.int64) if np.ndim(v) else v)
                                         for k, v in a.items()})
    X, y = synth()
    res = ls_problem(X, y).solve(transport=corrupting(fault), max_iter=8, seed=0, batch_size=10,
                                 tau=1.0)
    return Verdict("correct", f"accepted as floats ({res.status})")


@case("reply", "correct")
def reply_drop_mode_makes_it_a_dropout(ctx):
    X, y = synth()
    fault = _reply_faults()["nan"][0]
    res = ls_problem(X, y).solve(transport=corrupting(fault), max_iter=8, seed=0, batch_size=10,
                                 tau=1.0, on_client_failure="drop")
    drops = getattr(res, "dropouts", None)
    if not drops:
        raise Verdict("silent_wrong", f"no dropout recorded ({res.status})")
    return Verdict("correct", f"{len(drops)} dropout(s) recorded, {res.status}")


# -- the user's function failing in a client -------------------------------------------------------

def _fault_case(transport, action, names, secure=False, limit=30.0, timeout=None):
    def fn(ctx):
        opts = {"transport": transport}
        if secure:
            opts["secure_aggregation"] = True
        if timeout is not None:
            opts["client_timeout"] = timeout
        timed_error(ctx, action, limit, **opts)
    return fn


def _raise():
    raise RuntimeError("sensor offline")


def _nan_grad():
    return np.full(6, np.nan)


def _short_grad():
    return np.zeros(5)


def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def _exit_self():
    os._exit(3)


_FAULTS = {
    "raises": (_raise, ("ls", "client 0")),
    "returns_none": (lambda: None, ("ls", "client 0")),
    "returns_nan": (_nan_grad, ("ls", "client 0")),
    "wrong_shape": (_short_grad, ("ls", "client 0")),
}
for _tr in ("inprocess", "process"):
    for _key, (_act, _names) in _FAULTS.items():
        for _sec in (False, True):
            if _sec and _key in ("returns_none", "wrong_shape"):
                continue
            add(f"client_{_tr}_{_key}" + ("_secure" if _sec else ""), "client_fault",
                "clear_error", _fault_case(_tr, _act, _names, _sec), names=_names, state=True,
                timeout=90.0, needs="cryptography" if _sec else None)

add("client_process_killed", "client_fault", "clear_error",
    _fault_case("process", _kill_self, ("client 0",), limit=20.0), ("client 0", "SIGKILL"), True,
    ("clear_error",), 90.0)
add("client_process_exits", "client_fault", "clear_error",
    _fault_case("process", _exit_self, ("client 0",), limit=20.0), ("client 0",), True,
    ("clear_error",), 90.0)
add("client_process_sleeps_past_timeout", "timeout", "clear_error",
    _fault_case("process", sleep_forever, ("client 0",), limit=3 + 5, timeout=3),
    ("client 0", "round 4"), True, ("clear_error",), 90.0)
add("client_process_sleeps_past_timeout_secure", "timeout", "clear_error",
    _fault_case("process", sleep_forever, ("client 0",), secure=True, limit=3 + 5, timeout=3),
    ("client 0",), True, ("clear_error",), 90.0, needs="cryptography")
add("client_process_stopped_default_timeout", "timeout", "clear_error",
    _fault_case("process", lambda: os.kill(os.getpid(), signal.SIGSTOP), ("client 0",),
                limit=60 + 20), ("client 0",), True, ("clear_error",), 180.0, slow=True)
add("flower_sleeps_past_timeout", "timeout", "clear_error",
    _fault_case("flower", sleep_forever, ("client 0",), limit=5 + 5, timeout=5),
    ("client 0",), True, ("clear_error",), 300.0, slow=True, needs="flwr", grace=30.0)
add("flower_raises", "client_fault", "clear_error",
    _fault_case("flower", _raise, ("ls",), limit=60), ("ls", "client 0"), True,
    ("clear_error",), 300.0, slow=True, needs="flwr", grace=30.0)


@case("timeout", "correct", timeout=150)
def client_process_sleeps_drop_mode(ctx):
    return drop_case(ctx, "process", limit=100)


@case("timeout", "correct")
def client_inprocess_timeout_number_is_not_silent(ctx):
    X, y = synth()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ls_problem(X, y).solve(client_timeout=2, max_iter=5, seed=0)
    if not any("client_timeout" in str(x.message) for x in w):
        raise Verdict("silent_wrong", "client_timeout=2 in process silently ignored")
    return Verdict("correct", "warned that in-process clients cannot be timed out")


@case("timeout", "clear_error", names=("client_timeout",))
def client_timeout_negative(ctx):
    X, y = synth()
    ls_problem(X, y).solve(client_timeout=-1, transport="process", max_iter=5, seed=0)
    raise Verdict("silent_wrong", "accepted")


@case("timeout", "clear_error", names=("client_timeout",))
def client_timeout_nan(ctx):
    X, y = synth()
    ls_problem(X, y).solve(client_timeout=float("nan"), transport="process", max_iter=5, seed=0)
    raise Verdict("silent_wrong", "accepted")


@case("timeout", "correct", timeout=90)
def ctrl_c_process_transport(ctx):
    X, y = synth()
    path = ctx.path("run.npz")

    def cb(it):
        if it.t == 5:
            os.kill(os.getpid(), signal.SIGINT)
    try:
        ls_problem(X, y).solve(transport="process", checkpoint=path, max_iter=60, seed=0,
                               callback=cb)
    except KeyboardInterrupt as exc:
        if getattr(exc, "state", None) is None or getattr(exc, "checkpoint", None) != path:
            raise Verdict("crash", "Ctrl-C lost the work (no state or no checkpoint)") from None
        return Verdict("correct", f"state at round {exc.state.t}, checkpoint written")
    raise Verdict("silent_wrong", "Ctrl-C did not stop the solve")


# -- more checkpoint files: the zip's own structure ------------------------------------------------

def _zip_case(build):
    def fn(ctx):
        prob, path, o, X, y = written(ctx)
        bad = ctx.path("edited.npz")
        with zipfile.ZipFile(path) as zin, zipfile.ZipFile(bad, "w") as zout:
            build(zin, zout)
        res = prob.solve(**o, resume=bad)
        raise Verdict("silent_wrong", f"accepted ({res.status})")
    return fn


def _copy_all(zin, zout, skip=()):
    for info in zin.infolist():
        if info.filename not in skip:
            zout.writestr(info, zin.read(info))


def _meta_bomb(zin, zout):
    _copy_all(zin, zout, skip=("__meta__.npy",))
    zi = zipfile.ZipInfo("__meta__.npy")
    zi.compress_type = zipfile.ZIP_DEFLATED
    n = 50_000_000                              # characters: 200 MB of UCS-4
    with zout.open(zi, "w", force_zip64=True) as f:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": f"<U{n}", "fortran_order": False,
                                                   "shape": ()})
        f.write(buf.getvalue())
        chunk = b" \0\0\0" * (1 << 18)
        for _ in range(n * 4 // len(chunk)):
            f.write(chunk)


def _repeated(zin, zout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # zipfile warns of the duplicate name
        _copy_all(zin, zout)
        zout.writestr("state/w.npy", npy_bytes(np.ones(6)))


def _traversal(zin, zout):
    _copy_all(zin, zout)
    zout.writestr("../../escape.npy", npy_bytes(np.ones(3)))


def _many(zin, zout):
    _copy_all(zin, zout)
    for i in range(20000):
        zout.writestr(f"history/x{i}.npy", b"")


for _key, _build, _names in [
    ("meta_decompression_bomb", _meta_bomb, ("__meta__",)),
    ("repeated_member", _repeated, ("state/w",)),
    ("path_traversal_member", _traversal, ("escape",)),
    ("20000_members", _many, ("history/x",)),
]:
    add(f"file_{_key}", "checkpoint_file", "clear_error", _zip_case(_build),
        names=_names + ("edited.npz",), timeout=120)


@case("checkpoint_file", "clear_error", names=("fifo", "empty"))
def file_resume_from_a_fifo(ctx):
    """A named pipe as resume=: refused, not a read that waits for a writer forever."""
    prob, path, o, X, y = written(ctx)
    os.mkfifo(ctx.path("fifo"))
    prob.solve(**o, resume=ctx.path("fifo"))
    raise Verdict("silent_wrong", "accepted")


@case("checkpoint_path", "clear_error", names=("not a regular file",))
def ckpt_path_symlink_to_dev_null(ctx):
    os.symlink("/dev/null", ctx.path("link.npz"))
    _never_run(ctx, ctx.path("link.npz"))


@case("checkpoint_path", "correct")
def ckpt_path_pathlib(ctx):
    X, y = synth()
    prob = ls_problem(X, y)
    path = ctx.tmp / "run.npz"
    o = dict(max_iter=60, seed=0)
    prob.solve(**o, checkpoint=path, callback=lambda it: it.t >= 10)
    return resume_check(ctx, prob, path, o, X, y)


def _secure_written(ctx, **first):
    X, y = synth()
    prob = ls_problem(X, y)
    path = ctx.path("run.npz")
    o = dict(max_iter=30, seed=0, batch_size=10, tau=1.0)
    prob.solve(**o, **first, checkpoint=path, callback=lambda it: it.t >= 5)
    return prob, path, o


@case("resume_mismatch", "clear_error", names=("secure_aggregation", "run.npz"),
      needs="cryptography")
def resume_without_secure_aggregation(ctx):
    prob, path, o = _secure_written(ctx, secure_aggregation=True)
    prob.solve(**o, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "clear_error", names=("clients_per_round", "run.npz"))
def resume_other_clients_per_round(ctx):
    prob, path, o = _secure_written(ctx, clients_per_round=2)
    prob.solve(**o, clients_per_round=3, resume=path)
    raise Verdict("silent_wrong", "accepted")


@case("resume_mismatch", "correct")
def resume_other_checkpoint_every(ctx):
    prob, path, o, X, y = written(ctx)
    res = prob.solve(**o, resume=path, checkpoint=path, checkpoint_every=3)
    full = prob.solve(**o)
    if not np.array_equal(res.x, full.x):
        raise Verdict("silent_wrong", "another checkpoint_every changed the iterates")
    return Verdict("correct", "the uninterrupted iterates")


@case("client_fault", "correct", timeout=120, needs="cryptography")
def client_process_secure_drop_nan(ctx):
    """Secure aggregation on processes, on_client_failure="drop": client 0's gradient turns
    NaN from round 4; it is left out (a dropout) and the run goes on, honest about it."""
    prob, cb, X, y = faulty(ctx, _nan_grad)
    res = prob.solve(batch_size="full", tau=1.0, max_iter=12, seed=0, callback=cb,
                     transport="process", secure_aggregation=True, on_client_failure="drop")
    if not res.dropouts:
        raise Verdict("silent_wrong", "no dropout recorded")
    v = check_ls(res, X, y, want_converged=False)
    return Verdict(v.outcome, f"{len(res.dropouts)} dropouts; " + v.note)


@case("client_fault", "clear_error", names=("client 0",), state=True, timeout=120,
      needs="cryptography")
def client_process_secure_killed(ctx):
    timed_error(ctx, _kill_self, 20.0, transport="process", secure_aggregation=True)


def _explicit(change):
    def fn(ctx):
        X, y = synth()
        parts = [(X[:120].copy(), y[:120].copy()), (X[120:].copy(), y[120:].copy())]
        change(parts)
        res = ss.Problem(ls_function(), dim=6, data=ss.FederatedData(parts)).solve(seed=0)
        return check_ls(res, X, y) if parts[1][0].dtype != bool else Verdict(
            "correct", f"bool features accepted ({res.status})")
    return fn


for _key, _change, _expected, _names in [
    ("nan_in_client_1", lambda p: _set(p[1][0], (3, 1), np.nan), "clear_error", ("client 1",)),
    ("inf_y_in_client_1", lambda p: _set(p[1][1], 3, -np.inf), "clear_error", ("client 1",)),
    ("bool_X", lambda p: p.__setitem__(1, (p[1][0] > 0, p[1][1])), "clear_error",
     ("client 1", "bool")),
]:
    add(f"data_explicit_{_key}", "data", _expected, _explicit(_change), names=_names,
        accept=(("clear_error", "correct") if _key == "bool_X" else ()))


# -- operating-system limits -----------------------------------------------------------------------

def _nofile(limit):
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def _many_clients(n=100):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n * 3, 4))
    return ls_problem(X, X @ np.ones(4), clients=n), X


@case("resources", "clear_error", names=("ulimit -n", "100 clients"), timeout=120)
def fds_100_clients_limit_64(ctx):
    _nofile(64)
    prob, X = _many_clients()
    prob.solve(transport="process", max_iter=3, seed=0)
    raise Verdict("silent_wrong", "ran")


@case("resources", "clear_error", names=("ulimit -n",), timeout=120)
def fds_100_clients_limit_256(ctx):
    _nofile(256)
    prob, X = _many_clients()
    prob.solve(transport="process", max_iter=3, seed=0)
    raise Verdict("silent_wrong", "ran")


@case("resources", "correct", timeout=180)
def fds_100_clients_limit_1024(ctx):
    _nofile(1024)
    prob, X = _many_clients()
    res = prob.solve(transport="process", max_iter=3, seed=0, batch_size="full", tau=1.0)
    ref = ls_problem(X, X @ np.ones(4), clients=100).solve(max_iter=3, seed=0,
                                                          batch_size="full", tau=1.0)
    if not np.allclose(res.x, ref.x, rtol=1e-12, atol=1e-14):
        raise Verdict("silent_wrong", "the process transport's iterates differ from in-process")
    return Verdict("correct", "100 client processes, the in-process iterates")


# -- options the stop test might ignore ------------------------------------------------------------

def _opt_constrained(**opts):
    X, y = synth()
    prob, U = constrained(X, y)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = prob.solve(seed=0, **opts)
    return res, X, y, U, w


@case("options", "correct")
def opt_constrained_defaults(ctx):
    res, X, y, U, w = _opt_constrained()
    return check_constrained(res, X, y, U)


@case("options", "correct")
def opt_slack_tol_1e_10(ctx):
    res, X, y, U, w = _opt_constrained(slack_tol=1e-10)
    if not any("slack_tol" in str(x.message) for x in w):
        v = check_constrained(res, X, y, U, want_converged=False)
        raise Verdict("silent_wrong" if res.success else v.outcome,
                      "slack_tol below feas_tol without a word: " + v.note)
    return check_constrained(res, X, y, U, want_converged=False)


@case("options", "correct")
def opt_feas_tol_1e_12(ctx):
    res, X, y, U, w = _opt_constrained(feas_tol=1e-12)
    return check_constrained(res, X, y, U, feas_tol=1e-12, want_converged=False)


@case("options", "correct")
def opt_kkt_tol_1e_12(ctx):
    res, X, y, U, w = _opt_constrained(kkt_tol=1e-12)
    return check_constrained(res, X, y, U, kkt_tol=1e-12, want_converged=False)


@case("options", "correct")
def opt_kkt_tol_1e_12_unconstrained(ctx):
    X, y = synth()
    res = ls_problem(X, y).solve(seed=0, kkt_tol=1e-12)
    if res.success and res.kkt.stationarity_rel > 1e-12:
        raise Verdict("silent_wrong", f"converged with stationarity {res.kkt.stationarity_rel}")
    return check_ls(res, X, y, want_converged=False)


@case("options", "correct")
def opt_kkt_tol_loose(ctx):
    res, X, y, U, w = _opt_constrained(kkt_tol=0.5, feas_tol=0.5)
    return check_constrained(res, X, y, U, feas_tol=0.5, kkt_tol=0.5, want_converged=False)


@case("options", "clear_error", names=("kkt_tol",), accept=("clear_error", "correct"))
def opt_kkt_tol_zero(ctx):
    res, X, y, U, w = _opt_constrained(kkt_tol=0.0, max_iter=300)
    return check_constrained(res, X, y, U, kkt_tol=0.0, want_converged=False)


for _key, _opts, _names in [
    ("feas_tol_negative", dict(feas_tol=-1.0), ("feas_tol",)),
    ("kkt_tol_nan", dict(kkt_tol=float("nan")), ("kkt_tol",)),
    ("slack_tol_string", dict(slack_tol="tight"), ("slack_tol",)),
    ("penalty_decreasing", dict(penalty=[10.0, 1.0]), ("penalty",)),
    ("penalty_zero", dict(penalty=0.0), ("penalty",)),
    ("tau_zero", dict(tau=0.0), ("tau",)),
    ("tau_nan", dict(tau=float("nan")), ("tau",)),
    ("rho_above_one", dict(rho=2.0), ("rho",)),
    ("gamma_negative", dict(gamma=-0.5), ("gamma",)),
    ("batch_size_zero", dict(batch_size=0), ("batch_size",)),
    ("batch_size_too_large", dict(batch_size=10 ** 6), ("batch_size",)),
    ("batch_size_string", dict(batch_size="half"), ("batch_size",)),
    ("batch_size_float", dict(batch_size=2.5), ("batch_size",)),
    ("max_iter_negative", dict(max_iter=-1), ("max_iter",)),
    ("max_iter_float", dict(max_iter=2.5), ("max_iter",)),
    ("seed_string", dict(seed="abc"), ("seed",)),
    ("eval_every_negative", dict(eval_every=-3), ("eval_every",)),
    ("clients_per_round_zero", dict(clients_per_round=0), ("clients_per_round",)),
    ("clients_per_round_too_many", dict(clients_per_round=9), ("clients_per_round",)),
    ("on_client_failure_unknown", dict(on_client_failure="ignore"), ("on_client_failure",)),
    ("transport_unknown", dict(transport="carrier-pigeon"), ("carrier-pigeon",)),
    ("subproblem_unknown", dict(subproblem="newton"), ("subproblem",)),
    ("solver_unknown", dict(subproblem="cvxpy", solver="NOSUCH"), ("NOSUCH",)),
    ("solver_options_not_a_dict", dict(subproblem="cvxpy", solver_options=[1]),
     ("solver_options",)),
    ("misspelled_option", dict(max_iters=5), ("max_iter",)),
    ("client_threads_inprocess", dict(client_threads=2), ("client_threads",)),
    ("secure_range_negative", dict(secure_aggregation=True, secure_range=-1.0),
     ("secure_range",)),
    ("x0_wrong_length", dict(x0=np.zeros(5)), ("x0",)),
    ("x0_nan", dict(x0=np.full(6, np.nan)), ("x0",)),
    ("x0_2d", dict(x0=np.zeros((6, 1))), ("x0",)),
    ("x0_string", dict(x0="zeros"), ("x0",)),
    ("hessian_unknown", dict(hessian="bfgs"), ("hessian",)),
    ("surrogate_init_unknown", dict(surrogate_init="one"), ("surrogate_init",)),
]:
    def _fn(ctx, _opts=_opts):
        X, y = synth()
        kw = {"max_iter": 5, "seed": 0, **_opts}
        res = constrained(X, y)[0].solve(**kw)
        raise Verdict("silent_wrong", f"accepted ({res.status})")
    CASES[f"opt_{_key}"] = Case(f"opt_{_key}", "options", "clear_error", _fn, _names, False,
                                ("clear_error",), 60.0)


@case("options", "correct", accept=("correct", "clear_error"), names=("1e+12", "penalty"))
def opt_penalty_1e12_cvxpy(ctx):
    res, X, y, U, w = _opt_constrained(penalty=1e12, subproblem="cvxpy", max_iter=100)
    return check_constrained(res, X, y, U, want_converged=False)


@case("options", "correct", accept=("correct", "clear_error"), names=("penalty",))
def opt_penalty_1e12_closed_form(ctx):
    res, X, y, U, w = _opt_constrained(penalty=1e12, max_iter=200)
    return check_constrained(res, X, y, U, want_converged=False)


@case("options", "correct", accept=("correct", "clear_error"), names=("tau",))
def opt_tiny_fixed_tau_full_batches(ctx):
    X, y = synth()
    res = ls_problem(X, y).solve(seed=0, tau=1e-6, batch_size="full", max_iter=200)
    return check_ls(res, X, y, want_converged=False)


@case("options", "correct")
def opt_max_iter_zero(ctx):
    X, y = synth()
    try:
        res = ls_problem(X, y).solve(seed=0, max_iter=0)
    except ValueError as exc:
        if "max_iter" in str(exc):
            return Verdict("correct", f"refused naming max_iter: {exc}")
        raise
    if res.success and rel(res.x, lstsq(X, y)) > 1e-2:
        raise Verdict("silent_wrong", f"max_iter=0 claims {res.status}")
    return Verdict("correct", f"{res.status}: {res.message[:100]}")


@case("options", "correct")
def opt_cvxpy_path_defaults(ctx):
    X, y = synth()
    res = ls_problem(X, y).solve(seed=0, subproblem="cvxpy", max_iter=200)
    return check_ls(res, X, y)


@case("options", "correct")
def opt_constrained_cvxpy_path(ctx):
    res, X, y, U, w = _opt_constrained(subproblem="cvxpy", max_iter=400)
    return check_constrained(res, X, y, U)


# -- data: integer types, scaling, tiny clients, bad shapes ----------------------------------------

def _int_case(dtype, hess):
    def fn(ctx):
        rng = np.random.default_rng(0)
        lo, hi = (0, 250) if np.dtype(dtype).kind == "u" else (-100, 100)
        X = rng.integers(lo, hi, size=(200, 5)).astype(dtype)
        y = X.astype(float) @ np.linspace(-1, 1, 5) / 50 + rng.standard_normal(200)
        o = dict(seed=0, max_iter=100)
        got = []
        for data in (X, X.astype(float)):
            try:
                got.append(ls_problem(data, y, fn=ls_function(hess=hess)).solve(**o))
            except ss.SSCAError as exc:
                got.append(f"{type(exc).__name__}: {exc}")
        res, ref = got
        if isinstance(res, str) or isinstance(ref, str):
            if res == ref:
                return Verdict("correct", f"as float64, the same error: {res[:150]}")
            raise Verdict("silent_wrong", f"{dtype}: {str(res)[:120]}; float64: {str(ref)[:120]}")
        if not np.array_equal(res.x, ref.x):
            d = rel(res.x, ref.x)
            raise Verdict("silent_wrong" if d > 1e-8 else "correct",
                          f"{dtype} data gives other iterates than float64 (rel. {d:.1e})")
        return Verdict("correct", f"the float64 iterates ({res.status}, nit {res.nit})")
    return fn


for _dt in ("int8", "int16", "uint8", "int64"):
    for _h in (False, True):
        nm = f"data_{_dt}" + ("_diagonal_curvature" if _h else "")
        CASES[nm] = Case(nm, "data", "correct", _int_case(_dt, _h), (), False, ("correct",), 90.0)


@case("data", "correct")
def data_features_scaled_1e6_diagonal_curvature(ctx):
    X, y = synth(scale=1e6)
    res = ls_problem(X, y, fn=ls_function(hess=True)).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_uncentred_diagonal_curvature(ctx):
    """Features 0..249 (not centred), DiagonalCurvature, default options."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 250, size=(200, 5)).astype(float)
    y = X @ np.linspace(-1, 1, 5) / 50 + rng.standard_normal(200)
    res = ls_problem(X, y, fn=ls_function(hess=True)).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_features_scaled_1e6(ctx):
    X, y = synth(scale=1e6)
    res = ls_problem(X, y).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_mixed_scales(ctx):
    X, y = synth()
    X[:, 0] *= 1e4
    X[:, 1] *= 1e-3
    res = ls_problem(X, y).solve(seed=0, max_iter=400)
    return check_ls(res, X, y, want_converged=False)


@case("data", "correct")
def data_20_one_row_clients_batch_1(ctx):
    X, y = synth(n=20, d=4)
    data = ss.FederatedData([(X[i:i + 1], y[i:i + 1]) for i in range(20)])
    res = ss.Problem(ls_function(), dim=4, data=data).solve(seed=0, batch_size=1)
    return check_ls(res, X, y)


@case("data", "correct")
def data_20_one_row_clients_batch_1_fixed_tau(ctx):
    X, y = synth(n=20, d=4)
    data = ss.FederatedData([(X[i:i + 1], y[i:i + 1]) for i in range(20)])
    res = ss.Problem(ls_function(), dim=4, data=data).solve(seed=0, batch_size=1, tau=1.0)
    return check_ls(res, X, y, want_converged=False)


@case("data", "correct")
def data_single_client(ctx):
    X, y = synth()
    res = ls_problem(X, y, clients=1).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_float32(ctx):
    X, y = synth()
    res = ls_problem(X.astype(np.float32), y.astype(np.float32)).solve(seed=0)
    return check_ls(res, X.astype(np.float32), y.astype(np.float32))


@case("data", "correct")
def data_unequal_clients(ctx):
    X, y = synth()
    cuts = [0, 3, 50, 51, 240]
    data = ss.FederatedData([(X[a:b], y[a:b]) for a, b in zip(cuts, cuts[1:])])
    res = ss.Problem(ls_function(), dim=6, data=data).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_fortran_and_strided(ctx):
    X, y = synth()
    big = np.asfortranarray(np.repeat(X, 2, axis=1))[:, ::2]
    data = ss.FederatedData([(big[:120], y[:120]), (big[120:], y[120:])])
    res = ss.Problem(ls_function(), dim=6, data=data).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_lists_of_lists(ctx):
    X, y = synth()
    data = ss.FederatedData([(X[:120].tolist(), y[:120].tolist()),
                             (X[120:].tolist(), y[120:].tolist())])
    res = ss.Problem(ls_function(), dim=6, data=data).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct", needs="pandas")
def data_pandas(ctx):
    import pandas as pd
    X, y = synth()
    data = ss.FederatedData([(pd.DataFrame(X[:120]), pd.Series(y[:120])),
                             (pd.DataFrame(X[120:]), pd.Series(y[120:]))])
    res = ss.Problem(ls_function(), dim=6, data=data).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_no_constraints_list(ctx):
    X, y = synth()
    data = ss.FederatedData.split(X, y, num_clients=4, seed=0)
    res = ss.Problem(ls_function(), constraints=[], dim=6, data=data).solve(seed=0)
    return check_ls(res, X, y)


@case("data", "correct")
def data_duplicate_rows(ctx):
    X, y = synth()
    X2, y2 = np.r_[X, X], np.r_[y, y]
    res = ls_problem(X2, y2).solve(seed=0)
    return check_ls(res, X2, y2)


def _data_error(build, names):
    def fn(ctx):
        prob = build()
        res = prob.solve(seed=0, max_iter=5)
        raise Verdict("silent_wrong", f"accepted ({res.status})")
    return fn


def _with(X=None, y=None, change=None, dim=None, clients=None):
    def build():
        X0, y0 = synth()
        Xc, yc = (X0.copy(), y0.copy()) if change is None else change(X0.copy(), y0.copy())
        if clients is not None:
            data = ss.FederatedData(clients(Xc, yc))
        else:
            data = ss.FederatedData.split(Xc, yc, num_clients=4, seed=0)
        return ss.Problem(ls_function(), dim=dim or 6, data=data)
    return build


def _set(a, idx, v):
    a[idx] = v
    return a


for _key, _build, _names in [
    ("nan_in_X", _with(change=lambda X, y: (_set(X, (200, 2), np.nan), y)), ("row 200", "nan")),
    ("inf_in_y", _with(change=lambda X, y: (X, _set(y, 5, np.inf))), ("row 5", "inf")),
    ("empty_client", _with(clients=lambda X, y: [(X[:100], y[:100]), (X[:0], y[:0]),
                                                 (X[100:], y[100:])]), ("client 1",)),
    ("ragged_features", _with(clients=lambda X, y: [(X[:100], y[:100]),
                                                    (X[100:, :5], y[100:])]), ("client 1",)),
    ("y_wrong_length", _with(clients=lambda X, y: [(X[:100], y[:99]), (X[100:], y[100:])]),
     ("client 0",)),
    ("complex_X", _with(change=lambda X, y: (X.astype(complex), y)), ("complex",)),
    ("object_X", _with(change=lambda X, y: (X.astype(object), y)), ("dtype object",)),
    ("string_X", _with(change=lambda X, y: (X.astype(str), y)), ("dtype <U",)),
    ("X_3d", _with(clients=lambda X, y: [(X.reshape(240, 2, 3), y)]), (("ls", "client 0"),)),
    ("X_1d", _with(clients=lambda X, y: [(X[:, 0], y)]), ("client 0",)),
    ("dim_mismatch", _with(dim=5), (("ls", "dim"),)),
    ("dim_zero", _with(dim=-1), ("dim",)),
    ("y_column_vector", _with(clients=lambda X, y: [(X, y[:, None])]), (("ls", "client 0"),)),
]:
    CASES[f"data_{_key}"] = Case(f"data_{_key}", "data", "clear_error", _data_error(_build, _names),
                                 _names, False, ("clear_error",), 60.0)


@case("data", "clear_error", names=("20 clients",))
def data_split_more_clients_than_rows(ctx):
    X, y = synth(n=10)
    ss.FederatedData.split(X, y, num_clients=20, seed=0)
    raise Verdict("silent_wrong", "accepted")


def _user_function_case(value, grad, **opts):
    def fn(ctx):
        X, y = synth()
        f = ss.SampleFunction(value, grad, name="ls")
        ss.Problem(f, dim=6, data=ss.FederatedData.split(X, y, 4, seed=0)).solve(seed=0, **opts)
        raise Verdict("silent_wrong", "accepted")
    return fn


def _ls_value(w, X, y):
    return 0.5 * (X @ w - y) ** 2


for _key, _value, _grad, _names, _opts in [
    ("nan_in_grad_at_x0", _ls_value, lambda w, X, y: np.full(X.shape[1], np.nan),
     ("ls", "client"), {}),
    ("grad_sign_error", _ls_value, lambda w, X, y: -X.T @ (X @ w - y) / len(y), ("ls", "sign"),
     {}),
    ("grad_sum_not_mean", _ls_value, lambda w, X, y: X.T @ (X @ w - y),
     ("ls", "sum instead of a mean"), {"batch_size": 10}),
    ("value_returns_scalar", lambda w, X, y: float(np.mean(_ls_value(w, X, y))),
     lambda w, X, y: X.T @ (X @ w - y) / len(y), ("ls", "value"), {}),
]:
    add(f"data_{_key}", "data", "clear_error", _user_function_case(_value, _grad, **_opts),
        names=_names)


def energy_function():
    return ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w) ** 2,
                             lambda w, X, y: X.T @ (X @ w) / X.shape[0], name="energy")


@case("data", "clear_error", names=("bound", "nan"))
def data_constraint_bound_nan(ctx):
    X, y = synth()
    energy = energy_function()
    ss.Problem(ls_function(), constraints=[energy <= float("nan")], dim=6,
               data=ss.FederatedData.split(X, y, 4, seed=0)).solve(seed=0)
    raise Verdict("silent_wrong", "accepted")


@case("data", "correct", accept=("correct", "clear_error"), names=("bound", "inf"))
def data_constraint_bound_inf(ctx):
    X, y = synth()
    energy = energy_function()
    res = ss.Problem(ls_function(), constraints=[energy <= float("inf")], dim=6,
                     data=ss.FederatedData.split(X, y, 4, seed=0)).solve(seed=0)
    return check_ls(res, X, y, want_converged=False)


@case("data", "correct", accept=("correct", "clear_error"), names=("energy", "infeasible"))
def data_infeasible_constraint(ctx):
    """0.5 mean((x.w)^2) <= -1 has no solution: 'infeasible' (with evidence) or max_iter;
    never 'converged'."""
    X, y = synth()
    energy = energy_function()
    res = ss.Problem(ls_function(), constraints=[energy <= -1.0], dim=6,
                     data=ss.FederatedData.split(X, y, 4, seed=0)).solve(seed=0)
    if res.success or res.status == "converged":
        raise Verdict("silent_wrong", f"an infeasible problem {res.status}")
    return Verdict("correct", f"{res.status}: {res.message[:120]}")


@case("data", "correct")
def data_equality_constraint(ctx):
    X, y = synth()
    mean_pred = ss.SampleFunction(lambda w, X, y: X @ w, lambda w, X, y: X.mean(0), name="mean")
    data = ss.FederatedData.split(X, y, 4, seed=0)
    res = ss.Problem(ls_function(), constraints=[mean_pred == 0.5], dim=6, data=data).solve(seed=0)
    import cvxpy as cp
    w = cp.Variable(6)
    cp.Problem(cp.Minimize(cp.sum_squares(X @ w - y)), [X.mean(0) @ w == 0.5]).solve()
    err = rel(res.x, w.value)
    viol = abs(X.mean(0) @ res.x - 0.5)
    if res.success and (err > 1e-2 or viol > 1e-3):
        raise Verdict("silent_wrong", f"converged {err:.1e} from CVXPY, violation {viol:.1e}")
    return Verdict("correct", f"{res.status}, {err:.1e} from CVXPY, violation {viol:.1e}")


# =================================================================================================
# Running: child and parent
# =================================================================================================

def classify(exc, c: Case) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}"
    from ssca_solver.errors import SSCAError
    ours = isinstance(exc, SSCAError)
    plain = type(exc) in (ValueError, TypeError)
    if not (ours or plain):
        return "crash", "raw " + text
    said = str(exc).lower()
    missing = [n for n in c.names if not any(a.lower() in said for a in
                                             (n if isinstance(n, tuple) else (n,)))]
    if missing:
        return "crash", f"does not name {missing}: " + text
    if c.state and getattr(exc, "state", None) is None:
        return "crash", "work lost (no exc.state): " + text
    return "clear_error", text


def child_main(name, tmp, out):
    global ss
    warnings.simplefilter("default")
    # as at a terminal, even when the probe runs in the background (SIGINT ignored there)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import ssca_solver
    ss = ssca_solver
    c = CASES[name]
    ctx = Ctx(tmp)
    t0 = time.monotonic()
    note = ""
    try:
        got = c.fn(ctx)
        if isinstance(got, Verdict):
            outcome, note = got.outcome, got.note
        elif c.expected == "clear_error":
            outcome, note = "silent_wrong", f"returned {got!r}"[:300]
        else:
            outcome, note = "crash", f"the case returned {got!r}"[:300]
    except Verdict as v:
        outcome, note = v.outcome, v.note
    except BaseException as exc:                # noqa: BLE001 (classified, never re-raised)
        outcome, note = classify(exc, c)
        if getattr(exc, "probe_note", ""):
            note += f" ({exc.probe_note})"
    seconds = time.monotonic() - t0
    if outcome in ("correct", "clear_error") and _stray(ctx):
        outcome, note = "crash", f"stray files {_stray(ctx)}; " + note
    Path(out).write_text(json.dumps({"outcome": outcome, "note": note[:2000],
                                     "seconds": seconds, "done": time.time()}))


def group_alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_env() -> dict:
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}


class Zygote:
    """A process that has imported ssca_solver (and CVXPY: seconds of imports) and forks one
    fresh child per case, each in its own session (so its process group is its PID), with
    its stdout and stderr in the case's files. The zygote never runs a case itself."""

    def __init__(self):
        self.proc = None

    def fork(self, job: dict) -> int:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, __file__, "--zygote"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=child_env(), cwd=tempfile.gettempdir(),
                                         start_new_session=True, text=True)
            if self.proc.stdout.readline().strip() != "ready":
                raise RuntimeError("the probe's zygote did not start")
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)      # the zygote's own group
                self.proc.wait()


def zygote_main():
    import ssca_solver
    del ssca_solver                                     # imported once, shared by the forks
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # children reaped as they end
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:                                    # the case's process
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            os.chdir(job["tmp"])
            child_main(job["name"], job["tmp"], job["out"])
            raise SystemExit(0)                         # the interpreter's normal shutdown
        print(pid, flush=True)


def alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_case(c: Case, zygote: Zygote) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"probe_{c.name}_")
    case_dir = os.path.join(tmp, "case")
    os.mkdir(case_dir)
    out = os.path.join(tmp, "result.json")
    t0 = time.monotonic()
    pid = zygote.fork({"name": c.name, "tmp": case_dir, "out": out,
                       "stdout": os.path.join(tmp, "stdout"),
                       "stderr": os.path.join(tmp, "stderr")})
    while alive(pid) and time.monotonic() - t0 < c.timeout:
        time.sleep(0.05)
    timed_out = alive(pid)
    if timed_out:                                       # exactly the case's process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    seconds = time.monotonic() - t0
    row = {"name": c.name, "category": c.category, "expected": c.expected,
           "accept": list(c.accept)}
    # processes of the case's group still alive after its interpreter ended
    left = False
    deadline = time.monotonic() + (0 if timed_out else c.grace)
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(pid):
        left = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    if timed_out:
        row.update(outcome="hang", message=f"no outcome within {c.timeout:.0f} s (killed)")
    elif not os.path.exists(out):
        err = Path(tmp, "stderr").read_text(errors="replace").strip().splitlines()
        row.update(outcome="crash", message="the child died without an outcome: "
                   + " | ".join(err[-3:]))
    else:
        r = json.loads(Path(out).read_text())
        row.update(outcome=r["outcome"], message=r["note"])
        lingered = time.time() - r["done"]
        if lingered > c.grace + 5:
            row.update(outcome="hang", message=f"the interpreter lived {lingered:.0f} s after "
                       "the case ended; " + r["note"])
        seconds = r["seconds"]
    if left:
        row.update(outcome="hang", message="processes of the case outlived it (killed); "
                   + row["message"])
    row["seconds"] = round(seconds, 2)
    row["message"] = row["message"][:300]
    row["met"] = row["outcome"] in c.accept
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cats = sorted({r["category"] for r in rows})
    colors = {"clear_error": "#4c72b0", "correct": "#55a868", "silent_wrong": "#c44e52",
              "crash": "#dd8452", "hang": "#8172b2"}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bottom = np.zeros(len(cats))
    for o in OUTCOMES:
        n = np.array([sum(r["category"] == c and r["outcome"] == o for r in rows) for c in cats])
        ax.bar(cats, n, bottom=bottom, label=o, color=colors[o])
        bottom += n
    ax.set_ylim(0, 1.25 * max(bottom.max(), 1))
    ax.set_ylabel("cases")
    ax.set_title(f"fault probe: {len(rows)} cases by category and outcome")
    ax.legend(ncol=len(OUTCOMES), loc="upper center", fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows) -> str:
    cats = sorted({r["category"] for r in rows})
    head = "| category | cases | " + " | ".join(OUTCOMES) + " | met |"
    lines = [head, "|" + "---|" * (len(OUTCOMES) + 3)]
    for c in cats + ["all"]:
        sel = [r for r in rows if c == "all" or r["category"] == c]
        counts = [sum(r["outcome"] == o for r in sel) for o in OUTCOMES]
        lines.append(f"| {c} | {len(sel)} | " + " | ".join(map(str, counts))
                     + f" | {sum(r['met'] for r in sel)} |")
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--quick", action="store_true", help="one case in four, no slow ones")
    ap.add_argument("--only", default=None, metavar="SUBSTRING",
                    help="the cases whose name contains SUBSTRING (several: comma-separated)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.zygote:
        return zygote_main()
    if a.child:                                         # one case without the zygote
        return child_main(a.child, a.tmp, a.out)
    cases = list(CASES.values())
    if a.only:
        cases = [c for c in cases if any(o in c.name for o in a.only.split(","))]
    if a.quick:
        cases = [c for i, c in enumerate(cases) if i % 4 == 0 and not c.slow]
    import importlib.util
    rows, skipped = [], []
    t0 = time.monotonic()
    zygote = Zygote()
    try:
        for i, c in enumerate(cases):
            if c.needs and importlib.util.find_spec(c.needs) is None:
                skipped.append({"name": c.name, "needs": c.needs})
                continue
            row = run_case(c, zygote)
            rows.append(row)
            print(f"[{i + 1}/{len(cases)}] {row['outcome']:<12} {row['seconds']:6.1f}s {c.name}: "
                  f"{row['message'][:150]}", file=sys.stderr, flush=True)
    finally:
        zygote.close()
    wall = time.monotonic() - t0
    out = Path(a.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if a.quick else ""
    if a.only:
        suffix += "_only"
    doc = {"command": "python tests/fault_probe.py" + (" --quick" if a.quick else "")
           + (f" --only {a.only}" if a.only else ""),
           "commit": _commit(), "python": platform.python_version(), "machine": _cpu(),
           "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()[0],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "wall_seconds": round(wall, 1),
           "counts": {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES},
           "met": sum(r["met"] for r in rows), "skipped": skipped, "cases": rows}
    (out / f"fault_probe{suffix}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, out / f"fault_probe{suffix}.png")
    print(table(rows))
    print(f"\n{len(rows)} cases in {wall:.0f} s; skipped {len(skipped)}; not met: "
          + ", ".join(r["name"] for r in rows if not r["met"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
