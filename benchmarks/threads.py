"""Round time with and without client_threads: does limiting the clients' BLAS threads pay?

The paper's network (``problems/mlp.py``, 784-J-10, cross-entropy + lam |w|^2, Algorithm 1)
on synthetic rows (no download), I = 4 clients, B = 100 rows per client and round, tau = 0.1,
no evaluations during the run (``eval_every=0``): only the rounds are timed. Four settings:

* ``process``, ``client_threads=None``: every client process keeps the BLAS threads it
  inherits (one per core by default): 4 clients x cores threads;
* ``process``, ``client_threads="auto"`` (the default): at most max(1, cores // 4) each;
* ``inprocess`` with this process's BLAS threads (the library's default in-process);
* ``inprocess`` inside ``threadpoolctl.threadpool_limits(1)`` (what docs/engines.md suggests
  on a shared machine).

The settings are run in turn, ``--repeats`` times (interleaved, so that a change in the
machine's load hits them alike); each run's round time is the median over its rounds after
the first two (start-up, JIT). The JSON records the load average before and after every run,
the BLAS libraries, and max |x - x_ref| over every iterate between settings: each process
run against the in-process run at the same thread count, and the two in-process runs against
each other (0: bit for bit).

Usage:  python benchmarks/threads.py [--quick] [--hidden J] [--rounds T] [--repeats R]
Writes threads.json and threads.png (threads_quick.* with --quick) to the output directory
(benchmarks/results_local/ unless --publish or --results-dir: benchmarks/_common.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssca_solver as ss  # noqa: E402
from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402
from problems.mlp import MLP, classification_uncon  # noqa: E402
from ssca_solver.federated.transports import available_cpus  # noqa: E402

SETTINGS = ("process, client_threads=None", "process, client_threads='auto'",
            "inprocess, default threads", "inprocess, threadpool_limits(1)")


def build(hidden: int, rows: int, clients: int = 4):
    rng = np.random.default_rng(0)
    X = rng.random((rows * clients, 784))
    y = rng.integers(0, 10, rows * clients)
    net = MLP(784, hidden, 10)
    data = ss.FederatedData.split(X, y, num_clients=clients, seed=0)
    return classification_uncon(data, net), net


def run(prob, net, setting: str, rounds: int) -> dict:
    from threadpoolctl import threadpool_limits

    stamps, xs = [], []

    def cb(it):
        stamps.append(time.perf_counter())
        xs.append(it.x.copy())

    opts = dict(max_iter=rounds, seed=0, eval_every=0, batch_size=100, tau=0.1,
                x0=net.init(0), check_gradients=False, callback=cb)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    if setting.startswith("process"):
        threads = None if "None" in setting else "auto"
        prob.solve(transport="process", client_threads=threads, **opts)
    elif "limits" in setting:
        with threadpool_limits(1):
            prob.solve(**opts)
    else:
        prob.solve(**opts)
    wall = time.perf_counter() - t0
    gaps = np.diff([t0] + stamps)
    steady = gaps[2:] if gaps.size > 4 else gaps
    return {"setting": setting, "round_median_s": float(np.median(steady)),
            "round_q1_s": float(np.percentile(steady, 25)),
            "round_q3_s": float(np.percentile(steady, 75)),
            "first_round_s": float(gaps[0]), "wall_s": wall, "rounds": len(stamps),
            "load_before": list(load0), "load_after": list(os.getloadavg()),
            "x": np.array(xs)}


def plot(payload: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["summary"]
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    names = [r["setting"] for r in rows]
    med = [r["round_median_s"] * 1e3 for r in rows]
    lo = [r["round_median_s"] * 1e3 - r["runs_min_s"] * 1e3 for r in rows]
    hi = [r["runs_max_s"] * 1e3 - r["round_median_s"] * 1e3 for r in rows]
    colors = ["#c44e52", "#4c72b0", "#dd8452", "#55a868"]
    ax.barh(range(len(rows)), med, xerr=[lo, hi], color=colors[:len(rows)], capsize=4)
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlabel("round time, ms (median of the runs' medians; bars: their range)")
    for i, (m, r) in enumerate(zip(med, rows)):
        ax.text(r["runs_max_s"] * 1e3 + 0.01 * max(med), i, f" {m:.0f} ms", va="center",
                fontsize=9)
    ax.set_xlim(0, 1.15 * max(r["runs_max_s"] * 1e3 for r in rows))
    p = payload["problem"]
    ax.set_title(f"784-{p['hidden']}-10 network, I = 4 clients, B = 100, {payload['cpus']} "
                 f"CPUs, load {payload['load_min']:.1f}-{payload['load_max']:.1f}\n"
                 f"{machine_title(payload['machine'])}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="J = 32, 8 rounds, 1 repeat (seconds)")
    ap.add_argument("--hidden", type=int, default=None, help="J (default 128; 32 with --quick)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per run (default 20)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per setting (default 2)")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args(argv)
    if args.replot:
        import json

        name = "threads_quick" if args.quick else "threads"
        plot(json.loads((RESULTS / f"{name}.json").read_text()), RESULTS / f"{name}.png")
        return
    hidden = args.hidden or (32 if args.quick else 128)
    rounds = args.rounds or (8 if args.quick else 20)
    repeats = args.repeats or (1 if args.quick else 2)
    prob, net = build(hidden, rows=500)
    runs = []
    t_all = time.perf_counter()
    for r in range(repeats):
        for s in SETTINGS:
            out = run(prob, net, s, rounds)
            log(f"[{r + 1}/{repeats}] {s}: round {out['round_median_s'] * 1e3:.1f} ms "
                f"(first {out['first_round_s']:.2f} s), load {out['load_before'][0]:.2f} -> "
                f"{out['load_after'][0]:.2f}")
            runs.append(out)
    # bit for bit: the process runs against the in-process run of the same thread count
    ref = {"process, client_threads=None": "inprocess, default threads",
           "process, client_threads='auto'": "inprocess, threadpool_limits(1)",
           "inprocess, threadpool_limits(1)": "inprocess, default threads"}
    first = {}
    for o in runs:
        first.setdefault(o["setting"], o["x"])
    summary = []
    for s in SETTINGS:
        mine = [o for o in runs if o["setting"] == s]
        meds = [o["round_median_s"] for o in mine]
        row = {"setting": s, "round_median_s": statistics.median(meds),
               "runs_min_s": min(meds), "runs_max_s": max(meds),
               "first_round_s": statistics.median(o["first_round_s"] for o in mine)}
        if s in ref:    # 0: bit for bit (expected when the thread counts are the same)
            row["max_abs_x_minus"] = {ref[s]: float(np.abs(first[s] - first[ref[s]]).max())}
        summary.append(row)
    base = summary[0]["round_median_s"]
    for row in summary:
        row["speedup_vs_unlimited_process"] = base / row["round_median_s"]
    loads = [v for o in runs for v in (o["load_before"][0], o["load_after"][0])]
    for o in runs:
        o.pop("x")
    payload = {"command": " ".join(["python", "benchmarks/threads.py"]
                                   + (argv if argv is not None else sys.argv[1:])),
               "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(),
               "cpus": available_cpus(),
               "problem": {"hidden": hidden, "dim": net.dim, "clients": 4, "batch_size": 100,
                           "rows_per_client": 500, "rounds": rounds, "repeats": repeats,
                           "options": "method='ssca', tau=0.1, eval_every=0, seed=0"},
               "load_min": min(loads), "load_max": max(loads),
               "summary": summary, "runs": runs,
               "wall_s": time.perf_counter() - t_all}
    name = "threads_quick" if args.quick else "threads"
    path = write_json(name, payload)
    plot(payload, RESULTS / f"{name}.png")
    for row in summary:
        log(f"{row['setting']:34s} {row['round_median_s'] * 1e3:8.1f} ms  "
            f"x{row['speedup_vs_unlimited_process']:.2f}  {row.get('max_abs_x_minus', '')}")
    log(f"wrote {path} and {name}.png in {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
