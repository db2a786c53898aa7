"""The paper's network (Section VI) with DEFAULT options: issue 10 item 6.

Algorithm 1 (min F(w) + 1e-5 |w|^2, a 784-128-10 network, 10 clients) with fixed batches
B in {1, 10, 100} and T rounds, giving only batch_size, max_iter, seed and x0 (no tau, rho,
gamma), side by side in one run with

* the previous defaults (tau = 0.1, rho = 0.9/t^0.4, gamma = 0.9/t^0.55, on rounds),
* the epoch defaults before the stability-bound tau ("epoch-0.3": tau = 0.1,
  rho = EpochStep(0.3, 0.4), gamma = EpochStep(0.3, 0.55)), and
* the tuned settings of the last ``benchmarks/section_vi.py`` run (its JSON), run here on the
  same seeds: their mean final training cost at B = 100 is the target's reference (issue 10
  item 6: the defaults must end within 5 % of it, and diverge at no B). The figure the issue
  quoted, 0.478, came from an earlier Section VI run with other batch draws; the distance to
  it is reported too.

Algorithm 2 (min |w|^2 subject to F(w) <= U with U = 0.7, active at T = 100) with default
options: batch_size="auto" and everything else default (penalty stages of max_iter rounds),
and with a fixed B = 100. Reports whether the returned point is feasible on the full data
within feas_tol * max(1, U) and the status.

Writes benchmarks/results/network_defaults.json and .png. Needs Fashion-MNIST (the Debian
package dataset-fashion-mnist) unless --data digits.

    python benchmarks/network_defaults.py             # 16 min here (2 workers, load 5-10)
    python benchmarks/network_defaults.py --quick     # digits, 2 seeds: about a minute
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssca_solver as ss  # noqa: E402
from benchmarks._common import RESULTS, log, machine, machine_title, write_json  # noqa: E402
from problems.mlp import MLP, classification_con, classification_uncon  # noqa: E402
from ssca_solver.datasets import image_dataset  # noqa: E402

LAM = 1e-5
PREVIOUS = {"tau": 0.1, "rho": (0.9, 0.4), "gamma": (0.9, 0.55)}   # defaults before EpochStep
EPOCH_03 = {"tau": 0.1, "rho": (0.3, 0.4), "gamma": (0.3, 0.55)}    # EpochStep, tau 0.1
ISSUE_REFERENCE = 0.478     # issue 10 item 6's figure (an earlier Section VI run's tuned B=100)
_G = {}


def _setup(name, data_dir, hidden):
    (X, y), (Xt, yt) = image_dataset(name, data_dir)
    _G.update(X=X, y=y, Xt=Xt, yt=yt, net=MLP(X.shape[1], hidden, 10),
              data=ss.FederatedData.split(X, y, num_clients=10, seed=0))


def tuned_settings() -> dict:
    """The tuned SSCA settings per B of the last section_vi.py run (a1, a2, alpha, tau)."""
    path = RESULTS / "section_vi.json"
    if not path.exists():
        return {}
    d = json.loads(path.read_text())
    out = {}
    for key, v in d["grid"]["chosen_ssca"].items():
        B = int(key.split("B=")[1].split()[0])
        out[B] = {"a": v["a"], "tau": v["tau"]}
    table = {row["method"]: row for row in d.get("table", [])} if isinstance(
        d.get("table"), list) else {}
    return {"settings": out, "table": table}


def run(cfg):
    """One run of Algorithm 1 (cfg: setting, B, seed, T) or 2 (cfg: U)."""
    from threadpoolctl import threadpool_limits

    net, data, X, y = _G["net"], _G["data"], _G["X"], _G["y"]
    curve = {}
    norms = []

    def keep(it):
        norms.append(float(it.x @ it.x))
        if it.t % cfg["every"] == 0:
            curve[it.t] = it.x.copy()

    opts = dict(seed=cfg["seed"], x0=net.init(cfg["seed"]), callback=keep)
    s = cfg["setting"]
    if s == "previous":
        opts.update(tau=PREVIOUS["tau"], rho=ss.PowerStep(*PREVIOUS["rho"]),
                    gamma=ss.PowerStep(*PREVIOUS["gamma"]))
    elif s == "epoch-0.3":
        opts.update(tau=EPOCH_03["tau"], rho=ss.EpochStep(*EPOCH_03["rho"]),
                    gamma=ss.EpochStep(*EPOCH_03["gamma"]))
    elif s == "tuned":
        a1, a2, alpha = cfg["a"]
        opts.update(tau=cfg["tau"], rho=ss.PowerStep(a1, alpha),
                    gamma=ss.PowerStep(a2, alpha + 0.05))
    if cfg.get("B") is not None:
        opts["batch_size"] = cfg["B"]
    if "T" in cfg:
        opts["max_iter"] = cfg["T"]
    if cfg["alg"] == 1:
        opts["eval_every"] = None
    t0 = time.perf_counter()
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ss.ScheduleWarning)   # the tuned runs violate eq. (gamma)
        prob = (classification_uncon(data, net, LAM) if cfg["alg"] == 1
                else classification_con(data, net, cfg["U"]))
        res = prob.solve(**opts)
    wall = time.perf_counter() - t0
    ts = sorted(curve)
    cost = [float(net.evaluate(curve[t], X, y)[0]) for t in ts]
    final_cost, _ = net.evaluate(res.x, X, y)
    acc = float(net.evaluate(res.x, _G["Xt"], _G["yt"])[1])
    x0 = opts["x0"]
    out = {**{k: v for k, v in cfg.items() if k != "every"}, "t": ts, "train_cost": cost,
           "final_cost": float(final_cost), "test_acc": acc, "status": res.status,
           "nit": int(res.nit), "norm2_0": float(x0 @ x0), "max_norm2": max(norms),
           "final_norm2": float(res.x @ res.x), "wall_s": wall, "message": res.message}
    if cfg["alg"] == 1:
        init_cost = float(net.evaluate(x0, X, y)[0])
        out["initial_cost"] = init_cost
        # diverged: the training cost ended above where it started, or |w|^2 grew 100-fold
        out["diverged"] = bool(not np.isfinite(final_cost) or final_cost > init_cost
                               or max(norms) > 100 * max(out["norm2_0"], 1.0))
    else:
        viol = float(final_cost) - cfg["U"]
        out["violation"] = viol
        out["feas_tol"] = 1e-4 * max(1.0, abs(cfg["U"]))
        out["feasible"] = viol <= out["feas_tol"]
        out["batch_sizes"] = [float(b) for b in res.history.batch_size]
    return out


def pmap(cfgs, jobs):
    out = []
    ctx = mp.get_context("fork")
    with ctx.Pool(jobs) as pool:
        for r in pool.imap_unordered(run, cfgs):
            out.append(r)
            what = (f"B={r.get('B')} {r['setting']} seed {r['seed']}: cost {r['final_cost']:.4f}"
                    if r["alg"] == 1 else
                    f"Alg. 2 U={r['U']} B={r.get('B') or 'auto'}: violation {r['violation']:+.2e}"
                    f" {r['status']} after {r['nit']} rounds")
            log(f"  [{len(out)}/{len(cfgs)}] {what} ({r['wall_s']:.0f} s)")
    return out


def tuned_mean(runs, B=100):
    """Mean final cost of the tuned runs at batch size B (None without any)."""
    c = [r["final_cost"] for r in runs
         if r["alg"] == 1 and r["B"] == B and r["setting"] == "tuned"]
    return float(np.mean(c)) if c else None


def summarise(runs, reference):
    """Per (B, setting): mean, spread and worst final cost, divergences; at B = 100 the mean's
    distance to ``reference`` (None: no reference for this data set) and to the mean of the
    tuned runs at B = 100 of the same run."""
    same_run = tuned_mean(runs)
    rows = []
    keys = sorted({(r["B"], r["setting"]) for r in runs if r["alg"] == 1})
    for B, s in keys:
        rs = [r for r in runs if r["alg"] == 1 and r["B"] == B and r["setting"] == s]
        c = np.array([r["final_cost"] for r in rs])
        rows.append({"B": B, "setting": s, "runs": len(rs), "cost_mean": float(c.mean()),
                     "cost_std": float(c.std()), "cost_max": float(c.max()),
                     "acc_mean": float(np.mean([r["test_acc"] for r in rs])),
                     "diverged": int(sum(r["diverged"] for r in rs)),
                     "max_norm2": float(max(r["max_norm2"] for r in rs)),
                     "vs_reference": (float(c.mean() / reference - 1.0)
                                      if B == 100 and reference else None),
                     "vs_tuned_same_run": (float(c.mean() / same_run - 1.0)
                                           if B == 100 and same_run else None)})
    return rows


def plot(runs, rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    colors = {"default": "C0", "previous": "C3", "epoch-0.3": "C1", "tuned": "C2"}
    names = ("default", "previous", "epoch-0.3", "tuned")
    ax = axes[0]
    for s in names:
        rs = [r for r in runs if r["alg"] == 1 and r.get("B") == 100 and r["setting"] == s]
        if rs:
            t = rs[0]["t"]
            m = np.mean([r["train_cost"] for r in rs], axis=0)
            ax.plot(t, m, color=colors[s], label=f"{s} (mean of {len(rs)})")
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("training cost (full data)")
    ax.set_title("Algorithm 1, B = 100")
    ax.legend()
    ax = axes[1]
    Bs = sorted({r["B"] for r in rows})
    width = 0.2
    for k, s in enumerate(names):
        vals = [next((r["cost_mean"] for r in rows if r["B"] == B and r["setting"] == s),
                     np.nan) for B in Bs]
        ax.bar(np.arange(len(Bs)) + (k - 1.5) * width, vals, width, color=colors[s], label=s)
    ax.set_xticks(range(len(Bs)), [f"B={B}" for B in Bs])
    ax.set_ylabel(f"final training cost (T = {runs[0].get('T', '')})")
    ax.set_title("Algorithm 1: final cost per batch size")
    ax.legend()
    ax = axes[2]
    for r in (r for r in runs if r["alg"] == 2):
        ax.plot(r["t"], np.array(r["train_cost"]) - r["U"],
                label=f"B={r.get('B') or 'auto'}: {r['status']}, end {r['violation']:+.1e}")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_xlabel("round")
    ax.set_ylabel("F(w) - U (full data)")
    ax.set_title("Algorithm 2, U = 0.7, default options")
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="digits, 2 seeds, T = 30")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per setting (default 5)")
    ap.add_argument("--rounds", type=int, default=None, help="T (default 100)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data", default=None, choices=["fashion-mnist", "mnist", "digits"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--U", type=float, default=0.7)
    ap.add_argument("--skip-alg2", action="store_true")
    args = ap.parse_args(argv)
    q = args.quick
    data = args.data or ("digits" if q else "fashion-mnist")
    seeds = args.seeds or (2 if q else 5)
    T = args.rounds or (30 if q else 100)
    _setup(data, args.data_dir, 32 if q else args.hidden)
    tuned = tuned_settings() if data == "fashion-mnist" else {}
    settings = tuned.get("settings", {})
    ref = ISSUE_REFERENCE if data == "fashion-mnist" else None   # 0.478 is Fashion-MNIST's
    start = time.perf_counter()
    cfgs = []
    for B in (1, 10, 100):
        for seed in range(seeds):
            for s in ("default", "previous", "epoch-0.3") + (
                    ("tuned",) if B in settings else ()):
                cfg = dict(alg=1, B=B, seed=seed, T=T, setting=s, every=max(1, T // 20))
                if s == "tuned":
                    cfg.update(settings[B])
                cfgs.append(cfg)
    if not args.skip_alg2:
        # default options (batch "auto", default max_iter): the long one goes first
        cfgs.insert(0, dict(alg=2, U=args.U, seed=0, setting="default", every=10))
        cfgs.insert(1, dict(alg=2, U=args.U, B=100, seed=0, setting="default", every=10))
    log(f"network with default options: {data}, T={T}, {seeds} seeds, {len(cfgs)} runs, "
        f"{args.jobs} workers")
    runs = pmap(cfgs, args.jobs)
    runs.sort(key=lambda r: (r["alg"], r.get("B") or 0, r["setting"], r["seed"]))
    rows = summarise(runs, ref)
    for r in rows:
        log(f"B={r['B']:>3} {r['setting']:>8}: cost {r['cost_mean']:.4f} +- {r['cost_std']:.4f}"
            f" (max {r['cost_max']:.4f}), diverged {r['diverged']}/{r['runs']}"
            + (f", {100 * r['vs_reference']:+.1f} % vs {ref}" if r["vs_reference"] is not None
               else "")
            + (f", {100 * r['vs_tuned_same_run']:+.1f} % vs the tuned runs"
               if r["vs_tuned_same_run"] is not None else ""))
    m = machine()
    suffix = "_quick" if q else ""
    payload = {"command": "python benchmarks/network_defaults.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "machine": m, "data": data, "T": T,
        "seeds": seeds, "issue_reference_cost": ref,
        "tuned_same_run_cost": tuned_mean(runs),
        "previous_defaults": PREVIOUS, "epoch_0.3_defaults": EPOCH_03, "tuned": settings, "table": rows, "runs": runs,
        "wall_time_s": time.perf_counter() - start}
    path = write_json("network_defaults" + suffix, payload)
    plot(runs, rows, RESULTS / f"network_defaults{suffix}.png",
         f"{data}, 10 clients, T = {T}, {seeds} seeds; {machine_title(m)}")
    log(f"wrote {path} and the PNG ({payload['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()
