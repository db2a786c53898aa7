"""SSCA with default options on the smooth constrained problems of S2MPJ (issue 18).

S2MPJ (https://github.com/GrattonToint/S2MPJ, Gratton & Toint) is most of the CUTEst collection
translated to pure Python. It carries no licence, so nothing of it is copied into this project:
get it yourself and give the benchmark its directory,

    git clone https://github.com/GrattonToint/S2MPJ /path/to/S2MPJ
    python benchmarks/nlp_collection.py --s2mpj /path/to/S2MPJ

(the directory that holds s2mpjlib.py and python_problems/).

Selection, from each problem file's classification string "X-CORD-..-n-m" (s2mpjlib_select's
scheme): continuous variables (C), general constraints (L, N, Q or O), regular (R), n <= 50
and m <= 30 (problems whose size is variable, "V", are instantiated with their default
parameters and kept when those give n <= 50 and 1 <= m <= 30), and NOT the HS family (names
starting with "HS"), which is held out for an independent check. Problems without an objective
(classification "N": systems of equations) count apart; where S2MPJ has no objective function
they are written as a user writes a feasibility problem, with the deterministic objective
``lambda w: 0``, which the library gives F_0 = 0 (its proximal anchor).

Each problem becomes ONE client holding one dummy row: the objective and each constraint a
``SampleFunction`` whose value is an array of length 1 and whose grad is S2MPJ's gradient
(values and Jacobian evaluated once per point and cached). Constraint cl <= c(x) <= cu is
``c == cl`` when cl == cu, else ``c <= cu`` and/or ``c >= cl`` (the finite sides); finite
variable bounds are a CVXPY ``domain=``. The solve is ``prob.solve(method="ssca", x0=x0,
seed=0, batch_size="full", callback=...)``: default options; "full" only says explicitly what
"auto" does with one row per client (it starts at min(32, N_i) = 1 = all rows), and the
callback stops the run after --time-limit seconds of wall time (status "stopped"). Each solve
runs in a forked child process, killed if it does not return within the limit + 120 s.

References from the same start x0: SciPy SLSQP (default ftol 1e-6, 1000 iterations) and trust-constr
(exact Hessians from S2MPJ, gtol = xtol = 1e-10, 3000 iterations), each capped at 60 s; f* is
the lower objective of those whose violation is <= 1e-6.

Per problem: status, rounds, gap (f - f*) / max(1, |f*|), max violation (constraints relative
to max(1, |bound|), bounds absolute: the library's feas_tol units), an independent KKT
residual (kkt_residual below), wall time, ratio to SLSQP's wall time. Outcome:
  * certified:  status "converged", not false;
  * FALSE:      "converged" with (gap > 1e-4 and KKT residual > 1e-3) or violation > 1e-4;
  * honest:     "max_iter", "stopped", "infeasible" or "error" with a message;
  * not supported: ModelError "... closed-form path only so far" (equalities with a domain);
  * exception:  any other exception from Problem(...) or solve(), or a solve killed at the
    hard limit.

Usage:  python benchmarks/nlp_collection.py --s2mpj DIR [--quick] [--problems NAME ...]
                         [--time-limit 30] [--out NAME] [--replot] [--list] [--resume]
                         [--held-out] [--hessians]
--held-out runs the HS family (the held-out check) instead, into NAME_held_out.
--hessians gives every function S2MPJ's exact Hessian (``hess``), so that the default
hessian="auto" runs the Newton model (d <= 256 here always), into NAME[_held_out]_hessians.
Writes benchmarks/results/NAME[_held_out][_hessians][_quick][_problems].json (rewritten after
every problem) and .png (NAME: nlp_collection; _problems with --problems); progress on stderr.
--quick: 10 problems of different kinds (a smoke test, about 30 s). The full run (404 problems)
took 40-45 min on 2 shared cores, with or without --hessians; docs/benchmarks.md shows its
results, kkt_residual below the independent KKT residual.
"""

from __future__ import annotations

import argparse
import importlib
import math
import multiprocessing as mp
import os
import re
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402
from defaults import library_version  # noqa: E402

MAX_N, MAX_M = 50, 30
FEAS_REF = 1e-6            # a reference point counts when its violation is <= this
FEAS_TOL = 1e-4            # the library's default feas_tol (the FALSE-certificate rule)
GAP_TOL, KKT_TOL = 1e-4, 1e-3
ACTIVE = 1e-3              # an inequality within this (relative) of its bound may carry a multiplier
REF_TIME = 60.0            # seconds per reference solver
GRACE = 120.0              # a library child still running at time_limit + GRACE is killed
QUICK = ["BT1", "BT4", "MARATOS", "HIMMELP2", "LUKVLE1", "LUKVLI2", "DTOC5", "BOOTH",
         "SIMPLLPA", "ZECEVIC2"]
