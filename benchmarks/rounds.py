"""Rounds to a certified answer against the problem's conditioning, with the default options,
beside centralised solvers on the pooled rows, in one run.

The family (issue 38's first target): least squares over 8 clients (N = 2,000 rows, d = 20)
with features of condition number kappa in {1e2, 1e3, 1e4, 1e5, 1e6}, subject to an equality
(the mean prediction equals a target) and a norm ball |w|^2 <= r; every function carries its
Hessian, so ``hessian="auto"`` picks the Newton model. For each kappa, in one process:

* SSCA with the default options (``seed=0``); with ``batch_size="full"``; with
  ``hessian="lbfgs"`` and ``batch_size="full"`` (the quasi-Newton model); with
  ``kkt_tol=1e-8`` (default batches): status, rounds, floats sent up, wall time, and the
  relative distance |x - x*| / |x*| to the pooled optimum;
* SciPy's SLSQP (ftol 1e-14) and trust-constr (gtol 1e-10, the exact Hessians) on the pooled
  rows from zeros (iterations, wall time, distance);
* CVXPY + Clarabel on the pooled rows (the reference x*, tolerances 1e-10; its wall time).

Targets of the issue: certified in <= 30 rounds with |x - x*| / |x*| <= 1e-3, and
``kkt_tol=1e-8`` reached in <= 50 rounds.

Beside it, the batch schedule where a full pass is cheap: fairness-constrained logistic
regression (:func:`problems.fairness.fair_logistic`, a demographic-parity gap within 0.05 on
both sides) on synthetic rows, N = 40,000, d = 30, 20 clients, with the default options,
``batch_size="full"`` and ``batch_size="grow"``: the default's rounds within 1.5x of "full"'s.

Multinomial logistic regression (10 classes, d = 500 to 5,000 on synthetic rows, and d = 650
on scikit-learn's digits) + 1e-4 |w|^2 s.t. the cross-entropy on one class <= 0.7 of its
unconstrained value, 5 clients, default options, beside SLSQP on the pooled rows: rounds
<= 2x SLSQP's iterations. ``--quick`` skips it.

A round's cost against the number of constraints: min |w|^2 / 2 + c.w s.t. (a_m.w)^2 <= b_m,
n in {9, 300}, m in {10, 30, 100, 300}, each constraint its own function and the constraints as
one vector function, one client, the default options, beside an SLSQP iteration on the same
problem: a round within 5x an iteration at n = m = 300, and nearly flat in m; the same round
over Flower's simulation engine at m = 10 and 300 (skipped without Flower).

And Neyman-Pearson logistic regression pooled at N d = 5e6 and 2e7 (d = 20, 10 clients, the
synthetic rows of ``second_order.py``; class-1 loss + 1e-3 |w|^2 s.t. class-0 loss <= 0.3):
the default options against SciPy's SLSQP on the pooled rows (exact gradients, ftol 1e-12):
<= 30 rounds and <= 2x SLSQP's wall time. ``--quick`` skips it.

Writes ``rounds.json`` and ``rounds.png`` (rounds and distance against kappa, and a round's
time against m beside an SLSQP iteration's); ``--quick`` runs kappa in {1e2, 1e4};
``--replot`` redraws the PNG from the JSON.

    python benchmarks/rounds.py [--quick] [--publish] [--replot]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import RESULTS, log, machine, write_json  # noqa: E402
from problems import least_squares  # noqa: E402

KAPPAS = (1e2, 1e3, 1e4, 1e5, 1e6)
TARGET_ROUNDS, TARGET_DISTANCE, TARGET_TIGHT_ROUNDS = 30, 1e-3, 50


def family(kappa: float):
    """(problem, pooled X, y, target, r): problems.least_squares.ill_conditioned."""
    return least_squares.ill_conditioned(kappa)


def clarabel(X, y, target, r):
    t0 = time.perf_counter()
    x = least_squares.ill_conditioned_reference(X, y, target, r)
    return x, time.perf_counter() - t0


def scipy_run(method: str, X, y, target, r, x_ref):
    from scipy.optimize import NonlinearConstraint, minimize

    n, xbar = len(y), X.mean(0)
    H = X.T @ X / n

    def f(w):
        e = X @ w - y
        return 0.5 * e @ e / n, X.T @ e / n

    cons = [{"type": "eq", "fun": lambda w: xbar @ w - target, "jac": lambda w: xbar},
            {"type": "ineq", "fun": lambda w: r - w @ w, "jac": lambda w: -2 * w}]
    if method == "trust-constr":
        cons = [NonlinearConstraint(lambda w: xbar @ w, target, target, jac=lambda w: xbar[None]),
                NonlinearConstraint(lambda w: w @ w, -np.inf, r, jac=lambda w: 2 * w[None],
                                    hess=lambda w, v: 2 * v[0] * np.eye(len(w)))]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = minimize(f, np.zeros(X.shape[1]), jac=True, method=method, constraints=cons,
                       **({"hess": lambda w: H} if method == "trust-constr" else {}),
                       options=({"maxiter": 3000, "ftol": 1e-14} if method == "SLSQP" else
                                {"maxiter": 3000, "gtol": 1e-10, "xtol": 1e-14}))
    wall = time.perf_counter() - t0
    return {"iterations": int(out.nit), "wall": wall, "success": bool(out.success),
            "distance": float(np.linalg.norm(out.x - x_ref) / np.linalg.norm(x_ref))}


RUNS = {"default": {}, "full": {"batch_size": "full"},
        "lbfgs_full": {"batch_size": "full", "hessian": "lbfgs"},
        "tight": {"kkt_tol": 1e-8}}


def run(kappa: float) -> dict:
    prob, X, y, target, r = family(kappa)
    x_ref, t_ref = clarabel(X, y, target, r)
    out = {"kappa": kappa, "cond_X": float(np.linalg.cond(X)), "clarabel_wall": t_ref,
           "ssca": {}, "scipy": {}}
    for name, options in RUNS.items():
        t0 = time.perf_counter()
        res = prob.solve(seed=0, max_iter=1000, **options)
        wall = time.perf_counter() - t0
        c = res.communication
        out["ssca"][name] = {
            "options": options, "status": res.status, "rounds": int(res.nit), "wall": wall,
            "floats_up": int(c.up_total), "floats_up_per_client_round": int(c.up_per_client_round),
            "distance": float(np.linalg.norm(res.x - x_ref) / np.linalg.norm(x_ref)),
            "stationarity_rel": float(res.kkt.stationarity_rel)}
        log(f"kappa {kappa:.0e} {name:10s} {res.status:9s} {res.nit:4d} rounds "
            f"|x - x*|/|x*| = {out['ssca'][name]['distance']:.2e} {wall:.2f} s")
    for method in ("SLSQP", "trust-constr"):
        out["scipy"][method] = scipy_run(method, X, y, target, r, x_ref)
        log(f"kappa {kappa:.0e} {method:12s} {out['scipy'][method]['iterations']} iterations "
            f"distance {out['scipy'][method]['distance']:.2e}")
    d = out["ssca"]["default"]
    out["targets"] = {
        "certified_within_30_rounds": d["status"] == "converged" and d["rounds"] <= TARGET_ROUNDS,
        "distance_within_1e-3": d["distance"] <= TARGET_DISTANCE,
        "kkt_tol_1e-8_within_50_rounds": (out["ssca"]["tight"]["status"] == "converged"
                                          and out["ssca"]["tight"]["rounds"]
                                          <= TARGET_TIGHT_ROUNDS)}
    return out


FAIR_N, FAIR_D, FAIR_CLIENTS, FAIR_EPS, TARGET_FAIR_RATIO = 40_000, 30, 20, 0.05, 1.5


def fair_rows(n: int = FAIR_N, d: int = FAIR_D, seed: int = 0):
    """Synthetic rows for the fairness case: d - 1 Gaussian features and an intercept; the
    protected attribute s leans on the first feature, the label on all of them (so an
    unconstrained classifier's parity gap exceeds FAIR_EPS)."""
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((n, d - 1))
    s = (F[:, 0] + 0.5 * rng.standard_normal(n) > 0).astype(float)
    w = rng.standard_normal(d - 1) / np.sqrt(d - 1)
    w[0] = 1.0
    label = (F @ w + 0.3 * rng.standard_normal(n) > 0).astype(float)
    return np.hstack([F, np.ones((n, 1))]), np.column_stack([label, s])


def fair_case() -> dict:
    import ssca_solver as ss
    from problems.fairness import fair_logistic

    X, Y = fair_rows()
    prob = fair_logistic(ss.FederatedData.split(X, Y, num_clients=FAIR_CLIENTS, seed=0),
                         FAIR_EPS)
    out = {"n": FAIR_N, "d": FAIR_D, "clients": FAIR_CLIENTS, "eps": FAIR_EPS, "ssca": {}}
    for name, options in (("default", {}), ("full", {"batch_size": "full"}),
                          ("grow", {"batch_size": "grow"})):
        t0 = time.perf_counter()
        res = prob.solve(seed=0, **options)
        wall = time.perf_counter() - t0
        out["ssca"][name] = {"options": options, "status": res.status, "rounds": int(res.nit),
                             "wall": wall, "floats_up": int(res.communication.up_total),
                             "objective": float(res.fun)}
        log(f"fair logistic {name:8s} {res.status:9s} {res.nit:4d} rounds {wall:.2f} s")
    d, f = out["ssca"]["default"], out["ssca"]["full"]
    out["default_over_full_rounds"] = d["rounds"] / f["rounds"]
    out["target_met"] = (d["status"] == "converged"
                         and d["rounds"] <= TARGET_FAIR_RATIO * f["rounds"])
    return out


NP_SIZES, TARGET_NP_ROUNDS, TARGET_NP_WALL = (5e6, 2e7), 30, 2.0


def np_case() -> list:
    import ssca_solver as ss
    from problems.neyman_pearson import neyman_pearson
    from second_order import _np_data, _np_pooled_slsqp

    d, alpha, lam = 20, 0.3, 1e-3
    out = []
    for Nd in NP_SIZES:
        N = int(Nd // d)
        X, y = _np_data(N, d)
        prob = neyman_pearson(ss.FederatedData.split(X, y, num_clients=10, seed=0), alpha,
                              lam=lam)
        slsqp = _np_pooled_slsqp(X, y, alpha, lam)
        t0 = time.perf_counter()
        res = prob.solve(seed=0)
        wall = time.perf_counter() - t0
        rec = {"N": N, "d": d, "Nd": N * d, "slsqp": slsqp,
               "ssca": {"status": res.status, "rounds": int(res.nit), "wall": wall,
                        "objective": float(res.fun),
                        "max_violation": float(max(res.constraints.max(), 0.0))},
               "wall_over_slsqp": wall / slsqp["wall"],
               "relative_objective_vs_slsqp": (res.fun - slsqp["fun"]) / abs(slsqp["fun"])}
        rec["target_met"] = (res.status == "converged" and res.nit <= TARGET_NP_ROUNDS
                             and rec["wall_over_slsqp"] <= TARGET_NP_WALL)
        log(f"Neyman-Pearson N d = {N * d:.0e}: {res.status} {res.nit} rounds {wall:.2f} s, "
            f"SLSQP {slsqp['nit']} iterations {slsqp['wall']:.2f} s "
            f"({rec['wall_over_slsqp']:.2f}x)")
        out.append(rec)
    return out


MULTI_K, MULTI_FEATURES, MULTI_LAM = 10, (49, 99, 199, 499), 1e-4
MULTI_SLSQP_MAX_D = 5000
TARGET_MULTI_RATIO = 2.0


def multinomial_rows(p: int, seed: int = 0):
    """max(5000, 40 (p + 1)) rows of p Gaussian features (class means 3 N(0, I / p), so that
    the classes overlap alike at every p) and an intercept, 10 classes drawn uniformly."""
    n = max(5000, 40 * (p + 1))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, MULTI_K, n)
    means = 3.0 * rng.standard_normal((MULTI_K, p)) / np.sqrt(p)
    X = means[y] + rng.standard_normal((n, p))
    return np.hstack([X, np.ones((n, 1))]), y.astype(float)


def multinomial_case() -> list:
    """Multinomial logistic regression, 10 classes, d = 10 (p + 1), + 1e-4 |w|^2 s.t. the
    cross-entropy on class 8 <= 0.7 of its value at the unconstrained optimum (active), 5
    clients, default options; SLSQP on the pooled rows (exact gradients, ftol 1e-12) while
    d <= MULTI_SLSQP_MAX_D (its dense quadratic programs cost O(d^3) an iteration). Plus
    scikit-learn's digits (d = 650, the issue's example)."""
    import cvxpy as cp
    import ssca_solver as ss
    from scipy.optimize import minimize
    from problems import suite

    cases = [("digits", suite._digits())] + [(f"synthetic p = {p}", multinomial_rows(p))
                                             for p in MULTI_FEATURES]
    out = []
    for name, (X, y) in cases:
        d, k = MULTI_K * X.shape[1], 8
        data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
        f0 = suite.softmax_loss(MULTI_K)
        f1 = suite.softmax_loss(MULTI_K, k, float(np.mean(y == k)))
        reg = {"regularizer": lambda w: MULTI_LAM * cp.sum_squares(w)}
        free = ss.Problem(f0, dim=d, data=data, **reg).solve(seed=0, max_iter=3000)
        U = 0.7 * float(f1.value(free.x, X, y).mean())
        prob = ss.Problem(f0, [f1 <= U], dim=d, data=data, **reg)
        t0 = time.perf_counter()
        res = prob.solve(seed=0, max_iter=3000)
        wall = time.perf_counter() - t0
        rec = {"name": name, "d": d, "N": len(y), "U": U,
               "ssca": {"status": res.status, "rounds": int(res.nit), "wall": wall,
                        "objective": float(res.fun),
                        "floats_up": int(res.communication.up_total)}, "slsqp": None}
        if d <= MULTI_SLSQP_MAX_D:
            t0 = time.perf_counter()
            ref = minimize(lambda w: f0.value(w, X, y).mean() + MULTI_LAM * w @ w, np.zeros(d),
                           jac=lambda w: f0.grad(w, X, y) + 2.0 * MULTI_LAM * w,
                           method="SLSQP", options={"maxiter": 5000, "ftol": 1e-12},
                           constraints=[{"type": "ineq",
                                         "fun": lambda w: U - f1.value(w, X, y).mean(),
                                         "jac": lambda w: -f1.grad(w, X, y)}])
            rec["slsqp"] = {"iterations": int(ref.nit), "wall": time.perf_counter() - t0,
                            "objective": float(ref.fun), "message": str(ref.message)}
            rec["rounds_over_iterations"] = res.nit / max(ref.nit, 1)
            rec["relative_objective_vs_slsqp"] = (res.fun - ref.fun) / abs(ref.fun)
            rec["target_met"] = (res.status == "converged"
                                 and rec["rounds_over_iterations"] <= TARGET_MULTI_RATIO)
        log(f"multinomial {name} (d = {d}): {res.status} {res.nit} rounds {wall:.1f} s"
            + (f"; SLSQP {rec['slsqp']['iterations']} iterations {rec['slsqp']['wall']:.1f} s"
               if rec["slsqp"] else "; SLSQP not run"))
        out.append(rec)
    return out


CONS_NS, CONS_MS, TARGET_CONS_RATIO, CONS_REPEATS = (9, 300), (10, 30, 100, 300), 5.0, 5
#: passes over the constraints case's sizes (:func:`constraints_case`)
CONS_PASSES = 2


def constraints_rows(n: int, m: int, seed: int = 0):
    """min |w|^2 / 2 + c.w s.t. (a_m.w)^2 <= b_m, m = 1..M (a_m ~ N(0, I / n), b_m in
    [0.5, 1], c ~ N(0, I)): a few constraints active at the optimum."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, n)) / np.sqrt(n)
    return A, rng.uniform(0.5, 1.0, m), rng.standard_normal(n)


def constraints_problems(n: int, m: int, A, b, c0, calls=None) -> tuple:
    """The constraints case's problem (:func:`constraints_rows`' A, b, c0) with one function
    per constraint, and with the constraints as one VectorSampleFunction (one call of the
    user's function per round instead of m); with ``calls`` (a one-element list) every call
    of a user's function counted in it."""
    import ssca_solver as ss

    def counted(fn):
        if calls is None:
            return fn

        def call(*args):
            calls[0] += 1
            return fn(*args)
        return call

    data = ss.FederatedData([np.zeros((1, 1))])
    f = ss.SampleFunction(
        counted(lambda w, X, y: np.full(X.shape[0], 0.5 * w @ w + c0 @ w)),
        counted(lambda w, X, y: w + c0), name="f", convexity="convex")
    cons = [ss.SampleFunction(counted((lambda a: lambda w, X, y: np.full(
                X.shape[0], (a @ w) ** 2))(A[i])),
                counted((lambda a: lambda w, X, y: 2.0 * (a @ w) * a)(A[i])),
                name=f"c{i}", convexity="convex") <= b[i] for i in range(m)]
    vec = ss.VectorSampleFunction(
        counted(lambda w, X, y: np.tile((A @ w) ** 2, (X.shape[0], 1))),
        counted(lambda w, X, y: 2.0 * (A @ w)[:, None] * A), m, name="c",
        convexity="convex")
    return (ss.Problem(f, cons, dim=n, data=data), ss.Problem(f, vec <= b, dim=n, data=data))


def constraints_case() -> list:
    """A round's cost against the number of constraints (each its own SampleFunction, one
    client holding one row, default options) beside an SLSQP iteration on the same problem
    (exact gradients, the constraints as one vector function), at n = 9 (the Newton model,
    its Hessians differenced) and n = 300 (the quasi-Newton model); each solve's wall time
    the fastest of CONS_REPEATS runs (the solves take milliseconds to a second) in each of
    CONS_PASSES passes over the sizes, and the fastest pass kept. Each
    record's ``growth``: its round's time over the same n's at the smallest m (SLSQP's
    iteration's beside it)."""
    # every (n, m) measured in CONS_PASSES passes over the sizes, the fastest kept: a pause
    # of the machine (the benchmark's earlier cases' memory given back, another process) then
    # costs one pass's figure, not the smallest m's, which every growth is relative to
    passes = [{(n, m): _constraints_record(n, m) for n in CONS_NS for m in CONS_MS}
              for _ in range(CONS_PASSES)]
    out = []
    for n in CONS_NS:
        first = None
        for m in CONS_MS:
            rec = _fastest_record([p[(n, m)] for p in passes])
            first = first or rec
            rec["growth"] = {k: rec[k][key] / first[k][key] for k, key in
                             (("ssca", "round_s"), ("ssca_vector", "round_s"),
                              ("slsqp", "iteration_s"))}
            log(f"n = {n}, m = {m:3d}: SSCA {rec['ssca']['status']} {rec['ssca']['rounds']} "
                f"rounds, {rec['ssca']['round_s'] * 1e3:.1f} ms a round (one vector function: "
                f"{rec['ssca_vector']['round_s'] * 1e3:.1f} ms); SLSQP "
                f"{rec['slsqp']['iterations']} iterations, "
                f"{rec['slsqp']['iteration_s'] * 1e3:.2f} ms each; ratio "
                f"{rec['round_over_iteration']:.1f}; growth since m = {CONS_MS[0]}: "
                f"{rec['growth']['ssca']:.1f}x (vector {rec['growth']['ssca_vector']:.1f}x, "
                f"SLSQP {rec['growth']['slsqp']:.1f}x); calls of the user's functions a round "
                f"{rec['ssca']['user_calls_per_round']:.0f} (vector "
                f"{rec['ssca_vector']['user_calls_per_round']:.0f})")
            out.append(rec)
    top = max(CONS_NS)
    for rec in out:
        rec["target_met"] = (rec["n"] != top or rec["m"] != max(CONS_MS)
                             or rec["round_over_iteration"] <= TARGET_CONS_RATIO)
    return out


#: the constraints case over Flower's simulation engine: these n and m
FLOWER_NS, FLOWER_MS = (9, 300), (10, 300)


def constraints_flower_case() -> dict:
    """The constraints case's round on a federated transport: Flower's simulation engine
    (its ServerApp in a thread, the client in a Ray actor, every request and reply a Flower
    message), one solve for each n, m and form (one function per constraint, one vector
    function), the median of the times between successive rounds (callback timestamps: the
    engine's start-up is not in them). Each record's ``growth``: its round over the same n's
    and form's at the smallest m. Skipped (and said so) where Flower is not installed."""
    import importlib.util

    if importlib.util.find_spec("flwr") is None:
        log("constraints on Flower: Flower is not installed (pip install "
            "'ssca-solver[flower]'): skipped")
        return {"skipped": "Flower is not installed"}
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    out = []
    for n in FLOWER_NS:
        for form in ("separate", "vector"):
            first = None
            for m in FLOWER_MS:
                separate, together = constraints_problems(n, m, *constraints_rows(n, m))
                prob = together if form == "vector" else separate
                stamps = []
                t0 = time.perf_counter()
                res = prob.solve(seed=0, x0=np.zeros(n), transport="flower",
                                 callback=lambda it: stamps.append(time.perf_counter()))
                steps = np.diff(stamps)
                rec = {"n": n, "m": m, "form": form, "status": res.status,
                       "rounds": int(res.nit), "round_s": float(np.median(steps)),
                       "wall": time.perf_counter() - t0}
                first = first or rec
                rec["growth"] = rec["round_s"] / first["round_s"]
                out.append(rec)
                log(f"constraints on Flower: n = {n}, m = {m:3d}, {form}: {res.status} "
                    f"{res.nit} rounds, median round {rec['round_s'] * 1e3:.1f} ms "
                    f"({rec['growth']:.2f}x m = {FLOWER_MS[0]}'s)")
    return {"engine": "flower simulation", "results": out}


def _fastest_record(recs: list) -> dict:
    """One (n, m)'s record from its passes: SSCA's, the vector function's and SLSQP's parts
    each from the pass where it was fastest (the rounds and iterations are the same in
    every pass)."""
    rec = dict(recs[0])
    for key, time_key in (("ssca", "round_s"), ("ssca_vector", "round_s"),
                          ("slsqp", "iteration_s")):
        rec[key] = min((r[key] for r in recs), key=lambda part: part[time_key])
    rec["round_over_iteration"] = rec["ssca"]["round_s"] / rec["slsqp"]["iteration_s"]
    return rec


def _constraints_record(n: int, m: int) -> dict:
    """:func:`constraints_case`'s record of one (n, m)."""
    from scipy.optimize import minimize

    A, b, c0 = constraints_rows(n, m)
    x0 = np.zeros(n)

    def problems(calls=None):
        return constraints_problems(n, m, A, b, c0, calls)

    def fastest(prob):
        prob.solve(seed=0, x0=x0, max_iter=2)      # Numba's cache loaded outside the clock
        walls = []
        for _ in range(CONS_REPEATS):               # the fastest of a few: less noise
            t0 = time.perf_counter()
            res = prob.solve(seed=0, x0=x0)
            walls.append(time.perf_counter() - t0)
        return res, min(walls)

    separate, together = problems()
    res, wall = fastest(separate)
    vres, vwall = fastest(together)
    # the calls of the user's functions a round makes (a solve apart, off the clock: the
    # counting wraps every call)
    user_calls, calls = [], [0]
    for prob in problems(calls):
        calls[0] = 0
        counted_res = prob.solve(seed=0, x0=x0)
        user_calls.append(calls[0] / max(counted_res.nit, 1))

    def slsqp(maxiter):
        return minimize(lambda w: 0.5 * w @ w + c0 @ w, x0, jac=lambda w: w + c0,
                        method="SLSQP", options={"maxiter": maxiter, "ftol": 1e-12},
                        constraints=[{"type": "ineq", "fun": lambda w: b - (A @ w) ** 2,
                                      "jac": lambda w: -2.0 * (A @ w)[:, None] * A}])
    slsqp(1)                                       # its first call outside the clock too
    ref_walls = []
    for _ in range(CONS_REPEATS):
        t0 = time.perf_counter()
        ref = slsqp(1000)
        ref_walls.append(time.perf_counter() - t0)
    ref_wall = min(ref_walls)
    rec = {"n": n, "m": m, "active": int(np.sum(b - (A @ ref.x) ** 2 <= 1e-6)),
           "ssca": {"status": res.status, "rounds": int(res.nit), "wall": wall,
                    "round_s": wall / max(res.nit, 1), "objective": float(res.fun),
                    "user_calls_per_round": user_calls[0]},
           "ssca_vector": {"status": vres.status, "rounds": int(vres.nit), "wall": vwall,
                           "round_s": vwall / max(vres.nit, 1),
                           "objective": float(vres.fun),
                           "user_calls_per_round": user_calls[1]},
           "slsqp": {"iterations": int(ref.nit), "wall": ref_wall,
                     "iteration_s": ref_wall / max(ref.nit, 1), "objective": float(ref.fun),
                     "message": str(ref.message)}}
    rec["round_over_iteration"] = rec["ssca"]["round_s"] / rec["slsqp"]["iteration_s"]
    return rec


def plot(results, path, constraints=()):
    """Rounds and distance against the condition number; with ``constraints`` (the
    constraint case's records) a third panel: a round's time against m beside an SLSQP
    iteration's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = [r["kappa"] for r in results]
    fig, axes = plt.subplots(1, 3 if constraints else 2, figsize=(15 if constraints else 10, 4))
    a, b = axes[0], axes[1]
    for name, style in (("default", "o-"), ("full", "s-"), ("lbfgs_full", "^--"),
                        ("tight", "d:")):
        a.plot(k, [r["ssca"][name]["rounds"] for r in results], style, label=f"SSCA {name}")
        b.plot(k, [r["ssca"][name]["distance"] for r in results], style, label=f"SSCA {name}")
    for method, style in (("SLSQP", "k-"), ("trust-constr", "k--")):
        a.plot(k, [r["scipy"][method]["iterations"] for r in results], style,
               label=f"{method} (iterations)")
        b.plot(k, [r["scipy"][method]["distance"] for r in results], style, label=method)
    a.axhline(TARGET_ROUNDS, color="0.6", lw=0.8)
    b.axhline(TARGET_DISTANCE, color="0.6", lw=0.8)
    for ax, label in ((a, "rounds (SciPy: iterations)"), (b, "|x - x*| / |x*|")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("condition number of the features")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    a.set_title("Ill-conditioned least squares, equality + ball, 8 clients, d = 20",
                fontsize=9, loc="left")
    if constraints:
        c = axes[2]
        ns = sorted({r.get("n", 300) for r in constraints})
        for n, color in zip(ns, ("tab:blue", "tab:red", "tab:green")):
            recs = [r for r in constraints if r.get("n", 300) == n]
            ms = [r["m"] for r in recs]
            c.plot(ms, [1e3 * r["ssca"]["round_s"] for r in recs], "o-", color=color,
                   label=f"n = {n}: SSCA round, one function per constraint")
            c.plot(ms, [1e3 * r["ssca_vector"]["round_s"] for r in recs], "s--", color=color,
                   label=f"n = {n}: SSCA round, one vector function")
            c.plot(ms, [1e3 * r["slsqp"]["iteration_s"] for r in recs], ":", color=color,
                   marker="x", label=f"n = {n}: SLSQP iteration")
        top = [r for r in constraints if r.get("n", 300) == ns[-1]]
        c.plot([r["m"] for r in top],
               [TARGET_CONS_RATIO * 1e3 * r["slsqp"]["iteration_s"] for r in top],
               color="0.6", lw=0.8, label=f"{TARGET_CONS_RATIO:g}x an SLSQP iteration, "
                                          f"n = {ns[-1]}")
        c.set_xscale("log")
        c.set_yscale("log")
        c.set_xlabel("constraints m")
        c.set_ylabel("ms (fastest of a few solves)")
        c.set_title("A round against m", fontsize=9, loc="left")
        low = min(1e3 * r["slsqp"]["iteration_s"] for r in constraints)
        c.set_ylim(bottom=low / 40)            # room for the legend below the lines
        c.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="kappa in {1e2, 1e4} only")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args(argv)
    from defaults import library_version

    if args.replot:
        import json
        stem = "rounds_quick" if args.quick else "rounds"
        payload = json.loads((RESULTS / f"{stem}.json").read_text())
        plot(payload["results"], RESULTS / f"{stem}.png", payload.get("constraints") or ())
        log(f"redrew {stem}.png from {stem}.json")
        return 0

    t_all = time.perf_counter()
    kappas = (1e2, 1e4) if args.quick else KAPPAS
    results = [run(k) for k in kappas]
    fair = fair_case()
    neyman = [] if args.quick else np_case()
    many = constraints_case()
    many_flower = constraints_flower_case()
    multinomial = [] if args.quick else multinomial_case()
    stem = "rounds_quick" if args.quick else "rounds"
    payload = {"description": __doc__.split("\n\n")[0],
               "command": "python benchmarks/rounds.py" + (" --quick" if args.quick else ""),
               "machine": machine(), "library": library_version(),
               "total_time": time.perf_counter() - t_all, "results": results,
               "fair_logistic": fair, "neyman_pearson_pooled": neyman,
               "constraints": many, "constraints_flower": many_flower,
               "multinomial": multinomial,
               "targets_met": sum(all(r["targets"].values()) for r in results),
               "problems": len(results)}
    path = write_json(stem, payload)
    plot(results, RESULTS / f"{stem}.png", many)
    log(f"wrote {path} and {stem}.png; targets met on {payload['targets_met']} of "
        f"{len(results)} condition numbers; fair logistic: default / full rounds = "
        f"{fair['default_over_full_rounds']:.2f} (target <= {TARGET_FAIR_RATIO})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
