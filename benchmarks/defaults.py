"""What the DEFAULT options give on the problem suite (issue 10: "No tuning", "Accuracy,
measured"), against independent references, next to a hand-tuned baseline.

For every problem of :mod:`problems.suite` (each with a CVXPY + Clarabel reference on the
pooled data, or a multi-start SLSQP one when nonconvex):

* default options: ``prob.solve(seed=s, max_iter=MAX_ITER)`` for seeds 0, 1, 2 (nothing else
  set; max_iter is per penalty stage);
* hand-tuned: the best of the paper-style explicit settings batch_size in {10, 50, "full"} x
  tau in {0.1, 1.0}, max_iter 1000, penalty [10, 100, 1000], chosen on seed 100 by
  max(|gap|, violation) against the reference (fewest rounds on ties; for the infeasible
  problem: status "infeasible", then fewest rounds), then run on seeds 0, 1, 2. A batch larger
  than the smallest client is cut to its size (Dirichlet clients hold 2 rows);

and records status, rounds, samples drawn (rows of the probe and of every round, each client
capped at its N_i; the full-data evaluations of the stopping test are counted apart), floats
sent up (the algorithm's, and the evaluations'), wall time, relative objective gap, relative
violation, relative multiplier error, |x - x_ref|_inf and the KKT residuals, plus the history
of the adaptive defaults (batch sizes, tau, noise ratio, rejected steps). The acceptance
targets (issue 10 item 7) are checked per run (:func:`problems.suite.meets_targets`).

Usage:  python benchmarks/defaults.py [--quick] [--problems a,b] [--no-tuned] [--replot]
Writes benchmarks/results/defaults.json (defaults_quick.json with --quick), with a markdown
table under "table" (also printed), and defaults.png; progress on stderr.
--quick: seed 0 only, the tuned grid on two settings, without the digits problem (its CVXPY
reference takes ~40 s).
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
from problems import suite  # noqa: E402

MAX_ITER = 2000
SEEDS = (0, 1, 2)
TUNE_SEED = 100
GRID = [(b, tau) for b in (10, 50, "full") for tau in (0.1, 1.0)]
TUNED = dict(max_iter=1000, penalty=[10.0, 100.0, 1000.0])
START_BATCH = 32          # ssca_solver.methods.ssca.adaptive.START_BATCH (the probe's batch)


def samples_drawn(prob, res, probe_batch) -> tuple[int, int]:
    """(rows drawn by the probe and the rounds, rows read by the full-data evaluations).

    A round's batch B (NaN: full) is drawn by every client, capped at its N_i."""
    sizes = np.array(prob.data.client_sizes)
    N = int(sizes.sum())
    B = np.asarray(res.history.batch_size, dtype=float)
    full = np.isnan(B)
    rows = int(np.count_nonzero(full)) * N
    for b in B[~full]:
        rows += int(np.minimum(sizes, int(b)).sum())
    rows += N if probe_batch is None else int(np.minimum(sizes, probe_batch).sum())
    evals = (len(res.history.eval_t) + 1) * N          # + the final evaluation
    return rows, evals


def adaptive_history(res) -> dict:
    """What the adaptive defaults did: batch changes, tau, noise ratio, rejected steps."""
    h = res.history
    B = np.asarray(h.batch_size, dtype=float)
    changes = []
    for i, b in enumerate(B):
        prev = B[i - 1] if i else None
        if i == 0 or not (b == prev or (np.isnan(b) and np.isnan(prev))):
            changes.append([int(h.t[i]), "full" if np.isnan(b) else int(b)])
    tau = np.asarray(h.tau, dtype=float)
    noise = np.asarray(h.noise_ratio, dtype=float)
    rej = np.asarray(h.rejected, dtype=float)
    return {"batch_changes": changes, "tau_first": float(tau[0]), "tau_last": float(tau[-1]),
            "tau_min": float(tau.min()), "tau_max": float(tau.max()),
            "noise_ratio_max": float(noise.max(initial=0.0)),
            "noise_ratio_last_minibatch": float(noise[~np.isnan(B)][-1]) if np.any(~np.isnan(B))
            else None,
            "rejected": int(rej.sum()),
            "rejected_last_100": int(rej[-100:].sum()),
            "stages": [[s.penalty, s.rounds, s.slack_norm] for s in res.stages]}


def library_version() -> dict:
    """The commit of the measured ssca_solver and whether its files differ from it (from git;
    a snapshot outside git gives SSCA_LIBRARY_COMMIT)."""
    import os
    import subprocess

    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "ssca_solver"], check=True, capture_output=True,
                               text=True).stdout.strip()
        return {"commit": commit, "ssca_solver_modified": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": os.environ.get("SSCA_LIBRARY_COMMIT", "unknown"),
                "ssca_solver_modified": os.environ.get("SSCA_LIBRARY_MODIFIED", "unknown")}