OUTCOMES = ("certified", "FALSE", "honest", "not supported", "exception")
COLOURS = {"certified": "tab:green", "FALSE": "tab:red", "honest": "tab:blue",
           "not supported": "tab:gray", "exception": "black"}


# --------------------------------------------------------------------------- the collection

def _classification(path: Path):
    with open(path, errors="replace") as fh:
        m = re.search(r'classification = "([^"]*)"', fh.read())
    return m.group(1) if m else None


def _load(s2mpj: Path, name: str):
    for p in (str(s2mpj), str(s2mpj / "python_problems")):
        if p not in sys.path:
            sys.path.insert(0, p)
    mod = importlib.import_module(name)
    return getattr(mod, name)()


class _Timeout(Exception):
    """A problem ran past its time limit."""


def _alarm(*_):
    raise _Timeout()


def select(s2mpj: Path, names=None, held_out: bool = False) -> list[dict]:
    """The problems of the benchmark, each {name, classification, n, m, sized_by}; with
    ``held_out`` the HS family only (the independent check), else every family but HS."""
    files = sorted((s2mpj / "python_problems").glob("*.py"))
    if not files:
        raise SystemExit(f"no python_problems/*.py under {s2mpj}: give the S2MPJ directory "
                         "(git clone https://github.com/GrattonToint/S2MPJ)")
    out = []
    for f in files:
        name = f.stem
        if names is not None and name not in names:
            continue
        cl = _classification(f)
        parts = (cl or "").split("-")
        if len(parts) < 5 or len(parts[1]) < 4:
            continue
        kind = parts[1]
        if kind[0] != "C" or kind[2] not in "LNQO" or kind[3] != "R":
            continue
        if name.upper().startswith("HS") != bool(held_out):
            continue
        n_cl, m_cl = parts[3], parts[4]
        if n_cl != "V" and m_cl != "V" and (int(n_cl) > MAX_N or int(m_cl) > MAX_M):
            continue
        if n_cl != "V" and int(n_cl) > MAX_N:
            continue
        if m_cl != "V" and int(m_cl) > MAX_M:
            continue
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(20)
        try:                                    # the actual n, m (V: at the default parameters)
            P = _load(s2mpj, name)
            n, m = int(P.n), int(P.m)
        except _Timeout:
            log(f"  {name}: setup took over 20 s at its default parameters; left out")
            continue
        except Exception as exc:  # noqa: BLE001
            log(f"  {name}: setup failed ({type(exc).__name__}: {exc}); left out")
            continue
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        if n <= MAX_N and 1 <= m <= MAX_M:
            out.append({"name": name, "classification": cl, "n": n, "m": m,
                        "objective": kind[1] != "N",
                        "sized_by": "default parameters" if "V" in (n_cl, m_cl)
                        else "classification"})
    return out


class Evaluator:
    """S2MPJ's objective and constraints at a point, each evaluated once per point."""

    def __init__(self, P):
        self.P = P
        self.has_obj = bool((hasattr(P, "objgrps") and len(P.objgrps)) or hasattr(P, "H"))
        self.n, self.m = int(P.n), int(P.m)
        self._fkey = self._ckey = None
        self.calls = 0

    def obj(self, x):
        x = np.array(x, dtype=float).ravel()
        key = x.tobytes()
        if key != self._fkey:
            if self.has_obj:
                f, g = self.P.fgx(x.copy())
                self._f, self._g = float(np.asarray(f).ravel()[0]), np.asarray(g, float).ravel()
            else:
                self._f, self._g = 0.0, np.zeros(self.n)
            self._fkey = key
            self.calls += 1
        return self._f, self._g.copy()

    def cons(self, x):
        x = np.array(x, dtype=float).ravel()
        key = x.tobytes()
        if key != self._ckey:
            c, J = self.P.cJx(x.copy())
            J = J.toarray() if hasattr(J, "toarray") else np.asarray(J, float)
            self._c, self._J = np.asarray(c, float).ravel(), np.asarray(J, float).reshape(
                self.m, self.n)
            self._ckey = key
            self.calls += 1
        return self._c.copy(), self._J.copy()

    def obj_hess(self, x):
        if not self.has_obj:
            return np.zeros((self.n, self.n))
        H = self.P.fgHx(np.array(x, float).ravel())[2]
        return H.toarray() if hasattr(H, "toarray") else np.asarray(H, float)

    def cons_hessians(self, x) -> list:
        """Every constraint's Hessian at x (dense), evaluated once per point."""
        x = np.array(x, dtype=float).ravel()
        key = x.tobytes()
        if key != getattr(self, "_hkey", None):
            Hs = self.P.cJHx(x.copy())[2]
            self._H = [H.toarray() if hasattr(H, "toarray") else np.asarray(H, float)
                       for H in Hs]
            self._hkey = key
        return self._H

    def cons_hess(self, x, v):
        Hs = self.P.cJHx(np.array(x, float).ravel())[2]
        out = np.zeros((self.n, self.n))
        for vi, H in zip(v, Hs):
            if vi != 0.0:
                out += vi * (H.toarray() if hasattr(H, "toarray") else np.asarray(H, float))
        return out


