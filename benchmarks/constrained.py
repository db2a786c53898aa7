"""Algorithm 2 against the constrained federated baselines (issue 12), side by side in one run.

Problems (each with an independent reference):
  * Neyman-Pearson on breast cancer (problems.suite.neyman_pearson_cancer; convex, CVXPY +
    Clarabel on the pooled data);
  * the fairness example (problems.suite.fairness_diabetes; nonconvex constraints, SciPy SLSQP
    from x0 = 0 and 8 random starts on the pooled data, the KKT point reached from x0 = 0);
  * the stochastic QCQP (problems.suite.qcqp_three_constraints; convex, CVXPY + Clarabel);
  * the paper's constrained network (prob:class-con: min |w|^2 s.t. cross-entropy <= U, the
    784-128-10 swish network) on a NET_ROWS-row subset of Fashion-MNIST (10 IID clients), U
    active, all runs from the same initial weights (seeds vary the mini-batches only);
    reference: a long full-batch run of Algorithm 2 (deterministic SCA with the default
    options and batch_size="full", NET_REF_ROUNDS rounds per penalty stage) from that start.
    Only when /usr/share/datasets/fashion-mnist exists.

Methods, each with the same full-data KKT stopping test (feas_tol = kkt_tol = 1e-4) and at most
T rounds in all (a callback stops Algorithm 2's penalty continuation at T rounds):
  * "SSCA default": ``prob.solve(seed=s)``;
  * "SSCA tuned": the best of GRID_SSCA (6 settings) on the tuning seeds;
  * "primal-dual": ``method="primal_dual"``, the best of GRID_PD (6 settings);
  * "augmented Lagrangian": ``method="augmented_lagrangian"``, the best of GRID_AL (6).
Tuning: every setting on the tuning seeds TUNE_SEEDS (separate from the reported seeds); the
one with the fewest rounds to the target (mean over tuning seeds, a miss counting 2 T) wins,
ties broken by the final max(gap, violation).

Target: relative objective gap (F - F*)/|F*| <= 1e-2 and relative violation
max_m (F_m - U_m)_+ / max(1, |U_m|) <= 1e-3 at a full-data evaluation (every eval_every rounds).
Recorded per method: the rounds and the floats (up + down, the algorithm's messages only; the
full-data evaluations of the stopping test and SSCA's probe are diagnostics, counted apart in
the JSON) to reach it first, mean +- std over the runs that reached it and how many did; how
many runs meet the target at their returned point; curves of gap and violation against rounds
and floats (median over seeds), final status ("stopped": the T-round budget ran out;
"converged": the KKT test passed earlier), the rows the clients read to the target (the
computation: SSCA's batches, the baselines' E x B per round; SSCA's probe not counted), time.

Usage:  python benchmarks/constrained.py [--quick] [--problems a,b] [--seeds n] [--replot]
                                         [--out NAME]
Writes benchmarks/results/NAME[_quick].json and NAME[_quick].png (NAME: constrained); progress
on stderr. The results on docs/benchmarks.md: ``--problems neyman_pearson,fairness,qcqp`` and
``--problems network --out constrained_network``. --quick: 2 reported seeds, 1 tuning seed, the grids cut to 2 settings per method,
T / 4 rounds, no network.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import ssca_solver as ss  # noqa: E402
from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402
from defaults import library_version  # noqa: E402
from problems import suite  # noqa: E402

GAP_TARGET, VIOL_TARGET = 1e-2, 1e-3
TUNE_SEEDS = (100, 101)
FASHION = Path("/usr/share/datasets/fashion-mnist")
NET_ROWS, NET_HIDDEN, NET_U, NET_REF_ROUNDS = 10_000, 128, 0.7, 250

#: per problem: rounds T, eval_every, reported seeds
SETTINGS = {"neyman_pearson": dict(T=600, every=5, seeds=10),
            "fairness": dict(T=600, every=5, seeds=10),
            "qcqp": dict(T=600, every=5, seeds=10),
            "network": dict(T=500, every=10, seeds=3)}
NOTE_NETWORK = ("network: 3 reported seeds (not 10), 1 tuning seed, T = 500 rounds, grids of 3 "
                "settings per tuned method at B = 50 (not 6), on a 10,000-row subset of "
                "Fashion-MNIST, for time (2 shared cores)")

GRID_SSCA = [dict(batch_size=b, tau=tau, penalty=[10.0, 100.0, 1000.0])
             for b in (50, "full") for tau in (0.1, 1.0, 10.0)]
GRID_PD = [dict(batch_size=b, lr=a, dual_lr=e) for b in (50, "full")
           for a, e in ((0.1, 0.1), (0.5, 0.5), (0.5, 2.0))]
#: (a first grid with rho in {1, 10} only diverged or stalled on the QCQP in all 6 settings:
#: its multiplier steps rho (Fhat - U) overshoot there; rho = 0.3 is the small-step setting,
#: like GRID_PD's (0.1, 0.1))
GRID_AL = [dict(batch_size=b, lr=a, rho=r) for b in (50, "full")
           for a, r in ((0.1, 0.3), (0.5, 1.0), (0.5, 10.0))]
#: the network (cost: 3 settings each, B = 50 only, stated in the JSON): smaller steps (the
#: multiplier grows while the cross-entropy is far above U, and lr * lambda with it), and the
#: baselines start at lambda = 1 (from lambda = 0 the |w|^2 step drives w to the stationary
#: point w = 0 of the network first; measured)
NET_GRID_SSCA = [dict(batch_size=50, tau=tau, penalty=[100.0, 1000.0, 10000.0])
                 for tau in (0.1, 1.0, 10.0)]
NET_GRID_PD = [dict(batch_size=50, lr=a, dual_lr=e, multipliers0=[1.0])
               for a, e in ((0.05, 0.05), (0.02, 0.1), (0.05, 0.01))]
NET_GRID_AL = [dict(batch_size=50, lr=a, rho=r, multipliers0=[1.0])
               for a, r in ((0.05, 0.1), (0.02, 0.1), (0.05, 0.02))]

METHODS = ("SSCA default", "SSCA tuned", "primal-dual", "augmented Lagrangian")
SOLVE_METHOD = {"SSCA default": "ssca", "SSCA tuned": "ssca", "primal-dual": "primal_dual",
                "augmented Lagrangian": "augmented_lagrangian"}

_CACHE: dict = {}


# -- problems -------------------------------------------------------------------------------------

def network_problem():
    """prob:class-con on a NET_ROWS-row subset of Fashion-MNIST and its long-run reference."""
    from problems.mlp import MLP, classification_con
    from ssca_solver.datasets import image_dataset

    (X, y), _ = image_dataset("fashion-mnist", str(FASHION))
    idx = np.random.default_rng(0).permutation(len(y))[:NET_ROWS]
    X, y = X[idx], y[idx]
    net = MLP(X.shape[1], NET_HIDDEN, 10)
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    prob = classification_con(data, net, NET_U)
    x0 = net.init(0)
    log(f"  network reference: full-batch Algorithm 2 from net.init(0), "
        f"{NET_REF_ROUNDS} rounds per penalty stage ...")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(batch_size="full", max_iter=NET_REF_ROUNDS, x0=x0, eval_every=10,
                         seed=0)
    log(f"  network reference: {res.status}, |w|^2 = {res.fun:.6g}, F - U = "
        f"{res.constraints[0]:.3g}, {res.nit} rounds, {time.perf_counter() - t0:.0f} s")
    last = ", ".join(f"{v:.5g}" for v in res.history.objective[-3:])
    ref = {"kind": "nonconvex", "x": res.x, "fun": float(res.fun),
           "multipliers": res.kkt.multipliers,
           "source": f"full-batch Algorithm 2 (default options, batch_size='full', "
                     f"max_iter={NET_REF_ROUNDS} per penalty stage) from net.init(0): status "
                     f"{res.status}, {res.nit} rounds, F - U = {res.constraints[0]:.3g}, "
                     f"KKT stationarity (relative) {res.kkt.stationarity_rel:.3g}; |w|^2 at "
                     f"its last three evaluations (every 10 rounds): {last}"}
    return prob, ref, {"x0": x0}


def build(name):
    if name not in _CACHE:
        if name == "network":
            _CACHE[name] = network_problem()
        else:
            fn = {"neyman_pearson": suite.neyman_pearson_cancer,
                  "fairness": suite.fairness_diabetes,
                  "qcqp": suite.qcqp_three_constraints}[name]
            prob, ref = fn()
            _CACHE[name] = (prob, ref, {})
    return _CACHE[name]


# -- one run --------------------------------------------------------------------------------------

def relative_violation(cons, bounds):
    return np.max(np.maximum(cons, 0.0) / np.maximum(1.0, np.abs(bounds)), axis=-1,
                  initial=0.0)


def run(name, label, options, seed, T, every):
    """One solve, stopped at T rounds in all; the full-data curves and the first round at which
    the target holds."""
    prob, ref, extra = build(name)
    method = SOLVE_METHOD[label]
    opts = dict(options)
    if label == "SSCA tuned":          # every penalty stage fits in the budget of T rounds
        opts["max_iter"] = max(1, T // len(opts["penalty"]))
    elif label != "SSCA default":      # (SSCA default: the library's max_iter, 200 per stage)
        opts["max_iter"] = T
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # fixed schedules, inaccurate-solve notes
            res = prob.solve(method=method, seed=seed, eval_every=every,
                             callback=lambda it: it.t >= T, **extra, **opts)
    except (ss.SSCAError, ValueError, FloatingPointError) as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "seed": seed, "wall_s": time.perf_counter() - t0, "reached_round": None,
                "reached_floats": None, "t": [], "gap": [], "violation": [],
                "floats_per_round": None}
    h = res.history
    t = list(map(int, h.eval_t))
    obj = list(map(float, h.objective))
    cons = [np.asarray(c, dtype=float) for c in h.constraints]
    if not t or t[-1] != res.nit:                   # the returned point
        t.append(int(res.nit))
        obj.append(float(res.fun))
        cons.append(np.asarray(res.constraints, dtype=float))
    bounds = prob.bounds
    gap = [(f - ref["fun"]) / abs(ref["fun"]) for f in obj]
    viol = [float(relative_violation(c, bounds)) for c in cons]
    c = res.communication
    per_round = c.num_clients * (c.up_per_client_round + c.down_per_client_round)
    hit = next((k for k in range(len(t)) if gap[k] <= GAP_TARGET and viol[k] <= VIOL_TARGET),
               None)
    rows = np.cumsum(rows_per_round(prob, method, opts, h))
    return {"seed": seed, "status": res.status, "rounds": int(res.nit), "wall_s": res.time,
            "t": t, "gap": gap, "violation": viol, "floats_per_round": per_round,
            "eval_floats": c.eval_up_total + c.eval_down_total,
            "reached_round": None if hit is None else t[hit],
            "reached_floats": None if hit is None else t[hit] * per_round,
            "reached_rows": None if hit is None else int(rows[t[hit] - 1]),
            "rows_total": int(rows[-1]) if rows.size else 0,
            "final_gap": gap[-1], "final_violation": viol[-1],
            "final_fun": float(res.fun),
            "multipliers_kkt": [float(v) for v in res.kkt.multipliers],
            "multipliers_method": ([float(v) for v in res.extras["multipliers"]]
                                   if "multipliers" in res.extras else None)}


def rows_per_round(prob, method, opts, history):
    """Rows each round's clients read (the computation): SSCA, the batch of the round (the
    history's batch_size, NaN: full) capped at each N_i; the baselines, E local steps of B rows
    each (every row with "full"). SSCA's probe before round 1 is not counted."""
    sizes = np.array(prob.data.client_sizes)
    if method == "ssca":
        return np.array([sizes.sum() if np.isnan(b) else np.minimum(sizes, int(b)).sum()
                         for b in np.asarray(history.batch_size, dtype=float)])
    B = opts.get("batch_size", 10)
    rows = sizes.sum() if B in (None, "full") else np.minimum(sizes, int(B)).sum()
    return np.full(len(history.t), opts.get("local_steps", 1) * rows)


