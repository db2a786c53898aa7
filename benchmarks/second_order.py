"""The quasi-Newton model of the full-batch phase against the first-order surrogates, side by
side in one run (issue 19), with SciPy's SLSQP as the yardstick.

Three groups, default options throughout (only ``hessian`` differs: "lbfgs", the default,
and "none", the paper's first-order surrogates):

* ``classical``: the smooth programs of problems/classical.py (known optima; one client, one
  row, so every round is a full batch), max_iter 2000; SLSQP from the same start with exact
  gradients (iterations, wall time).
* ``diabetes``: least squares on scikit-learn's diabetes data (standardised, intercept), 8
  clients, s.t. the older group's mean squared error <= U (U = 1.0 inactive; 0.228 and 0.226
  active; the least the group can have is 0.2236), against CVXPY + Clarabel on the pooled
  data.
* ``cost``: one closed-form subproblem at d = 101,632, M = 1 with and without a full model
  (8 pairs), and the model's bookkeeping.
* ``pooled``: Neyman-Pearson logistic regression on synthetic data (d = 20, 10 clients):
  class-1 loss + 1e-3 |w|^2 s.t. class-0 loss <= 0.3, N d from 1e4 up to 5e6 (1e6 with
  --quick); SLSQP on the pooled data with exact gradients, and CVXPY + Clarabel on the pooled
  data up to N d = 1e6.

Records status, rounds, wall time, floats sent up, objective gap; writes second_order.json and
second_order.png (rounds per problem for both surrogates next to SLSQP's iterations, and wall
time ratios against SLSQP for the pooled group).

Usage:  python benchmarks/second_order.py [--quick] [--groups classical,diabetes,pooled]
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
    ap.add_argument("--groups", default=",".join(GROUPS))
    args = ap.parse_args()
    groups = args.groups.split(",")
    payload = {"machine": machine(), "command": " ".join(sys.argv), "quick": args.quick}
    if "classical" in groups:
        payload["classical"] = classical()
    if "diabetes" in groups:
        payload["diabetes"] = diabetes(args.quick)
    if "pooled" in groups:
        payload["pooled"] = pooled(args.quick)
    if "cost" in groups:
        payload["cost"] = cost(args.quick)
    payload["summary"] = summary(payload)
    name = "second_order_quick" if args.quick else "second_order"
    if set(groups) != set(GROUPS):
        name += "_" + "_".join(groups)
    write_json(name, payload)
    plot(payload, RESULTS / f"{name}.png")
    for k, v in payload["summary"].items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