def failed_run(prob, options, exc, wall) -> dict:
    """A solve that raised: the error, and the last rounds of the same (seeded, so identical)
    solve replayed with a callback that keeps each round's record (a diagnostic re-run)."""
    rows = []

    def keep(it):
        r = it.record
        rows.append({"t": int(it.t), "batch_size": float(r.get("batch_size", np.nan)),
                     "tau": float(r.get("tau", np.nan)), "rejected": float(r.get("rejected", 0)),
                     "noise_ratio": float(r.get("noise_ratio", np.nan)),
                     "max_slack": float(np.max(r["slack"], initial=0.0)),
                     "step_norm": float(r["step_norm"]),
                     "objective": None if it.objective is None else float(it.objective),
                     "max_constraint": None if it.constraints is None or not len(it.constraints)
                     else float(np.max(it.constraints))})

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prob.solve(**options, callback=keep)
    except Exception:  # noqa: BLE001 - the same error again
        pass
    state = getattr(exc, "state", None)
    return {"status": f"error: {type(exc).__name__}", "success": False,
            "rounds": int(getattr(state, "t", rows[-1]["t"] if rows else 0)),
            "time": wall, "wall": wall, "fun": None, "gap": None, "violation": None,
            "violation_U": None, "multipliers": None, "multiplier_error": None,
            "x_error": None, "stationarity_rel": None, "stationarity": None,
            "kkt_scale": None, "complementarity_rel": None, "feasibility_rel": None,
            "domain_violation": None, "kkt_passed": False, "message": str(exc)[:1000],
            "samples": None, "eval_samples": None, "floats_up": None, "eval_floats_up": None,
            "history": {"last_rounds": rows[-60:]}, "warnings": [],
            "misses": [f"raised {type(exc).__name__}"]}


def run(prob, ref, options: dict, probe_batch) -> dict:
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = prob.solve(**options)
    except Exception as exc:  # noqa: BLE001 - a failure of the defaults is a result here
        return failed_run(prob, options, exc, time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    m = suite.measure(prob, ref, res)
    rows, eval_rows = samples_drawn(prob, res, probe_batch)
    c = res.communication
    m.update(wall=wall, samples=rows, eval_samples=eval_rows, floats_up=int(c.up_total),
             eval_floats_up=int(c.eval_up_total), message=res.message,
             history=adaptive_history(res),
             warnings=sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught}),
             misses=suite.meets_targets(ref["kind"], m))
    return m


def score(kind, m) -> tuple:
    if kind == "infeasible":
        return (0.0 if m["status"] == "infeasible" else 1.0, m["rounds"])
    if m["gap"] is None:                      # the solve raised
        return (np.inf, m["rounds"])
    return (max(abs(m["gap"]), m["violation"]), m["rounds"])


def tuned_options(prob, b, tau, seed) -> dict:
    smallest = min(prob.data.client_sizes)
    opts = dict(batch_size=b if b == "full" else min(b, smallest), tau=tau, seed=seed,
                max_iter=TUNED["max_iter"])
    if prob.num_constraints:
        opts["penalty"] = TUNED["penalty"]
    return opts


def reference_check(prob, ref) -> dict:
    """The reference's own feasibility on the pooled data (its accuracy)."""
    if ref["x"] is None:
        return {"min_violation": ref["min_violation"]}
    cons = suite.pooled_constraints(prob, ref["x"])
    mu = np.asarray(ref["multipliers"], dtype=float)
    return {"max_F_minus_U": float(np.max(cons, initial=-np.inf)),
            "max_complementarity": float(np.max(np.abs(mu * cons), initial=0.0)),
            "stationarity": ref.get("stationarity")}


def fmt(v, spec=".1e"):
    if v is None:
        return "-"
    if isinstance(v, float) and np.isnan(v):
        return "nan"
    return format(v, spec)


