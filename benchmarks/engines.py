"""The cost of one round on each engine, at the paper's scale.

The paper's network (problems/mlp.py: 784-128-10, swish, d = 101,632) on Fashion-MNIST (the
60,000 training rows from /usr/share/datasets/fashion-mnist, split over I = 10 clients; synthetic
rows of the same shape when the folder is missing, and the JSON says which), Algorithm 1 with
B = 100 rows per client, tau = 0.1, the closed-form subproblem, the same seed and start on every
transport:

* ``inprocess``: clients in this process;
* ``process``: each client in a forked process (pipes);
* ``flower`` simulation: Flower's Simulation Runtime (ServerApp thread, ClientApps in Ray
  actors);
* ``flower`` deployment: a SuperLink and 10 SuperNodes on 127.0.0.1 (child processes started and
  stopped by PID), each node loading its rows from its own .npz file.

For each: the median wall time of one round after the first (the first round includes Numba's
cache load and the engines' warm-up), as a ratio to the in-process round of the same run, the
start-up time (solve call to the end of round 1, minus one median round), and the largest
|x_flower - x_inprocess| over every iterate (0: bit for bit).

Secure aggregation (issue 11 item 2): the same round with ``secure_aggregation=True`` in process
and on the Flower simulation (four exchanges per round: keys, encrypted shares, the masked task,
unmasking), as a ratio to the plain in-process round.

Partial participation (item 3): rounds and floats (up + down, counted from the messages, the
full-data evaluations excluded) until a target is met, for K = 2, 5, 10 of I = 10 clients
(uniform sampling, in process), on
* the paper's network above (prob:class-uncon, B = 100, default tau and schedules: tau 'auto' is
  the heavy-ball stability bound, 0.05 here): test accuracy on the 10,000
  Fashion-MNIST test rows >= TARGET_ACCURACY (checked every 10 rounds);
* Neyman-Pearson (problems/neyman_pearson.py: breast cancer, 10 clients, alpha = 0.3, the
  default options: adaptive batches, tau = 'auto', penalties 1e2..1e5): the pooled objective
  within 1 % of CVXPY's optimum and the type-I loss within 1e-3 of alpha (checked every 5
  rounds, from w itself).

Usage:  python benchmarks/engines.py [--quick] [--rounds R] [--deployment-rounds R]
        [--skip-deployment]
Writes benchmarks/results/engines.json and engines.png (engines_quick.* with --quick); progress
on stderr. Timings on a shared machine are noisy: the JSON records the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
# one BLAS thread everywhere (as section_v.py's round times): on 2 shared cores OpenBLAS's
# spinning threads make every round several times slower and far noisier
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import ssca_solver as ss  # noqa: E402
from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402
from problems.mlp import MLP, classification_uncon  # noqa: E402

CLIENTS, BATCH = 10, 100
TARGET_ACCURACY = 0.80
NP_ALPHA, NP_LAM = 0.3, 1e-3


def paper_data(quick: bool):
    """(FederatedData of I = 10 clients, a description). Fashion-MNIST when available."""
    try:
        from ssca_solver.datasets import fashion_mnist

        (X, y), _ = fashion_mnist()
        source = ("Fashion-MNIST training set (/usr/share/datasets/fashion-mnist), 60,000 rows "
                  "in [0, 1], split uniformly over 10 clients (seed 0)")
    except Exception as exc:               # the folder is missing: same shapes, synthetic
        rng = np.random.default_rng(0)
        X = rng.random((60_000, 784))
        y = rng.integers(0, 10, 60_000)
        source = f"synthetic rows of Fashion-MNIST's shape (60,000 x 784, 10 classes): {exc}"
    return ss.FederatedData.split(X, y, num_clients=CLIENTS, seed=0), source


def run(prob, net, rounds: int, **transport) -> dict:
    """Solve ``rounds`` rounds; the time of each round (callback timestamps) and the iterates."""
    stamps, xs = [], []
    t0 = time.perf_counter()

    def callback(it):
        stamps.append(time.perf_counter())
        xs.append(it.x.copy())

    res = prob.solve(max_iter=rounds, batch_size=BATCH, tau=0.1, seed=0, x0=net.init(0),
                     eval_every=None, check_gradients=False, callback=callback, **transport)
    total = time.perf_counter() - t0
    per_round = np.diff(stamps)                   # rounds 2..R
    median = float(np.median(per_round)) if per_round.size else float("nan")
    return {"rounds": rounds, "round_seconds": [float(v) for v in per_round],
            "median_round_s": median,
            "startup_s": float(stamps[0] - t0 - median) if per_round.size else None,
            "total_s": total, "up_floats_per_client_round": res.communication.up_per_client_round,
            "x": np.array(xs)}


def to_target(prob, K, max_rounds, check_every, reached, describe, **opts) -> dict:
    """Rounds and floats until ``reached(w)`` (checked every ``check_every`` rounds), and
    ``describe(w)`` at the returned point (how far from the target a run that missed it is)."""
    hit = []

    def callback(it):
        if it.t % check_every == 0 and reached(it.x):
            hit.append(it.t)
            return True
        return None

    t0 = time.perf_counter()
    res = prob.solve(max_iter=max_rounds, clients_per_round=K, callback=callback, seed=0,
                     **opts)
    c = res.communication
    return {"K": K, "reached": bool(hit), "rounds": hit[0] if hit else None,
            "rounds_run": int(res.nit), "floats_up": int(c.up_total),
            "floats_down": int(c.down_total), "floats": int(c.up_total + c.down_total),
            "at_the_end": describe(res.x), "seconds": time.perf_counter() - t0}


def sweep_network(prob, net, quick: bool) -> dict:
    from ssca_solver.datasets import fashion_mnist

    try:
        _, (Xt, yt) = fashion_mnist()
    except Exception as exc:
        return {"skipped": f"no Fashion-MNIST test set: {exc}"}
    max_rounds = 150 if quick else 1000
    out = {"target": f"test accuracy >= {TARGET_ACCURACY} (10,000 test rows), checked every "
                     f"10 rounds; at most {max_rounds} rounds", "runs": []}
    for K in (2, 5, 10):
        log(f"[engines] network, K = {K} of {CLIENTS}: to accuracy {TARGET_ACCURACY} ...")
        r = to_target(prob, K, max_rounds, 10,
                      lambda w: net.evaluate(w, Xt, yt)[1] >= TARGET_ACCURACY,
                      lambda w: {"test_accuracy": float(net.evaluate(w, Xt, yt)[1])},
                      batch_size=BATCH, x0=net.init(0), eval_every=None,
                      check_gradients=False)
        log(f"[engines]   {r}")
        out["runs"].append(r)
    return out


def sweep_np(quick: bool) -> dict:
    from problems.neyman_pearson import neyman_pearson, pooled_reference
    from ssca_solver.datasets import breast_cancer

    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=CLIENTS, seed=0)
    prob = neyman_pearson(data, alpha=NP_ALPHA, lam=NP_LAM)
    _, opt, _, _ = pooled_reference(X, y, NP_ALPHA, NP_LAM)
    pi0, pi1 = np.mean(y == 0), np.mean(y == 1)

    def losses(w):
        loss = np.logaddexp(0.0, -(2 * y - 1) * (X @ w))
        return loss[y == 1].mean() + NP_LAM * w @ w, loss[y == 0].mean()

    def reached(w):
        f, g = losses(w)
        return f <= opt + 0.01 * abs(opt) and g <= NP_ALPHA + 1e-3

    def describe(w):
        f, g = losses(w)
        return {"objective_relative_gap": float((f - opt) / abs(opt)),
                "type_I_loss_minus_alpha": float(g - NP_ALPHA)}

    max_rounds = 300 if quick else 1000
    out = {"target": f"pooled objective <= 1.01 x CVXPY optimum ({opt:.6g}) and type-I loss "
                     f"<= alpha + 1e-3, checked every 5 rounds; at most {max_rounds} rounds "
                     f"(per penalty stage)", "class_fractions": [float(pi0), float(pi1)],
           "runs": []}
    for K in (2, 5, 10):
        log(f"[engines] Neyman-Pearson, K = {K} of {CLIENTS} ...")
        r = to_target(prob, K, max_rounds, 5, reached, describe, eval_every=None)
        log(f"[engines]   {r}")
        out["runs"].append(r)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds on inprocess, process and the simulation (default 30; quick 6)")
    ap.add_argument("--deployment-rounds", type=int, default=None,
                    help="rounds on the deployment runtime (default 6; quick 3)")
    ap.add_argument("--skip-deployment", action="store_true")
    args = ap.parse_args()
    rounds = args.rounds or (6 if args.quick else 30)
    dep_rounds = args.deployment_rounds or (3 if args.quick else 6)
    name = "engines_quick" if args.quick else "engines"

    t_start = time.time()
    data, source = paper_data(args.quick)
    net = MLP(784, 128, 10)
    prob = classification_uncon(data, net, lam=1e-5)
    log(f"[engines] d = {net.dim}, I = {CLIENTS}, B = {BATCH}; data: {source}")

    transports = [("inprocess", {"transport": "inprocess"}, rounds),
                  ("process", {"transport": "process"}, rounds),
                  ("flower simulation", {"transport": "flower"}, rounds)]
    results = {}
    for label, kw, r in transports:
        log(f"[engines] {label}: {r} rounds ...")
        results[label] = run(prob, net, r, **kw)
        log(f"[engines] {label}: median round {results[label]['median_round_s']:.4f} s, "
            f"start-up {results[label]['startup_s']:.2f} s")
    if not args.skip_deployment:
        from ssca_solver.federated.flower import LocalFederation

        log(f"[engines] flower deployment: SuperLink + {CLIENTS} SuperNodes on 127.0.0.1, "
            f"{dep_rounds} rounds ...")
        with tempfile.TemporaryDirectory(prefix="ssca-engines-") as tmp:
            with LocalFederation(data, tmp) as fed:
                log(f"[engines]   started PIDs {fed.pids}")
                results["flower deployment"] = run(
                    prob, net, dep_rounds, transport="flower", flower_engine="deployment",
                    flower_superlink=fed.superlink, flower_start_timeout=300.0,
                    client_timeout=300.0)
            log(f"[engines]   stopped PIDs {fed.pids}: exit codes "
                f"{[p.returncode for p in fed.procs]}")
        log(f"[engines] flower deployment: median round "
            f"{results['flower deployment']['median_round_s']:.3f} s")

    base = results["inprocess"]
    table = {}
    for label, r in results.items():
        n = min(len(r["x"]), len(base["x"]))
        table[label] = {k: v for k, v in r.items() if k != "x"}
        table[label]["ratio_to_inprocess"] = r["median_round_s"] / base["median_round_s"]
        table[label]["max_abs_dx_vs_inprocess"] = float(np.max(np.abs(r["x"][:n] -
                                                                      base["x"][:n])))
    secure = {}
    for label, kw in (("inprocess + secure aggregation", {"transport": "inprocess"}),
                      ("flower simulation + secure aggregation", {"transport": "flower"})):
        r = max(3, rounds // 3)
        log(f"[engines] {label}: {r} rounds ...")
        out = run(prob, net, r, secure_aggregation=True, **kw)
        out["ratio_to_inprocess"] = out["median_round_s"] / base["median_round_s"]
        out["max_abs_dx_vs_plain_inprocess"] = float(np.max(np.abs(
            out["x"] - base["x"][:len(out["x"])])))
        out.pop("x")
        secure[label] = out
        log(f"[engines] {label}: median round {out['median_round_s']:.4f} s "
            f"({out['ratio_to_inprocess']:.3g}x)")
    participation = {"paper network (prob:class-uncon, Fashion-MNIST)":
                     sweep_network(prob, net, args.quick),
                     "Neyman-Pearson (breast cancer, 10 clients)": sweep_np(args.quick)}
    payload = {
        "benchmark": "engines", "quick": args.quick,
        "command": "python " + " ".join(sys.argv),
        "machine": machine(), "load_average_at_end": os.getloadavg(),
        "note": "2 cores shared with other jobs: timings are noisy",
        "problem": {"network": "784-128-10 swish (problems/mlp.py), lambda = 1e-5",
                    "d": net.dim, "clients": CLIENTS, "batch_size": BATCH, "data": source,
                    "method": "Algorithm 1, tau = 0.1, closed-form subproblem, "
                              "eval_every=None, seed 0"},
        "flwr": __import__("flwr").__version__,
        "round_time": table,
        "secure_aggregation_round": secure,
        "partial_participation": participation,
        "wall_seconds": time.time() - t_start,
    }
    path = write_json(name, payload)
    log(f"[engines] wrote {path}")
    plot(table, payload, RESULTS / f"{name}.png")


def plot(table: dict, payload: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(table)
    ratios = [table[k]["ratio_to_inprocess"] for k in labels]
    secs = [table[k]["median_round_s"] for k in labels]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bars = ax.bar(labels, ratios, color=["#555", "#1f77b4", "#2ca02c", "#d62728"][:len(labels)])
    ax.set_yscale("log")
    ax.set_ylabel("median round time / in-process round")
    for b, r, s in zip(bars, ratios, secs):
        ax.annotate(f"{r:.3g}x\n({s:.3g} s)", (b.get_x() + b.get_width() / 2, r),
                    ha="center", va="bottom", fontsize=8)
    ax.set_title(f"One round, d = {payload['problem']['d']:,}, I = 10, B = 100 "
                 f"(flwr {payload['flwr']})\n{machine_title(payload['machine'])}", fontsize=8)
    ax.set_ylim(top=max(ratios) * 8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"[engines] wrote {path}")


if __name__ == "__main__":
    main()