def bounds_of(P):
    xl, xu = np.asarray(P.xlower, float).ravel(), np.asarray(P.xupper, float).ravel()
    cl, cu = np.asarray(P.clower, float).ravel(), np.asarray(P.cupper, float).ravel()
    return xl, xu, cl, cu


# --------------------------------------------------------------------------- independent checks

def violation(x, c, xl, xu, cl, cu) -> float:
    """max over constraints of the violation relative to max(1, |bound|), and over the
    variable bounds of the absolute violation (the library's feas_tol units)."""
    v = 0.0
    with np.errstate(invalid="ignore"):
        up = np.where(np.isfinite(cu), (c - cu) / np.maximum(1.0, np.abs(cu)), -np.inf)
        lo = np.where(np.isfinite(cl), (cl - c) / np.maximum(1.0, np.abs(cl)), -np.inf)
        if c.size:
            v = max(v, float(np.max(up)), float(np.max(lo)))
        if x.size:
            v = max(v, float(np.max(np.where(np.isfinite(xl), xl - x, -np.inf))),
                    float(np.max(np.where(np.isfinite(xu), x - xu, -np.inf))))
    return v if np.isfinite(v) else float("inf")


def kkt_residual(x, g, c, J, xl, xu, cl, cu) -> dict:
    """The independent KKT residual at x:

        r(x) = |g + A mu|_inf / max(1, |g|_inf) + max_i mu_i |h_i| / max(1, |g|_inf) + viol(x)

    g = grad f(x); the columns of A are the gradients of the equalities c_k(x) - b_k (and
    of fixed variables) with free-sign multipliers, and of the inequalities h_i(x) <= 0 (c - cu,
    cl - c, x - xu, xl - x, finite sides only) that are within ACTIVE of their bound
    (h_i >= -ACTIVE max(1, |bound|); bounds: absolute) with multipliers mu_i >= 0; mu is the
    least-squares fit min |g + A mu|_2 over those signs (scipy.optimize.lsq_linear)."""
    from scipy.optimize import lsq_linear

    n = x.size
    cols, lower, slack = [], [], []
    for i in range(c.size):
        if cl[i] == cu[i]:
            cols.append(J[i]); lower.append(-np.inf); slack.append(0.0)
            continue
        if np.isfinite(cu[i]) and c[i] - cu[i] >= -ACTIVE * max(1.0, abs(cu[i])):
            cols.append(J[i]); lower.append(0.0); slack.append(c[i] - cu[i])
        if np.isfinite(cl[i]) and cl[i] - c[i] >= -ACTIVE * max(1.0, abs(cl[i])):
            cols.append(-J[i]); lower.append(0.0); slack.append(cl[i] - c[i])
    for j in range(n):
        e = np.zeros(n); e[j] = 1.0
        if xl[j] == xu[j]:
            cols.append(e); lower.append(-np.inf); slack.append(0.0)
            continue
        if np.isfinite(xu[j]) and x[j] - xu[j] >= -ACTIVE:
            cols.append(e); lower.append(0.0); slack.append(x[j] - xu[j])
        if np.isfinite(xl[j]) and xl[j] - x[j] >= -ACTIVE:
            cols.append(-e); lower.append(0.0); slack.append(xl[j] - x[j])
    scale = max(1.0, float(np.max(np.abs(g))) if n else 1.0)
    viol = violation(x, c, xl, xu, cl, cu)
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(J)) and np.all(np.isfinite(c))):
        return {"kkt": float("inf"), "stationarity": float("inf"), "complementarity": float("nan"),
                "violation": viol, "active": len(cols)}
    if cols:
        A = np.array(cols).T
        lo = np.array(lower)
        fit = lsq_linear(A, -g, bounds=(lo, np.full(lo.size, np.inf)), method="bvls",
                         tol=1e-12, max_iter=2000)
        mu = fit.x
        stat = float(np.max(np.abs(g + A @ mu))) / scale
        comp = float(np.max(np.abs(mu * np.array(slack)) * (lo == 0.0))) / scale
    else:
        mu, stat, comp = np.zeros(0), float(np.max(np.abs(g))) / scale if n else 0.0, 0.0
    return {"kkt": stat + comp + viol, "stationarity": stat, "complementarity": comp,
            "violation": viol, "active": len(cols)}