def score(runs, T):
    """Tuning score: (mean rounds to the target, a miss counting 2 T; mean final error)."""
    rounds = [r["reached_round"] if r["reached_round"] is not None else 2 * T for r in runs]
    err = [max(abs(r["final_gap"]), r["final_violation"]) if r["status"] != "error"
           else math.inf for r in runs]
    return float(np.mean(rounds)), float(np.mean(err))


def tune(name, label, grid, T, every, seeds):
    best, table = None, []
    for g in grid:
        runs = [run(name, label, g, s, T, every) for s in seeds]
        sc = score(runs, T)
        table.append({"options": describe(g), "score_rounds": sc[0], "score_error": sc[1],
                      "statuses": [r["status"] for r in runs]})
        log(f"    tune {label:<22s} {describe(g)}: rounds {sc[0]:.0f}, error {sc[1]:.3g}")
        if best is None or sc < best[0]:
            best = (sc, g)
    return best[1], table


def describe(options) -> dict:
    return {k: (v if isinstance(v, (int, float, str, list)) else repr(v))
            for k, v in options.items()}


def summarise(runs):
    reached = [r for r in runs if r["reached_round"] is not None]
    rr = np.array([r["reached_round"] for r in reached], dtype=float)
    ff = np.array([r["reached_floats"] for r in reached], dtype=float)
    nn = np.array([r["reached_rows"] for r in reached], dtype=float)
    ok = [r for r in runs if r["status"] != "error"]
    at_end = sum(1 for r in ok if r["final_gap"] <= GAP_TARGET
                 and r["final_violation"] <= VIOL_TARGET)
    return {"runs": len(runs), "reached": len(reached), "target_at_end": at_end,
            "rounds_mean": float(rr.mean()) if rr.size else None,
            "rounds_std": float(rr.std()) if rr.size else None,
            "floats_mean": float(ff.mean()) if ff.size else None,
            "floats_std": float(ff.std()) if ff.size else None,
            "rows_mean": float(nn.mean()) if nn.size else None,
            "rows_std": float(nn.std()) if nn.size else None,
            "final_gap_median": float(np.median([r["final_gap"] for r in ok])) if ok else None,
            "final_violation_median": (float(np.median([r["final_violation"] for r in ok]))
                                       if ok else None),
            "statuses": {s: sum(r["status"] == s for r in runs)
                         for s in sorted({r["status"] for r in runs})},
            "wall_s_mean": float(np.mean([r["wall_s"] for r in runs])),
            "floats_per_round": ok[0]["floats_per_round"] if ok else None}


