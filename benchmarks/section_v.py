"""Benchmarks of the closed-form path on the paper's network (Section V).

1. Closed form vs CVXPY + Clarabel on the same Problem 5 built from real client statistics of
   the 784-J-10 network on Fashion-MNIST, J in {16, 32, 64, 128} (d = 12,704 ... 101,632),
   M in {0, 1, 4}: time per solve (median of repeats), speed-up, agreement.
2. Per-round time at the paper's scale (I = 10 clients, B = 100, J = 128): client statistics
   vs server update (combine, recursive average, closed-form subproblem, eq. (updatew)).
3. The client kernel against the BLAS products it contains, same shapes, same run.

Usage:  python benchmarks/section_v.py [--quick] [--data-dir DIR]
Writes benchmarks/results/section_v.json and section_v.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssca_solver as ss  # noqa: E402
from _common import RESULTS, log, machine, median_time, write_json  # noqa: E402
from problems.mlp import MLP, _forward_backward, classification_con, classification_uncon  # noqa: E402,E501
from ssca_solver import driver  # noqa: E402
from ssca_solver.datasets import fashion_mnist  # noqa: E402
from ssca_solver.federated import InProcessTransport, RoundRequest, combine  # noqa: E402
from ssca_solver.solve import make_clients, make_subproblem, parse_options  # noqa: E402
from ssca_solver.subproblems import ClosedFormSubproblem, CvxpySubproblem  # noqa: E402

GROUPS = [(0, 1, 2), (3, 4, 5), (6, 7), (8, 9)]


def group_loss(net, group, frac):
    """Cross-entropy on the rows whose label is in ``group``, as a mean over that group."""
    ce = net.cross_entropy()
    labels = np.array(group)

    def value_and_grad(w, X, y):
        mask = np.isin(y, labels)
        v = np.zeros(len(y))
        g = np.zeros(net.dim)
        if mask.any():
            vm, gm = ce.value_and_grad(w, X[mask], y[mask])
            v[mask] = vm / frac
            g = gm * mask.sum() / len(y) / frac
        return v, g

    return ss.SampleFunction(lambda w, X, y: value_and_grad(w, X, y)[0],
                             lambda w, X, y: value_and_grad(w, X, y)[1],
                             name=f"CE{group}", value_and_grad=value_and_grad)


def build(net, data, y_all, M):
    if M == 0:
        return classification_uncon(data, net, lam=1e-5)
    if M == 1:
        return classification_con(data, net, U=0.13)
    fns = [group_loss(net, g, np.isin(y_all, g).mean()) for g in GROUPS[:M]]
    import cvxpy as cp
    return ss.Problem(lambda w: cp.sum_squares(w), [f <= 1.5 for f in fns], dim=net.dim,
                      data=data)


def part1(X, y, Js, Ms, repeats, cvxpy_repeats):
    rows = []
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    for J in Js:
        net = MLP(784, J, 10)
        for M in Ms:
            prob = build(net, data, y, M)
            msgs = InProcessTransport(make_clients(prob, 0)).exchange(
                RoundRequest(1, net.init(0), 100, 0.1))
            stats = driver.average_statistics(
                driver.init(net.init(0), prob.builders, 0.1, "tau").stats,
                combine(msgs, data.num_samples), 0.9)
            lam = prob.deterministic.norm2_coefficient()
            cf = ClosedFormSubproblem(net.dim, prob.builders, prob.objective is not None,
                                      prob.bounds, lam)
            t_cf, s_cf = median_time(lambda: cf.solve(stats, 1e5, 1), repeats, warmup=2)
            cv = CvxpySubproblem(net.dim, prob.builders, prob.objective is not None,
                                 prob.bounds, prob.deterministic)
            t_cv, s_cv = median_time(lambda: cv.solve(stats, 1e5, 1), cvxpy_repeats, warmup=0)
            err = float(np.linalg.norm(s_cf.w - s_cv.w) / max(np.linalg.norm(s_cv.w), 1e-300))
            t_ipm = float(cv.problem.solver_stats.solve_time)  # Clarabel alone, last solve
            row = {"J": J, "d": net.dim, "M": M, "closed_form_s": t_cf, "cvxpy_s": t_cv,
                   "clarabel_solve_only_s": t_ipm, "speedup": t_cv / t_cf,
                   "speedup_vs_clarabel_alone": t_ipm / t_cf, "primal_rel_err": err,
                   "multipliers_closed_form": s_cf.multipliers.tolist(),
                   "multipliers_cvxpy": s_cv.multipliers.tolist(),
                   "cvxpy_parametrized": cv.parametrize}
            rows.append(row)
            log(f"[1] d={net.dim:>7d} M={M}: closed form {t_cf * 1e3:8.3f} ms, CVXPY+Clarabel "
                f"{t_cv:7.3f} s (Clarabel alone {t_ipm:7.3f} s), speed-up {t_cv / t_cf:9.0f}x "
                f"({t_ipm / t_cf:8.0f}x vs Clarabel alone), rel. error {err:.1e}")
    return rows


def part2(X, y, rounds):
    """Round time with one BLAS thread (each client is its own machine in a deployment; with
    OpenBLAS's two threads on this 2-core machine the same round measured 3-4x slower and
    noisier, the threads contending with NumPy's element-wise work)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _part2(X, y, rounds)


def _part2(X, y, rounds):
    out = {}
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    net = MLP(784, 128, 10)
    for kind in ("uncon", "con"):
        prob = classification_uncon(data, net, 1e-5) if kind == "uncon" else \
            classification_con(data, net, 0.13)
        opts = parse_options({})
        sub = make_subproblem(prob, opts)
        transport = InProcessTransport(make_clients(prob, 0))
        state = driver.init(net.init(0), prob.builders, 0.1, "tau")
        t_client, t_server = [], []
        for t in range(1, rounds + 1):
            t0 = time.perf_counter()
            msgs = transport.exchange(RoundRequest(t, state.w, 100, 0.1))
            t1 = time.perf_counter()
            state, _ = driver.step(state, msgs, data.num_samples, 0.6 / t ** 0.3,
                                   0.9 / t ** 0.35, 1e5, sub)
            t2 = time.perf_counter()
            t_client.append(t1 - t0)
            t_server.append(t2 - t1)
        c, s = float(np.median(t_client[1:])), float(np.median(t_server[1:]))
        out[kind] = {"subproblem": sub.name, "blas_threads": 1, "client_stats_all_10_s": c,
                     "client_stats_per_client_s": c / 10, "server_update_s": s,
                     "server_share_of_round": s / (c + s), "rounds": rounds}
        log(f"[2] {kind}: 10 clients' statistics {c * 1e3:.1f} ms (sequential; "
            f"{c * 100:.1f} ms per client), server update {s * 1e3:.2f} ms = "
            f"{100 * s / (c + s):.2f} % of the round")
    return out


def part3(X, y, repeats):
    net = MLP(784, 128, 10)
    w1, w2, b1, b2 = net.unflatten(net.init(0))
    out = []
    for n in (100, 1000):
        Xb = np.ascontiguousarray(X[:n])
        yb = np.ascontiguousarray(y[:n].astype(np.int64))
        t_kernel, _ = median_time(lambda: _forward_backward(w1, w2, b1, b2, Xb, yb, 0, True),
                                  repeats, warmup=2)
        H = Xb @ w1.T
        S = np.tanh(H)
        D = np.random.default_rng(0).random((n, 10))

        def blas():
            Xb @ w1.T
            S @ w2.T
            D.T @ S
            dS = D @ w2
            dS.T @ Xb

        t_blas, _ = median_time(blas, repeats, warmup=2)
        out.append({"rows": n, "kernel_s": t_kernel, "blas_products_s": t_blas,
                    "ratio": t_kernel / t_blas})
        log(f"[3] n={n}: kernel {t_kernel * 1e3:.2f} ms, its 5 BLAS products "
            f"{t_blas * 1e3:.2f} ms, ratio {t_kernel / t_blas:.2f}")
    return out


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["closed_form_vs_cvxpy"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, M in enumerate(sorted({r["M"] for r in rows})):
        rr = [r for r in rows if r["M"] == M]
        d = [r["d"] for r in rr]
        col = f"C{i}"
        ax[0].loglog(d, [r["closed_form_s"] for r in rr], "o-", color=col,
                     label=f"closed form, M={M}")
        ax[0].loglog(d, [r["cvxpy_s"] for r in rr], "s--", color=col,
                     label=f"CVXPY+Clarabel, M={M}")
        ax[0].loglog(d, [r["clarabel_solve_only_s"] for r in rr], "x:", color=col,
                     label=f"Clarabel alone, M={M}")
        ax[1].semilogx(d, [r["speedup"] for r in rr], "o-", color=col, label=f"M={M}")
        ax[1].semilogx(d, [r["speedup_vs_clarabel_alone"] for r in rr], "x:", color=col,
                       label=f"M={M}, vs Clarabel alone")
    ax[0].set(xlabel="d", ylabel="seconds per solve (median)", title="Problem 5: time per solve")
    ax[0].legend(fontsize=7)
    ax[1].set(xlabel="d", ylabel="time / closed-form time", title="speed-up", yscale="log")
    ax[1].legend(fontsize=7)
    rt = res["round_time"]
    kinds = list(rt)
    ax[2].bar(kinds, [rt[k]["client_stats_all_10_s"] * 1e3 for k in kinds], label="10 clients")
    ax[2].bar(kinds, [rt[k]["server_update_s"] * 1e3 for k in kinds],
              bottom=[rt[k]["client_stats_all_10_s"] * 1e3 for k in kinds], label="server")
    for i, k in enumerate(kinds):
        ax[2].text(i, rt[k]["client_stats_all_10_s"] * 1e3,
                   f"server {100 * rt[k]['server_share_of_round']:.1f} %", ha="center",
                   va="bottom", fontsize=8)
    ax[2].set(ylabel="ms per round (median)", title="round at I=10, B=100, d=101,632")
    ax[2].legend()
    fig.suptitle(f"{res['machine']['cpu']} ({res['machine']['cores']} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="J in {16, 128}, fewer repeats")
    ap.add_argument("--data-dir", default=None, help="folder of Fashion-MNIST's IDX files")
    args = ap.parse_args(argv)
    (X, y), _ = fashion_mnist(args.data_dir)
    Js = [16, 128] if args.quick else [16, 32, 64, 128]
    start = time.perf_counter()
    res = {"command": " ".join(["python", "benchmarks/section_v.py"] + (argv or sys.argv[1:])),
           "machine": machine(), "data": "Fashion-MNIST train (60000 x 784)"}
    res["closed_form_vs_cvxpy"] = part1(X, y, Js, [0, 1, 4], 20 if args.quick else 50,
                                        1 if args.quick else 3)
    res["round_time"] = part2(X, y, 6 if args.quick else 21)
    res["kernel_vs_blas"] = part3(X, y, 10 if args.quick else 30)
    res["wall_time_s"] = time.perf_counter() - start
    path = write_json("section_v", res)
    plot(res, RESULTS / "section_v.png")
    log(f"wrote {path} and {RESULTS / 'section_v.png'} in {res['wall_time_s']:.0f} s")


if __name__ == "__main__":
    main()