def summary(entry) -> dict:
    """Worst case over seeds of the accuracy columns, means of the cost columns."""
    def worst(runs, key, absolute=False):
        vals = [r[key] for r in runs if r[key] is not None]
        if not vals:
            return None
        return float(max(abs(v) for v in vals)) if absolute else float(max(vals))

    def mean(runs, key):
        vals = [r[key] for r in runs if r[key] is not None]
        return float(np.mean(vals)) if vals else None

    out = {}
    for which in ("default", "tuned"):
        runs = entry.get(which)
        if not runs:
            continue
        out[which] = {"statuses": [r["status"] for r in runs],
                      "gap": worst(runs, "gap", True), "violation": worst(runs, "violation"),
                      "violation_U": worst(runs, "violation_U"),
                      "multiplier_error": worst(runs, "multiplier_error"),
                      "x_error": worst(runs, "x_error"),
                      "kkt": max((max(r["stationarity_rel"], r["complementarity_rel"])
                                  for r in runs if r["stationarity_rel"] is not None),
                                 default=None),
                      "rounds": mean(runs, "rounds"), "samples": mean(runs, "samples"),
                      "floats_up": mean(runs, "floats_up"), "time": mean(runs, "wall"),
                      "targets_met": all(not r["misses"] for r in runs),
                      "misses": sorted({x for r in runs for x in r["misses"]})}
    return out