# -- the benchmark --------------------------------------------------------------------------------

def grids(name, quick):
    g = ({"SSCA tuned": NET_GRID_SSCA, "primal-dual": NET_GRID_PD,
          "augmented Lagrangian": NET_GRID_AL} if name == "network" else
         {"SSCA tuned": GRID_SSCA, "primal-dual": GRID_PD, "augmented Lagrangian": GRID_AL})
    if quick:
        g = {k: [v[0], v[-1]] for k, v in g.items()}
    return g


def bench_problem(name, quick, seeds_override=None):
    cfg = SETTINGS[name]
    T = cfg["T"] // 4 if quick else cfg["T"]
    every = cfg["every"]
    nseeds = seeds_override or (2 if quick else cfg["seeds"])
    seeds = list(range(nseeds))
    tune_seeds = TUNE_SEEDS[:1] if (quick or name == "network") else TUNE_SEEDS
    t0 = time.perf_counter()
    prob, ref, _ = build(name)
    log(f"[{name}] d = {prob.dim}, M = {prob.num_constraints}, clients = "
        f"{prob.data.num_clients}, N = {prob.data.num_samples}; reference F* = "
        f"{ref['fun']:.6g} ({ref['kind']}); T = {T}, eval every {every}, seeds {seeds}, "
        f"tuning seeds {list(tune_seeds)}")
    chosen, tuning = {"SSCA default": {}}, {}
    for label, grid in grids(name, quick).items():
        chosen[label], tuning[label] = tune(name, label, grid, T, every, tune_seeds)
    out = {"reference": {"fun": ref["fun"], "kind": ref["kind"], "source": ref["source"],
                         "multipliers": [float(v) for v in ref["multipliers"]]},
           "T": T, "eval_every": every, "seeds": seeds, "tuning_seeds": list(tune_seeds),
           "dim": prob.dim, "constraints": prob.num_constraints,
           "clients": prob.data.num_clients, "rows": prob.data.num_samples,
           "methods": {}}
    for label in METHODS:
        runs = []
        for s in seeds:
            runs.append(run(name, label, chosen[label], s, T, every))
            r = runs[-1]
            log(f"  {label:<22s} seed {s}: {r['status']}, reached at "
                f"{r['reached_round']}, final gap {r.get('final_gap', float('nan')):.2e}, "
                f"violation {r.get('final_violation', float('nan')):.2e}, "
                f"{r['wall_s']:.1f} s")
        out["methods"][label] = {"options": describe(chosen[label]),
                                 "tuning": tuning.get(label), "summary": summarise(runs),
                                 "runs": runs}
    out["wall_s"] = time.perf_counter() - t0
    return out