def assess(ev, x, xl, xu, cl, cu) -> dict:
    """Objective, violation and independent KKT residual at x."""
    x = np.asarray(x, float).ravel()
    try:
        f, g = ev.obj(x)
        c, J = ev.cons(x)
    except Exception as exc:  # noqa: BLE001
        return {"f": float("nan"), "violation": float("inf"), "kkt": float("inf"),
                "assess_error": f"{type(exc).__name__}: {exc}"}
    out = {"f": f}
    out.update(kkt_residual(x, g, c, J, xl, xu, cl, cu))
    return out


# --------------------------------------------------------------------------- the runs (children)

def run_library(s2mpj: Path, name: str, time_limit: float, hessians: bool = False) -> dict:
    """SSCA with default options on one problem (``hessians``: every function carries
    S2MPJ's exact Hessian, so hessian="auto" runs the Newton model where d <= 256)."""
    import ssca_solver as ss

    P = _load(s2mpj, name)
    ev = Evaluator(P)
    xl, xu, cl, cu = bounds_of(P)
    x0 = np.asarray(P.x0, float).ravel()
    n, m = ev.n, ev.m

    def obj_value(w, X, y):
        return np.full(X.shape[0], ev.obj(w)[0])

    def obj_grad(w, X, y):
        return ev.obj(w)[1]

    objective = (ss.SampleFunction(obj_value, obj_grad, name="f",
                                   hess=(lambda w, X, y: ev.obj_hess(w)) if hessians else None)
                 if ev.has_obj else (lambda w: 0))
    cnames = [str(s) for s in getattr(P, "cnames", [])] or [f"c{i}" for i in range(m)]
    constraints, kinds = [], []
    for i in range(m):
        fn = ss.SampleFunction((lambda i: lambda w, X, y: np.full(X.shape[0],
                                                                   ev.cons(w)[0][i]))(i),
                               (lambda i: lambda w, X, y: ev.cons(w)[1][i])(i),
                               name=cnames[i] if i < len(cnames) else f"c{i}",
                               hess=((lambda i: lambda w, X, y: ev.cons_hessians(w)[i])(i)
                                     if hessians else None))
        if cl[i] == cu[i]:
            constraints.append(fn == float(cl[i])); kinds.append("eq")
            continue
        if np.isfinite(cu[i]):
            constraints.append(fn <= float(cu[i])); kinds.append("le")
        if np.isfinite(cl[i]):
            constraints.append(fn >= float(cl[i])); kinds.append("ge")
    lo_idx = np.flatnonzero(np.isfinite(xl) & (xl != xu))
    hi_idx = np.flatnonzero(np.isfinite(xu) & (xl != xu))
    fix_idx = np.flatnonzero(xl == xu)
    def box(w):                                 # the finite variable bounds
        cons = []
        if lo_idx.size:
            cons.append(w[lo_idx] >= xl[lo_idx])
        if hi_idx.size:
            cons.append(w[hi_idx] <= xu[hi_idx])
        if fix_idx.size:
            cons.append(w[fix_idx] == xl[fix_idx])
        return cons
    domain = box if (lo_idx.size or hi_idx.size or fix_idx.size) else None
    data = ss.FederatedData([np.zeros((1, 1))])
    out = {"n": n, "m": m, "equalities": kinds.count("eq"),
           "inequalities": len(kinds) - kinds.count("eq"),
           "bounds": int(lo_idx.size + hi_idx.size + fix_idx.size),
           "has_objective": ev.has_obj}
    t0 = time.perf_counter()

    def stop(it):
        return time.perf_counter() - t0 > time_limit

    caught = []
    try:
        with warnings.catch_warnings(record=True) as wl:
            warnings.simplefilter("always")
            prob = ss.Problem(objective, constraints, dim=n, data=data, domain=domain)
            res = prob.solve(method="ssca", x0=x0, seed=0, batch_size="full", callback=stop)
            caught = [f"{w.category.__name__}: {str(w.message)[:200]}" for w in wl]
    except Exception as exc:  # noqa: BLE001
        wall = time.perf_counter() - t0
        msg = f"{type(exc).__name__}: {exc}"
        unsupported = (isinstance(exc, ss.ModelError) and "only so far" in str(exc))
        out.update({"status": "not supported" if unsupported else "exception",
                    "exception": msg[:2000], "wall": wall,
                    "traceback": traceback.format_exc()[-3000:]})
        return out
    wall = time.perf_counter() - t0
    x = np.asarray(res.x, float).ravel()
    k = res.kkt
    out.update({"status": res.status, "message": str(res.message)[:2000], "rounds": int(res.nit),
                "wall": wall, "subproblem": res.subproblem, "fun": float(res.fun),
                "retries": int(np.nansum(res.history.retries)),
                "x": x.tolist(), "warnings": caught[:5],
                "lib_stationarity_rel": float(k.stationarity_rel),
                "lib_scale": float(k.scale), "lib_multiplier_source": k.multiplier_source,
                "lib_max_feasibility_rel": float(np.max(k.feasibility_rel, initial=0.0)),
                "lib_domain_violation": float(k.domain_violation),
                "penalty": None if res.penalty is None else float(res.penalty)})
    out.update({f"ind_{key}": v for key, v in assess(ev, x, xl, xu, cl, cu).items()})
    return out


