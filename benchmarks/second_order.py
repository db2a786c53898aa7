"""The quasi-Newton model of the full-batch phase against the first-order surrogates, side by
side in one run (issue 19), with SciPy's SLSQP as the yardstick.

Three groups, default options throughout but ``hessian``: "lbfgs" (the L-BFGS model; what the
default "auto" picks when a function has no Hessian) against "none" (the paper's first-order
surrogates); the Newton model has its own benchmark, rounds.py:

* ``classical``: the smooth programs of problems/classical.py (known optima; one client, one
  row, so every round is a full batch), max_iter 2000; SLSQP from the same start with exact
  gradients (iterations, wall time).
* ``diabetes``: least squares on scikit-learn's diabetes data (standardised, intercept), 8
  clients, s.t. the older group's mean squared error <= U (U = 1.0 inactive; 0.228 and 0.226
  active; the least the group can have is 0.2236), against CVXPY + Clarabel on the pooled
  data.
* ``cost``: one closed-form subproblem at d = 101,632, M = 1 with and without a full model
  (8 pairs), and the model's bookkeeping.
* ``round_cost`` (not in the default groups; asked for by name): whole full-batch rounds at
  the paper's network scale (784-128-10, d = 101,632, prob:class-con with U = 0.13, M = 1) on
  Fashion-MNIST's training rows (the first ``--rows``, 10 IID clients), ``batch_size="full"``,
  ``tau="auto"``, ``hessian="lbfgs"`` against ``"none"`` side by side in one process: the two
  solves run in two threads that hand over to each other every ``--block`` rounds (only one
  runs at a time), so that both see the same machine. Per round: the clients' time (a timed
  in-process transport), the server's (the rest of the round), and within it the subproblem,
  the quasi-Newton pair update and the compact form. One BLAS thread, as section_v.py.
* ``pooled``: Neyman-Pearson logistic regression on synthetic data (d = 20, 10 clients):
  class-1 loss + 1e-3 |w|^2 s.t. class-0 loss <= 0.3, N d from 1e4 up to 5e6 (1e6 with
  --quick); SLSQP on the pooled data with exact gradients, and CVXPY + Clarabel on the pooled
  data up to N d = 1e6.

Records status, rounds, wall time, floats sent up, objective gap; writes second_order.json and
second_order.png (rounds per problem for both surrogates next to SLSQP's iterations, and wall
time ratios against SLSQP for the pooled group).

Usage:  python benchmarks/second_order.py [--quick] [--groups classical,diabetes,pooled]
        python benchmarks/second_order.py --groups round_cost [--rows 60000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import RESULTS, log, machine, write_json  # noqa: E402

import ssca_solver as ss  # noqa: E402

HESSIANS = ("lbfgs", "none")
GROUPS = ("classical", "diabetes", "pooled", "cost")
EXTRA_GROUPS = ("round_cost",)       # run only when named in --groups


def _run(prob, **opts) -> dict:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(seed=0, progress=False, **opts)
    wall = time.perf_counter() - t0
    comm = res.communication
    return {"status": res.status, "rounds": int(res.nit), "wall": wall, "fun": float(res.fun),
            "floats_up": int(comm.up_total), "eval_floats_up": int(comm.eval_up_total),
            "stationarity_rel": float(res.kkt.stationarity_rel),
            "max_violation": float(np.max(res.kkt.feasibility_rel, initial=0.0))}


# -- classical programs ----------------------------------------------------------------------------

def _slsqp_classical(c) -> dict:
    from scipy.optimize import Bounds, minimize

    cons = []
    for fun, grad, kind, _ in c.constraints:
        # SciPy's inequalities are fun >= 0; the programs' are g <= 0
        cons.append({"type": "eq", "fun": fun, "jac": grad} if kind == "==" else
                    {"type": "ineq", "fun": (lambda f: lambda w: -f(w))(fun),
                     "jac": (lambda g: lambda w: -np.asarray(g(w)))(grad)})
    bounds = None
    if c.lo is not None or c.hi is not None:
        lo = c.lo if c.lo is not None else np.full(c.dim, -np.inf)
        hi = c.hi if c.hi is not None else np.full(c.dim, np.inf)
        bounds = Bounds(lo, hi)
    t0 = time.perf_counter()
    r = minimize(c.fun, c.x0, jac=c.grad, method="SLSQP", constraints=cons, bounds=bounds,
                 options={"maxiter": 2000, "ftol": 1e-12})
    return {"success": bool(r.success), "nit": int(r.nit), "wall": time.perf_counter() - t0,
            "fun": float(r.fun)}


def classical() -> list:
    from problems.classical import CLASSICAL, problem

    out = []
    for name in sorted(CLASSICAL):
        c = CLASSICAL[name]
        rec = {"problem": name, "optimum": c.optimum, "slsqp": _slsqp_classical(c)}
        for h in HESSIANS:
            rec[h] = _run(problem(c), x0=c.x0, max_iter=2000, hessian=h)
            rec[h]["gap"] = (rec[h]["fun"] - c.optimum) / max(1.0, abs(c.optimum))
        log(f"classical {name}: lbfgs {rec['lbfgs']['status']} {rec['lbfgs']['rounds']}, "
            f"none {rec['none']['status']} {rec['none']['rounds']}, SLSQP {rec['slsqp']['nit']}")
        out.append(rec)
    return out


# -- least squares on diabetes with a group constraint ----------------------------------------------

def diabetes(quick: bool) -> list:
    import cvxpy as cp

    from problems.least_squares import diabetes_regression

    X, y = diabetes_regression()
    older = X[:, 0] > 0
    Y = np.column_stack([y, older])
    pi = older.mean()
    loss = ss.SampleFunction(lambda w, X, Y: 0.5 * (X @ w - Y[:, 0]) ** 2,
                             lambda w, X, Y: X.T @ (X @ w - Y[:, 0]) / len(X), name="error")
    group = ss.SampleFunction(
        lambda w, X, Y: Y[:, 1] / pi * 0.5 * (X @ w - Y[:, 0]) ** 2,
        lambda w, X, Y: X.T @ (Y[:, 1] / pi * (X @ w - Y[:, 0])) / len(X), name="older")
    data = ss.FederatedData.split(X, Y, num_clients=8, seed=0)
    out = []
    for U in ((1.0, 0.226) if quick else (1.0, 0.228, 0.226)):
        w = cp.Variable(X.shape[1])
        con = cp.sum_squares(X[older] @ w - y[older]) / (2 * older.sum()) <= U
        ref = cp.Problem(cp.Minimize(cp.sum_squares(X @ w - y) / (2 * len(y))), [con])
        ref.solve(solver="CLARABEL")
        rec = {"U": U, "reference": float(ref.value), "multiplier": float(np.ravel(con.dual_value)[0])}
        for h in HESSIANS:
            rec[h] = _run(ss.Problem(loss, [group <= U], dim=X.shape[1], data=data), hessian=h)
            rec[h]["gap"] = (rec[h]["fun"] - ref.value) / abs(ref.value)
        log(f"diabetes U={U}: lbfgs {rec['lbfgs']['status']} {rec['lbfgs']['rounds']}, "
            f"none {rec['none']['status']} {rec['none']['rounds']}")
        out.append(rec)
    return out


# -- Neyman-Pearson against pooled solvers ----------------------------------------------------------

def _np_data(N: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.standard_normal((N, d - 1)), np.ones(N)])
    w_true = rng.standard_normal(d) / np.sqrt(d)
    y = (X @ w_true + 0.5 * rng.standard_normal(N) > 0).astype(float)
    return X, y


def _np_pooled_slsqp(X, y, alpha, lam) -> dict:
    from scipy.optimize import minimize

    m1, m0 = y == 1, y == 0
    X1, X0 = X[m1], X[m0]

    def loss(w, Z, sign):
        z = sign * (Z @ w)
        return np.mean(np.logaddexp(0.0, -z)), -(Z.T @ (sign / (1.0 + np.exp(z)))) / len(Z)

    def obj(w):
        v, g = loss(w, X1, 1.0)
        return v + lam * w @ w, g + 2 * lam * w

    cons = {"type": "ineq", "fun": lambda w: alpha - loss(w, X0, -1.0)[0],
            "jac": lambda w: -loss(w, X0, -1.0)[1]}
    t0 = time.perf_counter()
    r = minimize(obj, np.zeros(X.shape[1]), jac=True, method="SLSQP", constraints=[cons],
                 options={"maxiter": 1000, "ftol": 1e-12})
    return {"success": bool(r.success), "nit": int(r.nit), "wall": time.perf_counter() - t0,
            "fun": float(r.fun)}


def _np_pooled_clarabel(X, y, alpha, lam) -> dict:
    import cvxpy as cp

    w = cp.Variable(X.shape[1])
    m1, m0 = y == 1, y == 0
    obj = cp.sum(cp.logistic(-X[m1] @ w)) / m1.sum() + lam * cp.sum_squares(w)
    con = cp.sum(cp.logistic(X[m0] @ w)) / m0.sum() <= alpha
    t0 = time.perf_counter()
    p = cp.Problem(cp.Minimize(obj), [con])
    p.solve(solver="CLARABEL")
    return {"status": p.status, "wall": time.perf_counter() - t0, "fun": float(p.value)}


def pooled(quick: bool) -> list:
    from problems.neyman_pearson import neyman_pearson

    d, alpha, lam = 20, 0.3, 1e-3
    sizes = (1e4, 1e5, 1e6) if quick else (1e4, 1e5, 1e6, 5e6)
    out = []
    for Nd in sizes:
        N = int(Nd // d)
        X, y = _np_data(N, d)
        data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
        rec = {"N": N, "d": d, "Nd": N * d, "slsqp": _np_pooled_slsqp(X, y, alpha, lam)}
        if Nd <= 1e6:
            rec["clarabel"] = _np_pooled_clarabel(X, y, alpha, lam)
        for h in HESSIANS:
            rec[h] = _run(neyman_pearson(data, alpha, lam=lam), hessian=h)
            rec[h]["gap"] = (rec[h]["fun"] - rec["slsqp"]["fun"]) / abs(rec["slsqp"]["fun"])
            rec[h]["wall_vs_slsqp"] = rec[h]["wall"] / rec["slsqp"]["wall"]
        log(f"pooled N d = {N * d:.0e}: lbfgs {rec['lbfgs']['status']} "
            f"{rec['lbfgs']['rounds']} rounds {rec['lbfgs']['wall']:.2f} s "
            f"({rec['lbfgs']['wall_vs_slsqp']:.1f}x SLSQP), none {rec['none']['rounds']} "
            f"rounds ({rec['none']['wall_vs_slsqp']:.1f}x)")
        out.append(rec)
    return out


# -- the closed form's cost with the model -------------------------------------------------------------

def cost(quick: bool) -> dict:
    """One subproblem solve at the paper's network size (d = 101,632, M = 1) by the closed
    form, plain and with a full model (8 pairs), and the model's own bookkeeping (the pair
    update and the compact form), median of repeats."""
    from ssca_solver.methods.ssca.quasi_newton import MEMORY, LBFGSModel, add_pair
    from ssca_solver.subproblems.closed_form import solve_closed_form, solve_closed_form_model

    d = 101_632
    rng = np.random.default_rng(0)
    b0, b1 = rng.standard_normal(d), rng.standard_normal(d)
    x = rng.standard_normal(d)
    S, Y = np.zeros((0, d)), np.zeros((0, d))
    for _ in range(MEMORY):
        s = rng.standard_normal(d)
        S, Y = add_pair(S, Y, s, 2.0 * s + 0.1 * rng.standard_normal(d))
    reps = 3 if quick else 7

    def timed(f):
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
        return float(np.median(out))

    plain = timed(lambda: solve_closed_form(0.1, b0, 1.0, np.array([0.1]), [b1],
                                            np.array([0.5]), np.array([0.2]), 100.0,
                                            out=np.empty(d)))
    model = LBFGSModel(S, Y)
    with_model = timed(lambda: solve_closed_form_model(0.1, b0, 1.0, np.array([0.1]), [b1],
                                                       np.array([0.5]), np.array([0.2]),
                                                       100.0, model, x))
    update = timed(lambda: add_pair(S, Y, x, 2.0 * x))
    build = timed(lambda: LBFGSModel(S, Y))
    rec = {"d": d, "M": 1, "memory": MEMORY, "plain_s": plain, "with_model_s": with_model,
           "pair_update_s": update, "compact_form_s": build,
           "ratio": (with_model + update + build) / plain}
    log(f"cost at d = {d}: plain {plain * 1e3:.2f} ms, with the model {with_model * 1e3:.2f} ms "
        f"+ pair {update * 1e3:.2f} ms + compact form {build * 1e3:.2f} ms")
    return rec


# -- whole full-batch rounds at the paper's scale, with and without the model ----------------------

class _Clock:
    """Per-solve (per-thread) time accumulators of the current round, read and reset at the
    round's end by the callback."""

    def __init__(self):
        self.acc = {}

    def add(self, key, dt, count=True):
        self.acc[key] = self.acc.get(key, 0.0) + dt
        if count:
            self.acc["n_" + key] = self.acc.get("n_" + key, 0) + 1

    def take(self) -> dict:
        out, self.acc = self.acc, {}
        return out


