"""Reproduction of the paper's Section VI on Fashion-MNIST (MNIST with --data mnist --data-dir).

Runs, on the same partition (I = 10 IID clients), from the same initial points, with the same
evaluation:
  * Algorithm 1 (SSCA) with the paper's (a1, a2, alpha) for B = 1, 10, 100 and with settings
    tuned by grid search;
  * FedSGD (E = 1, batch B), FedAvg with E = 2 local steps of batch B/2 (the equal-computation
    comparison) and SGD with server momentum, learning rates abar / t^alphabar tuned by grid
    search with the same budget as SSCA's;
  * Algorithm 2 for U = 0.13 (the paper) and values of U that make the constraint active;
  * lambda and U sweeps for the |w|^2-versus-cost trade-off (Figure 3).
The grid search is selected on the final training cost, on seeds separate from the reported
ones. Training cost is evaluated on all N rows every T/4 rounds and test accuracy every 10
rounds, from iterates saved during the run; grid-search runs evaluate only their final cost.

Usage:  python benchmarks/section_vi.py [--quick] [--runs R] [--rounds T] [--jobs 2]
Writes benchmarks/results/section_vi[_quick].json, fig1/fig2/fig3 PNGs and a table (Markdown).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssca_solver as ss  # noqa: E402
from _common import RESULTS, log, machine, write_json  # noqa: E402
from problems.mlp import MLP, classification_con, classification_uncon  # noqa: E402
from ssca_solver.datasets import image_dataset  # noqa: E402

PAPER = {1: (0.4, 0.4, 0.4), 10: (0.6, 0.9, 0.3), 100: (0.9, 0.9, 0.3)}  # (a1, a2, alpha)
TAU, C, LAM = 0.1, 1e5, 1e-5

_G = {}  # data shared with forked workers


def _setup(name, data_dir, hidden):
    (X, y), (Xt, yt) = image_dataset(name, data_dir)
    _G.update(X=X, y=y, Xt=Xt, yt=yt, net=MLP(X.shape[1], hidden, 10),
              data=ss.FederatedData.split(X, y, num_clients=10, seed=0))


def run(cfg):
    """One run: cfg = dict(method, B, seed, T, ...). Returns curves and final numbers."""
    from threadpoolctl import threadpool_limits

    net, data = _G["net"], _G["data"]
    snaps = {}
    every = cfg["acc_every"]

    def keep(t, w):
        if t % every == 0:
            snaps[t] = w.copy()

    t0 = time.perf_counter()
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the paper's schedules violate sum gamma^2 < inf
        x0 = net.init(cfg["seed"])
        keep(0, x0)
        common = dict(max_iter=cfg["T"], seed=cfg["seed"], x0=x0, eval_every=None)
        m = cfg["method"]
        if m in ("ssca", "ssca-con"):
            a1, a2, alpha = cfg["a"]
            prob = (classification_uncon(data, net, cfg.get("lam", LAM)) if m == "ssca"
                    else classification_con(data, net, cfg["U"]))
            res = prob.solve(method="ssca", batch_size=cfg["B"], tau=cfg["tau"],
                             rho=ss.PowerStep(a1, alpha), gamma=ss.PowerStep(a2, alpha + 0.05),
                             penalty=[C], callback=lambda it: keep(it.t, it.x), **common)
        else:
            abar, alphabar = cfg["lr"]
            prob = classification_uncon(data, net, LAM)
            res = prob.solve(method="fedavg", batch_size=cfg["B"], local_steps=cfg["E"],
                             lr=lambda t: abar / t ** alphabar, momentum=cfg["momentum"],
                             callback=lambda it: keep(it.t, it.x), **common)
        run_time = time.perf_counter() - t0
        ts = sorted(snaps)
        acc = [net.evaluate(snaps[t], _G["Xt"], _G["yt"])[1] for t in ts]
        cost_ts = [t for t in ts if t % cfg["cost_every"] == 0 or t == ts[-1]]
        cost = [net.evaluate(snaps[t], _G["X"], _G["y"])[0] for t in cost_ts]
    w = res.x
    return {**cfg, "t_acc": ts, "test_acc": acc, "t_cost": cost_ts, "train_cost": cost,
            "norm2": float(w @ w), "floats_up_per_client_round": res.communication.
            up_per_client_round, "floats_down_per_client_round": res.communication.
            down_per_client_round, "status": res.status, "run_time_s": run_time,
            "eval_time_s": time.perf_counter() - t0 - run_time}


def pmap(cfgs, jobs):
    out = []
    if jobs <= 1:
        for i, c in enumerate(cfgs):
            out.append(run(c))
            log(f"  {i + 1}/{len(cfgs)} {label(c)} seed {c['seed']}: final cost "
                f"{out[-1]['train_cost'][-1]:.4f}, acc {out[-1]['test_acc'][-1]:.3f}")
        return out
    with mp.get_context("fork").Pool(jobs) as pool:
        for i, r in enumerate(pool.imap(run, cfgs)):
            out.append(r)
            log(f"  {i + 1}/{len(cfgs)} {label(r)} seed {r['seed']}: final cost "
                f"{r['train_cost'][-1]:.4f}, acc {r['test_acc'][-1]:.3f} "
                f"({r['run_time_s']:.1f} s + eval {r['eval_time_s']:.1f} s)")
    return out


def label(c):
    m = c["method"]
    if m == "ssca":
        return f"SSCA B={c['B']}" + (" tuned" if c.get("tuned") else "")
    if m == "ssca-con":
        return f"SSCA-con B={c['B']} U={c['U']:g}"
    if c["momentum"]:
        return f"SGD-momentum B={c['B']}"
    return f"FedSGD B={c['B']}" if c["E"] == 1 else f"FedAvg E={c['E']} B={c['B']}"


def baseline_specs(Bs):
    specs = [dict(method="fedavg", B=B, E=1, momentum=0.0) for B in Bs]
    specs += [dict(method="fedavg", B=B // 2, E=2, momentum=0.0) for B in Bs if B >= 10]
    specs += [dict(method="fedavg", B=B, E=1, momentum=0.9) for B in Bs if B >= 10]
    return specs


def grid(specs, grids, T, jobs, base):
    """Pick per spec the grid point with the lowest final training cost (seed 1000)."""
    # selection needs only the final training cost: no intermediate evaluation
    cfgs = [{**s, **g, "seed": 1000, "T": T, **base, "acc_every": T, "cost_every": T}
            for s in specs for g in grids(s)]
    log(f"grid search: {len(cfgs)} runs")
    res = pmap(cfgs, jobs)
    best = {}
    for r in res:
        key = label(r)
        if key not in best or r["train_cost"][-1] < best[key]["train_cost"][-1] or \
                not np.isfinite(best[key]["train_cost"][-1]):
            best[key] = r
    return best, res


def reach(r, target):
    for t, a in zip(r["t_acc"], r["test_acc"]):
        if a >= target:
            return t
    return None


def summarise(runs, targets):
    table = {}
    for key in sorted({label(r) for r in runs}):
        rs = [r for r in runs if label(r) == key]
        row = {"runs": len(rs), "final_test_acc_mean": float(np.mean([r["test_acc"][-1]
                                                                      for r in rs])),
               "final_test_acc_std": float(np.std([r["test_acc"][-1] for r in rs])),
               "final_train_cost_mean": float(np.mean([r["train_cost"][-1] for r in rs])),
               "final_train_cost_std": float(np.std([r["train_cost"][-1] for r in rs]))}
        for tg in targets:
            ts = [reach(r, tg) for r in rs]
            got = [t for t in ts if t is not None]
            per_round = rs[0]["floats_up_per_client_round"] + rs[0]["floats_down_per_client_round"]
            row[f"reach_{tg:.2f}"] = {
                "reached": f"{len(got)}/{len(rs)}",
                "rounds_mean": float(np.mean(got)) if got else None,
                "rounds_std": float(np.std(got)) if got else None,
                "floats_per_client_mean": float(np.mean(got)) * per_round if got else None}
        table[key] = row
    return table


def table_markdown(table, targets):
    head = "| method | runs | final test acc | final train cost | " + " | ".join(
        f"rounds to {t:.0%} (floats/client)" for t in targets) + " |"
    lines = [head, "|" + "---|" * (4 + len(targets))]
    for key, row in table.items():
        cells = [key, str(row["runs"]),
                 f"{row['final_test_acc_mean']:.3f} ± {row['final_test_acc_std']:.3f}",
                 f"{row['final_train_cost_mean']:.4f} ± {row['final_train_cost_std']:.4f}"]
        for t in targets:
            c = row[f"reach_{t:.2f}"]
            cells.append("not reached" if c["rounds_mean"] is None else
                         f"{c['rounds_mean']:.0f} ± {c['rounds_std']:.0f} [{c['reached']}] "
                         f"({c['floats_per_client_mean']:.3g})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def band(ax, runs, xkey, ykey, lab, **kw):
    xs = runs[0][xkey]
    ys = np.array([r[ykey] for r in runs])
    m, s = ys.mean(0), ys.std(0)
    line, = ax.plot(xs, m, label=lab, **kw)
    ax.fill_between(xs, m - s, m + s, color=line.get_color(), alpha=0.2)


def plots(runs, sweeps, suffix, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for r in runs:
        groups.setdefault(label(r), []).append(r)
    for fig_name, xkey, ykey, ylab in (("fig1", "t_cost", "train_cost", "training cost F(w_t)"),
                                       ("fig2", "t_acc", "test_acc", "test accuracy")):
        fig, ax = plt.subplots(1, 2, figsize=(13, 4.6))
        for key, rs in sorted(groups.items()):
            panel = 1 if key.startswith("SSCA-con") else 0
            style = "-" if key.startswith("SSCA") else "--"
            band(ax[panel], rs, xkey, ykey, key, linestyle=style)
        ax[0].set(title="(a) Algorithm 1 vs SGD baselines", xlabel="round t", ylabel=ylab)
        ax[1].set(title="(b) Algorithm 2", xlabel="round t", ylabel=ylab)
        for a in ax:
            a.legend(fontsize=7)
            if ykey == "train_cost":
                a.set_yscale("log")
        fig.suptitle(title + " — mean ± std over runs", fontsize=9)
        fig.tight_layout()
        fig.savefig(RESULTS / f"section_vi_{fig_name}{suffix}.png", dpi=110)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4.6))
    for kind, mk in (("lambda", "o-"), ("U", "s-")):
        rs = sorted(sweeps[kind], key=lambda r: r["train_cost"][-1])
        ax.plot([r["train_cost"][-1] for r in rs], [r["norm2"] for r in rs], mk,
                label="Algorithm 1, sweeping lambda" if kind == "lambda" else
                "Algorithm 2, sweeping U")
        for r in rs:
            ax.annotate(f"{r.get('lam', r.get('U')):g}", (r["train_cost"][-1], r["norm2"]),
                        fontsize=7)
    ax.set(xlabel="training cost F(w_T)", ylabel="|w_T|^2", title="(Fig. 3) |w|^2 vs cost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"section_vi_fig3{suffix}.png", dpi=110)
    plt.close(fig)


def fig3_sweeps(tuned, B, T, base, jobs):
    """Figure 3: one run per lambda (Algorithm 1) and per U (Algorithm 2), both with the tuned
    SSCA settings for batch B (the results: docs/benchmarks.md)."""
    a, tau = tuple(tuned["a"]), tuned["tau"]
    cfgs = [dict(method="ssca", B=B, a=a, tau=tau, lam=lam, seed=0, T=T, sweep="lambda",
                 **base) for lam in (1e-5, 1e-4, 1e-3, 1e-2, 3e-2)]
    cfgs += [dict(method="ssca-con", B=B, a=a, tau=tau, U=U, seed=0, T=T, sweep="U", **base)
             for U in (0.3, 0.4, 0.5, 0.7, 1.0)]
    log(f"figure 3 sweeps: {len(cfgs)} runs")
    sw = pmap(cfgs, jobs)
    return {"lambda": [r for r in sw if r["sweep"] == "lambda"],
            "U": [r for r in sw if r["sweep"] == "U"]}


def redo_fig3(args):
    """Re-run only Figure 3 from a finished run's JSON (its tuned settings), updating it."""
    import json

    path = RESULTS / "section_vi.json"
    payload = json.loads(path.read_text())
    _setup(payload["data"], args.data_dir, args.hidden)
    B, T = payload["batch_sizes"][-1], payload["T"]
    base = dict(acc_every=10, cost_every=max(5, T // 4))
    sweeps = fig3_sweeps(payload["grid"]["chosen_ssca"][f"SSCA B={B} tuned"], B, T, base,
                         args.jobs)
    payload["sweeps"] = sweeps
    payload["fig3_command"] = "python benchmarks/section_vi.py --fig3-only"
    path.write_text(json.dumps(payload, indent=2, default=float))
    plots(payload["runs"], sweeps, "", f"{payload['data']}, T={T}")
    for k in ("lambda", "U"):
        for r in sweeps[k]:
            log(f"{k}={r.get('lam', r.get('U')):g}: cost {r['train_cost'][-1]:.4f}, |w|^2 "
                f"{r['norm2']:.2f}, test acc {r['test_acc'][-1]:.3f}, {r['status']}")


def long_run(args):
    """T = 1000 for the B = 100 methods (and FedAvg E = 2, B = 50), with the settings the
    grid search chose in the last full run; R = ``--runs`` (default 2)."""
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    payload = json.loads((RESULTS / "section_vi.json").read_text())
    _setup(payload["data"], args.data_dir, args.hidden)
    T, R = args.rounds or 1000, args.runs or 2
    base = dict(acc_every=50, cost_every=T // 4)
    chosen_b, chosen_s = payload["grid"]["chosen_baselines"], payload["grid"]["chosen_ssca"]
    specs = [dict(method="ssca", B=100, tuned=True, a=tuple(chosen_s["SSCA B=100 tuned"]["a"]),
                  tau=chosen_s["SSCA B=100 tuned"]["tau"]),
             dict(method="fedavg", B=100, E=1, momentum=0.0, lr=chosen_b["FedSGD B=100"]),
             dict(method="fedavg", B=50, E=2, momentum=0.0, lr=chosen_b["FedAvg E=2 B=50"]),
             dict(method="fedavg", B=100, E=1, momentum=0.9,
                  lr=chosen_b["SGD-momentum B=100"]),
             dict(method="ssca-con", B=100, U=0.7, a=tuple(chosen_s["SSCA B=100 tuned"]["a"]),
                  tau=chosen_s["SSCA B=100 tuned"]["tau"])]
    cfgs = [{**sp, "seed": seed, "T": T, **base} for seed in range(R) for sp in specs]
    start = time.perf_counter()
    runs = pmap(cfgs, args.jobs)
    table = summarise(runs, (0.8, 0.82, 0.84))
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    groups = {}
    for r in runs:
        groups.setdefault(label(r), []).append(r)
    for key, rs in sorted(groups.items()):
        band(ax[0], rs, "t_cost", "train_cost", key)
        band(ax[1], rs, "t_acc", "test_acc", key)
    ax[0].set(xlabel="round t", ylabel="training cost", yscale="log", title=f"T = {T}")
    ax[1].set(xlabel="round t", ylabel="test accuracy", title=f"T = {T}, R = {R}")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "section_vi_long.png", dpi=110)
    write_json("section_vi_long", {"command": "python benchmarks/section_vi.py --long",
                                   "machine": machine(), "T": T, "R": R, "runs": runs,
                                   "table": table, "wall_time_s": time.perf_counter() - start})
    md = table_markdown(table, (0.8, 0.82, 0.84))
    (RESULTS / "section_vi_long_table.md").write_text(md + "\n")
    print(md)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few minutes: R=2, T=30, B=10, 100")
    ap.add_argument("--runs", type=int, default=None, help="R reported runs (default 10)")
    ap.add_argument("--rounds", type=int, default=None, help="T (default 100)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--data", default="fashion-mnist", choices=["fashion-mnist", "mnist",
                                                                  "digits"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--long", action="store_true",
                    help="T = 1000 for the B = 100 methods with the last run's tuned settings")
    ap.add_argument("--fig3-only", action="store_true",
                    help="re-run only Figure 3's sweeps from the last full run's JSON")
    args = ap.parse_args(argv)
    if args.fig3_only:
        return redo_fig3(args)
    if args.long:
        return long_run(args)
    q = args.quick
    R = args.runs or (2 if q else 10)
    T = args.rounds or (30 if q else 100)
    Bs = [10, 100] if q else [1, 10, 100]
    # full-data training cost (60000 rows, ~0.6 s single-threaded) every T/4 rounds and test
    # accuracy (10000 rows) every 10: evaluation then costs about as much as a B = 100 run
    base = dict(acc_every=5 if q else 10, cost_every=max(5, T // 4))
    _setup(args.data, args.data_dir, args.hidden)
    start = time.perf_counter()
    log(f"Section VI on {args.data}: R={R}, T={T}, B in {Bs}, {args.jobs} workers")

    # -- grid searches, same budget (number of configurations) for SSCA and the baselines -----
    lr_grid = [(a, al) for a in ((0.1, 0.5) if q else (0.05, 0.2, 0.5, 1.0))
               for al in ((0.3,) if q else (0.0, 0.3, 0.6))]
    ssca_grid = ([(a, tau) for a in ((0.6, 0.9, 0.3), (0.9, 0.5, 0.1))
                  for tau in (0.1,)] if q else
                 [(a, tau) for a in ((0.6, 0.9, 0.3), (0.9, 0.9, 0.3), (0.9, 0.5, 0.1),
                                     (0.3, 0.3, 0.1)) for tau in (0.05, 0.1, 0.2)])
    assert len(lr_grid) == len(ssca_grid)  # the same budget per method
    best_b, grid_b = grid(baseline_specs(Bs), lambda s: [{"lr": g} for g in lr_grid], T,
                          args.jobs, base)
    best_s, grid_s = grid([dict(method="ssca", B=B, tuned=True) for B in Bs],
                          lambda s: [{"a": a, "tau": tau} for a, tau in ssca_grid], T,
                          args.jobs, base)

    # -- reported runs ----------------------------------------------------------------------
    cfgs = []
    for seed in range(R):
        for B in Bs:
            cfgs.append(dict(method="ssca", B=B, a=PAPER[B], tau=TAU, seed=seed, T=T, **base))
        for key, b in {**best_b, **best_s}.items():
            keep = {k: b[k] for k in ("method", "B", "E", "momentum", "lr", "a", "tau", "tuned")
                    if k in b}
            cfgs.append({**keep, "seed": seed, "T": T, **base})
        for B in [b for b in Bs if b >= 10]:
            for U in (0.13, 0.7, 1.0):  # the paper's U and two that are active at T = 100
                cfgs.append(dict(method="ssca-con", B=B, a=PAPER[B], tau=TAU, U=U, seed=seed,
                                 T=T, **base))
    log(f"reported runs: {len(cfgs)}")
    runs = pmap(cfgs, args.jobs)

    sweeps = fig3_sweeps(best_s[f"SSCA B={Bs[-1]} tuned"], Bs[-1], T, base, args.jobs)

    targets = (0.7, 0.75, 0.8) if args.data != "mnist" else (0.88, 0.9, 0.92)
    table = summarise(runs, targets)
    suffix = "_quick" if q else ""
    title = (f"{args.data}, I=10, K={_G['net'].K}, J={_G['net'].J}, T={T}, R={R} runs "
             f"({machine()['cpu']}, {args.jobs} workers)")
    plots(runs, sweeps, suffix, title)
    wall = time.perf_counter() - start
    payload = {"command": "python benchmarks/section_vi.py " + " ".join(argv or sys.argv[1:]),
               "machine": machine(), "data": args.data, "R": R, "T": T, "batch_sizes": Bs,
               "tau": TAU, "c": C, "lambda": LAM, "paper_settings": PAPER,
               "grid": {"lr_grid": lr_grid, "ssca_grid": ssca_grid,
                        "chosen_baselines": {k: v["lr"] for k, v in best_b.items()},
                        "chosen_ssca": {k: {"a": v["a"], "tau": v["tau"]}
                                        for k, v in best_s.items()},
                        "runs": grid_b + grid_s},
               "runs": runs, "sweeps": sweeps, "table": table, "targets": targets,
               "wall_time_s": wall}
    path = write_json(f"section_vi{suffix}", payload)
    (RESULTS / f"section_vi_table{suffix}.md").write_text(table_markdown(table, targets) + "\n")
    log(f"wrote {path}, figures and table in {wall / 60:.1f} min")
    print(table_markdown(table, targets))


if __name__ == "__main__":
    main()
