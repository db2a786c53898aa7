"""The paper's network by automatic differentiation (JAX, and PyTorch where installed) against
its Numba kernels: issue 22.

The same K-J-L network (Section V: swish, softmax, cross-entropy; problems/mlp.py with its
hand-written gradient in Numba kernels, problems/mlp_jax.py as a JAX loss of one sample handed to
``ss.SampleFunction.from_jax``), side by side:

1. Client kernel: the median time of one ``value_and_grad`` on a batch of B rows (what a
   client computes per round and function), JAX with power-of-two buckets (the default; B = 10
   and 100 are padded to 16 and 128) and with exact shapes, against Numba; and JAX's first
   call at each B (tracing and compiling).
2. Round: Algorithm 1 (min F(w) + 1e-5 |w|^2, 10 clients, in-process transport, closed-form
   subproblem, the paper's fixed B with tau = 0.1) for T rounds: the median time of a round
   (between consecutive callbacks, so the first round's compiling is left out), the solve's
   wall time, and the largest difference between the two runs' iterates.

Where torch is importable (it is no dependency: a separate venv with the CPU build), the same
network as a torch loss (problems/mlp_torch.py, ``ss.SampleFunction.from_torch``) is timed
too, in the same process and the same loops: one more kernel column and one more solve.

Each figure is given with its ratio JAX / Numba (and torch / Numba). Both run on ``--threads`` threads (default 1:
BLAS through threadpoolctl for the kernels' np.dot, XLA_FLAGS for JAX's CPU backend, set before
JAX starts, torch.set_num_threads for torch), as the other benchmarks do: on a shared 2-core machine, two BLAS threads competing
with other jobs made single Numba calls 50 times slower at random. The load average is recorded
before and after.

Usage:  python benchmarks/autodiff.py [--quick] [--data fashion-mnist|digits]
        (--quick: digits, a 64-32-10 network, 10 rounds: seconds)
Writes benchmarks/results/autodiff.json and autodiff.png (autodiff_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssca_solver as ss  # noqa: E402
from benchmarks._common import (RESULTS, log, machine, machine_title, median_time,  # noqa: E402
                                write_json)
from problems import mlp, mlp_jax  # noqa: E402
from ssca_solver.datasets import image_dataset  # noqa: E402
from ssca_solver.model.autodiff import bucket_size  # noqa: E402

LAM = 1e-5


def kernel_times(net, X, y, batches, repeats, torch_module=None):
    """Per B: median seconds of one value_and_grad (Numba, JAX pow2, JAX exact, and torch
    when ``torch_module`` is problems.mlp_torch), the first JAX call (trace + compile), and
    the largest gradient difference."""
    rng = np.random.default_rng(0)
    w = net.init(0)
    numba_f = net.cross_entropy()
    jax_f = {b: mlp_jax.cross_entropy(net, buckets=b) for b in ("pow2", "exact")}
    torch_f = None if torch_module is None else torch_module.cross_entropy(net)
    rows = []
    for B in batches:
        idx = rng.choice(len(y), B, replace=False)
        Xb, yb = np.ascontiguousarray(X[idx]), y[idx]
        t_numba, (_, g_numba) = median_time(lambda: numba_f.value_and_grad(w, Xb, yb), repeats)
        row = {"B": B, "numba_s": t_numba}
        for b, f in jax_f.items():
            t0 = time.perf_counter()
            f.value_and_grad(w, Xb, yb)
            row[f"jax_{b}_first_call_s"] = time.perf_counter() - t0
            t, (_, g) = median_time(lambda: f.value_and_grad(w, Xb, yb), repeats)
            row[f"jax_{b}_s"] = t
            row[f"jax_{b}_over_numba"] = t / t_numba
            row[f"jax_{b}_max_grad_diff"] = float(np.max(np.abs(g - g_numba)))
        if torch_f is not None:
            t, (_, g) = median_time(lambda: torch_f.value_and_grad(w, Xb, yb), repeats)
            row["torch_s"], row["torch_over_numba"] = t, t / t_numba
            row["torch_max_grad_diff"] = float(np.max(np.abs(g - g_numba)))
            log(f"  kernel B={B:>5}: torch {1e3 * t:8.3f} ms (x{row['torch_over_numba']:.2f})")
        row["padded_to"] = bucket_size(B)
        log(f"  kernel B={B:>5}: Numba {1e3 * t_numba:8.3f} ms, JAX (pow2, {row['padded_to']} "
            f"rows) {1e3 * row['jax_pow2_s']:8.3f} ms (x{row['jax_pow2_over_numba']:.2f}), "
            f"JAX exact {1e3 * row['jax_exact_s']:8.3f} ms (x{row['jax_exact_over_numba']:.2f})"
            f"; first JAX call {row['jax_pow2_first_call_s']:.2f} s")
        rows.append(row)
    return rows


def solve_times(net, data, B, T, torch_module=None):
    """Algorithm 1 with the Numba and the JAX (and torch) cross-entropy: median round time,
    wall time, and the largest difference of the iterates."""
    out, xs = {"B": B, "T": T}, {}
    runs = [("numba", mlp), ("jax", mlp_jax)] + ([] if torch_module is None
                                                 else [("torch", torch_module)])
    for which, module in runs:
        stamps, its = [], []

        def keep(it):
            stamps.append(time.perf_counter())
            its.append(it.x.copy())

        prob = module.classification_uncon(data, net, LAM)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ss.ScheduleWarning)
            res = prob.solve(method="ssca", max_iter=T, x0=net.init(0), seed=0, batch_size=B,
                             tau=0.1, eval_every=None, callback=keep)
        out[f"{which}_wall_s"] = time.perf_counter() - t0
        out[f"{which}_round_s"] = float(np.median(np.diff(stamps)))
        out[f"{which}_first_round_s"] = stamps[0] - t0
        out["subproblem"] = res.subproblem
        xs[which] = np.array(its)
    out["round_jax_over_numba"] = out["jax_round_s"] / out["numba_round_s"]
    out["max_iterate_diff"] = float(np.max(np.abs(xs["jax"] - xs["numba"])))
    out["max_iterate"] = float(np.max(np.abs(xs["numba"])))
    if "torch" in xs:
        out["round_torch_over_numba"] = out["torch_round_s"] / out["numba_round_s"]
        out["max_iterate_diff_torch"] = float(np.max(np.abs(xs["torch"] - xs["numba"])))
        log(f"  solve B={B:>4}, T={T}: round torch {1e3 * out['torch_round_s']:.2f} ms "
            f"(x{out['round_torch_over_numba']:.2f}); iterates differ by "
            f"{out['max_iterate_diff_torch']:.1e}")
    log(f"  solve B={B:>4}, T={T}: round Numba {1e3 * out['numba_round_s']:.2f} ms, JAX "
        f"{1e3 * out['jax_round_s']:.2f} ms (x{out['round_jax_over_numba']:.2f}); first round "
        f"{out['numba_first_round_s']:.2f} s / {out['jax_first_round_s']:.2f} s; iterates "
        f"differ by {out['max_iterate_diff']:.1e}")
    return out


def plot(kernels, solves, path, title):
    """The figure: kernel times per B (three bars, ratios on top) and round times."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    Bs = [r["B"] for r in kernels]
    x = np.arange(len(Bs))
    series = [("numba_s", "Numba kernels", "C0"), ("jax_pow2_s", "JAX, pow2 buckets", "C1"),
              ("jax_exact_s", "JAX, exact shapes", "C2")]
    if "torch_s" in kernels[0]:
        series.append(("torch_s", "PyTorch (from_torch)", "C3"))
    width = 0.8 / len(series)
    for k, (key, label, color) in enumerate(series):
        vals = [1e3 * r[key] for r in kernels]
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, vals, width, color=color,
                      label=label)
        if key != "numba_s":
            ratio = key.replace("_s", "_over_numba")
            for bar, r in zip(bars, kernels):
                ax.annotate(f"x{r[ratio]:.1f}", (bar.get_x() + bar.get_width() / 2,
                                                 bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"B={B}" for B in Bs])
    ax.set_yscale("log")
    ax.set_ylabel("ms per value_and_grad (median)")
    ax.set_title("client kernel: one batch")
    ax.legend(fontsize=8)
    ax = axes[1]
    Bs = [r["B"] for r in solves]
    x = np.arange(len(Bs))
    series = [("numba_round_s", "Numba kernels", "C0"), ("jax_round_s", "JAX (from_jax)", "C1")]
    if "torch_round_s" in solves[0]:
        series.append(("torch_round_s", "PyTorch (from_torch)", "C3"))
    width = 0.7 / len(series)
    for k, (key, label, color) in enumerate(series):
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, [1e3 * r[key] for r in solves],
                      width, color=color, label=label)
        if key != "numba_round_s":
            ratio = key.replace("_round_s", "").join(("round_", "_over_numba"))
            for bar, r in zip(bars, solves):
                ax.annotate(f"x{r[ratio]:.2f}",
                            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [f"B={B}" for B in Bs])
    ax.set_ylabel("ms per round (median)")
    ax.set_title("Algorithm 1, 10 clients in process, closed form")
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    """Run both parts, write the JSON and the PNG."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="digits, 64-32-10, 10 rounds")
    ap.add_argument("--data", default=None, choices=["fashion-mnist", "mnist", "digits"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rounds", type=int, default=None, help="T (default 30; 10 with --quick)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS and XLA threads (default 1)")
    args = ap.parse_args(argv)
    if args.threads == 1:           # before JAX starts: XLA reads its flags once
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_"
                                   "eigen=false intra_op_parallelism_threads=1").strip()
    from threadpoolctl import threadpool_limits
    try:                            # optional: never a dependency
        import torch

        from problems import mlp_torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = mlp_torch = None
    q = args.quick
    name = args.data or ("digits" if q else "fashion-mnist")
    T = args.rounds or (10 if q else 30)
    (X, y), _ = image_dataset(name, args.data_dir)
    net = mlp.MLP(X.shape[1], 32 if q else 128, 10)
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    batches = (10, 100) if q else (1, 10, 100, 1000)
    solve_batches = (10, 100) if q else (10, 100)
    load_before = os.getloadavg()
    start = time.perf_counter()
    log(f"autodiff benchmark: {name}, network {net.K}-{net.J}-{net.L} (d = {net.dim}), "
        f"load average {load_before[0]:.2f}")
    with threadpool_limits(args.threads):
        kernels = kernel_times(net, X, y, batches, repeats=5 if q else 30,
                               torch_module=mlp_torch)
        solves = [solve_times(net, data, B, T, torch_module=mlp_torch) for B in solve_batches]
    m = machine()
    import jax
    m["jax"] = jax.__version__
    if torch is not None:
        m["torch"] = torch.__version__
    suffix = "_quick" if q else ""
    payload = {"command": "python benchmarks/autodiff.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "machine": m, "data": name,
        "network": [net.K, net.J, net.L], "dim": net.dim, "clients": 10,
        "threads": args.threads, "xla_flags": os.environ.get("XLA_FLAGS"),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "kernel": kernels, "solve": solves, "wall_time_s": time.perf_counter() - start}
    path = write_json("autodiff" + suffix, payload)
    plot(kernels, solves, RESULTS / f"autodiff{suffix}.png",
         f"{name}, network {net.K}-{net.J}-{net.L}, JAX {jax.__version__}"
         + ("" if torch is None else f", torch {torch.__version__}") + " vs Numba, "
         f"{args.threads} thread(s); "
         f"{machine_title(m)}; load {load_before[0]:.1f}")
    log(f"wrote {path} and the PNG ({payload['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()