#: the server's parts timed separately (``_instrument``)
SERVER_PARTS = ("sub_plain", "sub_model", "sub_metric", "pair_update", "compact_form",
                "round_evaluation", "stop_test")
_CLOCKS: dict = {}      # threading.get_ident() -> _Clock of the solve running in that thread


def _clock():
    import threading

    return _CLOCKS.get(threading.get_ident())


def _timed(fn, key):
    """``fn`` with its time added to the calling thread's clock under ``key``."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        c = _clock()
        if c is None:
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            c.add(key, time.perf_counter() - t0)

    return wrapper


def _instrument() -> None:
    """Time the server's parts in this process (class attributes wrapped once): the closed
    form plain, with the diagonal metric and with the model; the pair update; the compact
    form (``ModelCache``, built once per set of pairs); the round's free full-data evaluation
    (``SSCA.round_evaluation``) and the KKT stop test (``Session._stop_test``)."""
    from ssca_solver.engine.session import Session
    from ssca_solver.methods.ssca import acceptance
    from ssca_solver.methods.ssca.algorithm import SSCA
    from ssca_solver.methods.ssca.settings import ModelCache
    from ssca_solver.subproblems.closed_form import ClosedFormSubproblem

    if getattr(SSCA, "_round_cost_instrumented", False):
        return
    ClosedFormSubproblem.solve = _timed(ClosedFormSubproblem.solve, "sub_plain")
    ClosedFormSubproblem.solve_model = _timed(ClosedFormSubproblem.solve_model, "sub_model")
    ClosedFormSubproblem.solve_metric = _timed(ClosedFormSubproblem.solve_metric, "sub_metric")
    acceptance.with_pair = _timed(acceptance.with_pair, "pair_update")
    ModelCache.__call__ = _timed(ModelCache.__call__, "compact_form")
    SSCA.round_evaluation = _timed(SSCA.round_evaluation, "round_evaluation")
    Session._stop_test = _timed(Session._stop_test, "stop_test")
    SSCA._round_cost_instrumented = True


def _timed_transport_factory():
    """A transport like "inprocess" whose clients' ``handle`` time goes to the calling
    thread's clock, by task (``client:<task>``), and the one read-only copy of w per request
    to ``copy``."""
    from ssca_solver.federated import InProcessTransport
    from ssca_solver.federated.messages import Dropout
    from ssca_solver.federated.transports import describe_error, participant_order

    class TimedTransport(InProcessTransport):
        def stream(self, request, participants=None, tolerate_failures=False):
            c = _clock()
            t0 = time.perf_counter()
            request = request.read_only()
            c.add("copy", time.perf_counter() - t0, count=False)
            for i in participant_order(participants, self.num_clients):
                t1 = time.perf_counter()
                try:
                    reply = self._clients[i].handle(request)
                except Exception as exc:
                    if not tolerate_failures:
                        raise
                    reply = Dropout(i, request.task, request.round, describe_error(exc))
                finally:
                    c.add("client:" + request.task, time.perf_counter() - t1, count=False)
                yield reply

    return lambda clients, timeout: TimedTransport(clients)


def round_cost(rows: int, rounds: int, block: int, U: float = 0.13) -> dict:
    """Full-batch rounds of prob:class-con on the paper's network, hessian "lbfgs" and "none"
    side by side (module docstring). Returns per-round rows and medians."""
    import os
    import threading

    from threadpoolctl import threadpool_limits

    from problems.mlp import MLP, classification_con
    from ssca_solver.datasets import fashion_mnist
    from ssca_solver.federated import register_transport
    from ssca_solver.methods.ssca.quasi_newton import memory_for

    (X, y), _ = fashion_mnist()
    X, y = X[:rows], y[:rows]
    net = MLP(784, 128, 10)
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    prob = classification_con(data, net, U)
    memory = memory_for(net.dim)
    _instrument()
    register_transport("timed_inprocess", _timed_transport_factory())

    order = list(HESSIANS)                    # "lbfgs" first, then "none", alternating
    cond = threading.Condition()
    turn = {"who": order[0]}
    done = {h: False for h in order}
    per_round = {h: [] for h in order}
    results = {}

    def other(h):
        return order[1 - order.index(h)]

    def wait_turn(h):
        with cond:
            cond.wait_for(lambda: turn["who"] == h or done[other(h)])

    def hand_over(h):
        with cond:
            if not done[other(h)]:
                turn["who"] = other(h)
                cond.notify_all()
                cond.wait_for(lambda: turn["who"] == h or done[other(h)])

    def worker(h):
        clock = _CLOCKS[threading.get_ident()] = _Clock()
        last = {"resume": None, "block_start": True}
        wait_turn(h)

        def callback(it):
            t_end = time.perf_counter()
            acc = clock.take()
            server_parts = {k: acc.get(k, 0.0) for k in
                            SERVER_PARTS}
            clients_round = acc.get("client:ssca.round", 0.0)
            clients_other = sum(v for k, v in acc.items()
                                if k.startswith("client:") and k != "client:ssca.round")
            total = None if last["resume"] is None else t_end - last["resume"]
            rec = {"t": it.t, "stage": it.stage, "penalty": it.penalty,
                   "pairs": int(it.state.qn_s.shape[0]) if it.state.qn_s.ndim == 2 else 0,
                   "metric": bool(it.state.metric.size),
                   "tau": float(it.record.get("tau", np.nan)),
                   "rejected": int(it.record.get("rejected", 0)),
                   "step_norm": float(it.record.get("step_norm", np.nan)),
                   "first_in_block": last["block_start"], "total_s": total,
                   "clients_round_s": clients_round, "clients_other_tasks_s": clients_other,
                   "copy_s": acc.get("copy", 0.0),
                   "subproblem_calls": {k: acc.get("n_" + k, 0) for k in
                                        ("sub_plain", "sub_model", "sub_metric")},
                   **{k + "_s": v for k, v in server_parts.items()}}
            if total is not None:
                rec["server_s"] = total - clients_round - clients_other - rec["copy_s"]
                rec["server_rest_s"] = rec["server_s"] - sum(server_parts.values())
            per_round[h].append(rec)
            last["block_start"] = False
            if it.t % block == 0:
                hand_over(h)
                last["block_start"] = True
            last["resume"] = time.perf_counter()

        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = prob.solve(method="ssca", batch_size="full", tau="auto", hessian=h,
                                 max_iter=rounds, seed=0, x0=net.init(0), callback=callback,
                                 transport="timed_inprocess", progress=False)
            results[h] = {"status": res.status, "rounds": int(res.nit), "fun": float(res.fun),
                          "max_violation": float(np.max(res.kkt.feasibility_rel, initial=0.0)),
                          "solve_wall_s_incl_waits": time.perf_counter() - t0}
        except BaseException as exc:          # recorded, and the other solve goes on
            results[h] = {"error": repr(exc)}
        finally:
            with cond:
                done[h] = True
                turn["who"] = other(h)
                cond.notify_all()

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    with threadpool_limits(1):
        threads = [threading.Thread(target=worker, args=(h,)) for h in order]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    wall = time.perf_counter() - t0

    def med(rs, key):
        v = [r[key] for r in rs if r.get(key) is not None]
        return float(np.median(v)) if v else None

    # rounds compared: those after the lbfgs run's memory is full (its first round with
    # `memory` pairs in the state, i.e. the model of every later round is full), excluding the
    # first round of each block when blocks are longer than one round (caches after the other
    # solve); the same round numbers of "none"
    full = [r["t"] for r in per_round["lbfgs"] if r["pairs"] >= memory]
    t_full = min(full) + 1 if full else None
    summary = {}
    for sel_name, keep_first in (("after_memory_full", False),
                                 ("after_memory_full_incl_block_starts", True)):
        sel = {}
        for h in order:
            rs = [r for r in per_round[h] if t_full is not None and r["t"] >= t_full
                  and r.get("total_s") is not None
                  and (keep_first or block == 1 or not r["first_in_block"])]
            sel[h] = {"rounds_in_median": len(rs),
                      **{k: med(rs, k) for k in ("total_s", "clients_round_s",
                                                 "clients_other_tasks_s", "copy_s",
                                                 "server_s", "server_rest_s",
                                                 *(p + "_s" for p in SERVER_PARTS))},
                      "rejected_rounds": int(sum(r["rejected"] > 0 for r in rs)),
                      "rounds_with_model_solve": int(sum(r["subproblem_calls"]["sub_model"] > 0
                                                         for r in rs))}
        if sel["lbfgs"]["total_s"] and sel["none"]["total_s"]:
            sel["ratio_total_lbfgs_over_none"] = sel["lbfgs"]["total_s"] / sel["none"]["total_s"]
            sel["ratio_server_lbfgs_over_none"] = (sel["lbfgs"]["server_s"]
                                                   / sel["none"]["server_s"])
            # per-round ratios on the same round numbers (both medians of paired rounds)
            by_t = {r["t"]: r for r in per_round["none"] if r.get("total_s") is not None}
            pairs = [(r["total_s"], by_t[r["t"]]["total_s"]) for r in per_round["lbfgs"]
                     if t_full is not None and r["t"] >= t_full and r["t"] in by_t
                     and r.get("total_s") is not None
                     and (keep_first or block == 1
                                 or not (r["first_in_block"] or by_t[r["t"]]["first_in_block"]))]
            sel["paired_round_ratio_median"] = (float(np.median([a / b for a, b in pairs]))
                                                if pairs else None)
            sel["paired_round_ratio_p10_p90"] = ([float(np.percentile([a / b for a, b in pairs],
                                                                      q)) for q in (10, 90)]
                                                 if pairs else None)
            # the load on a shared machine moves the clients' and the server's times together
            # (both compute on the same cores): the server's time as a share of the clients'
            # in the same round, and the ratio of whole rounds it implies at equal client time
            share = {h: float(np.median([r["server_s"] / r["clients_round_s"] for r in
                                         per_round[h] if t_full is not None and r["t"] >= t_full
                                         and r.get("server_s") is not None
                                         and (keep_first or block == 1
                                              or not r["first_in_block"])]))
                     for h in order}
            sel["server_over_clients_median"] = share
            sel["ratio_at_equal_client_time"] = (1.0 + share["lbfgs"]) / (1.0 + share["none"])
        summary[sel_name] = sel
    out = {"rows": rows, "num_clients": 10, "dim": net.dim, "M": 1, "U": U,
           "data": f"Fashion-MNIST train, first {rows} rows, 10 IID clients (split seed 0)",
           "options": {"batch_size": "full", "tau": "auto", "max_iter": rounds, "seed": 0,
                       "x0": "net.init(0)", "transport": "in-process (timed)",
                       "blas_threads": 1},
           "memory": memory, "block": block, "first_round_with_full_model": t_full,
           "loadavg_at_start": load0, "loadavg_at_end": os.getloadavg(), "wall_s": wall,
           "results": results, "per_round": per_round, "summary": summary}
    s = summary["after_memory_full"]
    if "ratio_total_lbfgs_over_none" in s:
        log(f"round_cost N = {rows}: rounds {t_full}..{rounds}, per round (median) lbfgs "
            f"{s['lbfgs']['total_s'] * 1e3:.0f} ms (clients "
            f"{s['lbfgs']['clients_round_s'] * 1e3:.0f}, server "
            f"{s['lbfgs']['server_s'] * 1e3:.0f}), none {s['none']['total_s'] * 1e3:.0f}"
            f" ms (clients {s['none']['clients_round_s'] * 1e3:.0f}, server "
            f"{s['none']['server_s'] * 1e3:.0f}); ratio {s['ratio_total_lbfgs_over_none']:.2f}"
            f" (paired rounds: {s['paired_round_ratio_median']:.2f}; at equal client time: "
            f"{s['ratio_at_equal_client_time']:.2f})")
    else:
        log(f"round_cost N = {rows}: no round after a full memory (first full round: {t_full}); "
            f"results {results}")
    return out


def plot_round_cost(rc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    colors = {"lbfgs": "C0", "none": "C1"}
    for h, rs in rc["per_round"].items():
        rs = [r for r in rs if r.get("total_s") is not None]
        t = [r["t"] for r in rs]
        axes[0].plot(t, [1e3 * r["total_s"] for r in rs], "o-", color=colors[h], ms=3,
                     label=f"hessian='{h}': whole round")
        axes[0].plot(t, [1e3 * r["clients_round_s"] for r in rs], ":", color=colors[h],
                     label=f"hessian='{h}': clients")
        axes[1].plot(t, [1e3 * r["server_s"] for r in rs], "o-", color=colors[h], ms=3,
                     label=f"hessian='{h}': server (round - clients - copy of w)")
        if h == "lbfgs":
            axes[1].plot(t, [1e3 * r["sub_model_s"] for r in rs], "s--", color=colors[h], ms=3,
                         label="hessian='lbfgs': subproblem with the model")
    for ax in axes:
        if rc.get("first_round_with_full_model"):
            ax.axvline(rc["first_round_with_full_model"], color="gray", lw=0.8, ls="--",
                       label=f"model's memory full ({rc['memory']} pairs)")
        ax.set_xlabel("round")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
    s = rc["summary"]["after_memory_full"]
    ratio = s.get("ratio_total_lbfgs_over_none")
    axes[0].set_title(f"full-batch rounds, d = {rc['dim']}, M = 1, N = {rc['rows']}, 10 clients"
                      + (f": lbfgs / none = {ratio:.2f} (median, memory full)" if ratio else ""),
                      fontsize=9)
    axes[1].set_title("server's part of each round", fontsize=9)
    fig.suptitle(f"load average {rc['loadavg_at_start'][0]:.1f} at start, "
                 f"{rc['loadavg_at_end'][0]:.1f} at end; one BLAS thread", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- summary and figure ------------------------------------------------------------------------------

def summary(payload: dict) -> dict:
    out = {}
    cl = payload.get("classical") or []
    if cl:
        for h in HESSIANS:
            cert = [r for r in cl if r[h]["status"] == "converged"]
            out[f"classical_{h}_certified"] = len(cert)
            out[f"classical_{h}_median_rounds"] = float(np.median([r[h]["rounds"]
                                                                   for r in cert])) if cert else None
        out["classical_slsqp_median_nit"] = float(np.median([r["slsqp"]["nit"] for r in cl]))
        both = [r for r in cl if r["lbfgs"]["status"] == "converged"]
        out["classical_lbfgs_median_rounds_over_slsqp_nit"] = float(np.median(
            [r["lbfgs"]["rounds"] / max(1, r["slsqp"]["nit"]) for r in both])) if both else None
        out["classical_lbfgs_median_wall_over_slsqp"] = float(np.median(
            [r["lbfgs"]["wall"] / r["slsqp"]["wall"] for r in both])) if both else None
    for r in payload.get("diabetes") or []:
        out[f"diabetes_U{r['U']}_rounds"] = {h: r[h]["rounds"] for h in HESSIANS}
        out[f"diabetes_U{r['U']}_status"] = {h: r[h]["status"] for h in HESSIANS}
    for r in payload.get("pooled") or []:
        out[f"pooled_Nd{r['Nd']:.0e}_wall_vs_slsqp"] = {h: r[h]["wall_vs_slsqp"]
                                                        for h in HESSIANS}
    if payload.get("cost"):
        out["cost_ratio_model_over_plain"] = payload["cost"]["ratio"]
    rc = payload.get("round_cost")
    if rc:
        s = rc["summary"]["after_memory_full"]
        out["round_cost_ratio_lbfgs_over_none"] = s.get("ratio_total_lbfgs_over_none")
        out["round_cost_paired_ratio_median"] = s.get("paired_round_ratio_median")
        out["round_cost_server_ratio_lbfgs_over_none"] = s.get("ratio_server_lbfgs_over_none")
        out["round_cost_ratio_at_equal_client_time"] = s.get("ratio_at_equal_client_time")
        out["round_cost_median_s"] = {h: {k: s[h][k] for k in ("total_s", "clients_round_s",
                                                               "server_s", "sub_model_s")}
                                      for h in HESSIANS}
    return out


def plot(payload: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    cl = payload.get("classical") or []
    if cl:
        ax = axes[0]
        names = [r["problem"] for r in cl]
        x = np.arange(len(names))
        for k, (h, lab) in enumerate((("lbfgs", "SSCA, hessian='lbfgs'"),
                                      ("none", "SSCA, hessian='none'"))):
            vals = [r[h]["rounds"] if r[h]["status"] == "converged" else np.nan for r in cl]
            ax.bar(x + (k - 1) * 0.27, vals, 0.27, label=lab)
        ax.bar(x + 0.27, [r["slsqp"]["nit"] for r in cl], 0.27, label="SLSQP iterations")
        ax.set_yscale("log")
        ax.set_xticks(x, names, rotation=70, fontsize=7)
        ax.set_ylabel("rounds to the certificate (missing: not certified)")
        ax.set_title("classical programs (max_iter 2000)")
        ax.legend(fontsize=7)
    db = payload.get("diabetes") or []
    if db:
        ax = axes[1]
        x = np.arange(len(db))
        for k, h in enumerate(HESSIANS):
            ax.bar(x + (k - 0.5) * 0.4, [r[h]["rounds"] for r in db], 0.4,
                   label=f"hessian='{h}' ({', '.join(r[h]['status'] for r in db)})")
        ax.set_xticks(x, [f"U = {r['U']}" for r in db])
        ax.set_ylabel("rounds")
        ax.set_title("least squares on diabetes, group constraint, 8 clients")
        ax.legend(fontsize=7)
    po = payload.get("pooled") or []
    if po:
        ax = axes[2]
        Nd = [r["Nd"] for r in po]
        for h in HESSIANS:
            ax.loglog(Nd, [r[h]["wall_vs_slsqp"] for r in po], "o-", label=f"hessian='{h}'")
        cl_ratio = [(r["Nd"], r["clarabel"]["wall"] / r["slsqp"]["wall"]) for r in po
                    if "clarabel" in r]
        if cl_ratio:
            ax.loglog(*zip(*cl_ratio), "s--", label="CVXPY + Clarabel (pooled)")
        ax.axhline(3.0, color="gray", lw=0.8, ls=":", label="3x SLSQP")
        ax.set_xlabel("N d")
        ax.set_ylabel("wall time / SLSQP's on the pooled data")
        ax.set_title("Neyman-Pearson, 10 clients, default options")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--groups", default=",".join(GROUPS),
                    help=f"of {', '.join(GROUPS + EXTRA_GROUPS)} (default: {','.join(GROUPS)})")
    ap.add_argument("--rows", type=int, default=60000,
                    help="round_cost: Fashion-MNIST training rows used (default all 60000)")
    ap.add_argument("--rounds", type=int, default=40, help="round_cost: max_iter (default 40)")
    ap.add_argument("--block", type=int, default=1,
                    help="round_cost: rounds per turn of each solve (default 1: the two "
                         "solves alternate every round, so that each pair of rounds with the "
                         "same number sees nearly the same load)")
    args = ap.parse_args()
    groups = args.groups.split(",")
    unknown = set(groups) - set(GROUPS + EXTRA_GROUPS)
    if unknown:
        ap.error(f"unknown groups {sorted(unknown)}")
    payload = {"machine": machine(), "command": " ".join(sys.argv), "quick": args.quick}
    if "classical" in groups:
        payload["classical"] = classical()
    if "diabetes" in groups:
        payload["diabetes"] = diabetes(args.quick)
    if "pooled" in groups:
        payload["pooled"] = pooled(args.quick)
    if "cost" in groups:
        payload["cost"] = cost(args.quick)
    if "round_cost" in groups:
        payload["round_cost"] = round_cost(args.rows, args.rounds, args.block)
    payload["summary"] = summary(payload)
    name = "second_order_quick" if args.quick else "second_order"
    if set(groups) != set(GROUPS):
        name += "_" + "_".join(groups)
    write_json(name, payload)
    if set(groups) & {"classical", "diabetes", "pooled"}:
        plot(payload, RESULTS / f"{name}.png")
    if "round_cost" in groups:
        plot_round_cost(payload["round_cost"], RESULTS / (
            f"{name}.png" if groups == ["round_cost"] else f"{name}_round_cost.png"))
    for k, v in payload["summary"].items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