def optional_references() -> dict:
    notes = {}
    for mod in ("cooper", "humancompatible.train"):
        try:
            __import__(mod)
            notes[mod] = ("importable, but not run: this benchmark has no adapter for it yet")
        except ImportError:
            notes[mod] = ("not installed (it pulls torch with CUDA, 5.6 GB): its pooled "
                          "augmented Lagrangian reference was not run")
    return notes


def table_markdown(results) -> str:
    lines = ["| problem | method | reached | rounds to target | floats to target | "
             "floats/round | rows read to target | target held at the end | "
             "final gap (median) | final violation (median) | statuses |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, pr in results.items():
        for label, m in pr["methods"].items():
            s = m["summary"]
            rounds = (f"{s['rounds_mean']:.0f} ± {s['rounds_std']:.0f}"
                      if s["rounds_mean"] is not None else "not reached")
            floats = (f"{s['floats_mean']:.3g} ± {s['floats_std']:.2g}"
                      if s["floats_mean"] is not None else "—")
            fpr = f"{s['floats_per_round']:,}" if s["floats_per_round"] else "—"
            rws = (f"{s['rows_mean']:.3g} ± {s['rows_std']:.2g}" if s.get("rows_mean")
                   is not None else "—")
            gap = (f"{s['final_gap_median']:.2e}" if s["final_gap_median"] is not None
                   else "—")
            vio = (f"{s['final_violation_median']:.1e}"
                   if s["final_violation_median"] is not None else "—")
            st = ", ".join(f"{k} {v}" for k, v in s["statuses"].items())
            lines.append(f"| {name} | {label} | {s['reached']}/{s['runs']} | {rounds} | "
                         f"{floats} | {fpr} | {rws} | {s['target_at_end']}/{s['runs']} | {gap} | "
                         f"{vio} | {st} |")
    return "\n".join(lines)


def median_curve(runs, key, xkey):
    """(x, median of key) on the union of evaluation rounds, each run held at its last value
    after it stopped (a converged run stays where it stopped)."""
    ok = [r for r in runs if r["status"] != "error" and r["t"]]
    if not ok:
        return np.zeros(0), np.zeros(0)
    ts = np.array(sorted({t for r in ok for t in r["t"]}))
    vals = []
    for r in ok:
        t, v = np.array(r["t"]), np.array(r[key], dtype=float)
        idx = np.searchsorted(t, ts, side="right") - 1
        vals.append(np.where(idx >= 0, v[np.maximum(idx, 0)], np.nan))
    med = np.nanmedian(np.array(vals), axis=0)
    x = ts if xkey == "rounds" else ts * ok[0]["floats_per_round"]
    return x, med


def plot(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 4, figsize=(18, 3.6 * len(names)), squeeze=False)
    colors = {"SSCA default": "C0", "SSCA tuned": "C1", "primal-dual": "C2",
              "augmented Lagrangian": "C3"}
    for i, name in enumerate(names):
        pr = results[name]
        for j, (key, xkey) in enumerate((("gap", "rounds"), ("violation", "rounds"),
                                         ("gap", "floats"), ("violation", "floats"))):
            ax = axes[i, j]
            for label, m in pr["methods"].items():
                x, y = median_curve(m["runs"], key, xkey)
                if not x.size:
                    continue
                y = np.abs(y) if key == "gap" else y
                ax.plot(x, np.maximum(y, 1e-10 if key == "gap" else 1e-6),
                        color=colors[label], label=label)
            ax.axhline(GAP_TARGET if key == "gap" else VIOL_TARGET, color="k", ls=":", lw=1)
            ax.set_yscale("log")
            ax.set_xscale("log" if xkey == "floats" else "linear")
            ax.set_xlabel("rounds" if xkey == "rounds" else "floats sent (up + down)")
            ax.set_ylabel("|F - F*| / |F*|" if key == "gap"
                          else "max (F_m - U_m)+ / max(1,|U_m|)\n(feasible: 1e-6)",
                          fontsize=8)
            ax.set_title(f"{name}: {'objective gap' if key == 'gap' else 'violation'} "
                         f"(median of {pr['methods']['SSCA default']['summary']['runs']})",
                         fontsize=9)
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--problems", default="network,neyman_pearson,fairness,qcqp")
    ap.add_argument("--seeds", type=int, default=None, help="reported seeds per problem")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON")
    ap.add_argument("--out", default="constrained",
                    help="name of the JSON and PNG in benchmarks/results (default constrained)")
    args = ap.parse_args(argv)
    suffix = "_quick" if args.quick else ""
    out = args.out + suffix
    jpath = RESULTS / f"{out}.json"
    if args.replot:
        import json
        payload = json.loads(jpath.read_text())
        plot(payload["problems"], RESULTS / f"{out}.png", payload["title"])
        return
    from threadpoolctl import threadpool_limits

    names = [n.strip() for n in args.problems.split(",") if n.strip()]
    notes = {"network_limits": NOTE_NETWORK}
    if "network" in names and args.quick:
        names.remove("network")
        notes["network"] = "skipped in --quick"
    if "network" in names and not FASHION.exists():
        names.remove("network")
        notes["network"] = f"skipped: {FASHION} does not exist"
    mach = machine()
    t0 = time.perf_counter()
    results = {}
    with threadpool_limits(1):
        for name in names:
            try:
                results[name] = bench_problem(name, args.quick, args.seeds)
            except Exception as exc:        # record it and go on with the other problems
                import traceback
                notes[name] = f"failed: {type(exc).__name__}: {exc}"
                log(traceback.format_exc())
                continue
            log(f"[{name}] done in {results[name]['wall_s']:.0f} s")
            payload = {"machine": mach, "library": library_version(),
                       "command": "python " + " ".join(["benchmarks/constrained.py",
                                                        *(argv if argv is not None
                                                          else sys.argv[1:])]),
                       "targets": {"gap": GAP_TARGET, "violation": VIOL_TARGET},
                       "notes": notes, "optional_references": optional_references(),
                       "problems": results, "wall_s": time.perf_counter() - t0,
                       "title": f"constrained baselines; {machine_title(mach)}"}
            payload["table"] = table_markdown(results)
            write_json(out, payload)       # after every problem
    plot(results, RESULTS / f"{out}.png", payload["title"])
    print(payload["table"])
    log(f"wrote {jpath} and {out}.png in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