def table(results) -> str:
    head = ("| problem | kind | default status (seeds) | gap | viol | mu err | x err | KKT | "
            "rounds | samples | floats up | time s | targets | tuned setting | tuned status | "
            "gap | viol | mu err | rounds | samples | time s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, e in results.items():
        s, kind = e["summary"], e["reference"]["kind"]
        d = s["default"]
        row = [name, kind, "/".join(d["statuses"]), fmt(d["gap"]), fmt(d["violation"]),
               fmt(d["multiplier_error"]), fmt(d["x_error"]), fmt(d["kkt"]),
               fmt(d["rounds"], ".0f"), fmt(d["samples"], ".3g"), fmt(d["floats_up"], ".3g"),
               fmt(d["time"], ".2f"), "met" if d["targets_met"] else
               "MISSED: " + "; ".join(d["misses"])]
        t = s.get("tuned")
        if t:
            cfg = e["tuned_setting"]
            row += [f"B={cfg['batch_size']}, tau={cfg['tau']}", "/".join(t["statuses"]),
                    fmt(t["gap"]), fmt(t["violation"]), fmt(t["multiplier_error"]),
                    fmt(t["rounds"], ".0f"), fmt(t["samples"], ".3g"), fmt(t["time"], ".2f")]
        else:
            row += ["-"] * 8
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    x = np.arange(len(names))
    floor = 1e-16

    def col(which, key):
        out = []
        for n in names:
            s = results[n]["summary"].get(which)
            v = None if s is None else s[key]
            out.append(np.nan if v is None else max(abs(v), floor))
        return np.array(out)

    fig, axes = plt.subplots(3, 1, figsize=(12, 10), sharex=True)
    panels = [("gap", "|relative objective gap| (worst seed)", 1e-3),
              ("violation", "relative violation (worst seed)", 1e-4),
              ("rounds", "rounds (mean over seeds)", None)]
    for ax, (key, title, target) in zip(axes, panels):
        ax.bar(x - 0.2, col("default", key), 0.4, label="default options")
        ax.bar(x + 0.2, col("tuned", key), 0.4, label="hand-tuned (best of grid)")
        ax.set_yscale("log")
        ax.set_title(title)
        if target:
            ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:g}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].text(0.01, 0.9, f"bars at {floor:g}: no violation", transform=axes[1].transAxes,
                 fontsize=8)
    for i, n in enumerate(names):
        if results[n]["reference"]["kind"] == "infeasible":
            axes[0].text(i, 1e-10, "infeasible:\nno gap", ha="center", fontsize=7)
        raised = sum(s.startswith("error") for s in results[n]["summary"]["default"]["statuses"])
        if raised:
            axes[0].text(i, 0.97, f"{raised} seed(s)\nraised", ha="center", va="top",
                         fontsize=7, color="red", transform=axes[0].get_xaxis_transform())
    axes[-1].set_xticks(x)
    axes[-1].set_xticklabels(names, rotation=30, ha="right")
    for label, n in zip(axes[-1].get_xticklabels(), names):
        if not results[n]["summary"]["default"]["targets_met"]:
            label.set_color("red")
    axes[-1].text(0.01, 0.9, "red names: default options miss a target on some seed",
                  transform=axes[-1].transAxes, fontsize=8, color="red")
    fig.suptitle("Default options vs hand-tuned SSCA on the problem suite")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--problems", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--no-tuned", action="store_true")
    ap.add_argument("--replot", action="store_true",
                    help="redraw the PNG from the JSON (with --quick: the quick one)")
    args = ap.parse_args(argv)
    if args.replot:
        import json
        stem = "defaults_quick" if args.quick else "defaults"
        plot(json.loads((RESULTS / f"{stem}.json").read_text())["problems"],
             RESULTS / f"{stem}.png")
        return
    names = args.problems.split(",") if args.problems else list(suite.PROBLEMS)
    seeds, grid = SEEDS, GRID
    if args.quick:
        seeds, grid = (0,), [("full", 1.0), (10, 0.1)]
        if not args.problems:
            names = [n for n in names if n != "softmax_digits"]
    results = {}
    t_all = time.perf_counter()
    warm, _ = suite.build("qcqp3")       # compiles the Numba kernels before anything is timed
    warm.solve(seed=0, max_iter=50)
    for name in names:
        t0 = time.perf_counter()
        prob, ref = suite.build(name)
        t_ref = time.perf_counter() - t0
        log(f"[{name}] reference ({ref['kind']}) in {t_ref:.1f} s: {ref['source']}")
        entry = {"reference": {"kind": ref["kind"], "fun": ref["fun"],
                               "multipliers": None if ref["multipliers"] is None
                               else np.asarray(ref["multipliers"]).tolist(),
                               "source": ref["source"], "time": t_ref,
                               "check": reference_check(prob, ref)},
                 "doc": (suite.PROBLEMS[name].__doc__ or "").strip(),
                 "dim": prob.dim, "clients": list(prob.data.client_sizes),
                 "constraints": [c.name for c in prob.constraints]}
        entry["default"] = []
        for s in seeds:
            m = run(prob, ref, dict(seed=s, max_iter=MAX_ITER), START_BATCH)
            entry["default"].append(dict(seed=s, **m))
            log(f"[{name}] default seed {s}: {m['status']} in {m['rounds']} rounds, "
                f"{m['wall']:.1f} s, gap {fmt(m['gap'])}, viol {fmt(m['violation'])}, "
                f"mu err {fmt(m['multiplier_error'])}, x err {fmt(m['x_error'])}, "
                f"KKT {fmt(m['stationarity_rel'])}/{fmt(m['complementarity_rel'])}"
                + (f"  MISSES: {m['misses']}" if m["misses"] else ""))
        if not args.no_tuned:
            trials = []
            for b, tau in grid:
                opts = tuned_options(prob, b, tau, TUNE_SEED)
                m = run(prob, ref, opts, None if b == "full" else opts["batch_size"])
                trials.append({"batch_size": opts["batch_size"], "tau": tau,
                               "score": list(score(ref["kind"], m)), "status": m["status"],
                               "rounds": m["rounds"], "gap": m["gap"],
                               "violation": m["violation"], "wall": m["wall"]})
                log(f"[{name}] grid B={opts['batch_size']} tau={tau}: {m['status']} "
                    f"{m['rounds']} rounds, gap {fmt(m['gap'])}, viol {fmt(m['violation'])}")
            best = min(range(len(trials)), key=lambda i: tuple(trials[i]["score"]))
            cfg = trials[best]
            entry["tuning_grid"] = trials
            entry["tuned_setting"] = {"batch_size": cfg["batch_size"], "tau": cfg["tau"],
                                      **{k: v for k, v in TUNED.items()
                                         if k != "penalty" or prob.num_constraints}}
            entry["tuned"] = []
            for s in seeds:
                opts = tuned_options(prob, cfg["batch_size"], cfg["tau"], s)
                m = run(prob, ref, opts, None if cfg["batch_size"] == "full"
                        else opts["batch_size"])
                entry["tuned"].append(dict(seed=s, **m))
                log(f"[{name}] tuned seed {s}: {m['status']} in {m['rounds']} rounds, "
                    f"gap {fmt(m['gap'])}, viol {fmt(m['violation'])}")
        entry["summary"] = summary(entry)
        results[name] = entry
        log(f"[{name}] done in {time.perf_counter() - t0:.1f} s")
    text = table(results)
    met = [n for n, e in results.items() if e["summary"]["default"]["targets_met"]]
    missed = [n for n in results if n not in met]
    payload = {"description": __doc__, "command": "python benchmarks/defaults.py"
               + (" --quick" if args.quick else "") + (f" --problems {args.problems}"
                                                       if args.problems else ""),
               "machine": machine(), "library": library_version(), "max_iter_default": MAX_ITER, "seeds": list(seeds),
               "targets": suite.TARGETS, "grid": [list(g) for g in grid],
               "tuned_common": TUNED, "total_time": time.perf_counter() - t_all,
               "targets_met": met, "targets_missed": missed, "table": text,
               "problems": results}
    stem = "defaults_quick" if args.quick else "defaults"
    path = write_json(stem, payload)
    plot(results, RESULTS / f"{stem}.png")
    print(text)
    print(f"\ndefault options meet the targets on {len(met)}/{len(results)} problems"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    log(f"wrote {path} and {RESULTS / (stem + '.png')} in {payload['total_time']:.0f} s")


if __name__ == "__main__":
    main()