def run_reference(s2mpj: Path, name: str, method: str) -> dict:
    """SciPy's SLSQP or trust-constr from S2MPJ's x0, stopped after REF_TIME seconds."""
    from scipy.optimize import Bounds, NonlinearConstraint, minimize

    P = _load(s2mpj, name)
    ev = Evaluator(P)
    xl, xu, cl, cu = bounds_of(P)
    x0 = np.asarray(P.x0, float).ravel()
    eq = np.flatnonzero(cl == cu)
    up = np.flatnonzero((cl != cu) & np.isfinite(cu))
    lo = np.flatnonzero((cl != cu) & np.isfinite(cl))
    bnds = Bounds(xl, xu) if (np.isfinite(xl).any() or np.isfinite(xu).any()) else None

    def capped(t0):
        def cb(*args):
            if time.perf_counter() - t0 > REF_TIME:
                raise StopIteration
        return cb

    def ineq_f(x):
        c = ev.cons(x)[0]
        return np.concatenate([cu[up] - c[up], c[lo] - cl[lo]])

    def ineq_j(x):
        J = ev.cons(x)[1]
        return np.vstack([-J[up], J[lo]])

    cons = []
    if eq.size:
        cons.append({"type": "eq", "fun": lambda x: ev.cons(x)[0][eq] - cl[eq],
                     "jac": lambda x: ev.cons(x)[1][eq]})
    if up.size or lo.size:
        cons.append({"type": "ineq", "fun": ineq_f, "jac": ineq_j})
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if method == "SLSQP":
                r = minimize(lambda x: ev.obj(x)[0], x0, jac=lambda x: ev.obj(x)[1],
                             method="SLSQP", bounds=bnds, constraints=cons,
                             options={"maxiter": 1000},
                             callback=capped(t0))
            else:
                nl = NonlinearConstraint(lambda x: ev.cons(x)[0], cl, cu,
                                         jac=lambda x: ev.cons(x)[1],
                                         hess=lambda x, v: ev.cons_hess(x, v))
                r = minimize(lambda x: ev.obj(x)[0], x0, jac=lambda x: ev.obj(x)[1],
                             hess=lambda x: ev.obj_hess(x), method="trust-constr",
                             bounds=bnds, constraints=[nl],
                             options={"maxiter": 3000, "gtol": 1e-10, "xtol": 1e-10},
                             callback=capped(t0))
        wall = time.perf_counter() - t0
        x = np.asarray(r.x, float).ravel()
        # nfev: the points at which the functions' values were asked for (its line searches'
        # trial points included), the exchanges a federated run of the method would need
        rec = {"wall": wall, "message": str(r.message)[:300], "nit": int(getattr(r, "nit", -1)),
               "nfev": int(getattr(r, "nfev", -1)), "njev": int(getattr(r, "njev", -1)),
               "x": x.tolist()}
        rec.update(assess(ev, x, xl, xu, cl, cu))
    except Exception as exc:  # noqa: BLE001
        rec = {"wall": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"[:500],
               "f": float("nan"), "violation": float("inf"), "kkt": float("inf")}
    return rec


def _child(conn, fn, args):
    try:
        conn.send(fn(*args))
    except BaseException as exc:  # noqa: BLE001
        conn.send({"status": "exception", "exception": f"{type(exc).__name__}: {exc}"[:2000],
                   "traceback": traceback.format_exc()[-3000:]})
    finally:
        conn.close()


def in_child(fn, args, limit: float) -> dict:
    """fn(*args) in a forked child; {"status": "exception", ...} if it dies or overruns."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    send.close()
    out = None
    if recv.poll(limit):
        try:
            out = recv.recv()
        except EOFError:
            out = None
    proc.join(5.0)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    if out is None:
        why = (f"killed after {time.perf_counter() - t0:.0f} s (no answer within {limit:.0f} s)"
               if proc.exitcode in (None, -signal.SIGKILL) else
               f"the process died (exit code {proc.exitcode})")
        out = {"status": "exception", "exception": why, "wall": time.perf_counter() - t0}
    return out


# --------------------------------------------------------------------------- outcome and output

def outcome(rec: dict) -> str:
    lib = rec["library"]
    st = lib.get("status")
    if st in ("exception", "not supported"):
        return st
    if st == "converged":
        gap, kkt, viol = rec.get("gap"), lib.get("ind_kkt", math.inf), lib.get("ind_violation",
                                                                                  math.inf)
        wrong_point = (kkt > KKT_TOL) and (gap is None or gap > GAP_TOL)
        return "FALSE" if (wrong_point or not viol <= FEAS_TOL) else "certified"
    return "honest" if lib.get("message") else "exception"


def finish(rec: dict) -> dict:
    refs = rec.get("references", {})
    feas = {k: v for k, v in refs.items() if v.get("violation", math.inf) <= FEAS_REF
            and np.isfinite(v.get("f", np.nan))}
    rec["reference"] = None
    rec["f_star"] = None
    if feas:
        best = min(feas, key=lambda k: feas[k]["f"])
        rec["reference"], rec["f_star"] = best, feas[best]["f"]
    lib = rec["library"]
    rec["gap"] = None
    if rec["f_star"] is not None and "ind_f" in lib and np.isfinite(lib["ind_f"]):
        rec["gap"] = (lib["ind_f"] - rec["f_star"]) / max(1.0, abs(rec["f_star"]))
    slsqp = refs.get("SLSQP", {}).get("wall")
    rec["time_ratio"] = (lib["wall"] / slsqp) if (slsqp and lib.get("wall") is not None) else None
    rec["outcome"] = outcome(rec)
    rec["note"] = note(rec)
    return rec


def note(rec: dict) -> str:
    """One line on why, for the FALSE certificates, exceptions and suspicious statuses."""
    lib, o = rec["library"], rec["outcome"]
    if o in ("exception", "not supported"):
        return lib.get("exception", "")[:300]
    if o == "FALSE":
        return (f"converged at round {lib.get('rounds')}: gap {fmt(rec['gap'])}, independent KKT "
                f"{fmt(lib.get('ind_kkt'))} (stationarity {fmt(lib.get('ind_stationarity'))}), "
                f"violation {fmt(lib.get('ind_violation'))}; library's relative stationarity "
                f"{fmt(lib.get('lib_stationarity_rel'))} over scale {fmt(lib.get('lib_scale'))}")
    if lib.get("status") == "infeasible" and rec.get("reference"):
        return f"'infeasible' although {rec['reference']} found a point with violation <= 1e-6"
    return ""


def fmt(v) -> str:
    if v is None:
        return "-"
    try:
        return f"{v:.2g}"
    except (TypeError, ValueError):
        return str(v)


def counts(recs: list[dict]) -> dict:
    groups = {"all": recs, "with objective": [r for r in recs if r["objective"]],
              "no objective (F_0 = 0)": [r for r in recs if not r["objective"]]}
    return {g: {o: sum(r["outcome"] == o for r in rs) for o in OUTCOMES} | {"total": len(rs)}
            for g, rs in groups.items()}


def strip(rec: dict) -> dict:
    """The record without points (kept short in the JSON)."""
    out = dict(rec)
    out["library"] = {k: v for k, v in rec["library"].items() if k != "x"}
    out["references"] = {m: {k: v for k, v in r.items() if k != "x"}
                         for m, r in rec.get("references", {}).items()}
    return out


def plot(payload: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = payload["problems"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5))
    floor, none_row = 1e-10, 1e9          # gaps <= floor drawn at floor; no gap at none_row

    def gap_y(r):
        return none_row if r["gap"] is None else min(max(r["gap"], floor), 1e8)

    for o in OUTCOMES:
        rs = [r for r in recs if r["outcome"] == o]
        if not rs:
            continue
        mk = "x" if o in ("exception", "not supported") else "o"
        xs = [r["time_ratio"] if r["time_ratio"] else np.nan for r in rs]
        ax.scatter(xs, [gap_y(r) for r in rs], s=18, c=COLOURS[o], label=f"{o} ({len(rs)})",
                   marker=mk, alpha=0.8)
        ks = [max(r["library"].get("ind_kkt", np.nan), floor) for r in rs]
        bx.scatter(ks, [gap_y(r) for r in rs], s=18, c=COLOURS[o], label=o, marker=mk,
                   alpha=0.8)
    for r in recs:
        if r["outcome"] == "FALSE":
            ax.annotate(r["name"], (r["time_ratio"] or np.nan, gap_y(r)), fontsize=6)
            bx.annotate(r["name"], (max(r["library"].get("ind_kkt", np.nan), floor), gap_y(r)),
                        fontsize=6)
    for a in (ax, bx):
        a.set_xscale("log"); a.set_yscale("log")
        a.axhline(GAP_TOL, color="k", lw=0.5, ls="--")
        a.axhline(3e8, color="k", lw=0.5)
        a.set_ylabel(f"gap (f - f*) / max(1, |f*|)   (<= {floor:g}: at {floor:g})")
        a.text(0.01, 0.985, "no feasible reference, or no point", transform=a.transAxes,
               fontsize=7, va="top")
    ax.set_xlabel("wall time / SLSQP's wall time")
    family = ("the HS family, held out" if "--held-out" in payload.get("command", "")
              else "no HS")
    given = (", exact Hessians given" if payload.get("options", {}).get("hessians") else "")
    ax.set_title(f"SSCA defaults on S2MPJ (n <= 50, m <= 30, {family}{given})", fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    bx.axvline(KKT_TOL, color="k", lw=0.5, ls="--")
    bx.set_xlabel(f"independent KKT residual at the returned point (<= {floor:g}: at {floor:g})")
    bx.set_title("FALSE certificate: converged, top right of the dashed lines "
                 "(or violation > 1e-4)", fontsize=10)
    fig.suptitle(f"{machine_title(payload['machine'])}; library {payload['library']['commit'][:7]}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def warm_up() -> None:
    """Import and compile in the parent once, so that every forked child starts warm."""
    import ssca_solver as ss

    sf = ss.SampleFunction(lambda w, X, y: np.full(X.shape[0], float(w @ w)),
                           lambda w, X, y: 2 * w)
    g = ss.SampleFunction(lambda w, X, y: np.full(X.shape[0], float(w.sum())),
                          lambda w, X, y: np.ones_like(w))
    data = ss.FederatedData([np.zeros((1, 1))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cons in ([g >= 1.0], [g == 1.0], [g >= 1.0, g == 1.0, g <= 2.0]):
            for domain in (None, lambda w: [w >= -5.0]):
                ss.Problem(sf, cons, dim=2, data=data, domain=domain).solve(
                    x0=np.ones(2), seed=0, batch_size="full", max_iter=5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--s2mpj", type=Path, help="the S2MPJ directory (s2mpjlib.py, python_problems/)")
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} problems")
    ap.add_argument("--problems", nargs="+", metavar="NAME", help="only these problems")
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per solve (30)")
    ap.add_argument("--out", default="nlp_collection")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON")
    ap.add_argument("--list", action="store_true", help="print the selection and stop")
    ap.add_argument("--held-out", action="store_true",
                    help="run the held-out HS family instead (output NAME_held_out)")
    ap.add_argument("--hessians", action="store_true",
                    help="give every function S2MPJ's exact Hessian, so that the default "
                         "hessian='auto' runs the Newton model where d <= 256 (output "
                         "NAME_hessians)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the problems already in the JSON (same options), run the rest")
    args = ap.parse_args()
    name = (args.out + ("_held_out" if args.held_out else "")
            + ("_hessians" if args.hessians else "") + ("_quick" if args.quick else "")
            + ("_problems" if args.problems else ""))
    if args.replot:
        import json
        payload = json.loads((RESULTS / f"{name}.json").read_text())
        plot(payload, RESULTS / f"{name}.png")
        return
    if args.s2mpj is None:
        ap.error("--s2mpj DIR is required (git clone https://github.com/GrattonToint/S2MPJ)")
    s2mpj = args.s2mpj.resolve()
    wanted = set(args.problems) if args.problems else (set(QUICK) if args.quick else None)
    log(f"selecting from {s2mpj} ...")
    probs = select(s2mpj, wanted, held_out=args.held_out)
    if wanted:
        missing = wanted - {p["name"] for p in probs}
        if missing:
            log(f"not in the selection (not a smooth constrained non-HS problem with n <= "
                f"{MAX_N}, m <= {MAX_M}, or not found): {' '.join(sorted(missing))}")
    log(f"{len(probs)} problems ({sum(p['objective'] for p in probs)} with an objective)")
    if args.list:
        for p in probs:
            print(p["name"], p["classification"], p["n"], p["m"], p["sized_by"])
        return
    try:
        s2_commit = __import__("subprocess").run(
            ["git", "-C", str(s2mpj), "rev-parse", "HEAD"], capture_output=True, text=True,
            check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        s2_commit = "unknown (not a git checkout)"
    warm_up()
    argv = list(sys.argv[1:])
    for j, a in enumerate(argv[:-1]):
        if a == "--s2mpj":
            argv[j + 1] = "DIR"
    payload = {"command": " ".join(["python", "benchmarks/nlp_collection.py"] + argv),
               "machine": machine(), "library": library_version(), "s2mpj_commit": s2_commit,
               "options": {"solve": "method='ssca', x0=S2MPJ's x0, seed=0, batch_size='full', "
                                    f"callback: stop after {args.time_limit:g} s",
                           "hessians": bool(args.hessians),
                           "time_limit": args.time_limit, "ref_time_limit": REF_TIME,
                           "feas_ref": FEAS_REF, "feas_tol": FEAS_TOL, "gap_tol": GAP_TOL,
                           "kkt_tol": KKT_TOL, "active": ACTIVE},
               "complete": False, "problems": []}
    done, prev_wall = {}, 0.0
    if args.resume and (RESULTS / f"{name}.json").exists():
        import json
        old = json.loads((RESULTS / f"{name}.json").read_text())
        done = {r["name"]: r for r in old["problems"]}
        prev_wall = float(old.get("wall_total", 0.0))
        if old.get("library") != payload["library"]:
            raise SystemExit(f"--resume: {name}.json was measured on {old.get('library')}, "
                             f"not on {payload['library']}")
        payload["resumed"] = old.get("resumed", 0) + 1
        log(f"resuming: {len(done)} problems already in {name}.json")
    t_start = time.perf_counter()
    for i, p in enumerate(probs, 1):
        if p["name"] in done:
            payload["problems"].append(done[p["name"]])
            continue
        log(f"[{i}/{len(probs)}] {p['name']} (n={p['n']}, m={p['m']}, {p['classification']}) ...")
        rec = dict(p)
        rec["references"] = {}
        for method in ("SLSQP", "trust-constr"):   # each in its own child: SciPy may crash
            r = in_child(run_reference, (s2mpj, p["name"], method), REF_TIME + 60)
            if r.get("status") == "exception":     # the child died or overran
                r = {"error": r["exception"], "f": float("nan"), "violation": float("inf"),
                     "kkt": float("inf"), "wall": None}
            rec["references"][method] = r
        rec["library"] = in_child(run_library, (s2mpj, p["name"], args.time_limit,
                                                args.hessians),
                                  args.time_limit + GRACE)
        rec = strip(finish(rec))
        lib = rec["library"]
        log(f"    {lib.get('status')} rounds={lib.get('rounds', '-')} gap={fmt(rec['gap'])} "
            f"viol={fmt(lib.get('ind_violation'))} kkt={fmt(lib.get('ind_kkt'))} "
            f"t={fmt(lib.get('wall'))} s x{fmt(rec['time_ratio'])} SLSQP -> {rec['outcome']}"
            + (f"  [{rec['note'][:160]}]" if rec["note"] else ""))
        payload["problems"].append(rec)
        payload["counts"] = counts(payload["problems"])
        payload["wall_total"] = prev_wall + time.perf_counter() - t_start
        write_json(name, payload)
    payload["complete"] = True
    payload["counts"] = counts(payload["problems"])
    payload["wall_total"] = prev_wall + time.perf_counter() - t_start
    path = write_json(name, payload)
    plot(payload, RESULTS / f"{name}.png")
    log(f"{len(probs)} problems in {payload['wall_total']:.0f} s; wrote {path} and "
        f"{RESULTS / (name + '.png')}")
    for g, cnt in payload["counts"].items():
        log(f"  {g:24s} " + "  ".join(f"{o}: {cnt[o]}" for o in OUTCOMES) + f"  (of {cnt['total']})")


if __name__ == "__main__":
    main()
